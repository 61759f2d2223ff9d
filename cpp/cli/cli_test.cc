// Black-box tests of the built `gpuprof` binary (path in GPUPROF_CLI_PATH): help, version,
// the rule registry, error messages and exit codes, and `insights` on DBs written here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/format.h"
#include "analysis/report.h"
#include "analysis/rules/registry.h"
#include "analysis/store_test_util.h"
#include "analysis/test_runs.h"

namespace gpuprof::cli {
namespace {

using analysis::testing::kMs;
using analysis::testing::RunBuilder;
using analysis::testing::StepShape;
using ::testing::HasSubstr;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A scratch directory per test; the CLI runs inside it.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("gpuprof_cli_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // In-process analysis must see the same (unset) rate as the CLI runs below.
    if (const char* rate = std::getenv("GPUPROF_GPU_RATE")) saved_rate_ = rate;
    unsetenv("GPUPROF_GPU_RATE");
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    if (saved_rate_) setenv("GPUPROF_GPU_RATE", saved_rate_->c_str(), 1);
  }

  Result Run(const std::string& args, const std::string& env = "") {
    const std::string out = (dir_ / "stdout.txt").string();
    const std::string err = (dir_ / "stderr.txt").string();
    // The caller's GPUPROF_GPU_RATE must not leak into expectations about the cost line.
    const std::string cmd = "cd " + Quote(dir_.string()) + " && env -u GPUPROF_GPU_RATE " + env +
                            " " + Quote(GPUPROF_CLI_PATH) + " " + args + " >" + Quote(out) + " 2>" +
                            Quote(err);
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes runs into `db` and returns their ids.
  std::vector<int64_t> WriteRuns(const std::string& db, const std::vector<store::RunData>& runs) {
    auto store = analysis::testing::OpenDb(db);
    std::vector<int64_t> ids;
    if (!store) return ids;
    for (const auto& r : runs) ids.push_back(analysis::testing::WriteRun(*store, r));
    return ids;
  }

  std::filesystem::path dir_;
  std::optional<std::string> saved_rate_;
};

RunBuilder StallRun(const std::string& name, size_t steps) {
  RunBuilder b;
  b.Name(name);
  StepShape s;
  s.wait_ns = 50 * kMs;
  s.phases = {{"forward", 20 * kMs, std::nullopt},
              {"backward", 20 * kMs, std::nullopt},
              {"optimizer", 5 * kMs, std::nullopt}};
  b.Steps(steps, s);
  return b;
}

TEST_F(CliTest, HelpForEveryCommand) {
  for (const char* args : {"--help", "insights --help", "rules --help", "version --help"}) {
    const Result r = Run(args);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr("Usage")) << args;
  }
  EXPECT_THAT(Run("insights --help").out, HasSubstr("--json"));
  EXPECT_THAT(Run("insights --help").out, HasSubstr("--group"));
  EXPECT_THAT(Run("rules --help").out, HasSubstr("--markdown"));
}

TEST_F(CliTest, NoCommandPrintsUsageAndFails) {
  const Result r = Run("");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("insights"));
}

TEST_F(CliTest, MalformedCommandLinesAreUsageErrorsWithStatus2) {
  // GIVEN a DB with a run, so that only the command line can be wrong
  WriteRuns(Path("h.db"), {StallRun("a", 4).Build()});
  for (const char* args : {"bogus", "rules --bogus", "insights h.db 1 extra", "insights --json=x",
                           "version extra", "insights --gpu-rate"}) {
    // WHEN the CLI parses it  THEN it exits 2 with CLI11's message on stderr and no output
    const Result r = Run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_FALSE(r.err.empty()) << args;
  }
  EXPECT_THAT(Run("insights h.db 1 extra").err, HasSubstr("extra"));
  // AND help stays 0, a data error (no such run) stays 1
  EXPECT_EQ(Run("insights --help").code, 0);
  EXPECT_EQ(Run("insights h.db 9").code, 1);
  // AND the exit statuses are in the help
  EXPECT_THAT(Run("--help").out, HasSubstr("2 usage error"));
}

