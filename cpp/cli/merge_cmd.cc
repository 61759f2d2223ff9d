#include "merge_cmd.h"

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "analysis/format.h"
#include "store/sqlite_store.h"

namespace gpuprof::cli {
namespace {

// main.cc's exit statuses.
constexpr int kDataError = 1;
constexpr int kUsageError = 2;

struct MergeArgs {
  std::string out;
  std::vector<std::string> inputs;
};

int Fail(const std::string& message, int code = kDataError) {
  std::cerr << "gpuprof: " << analysis::ValidUtf8(message) << "\n";
  return code;
}

// How OUT knows a run it already holds (ingest_runs.run_uuid): the process that recorded it.
// The local run id is left out, so that a run merged through an intermediate file is still the
// same run. The "merge:" prefix keeps these apart from a team server's push ids.
std::string MergeId(const store::RunInfo& r) {
  return "merge:" + r.hostname + ":" + std::to_string(r.pid) + ":" +
         std::to_string(r.start_unix_ns);
}

// "rank 1 of 4, group G" / "" for a run that is not a rank.
std::string RankText(const store::RunInfo& r) {
  std::string out;
  if (r.rank) {
    out = "rank " + std::to_string(*r.rank);
    if (r.world_size) out += " of " + std::to_string(*r.world_size);
  }
  if (r.group_id) out += (out.empty() ? "" : ", ") + std::string("group ") + *r.group_id;
  return out;
}

int RunMerge(const MergeArgs& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Every input is opened (and so checked) before OUT is touched.
  struct Input {
    std::string path;
    std::unique_ptr<store::SqliteStore> store;
    std::vector<store::RunInfo> runs;
  };
  std::vector<Input> inputs;
  std::set<std::string> seen;
  for (const std::string& path : args.inputs) {
    if (fs::exists(args.out, ec) && fs::equivalent(path, args.out, ec)) {
      return Fail(path + " is the output file: a file cannot be merged into itself", kUsageError);
    }
    std::error_code canon_ec;
    const std::string key = fs::weakly_canonical(path, canon_ec).string();
    if (!seen.insert(canon_ec ? path : key).second) {
      return Fail(path + " is given twice", kUsageError);
    }
    auto db = store::SqliteStore::Open(path, store::SqliteStore::Mode::kReadOnly);
    if (!db) return Fail(db.status().message());
    auto runs = (*db)->ListRuns();
    if (!runs) return Fail(runs.status().message());
    inputs.push_back({path, std::move(db).value(), std::move(runs).value()});
  }
  auto out = store::SqliteStore::Open(args.out);
  if (!out) return Fail(out.status().message());

  size_t copied = 0, present = 0;
  std::map<std::string, size_t> groups;  // group id -> runs of it in OUT from this merge
  for (Input& in : inputs) {
    if (in.runs.empty()) std::cout << in.path << ": no runs\n";
    for (const store::RunInfo& info : in.runs) {
      auto all = in.store->LoadRunRows(info.run_id);
      if (!all) return Fail(all.status().message());
      store::RunInfo copy = all->data.run;
      copy.run_id = 0;
      bool existed = false;
      auto id = (*out)->ImportRun(MergeId(info), copy, all->rows, all->data.insights, &existed);
      if (!id) {
        return Fail("merging run " + std::to_string(info.run_id) + " of " + in.path + ": " +
                    id.status().message() + " (nothing of that run was written; the runs " +
                    "listed before it are in " + args.out + ": run the same command again)");
      }
      const std::string rank = RankText(info);
      std::cout << in.path << " run " << info.run_id << " (" << analysis::ValidUtf8(info.run_name)
                << (rank.empty() ? "" : ", " + analysis::ValidUtf8(rank)) << "): ";
      if (existed) {
        ++present;
        std::cout << "already in " << args.out << " as run " << *id << "\n";
      } else {
        ++copied;
        std::cout << "run " << *id << " of " << args.out << " (" << all->rows.size() << " rows)";
        if (info.status == "running") {
          std::cout << "; it had not ended (still running, or killed): copied as it was, and "
                       "merging it again will not update it";
        }
        std::cout << "\n";
      }
      if (info.group_id) ++groups[*info.group_id];
    }
  }
  std::cout << "merged " << copied << " run" << (copied == 1 ? "" : "s") << " into " << args.out;
  if (present) std::cout << " (" << present << " already there)";
  std::cout << "\n";
  for (const auto& [group, n] : groups) {
    std::cout << "  group " << analysis::ValidUtf8(group) << " (" << n << " run"
              << (n == 1 ? "" : "s") << "): gpuprof insights "
              << analysis::ShellQuoteIfNeeded(args.out) << " --group "
              << analysis::ShellQuoteIfNeeded(group) << "\n";
  }
  return 0;
}

}  // namespace

Subcommand AddMergeCommand(CLI::App& app) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Copy every run of the IN files into OUT (created when missing), e.g. the files the nodes "
      "of one job wrote, so that `gpuprof insights OUT --group NAME` compares all their ranks. "
      "A run already in OUT is skipped; each run is copied whole, in one transaction.");
  cmd->add_option("out", args->out, "The gpuprof SQLite file to merge into")->required();
  cmd->add_option("inputs", args->inputs, "gpuprof SQLite files to read (not changed)")->required();
  return Subcommand{cmd, [args] { return RunMerge(*args); }};
}

}  // namespace gpuprof::cli
