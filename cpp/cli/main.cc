// The `gpuprof` command-line tool.
//
//   gpuprof insights [DB] [RUN] [--json] [--gpu-rate USD]   report of a stored run
//   gpuprof insights [DB] --group NAME [--json]              every rank of a multi-rank run
//   gpuprof rules [--markdown | --reference]                 the rule registry / MFU and
//                                                            cost reference tables
//   gpuprof version
//
// Exit status: 0 on success (also --help), 1 when the data cannot be read or does not hold
// what was asked for (no such DB file, not a gpuprof DB, no such run or group), 2 on a usage
// error (unknown subcommand or option, an extra argument, a malformed value, no subcommand).
// The message on stderr says which and how to fix it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis.h"
#include "analysis/flops.h"
#include "analysis/format.h"
#include "analysis/pricing.h"
#include "analysis/rules/registry.h"
#include "store/rows.h"
#include "store/sqlite_store.h"

namespace gpuprof::cli {
namespace {

constexpr int kDataError = 1;
constexpr int kUsageError = 2;

int Fail(const std::string& message, int code = kDataError) {
  std::cerr << "gpuprof: " << analysis::ValidUtf8(message) << "\n";
  return code;
}

int UsageError(const std::string& message) { return Fail(message, kUsageError); }

// "1–3, 5, 7–9" for ascending ids.
std::string IdRanges(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ids[i]);
    if (j > i) out += "–" + std::to_string(ids[j]);
    i = j + 1;
  }
  return out;
}

// A run id as typed: digits only ("42"). One that does not fit in 64 bits is still a run id,
// of a run that cannot exist.
bool LooksLikeRunId(const std::string& text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return c >= '0' && c <= '9'; });
}