TEST_F(CliTest, Version) {
  const Result r = Run("version");
  EXPECT_EQ(r.code, 0);
  // The first line is the version; then what this build has of its optional parts.
  const std::string server =
#ifdef GPUPROF_HAVE_SERVER
      "built";
#else
      "not built (Boost, zlib, OpenSSL or libjs-dygraphs were missing at build time)";
#endif
  const std::string postgres =
#ifdef GPUPROF_WITH_POSTGRES
      "built";
#else
      "not built (libpq was missing at build time)";
#endif
  EXPECT_EQ(r.out, std::string("gpuprof ") + GPUPROF_VERSION + " (store schema " +
                       std::to_string(store::kSchemaVersion) + ")\n" +
                       "team server, push, dashboard, webhook: " + server + "\n" +
                       "PostgreSQL storage: " + postgres + "\n");
}

TEST_F(CliTest, RulesMarkdownIsTheRegistry) {
  const Result r = Run("rules --markdown");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, analysis::RulesMarkdown());
  for (const auto& rule : analysis::Rules()) EXPECT_THAT(r.out, HasSubstr("`" + rule.id + "`"));
  const Result text = Run("rules");
  EXPECT_EQ(text.code, 0);
  EXPECT_EQ(text.out, analysis::RulesText());
}

TEST_F(CliTest, MissingDbIsAClearError) {
  const Result r = Run("insights x.db");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "gpuprof: no such file: x.db — run a profiled script first, or pass the DB path\n");
  // The default DB is ./gpuprof.db.
  EXPECT_THAT(Run("insights").err, HasSubstr("no such file: gpuprof.db"));
}

TEST_F(CliTest, EmptyDbIsAClearError) {
  ASSERT_TRUE(analysis::testing::OpenDb(Path("empty.db")));  // schema, no runs
  const Result r = Run("insights empty.db");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("empty.db holds no runs yet"));
}

TEST_F(CliTest, NotADbIsAClearError) {
  std::ofstream(Path("notes.db")) << "hello, not sqlite";
  const Result r = Run("insights notes.db");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("notes.db"));
}

TEST_F(CliTest, UnknownRunListsTheAvailableIds) {
  const auto ids = WriteRuns(
      Path("u.db"), {StallRun("a", 4).Build(), StallRun("b", 4).Build(), StallRun("c", 4).Build()});
  ASSERT_EQ(ids.size(), 3u);
  const Result r = Run("insights u.db 999");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "gpuprof: no run 999 in u.db (run ids: " + std::to_string(ids[0]) + "–" +
                       std::to_string(ids[2]) + ")\n");
  // A lone integer is a run id in ./gpuprof.db.
  EXPECT_THAT(Run("insights 999").err, HasSubstr("no such file: gpuprof.db"));
  const Result bad = Run("insights u.db seven");
  EXPECT_EQ(bad.code, 2);  // a malformed RUN is a usage error
  EXPECT_THAT(bad.err, HasSubstr("RUN must be a run id"));
}

TEST_F(CliTest, InsightsDefaultsToTheLatestRunInGpuprofDb) {
  WriteRuns(Path("gpuprof.db"), {StallRun("first", 3).Build(), StallRun("second", 6).Build()});
  const Result r = Run("insights");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gpuprof · second · run 2  (6 steps, avg " +
                               analysis::FormatDuration(100.0 * kMs) + ")"));
  // The same text as the library renders for that run.
  auto store = analysis::testing::OpenDb(Path("gpuprof.db"));
  auto report = analysis::AnalyzeRun(*store, 2, {});
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(r.out, analysis::FormatFullReport(*report));
  EXPECT_EQ(Run("insights 2").out, r.out);
  EXPECT_EQ(Run("insights gpuprof.db latest").out, r.out);
  // A lone 'latest' is the latest run of ./gpuprof.db, as a lone integer is a run of it.
  const Result latest = Run("insights latest");
  EXPECT_EQ(latest.code, 0) << latest.err;
  EXPECT_EQ(latest.out, r.out);
  EXPECT_EQ(Run("insights latest --json").out, Run("insights gpuprof.db 2 --json").out);
  EXPECT_THAT(Run("insights 1").out, HasSubstr("gpuprof · first · run 1  (3 steps"));
  EXPECT_THAT(r.out, HasSubstr("[HIGH]  " + analysis::FormatPercent(0.5) +
                               " of step time waiting on the loader (inter-step gap)"));
}

TEST_F(CliTest, AFileNamedLatestOrAnIntegerIsReadAsTheDb) {
  // GIVEN ./gpuprof.db with two runs, and DB files named "latest" and "7" with one run each
  WriteRuns(Path("gpuprof.db"),
            {StallRun("default-1", 3).Build(), StallRun("default-2", 4).Build()});
  WriteRuns(Path("latest"), {StallRun("in-latest", 5).Build()});
  WriteRuns(Path("7"), {StallRun("in-seven", 6).Build()});
  // WHEN the shorthand names an existing file  THEN that file is the DB (its latest run)
  const Result latest = Run("insights latest");
  EXPECT_EQ(latest.code, 0) << latest.err;
  EXPECT_THAT(latest.out, HasSubstr("gpuprof · in-latest · run 1  (5 steps"));
  const Result seven = Run("insights 7");
  EXPECT_EQ(seven.code, 0) << seven.err;
  EXPECT_THAT(seven.out, HasSubstr("gpuprof · in-seven · run 1  (6 steps"));
  // AND naming the DB explicitly still reads ./gpuprof.db
  EXPECT_THAT(Run("insights gpuprof.db latest").out, HasSubstr("gpuprof · default-2 · run 2"));
}

TEST_F(CliTest, InsightsForAGivenRunAndJson) {
  const auto ids =
      WriteRuns(Path("runs.db"), {StallRun("first", 3).Build(), StallRun("second", 5).Build()});
  const Result r = Run("insights runs.db " + std::to_string(ids[0]));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("gpuprof · first · run " + std::to_string(ids[0]) + "  (3 steps"));

  const Result j = Run("insights runs.db " + std::to_string(ids[1]) + " --json");
  EXPECT_EQ(j.code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["run"]["run_name"], "second");
  EXPECT_EQ(doc["run"]["run_id"], ids[1]);
  EXPECT_EQ(doc["steps"]["count"], 5);
  ASSERT_FALSE(doc["insights"].empty());
  EXPECT_EQ(doc["insights"][0]["rule_id"], "dataloader_stall");
  EXPECT_TRUE(doc["not_evaluated"].is_array());
}

TEST_F(CliTest, GpuRateOptionAndEnvironment) {
  RunBuilder b = StallRun("priced", 5);
  b.Gpu("Acme X1", 2);  // no reference rate
  b.run().end_ns = 1800LL * 1'000'000'000;
  WriteRuns(Path("gpuprof.db"), {b.Build()});
  EXPECT_THAT(Run("insights").out,
              ::testing::ContainsRegex("\n  cost +cost unknown: no reference rate"));
  EXPECT_THAT(Run("insights --gpu-rate 2").out,
              HasSubstr("Estimated cost: $2.00 (30 min · 2× GPU @ $2.00/h)"));
  EXPECT_THAT(Run("insights", "GPUPROF_GPU_RATE=3").out,
              HasSubstr("Estimated cost: $3.00 (30 min · 2× GPU @ $3.00/h)"));
  const Result bad = Run("insights --gpu-rate cheap");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--gpu-rate 'cheap'"));
}

// Rank `rank` of group `group` with steady steps of `step_ms`.
RunBuilder RankRun(const std::string& group, int64_t rank, int64_t step_ms) {
  RunBuilder b;
  b.Name("ddp").Rank(group, rank, 2);
  b.run().hostname = "node-" + std::to_string(rank);
  StepShape s;
  s.duration_ns = step_ms * kMs;
  s.wait_ns = 5 * kMs;
  s.phases = {{"forward", 20 * kMs, std::nullopt}};
  b.Steps(30, s);
  return b;
}