std::optional<int64_t> ParseRunId(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

// JSON for stdout. Text read from a DB may hold invalid UTF-8 (an edited or damaged file):
// such bytes become U+FFFD instead of aborting the dump.
std::string DumpJson(const nlohmann::json& doc) {
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct InsightsArgs {
  std::string db = "gpuprof.db";
  std::string run;  // empty or "latest" = the latest run
  bool json = false;
  std::string gpu_rate;
  std::optional<std::string> group;  // --group NAME: analyze runs with runs.group_id == NAME
};

int RunInsights(InsightsArgs args) {
  std::error_code ec;
  // `gpuprof insights 42` means run 42 of ./gpuprof.db unless a file named "42" exists; so
  // does `gpuprof insights latest` (the latest run) unless a file named "latest" exists.
  if (args.run.empty() && (LooksLikeRunId(args.db) || args.db == "latest") &&
      !std::filesystem::exists(args.db, ec)) {
    args.run = args.db;
    args.db = "gpuprof.db";
  }
  if (!std::filesystem::exists(args.db, ec)) {
    return Fail("no such file: " + args.db +
                " — run a profiled script first, or pass the DB path");
  }
  if (std::filesystem::is_directory(args.db, ec)) {
    return Fail(args.db + " is a directory; pass the gpuprof DB file (e.g. " +
                (std::filesystem::path(args.db) / "gpuprof.db").string() + ")");
  }
  analysis::AnalysisOptions options;
  if (!args.gpu_rate.empty()) {
    options.gpu_rate_usd_per_hour = analysis::ParseRate(args.gpu_rate);
    if (!options.gpu_rate_usd_per_hour) {
      return UsageError("--gpu-rate '" + args.gpu_rate +
                        "' is not a non-negative number of USD per GPU-hour");
    }
  }
  auto store = store::SqliteStore::Open(args.db, store::SqliteStore::Mode::kReadOnly);
  if (!store) return Fail(store.error());
  auto runs = (*store)->ListRuns();
  if (!runs) return Fail(runs.error());
  if (runs->empty()) {
    return Fail(args.db + " holds no runs yet — run a script under gpuprof.profile() first");
  }
  if (args.group) {
    if (!args.run.empty()) {
      return UsageError("--group analyzes every run of the group; leave out RUN (got '" +
                        args.run + "')");
    }
    auto group = analysis::AnalyzeStoredGroup(**store, *args.group, options);
    if (!group) return Fail(group.error());
    if (args.json) {
      std::cout << DumpJson(analysis::GroupReportJson(*group)) << "\n";
    } else {
      std::cout << analysis::FormatGroupReport(*group, args.db);
    }
    return 0;
  }
  std::vector<int64_t> ids;
  for (const auto& r : *runs) ids.push_back(r.run_id);

  int64_t run_id = ids.back();
  if (!args.run.empty() && args.run != "latest") {
    if (!LooksLikeRunId(args.run)) {
      return UsageError("RUN must be a run id (an integer) or 'latest', got '" + args.run +
                        "'");
    }
    const std::optional<int64_t> parsed = ParseRunId(args.run);
    if (!parsed || std::find(ids.begin(), ids.end(), *parsed) == ids.end()) {
      return Fail("no run " + args.run + " in " + args.db + " (run ids: " + IdRanges(ids) + ")");
    }
    run_id = *parsed;
  }
  auto report = analysis::AnalyzeRun(**store, run_id, options);
  if (!report) return Fail(report.error());
  if (args.json) {
    std::cout << DumpJson(analysis::ReportJson(*report)) << "\n";
  } else {
    std::cout << analysis::FormatFullReport(*report);
  }
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"gpuprof: diagnoses why a training run is slow, in one sentence per problem."};
  app.name("gpuprof");
  app.require_subcommand(0, 1);

  InsightsArgs insights_args;
  CLI::App* insights = app.add_subcommand(
      "insights", "Print the full insights report of a stored run (latest run by default).");
  insights->add_option("db", insights_args.db,
                       "gpuprof SQLite file written by gpuprof.profile() (default: ./gpuprof.db)");
  insights->add_option("run", insights_args.run,
                       "Run id or 'latest' (the default). A lone integer or 'latest' is a run "
                       "of ./gpuprof.db unless a file of that name exists");
  insights->add_flag("--json", insights_args.json,
                     "Print a JSON document (run, steps, mfu, telemetry, insights, "
                     "not_evaluated; with --group: ranks, insights, not_evaluated) instead of "
                     "text");
  insights->add_option("--group", insights_args.group,
                       "Analyze every rank of a multi-rank run: the runs whose group_id is NAME "
                       "(per-rank step times, rank skew, per-bucket collective skew)")
      ->type_name("NAME");
  insights->add_option("--gpu-rate", insights_args.gpu_rate,
                       "USD per GPU-hour for the cost line (overrides $GPUPROF_GPU_RATE and "
                       "the reference table)");

  bool markdown = false;
  bool reference = false;
  CLI::App* rules = app.add_subcommand("rules", "List the insight rules and their thresholds.");
  rules->add_flag("--markdown", markdown, "Print Markdown tables (the README rule table)");
  rules->add_flag("--reference", reference,
                  "Print the reference tables instead: dense peak TFLOPs per GPU model and "
                  "dtype (MFU) and USD per GPU-hour (cost), as Markdown");

  CLI::App* version = app.add_subcommand("version", "Print the gpuprof version.");

  app.footer("Exit status: 0 ok, 1 data error (no such DB, run or group), 2 usage error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and CLI11's other "success" exits) print and exit 0; every malformed command
    // line is a usage error, whatever CLI11's internal code for it.
    const int code = app.exit(e);
    return code == 0 ? 0 : kUsageError;
  }

  if (insights->parsed()) return RunInsights(insights_args);
  if (rules->parsed()) {
    if (reference) {
      std::cout << "Peak TFLOPs (dense, per GPU)\n\n"
                << analysis::PeakTflopsMarkdown() << "\nReference GPU rates\n\n"
                << analysis::GpuRatesMarkdown();
    } else {
      std::cout << (markdown ? analysis::RulesMarkdown() : analysis::RulesText());
    }
    return 0;
  }
  if (version->parsed()) {
    std::cout << "gpuprof " << GPUPROF_VERSION << " (store schema " << store::kSchemaVersion
              << ")\n";
    return 0;
  }
  std::cerr << app.help();
  return kUsageError;
}

}  // namespace
}  // namespace gpuprof::cli

// No C++ exception leaves the CLI: whatever escapes (a bug, a damaged DB that trips a library)
// is one line on stderr and exit status 1, never an abort.
int main(int argc, char** argv) {
  try {
    return gpuprof::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpuprof: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "gpuprof: internal error (unknown exception)\n";
  }
  return 1;
}