TEST_F(CliTest, InsightsForAGroup) {
  WriteRuns(Path("gpuprof.db"), {StallRun("single", 5).Build(), RankRun("job", 0, 62).Build(),
                                 RankRun("job", 1, 87).Build()});
  const Result r = Run("insights --group job");
  EXPECT_EQ(r.code, 0) << r.err;
  auto store = analysis::testing::OpenDb(Path("gpuprof.db"));
  auto report = analysis::AnalyzeStoredGroup(*store, "job", {});
  ASSERT_TRUE(report.ok()) << report.error();
  EXPECT_EQ(r.out, analysis::FormatGroupReport(*report, "gpuprof.db"));
  EXPECT_THAT(r.out, HasSubstr("gpuprof · group job · 2 ranks (runs 2, 3)"));
  EXPECT_THAT(r.out, HasSubstr("[MED]   Rank skew: rank 1 median step " +
                               analysis::FormatDuration(87.0 * kMs) + " vs " +
                               analysis::FormatDuration(62.0 * kMs) + " on rank 0 ("));
  // bucket_skew needs collective timings, which these ranks did not record.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("\n  bucket_skew +no collective timings: the DDP "
                                              "comm hook was not installed"));
  // The DB may be named too.
  EXPECT_EQ(Run("insights gpuprof.db --group job").out, r.out);

  const Result j = Run("insights gpuprof.db --group job --json");
  EXPECT_EQ(j.code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_TRUE(doc["group_of_run_name"].is_null());  // NAME was the group id
  doc.erase("group_of_run_name");
  EXPECT_EQ(doc, analysis::GroupReportJson(*report));
  EXPECT_EQ(doc["group_id"], "job");
  ASSERT_EQ(doc["ranks"].size(), 2u);
  EXPECT_EQ(doc["ranks"][0]["hostname"], "node-0");
  EXPECT_EQ(doc["insights"][0]["rule_id"], "rank_skew");
  EXPECT_EQ(doc["not_evaluated"][0]["rule_id"], "bucket_skew");
}

TEST_F(CliTest, UnknownGroupIsAClearError) {
  WriteRuns(Path("g.db"), {RankRun("job", 0, 62).Build(), StallRun("single", 5).Build()});
  const Result r = Run("insights g.db --group jbo");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "gpuprof: no runs with group_id 'jbo' in g.db, nor runs of that name with a "
            "group_id (groups: job; --group takes a group id or the run name of the "
            "group's runs)\n");
  // A run name whose runs have no group_id is not a group either.
  EXPECT_THAT(Run("insights g.db --group single").err,
              HasSubstr("no runs with group_id 'single' in g.db, nor runs of that name"));
  WriteRuns(Path("plain.db"), {StallRun("single", 5).Build()});
  EXPECT_EQ(Run("insights plain.db --group job").err,
            "gpuprof: no runs with group_id 'job' in plain.db, nor runs of that name with a "
            "group_id (no run in it has a group_id; --group takes a group id or the run name "
            "of the group's runs)\n");
  const Result with_run = Run("insights g.db 1 --group job");
  EXPECT_EQ(with_run.code, 2);
  EXPECT_THAT(with_run.err, HasSubstr("--group analyzes every run of the group; leave out RUN"));
}

TEST_F(CliTest, GroupByTheRunNameOfItsRanks) {
  // GIVEN two launches of a job named "ddp" (groups "a1" then "b2"), their ranks' runs named so
  WriteRuns(Path("g.db"), {RankRun("a1", 0, 62).Build(), RankRun("a1", 1, 62).Build(),
                           StallRun("single", 5).Build(), RankRun("b2", 0, 62).Build(),
                           RankRun("b2", 1, 87).Build()});
  // WHEN --group is given the run name
  const Result r = Run("insights g.db --group ddp");
  EXPECT_EQ(r.code, 0) << r.err;
  // THEN the newest group is analyzed, and the report says which and why first
  auto store = analysis::testing::OpenDb(Path("g.db"));
  auto report = analysis::AnalyzeStoredGroup(*store, "b2", {});
  ASSERT_TRUE(report.ok()) << report.error();
  EXPECT_EQ(r.out, "group b2: the newest group of runs named 'ddp' (2 groups)\n" +
                       analysis::FormatGroupReport(*report, "g.db"));
  EXPECT_THAT(r.out, HasSubstr("gpuprof · group b2 · 2 ranks (runs 4, 5)"));
  // AND --json has the same group, and says how NAME was read
  const Result j = Run("insights g.db --group ddp --json");
  EXPECT_EQ(j.code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["group_id"], "b2");
  EXPECT_EQ(doc["group_of_run_name"], (nlohmann::json{{"run_name", "ddp"}, {"groups", 2}}));
  doc.erase("group_of_run_name");
  EXPECT_EQ(doc, analysis::GroupReportJson(*report));
  // AND a group id wins over a run name: the older group by its id
  const Result by_id = Run("insights g.db --group a1");
  EXPECT_EQ(by_id.code, 0) << by_id.err;
  EXPECT_THAT(by_id.out, ::testing::StartsWith("gpuprof · group a1 · 2 ranks (runs 1, 2)"));
}

}  // namespace
}  // namespace gpuprof::cli
