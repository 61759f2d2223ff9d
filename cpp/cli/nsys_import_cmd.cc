#include "nsys_import_cmd.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/format.h"
#include "store/rows.h"
#include "store/sqlite_store.h"
#include "traces/nsys_import.h"

namespace gpuprof::cli {
namespace {

constexpr int kDataError = 1;
constexpr int kUsageError = 2;
constexpr const char* kSource = "nsys";

struct NsysImportArgs {
  std::string file;
  std::string db = "gpuprof.db";
  std::string run;  // empty or "latest": the newest run
  bool replace = false;
  std::optional<int64_t> pid;
};

int Fail(const std::string& message, int code = kDataError) {
  std::cerr << "gpuprof: " << analysis::ValidUtf8(message) << "\n";
  return code;
}

// What the import needs of the DB, read (read-only) before the capture is: nothing is written
// when the capture turns out to be unusable.
struct Target {
  int64_t run_id = 0;
  store::RunInfo run;
  std::vector<store::StepRow> steps;
  size_t nsys_rows = 0;  // kernels rows of the run with source "nsys" (an earlier import)
  int exit = 0;          // non-zero: failed, message printed
};

Target ReadTarget(const NsysImportArgs& args) {
  Target t;
  std::error_code ec;
  if (!std::filesystem::exists(args.db, ec)) {
    t.exit = Fail("no such file: " + args.db +
                  " — pass --db with the gpuprof DB of the run that "
                  "was profiled under nsys");
    return t;
  }
  if (std::filesystem::is_directory(args.db, ec)) {
    t.exit = Fail(args.db + " is a directory; pass --db with the gpuprof DB file");
    return t;
  }
  auto store = store::SqliteStore::Open(args.db, store::SqliteStore::Mode::kReadOnly);
  if (!store) {
    t.exit = Fail(store.error());
    return t;
  }
  auto runs = (*store)->ListRuns();
  if (!runs) {
    t.exit = Fail(runs.error());
    return t;
  }
  if (runs->empty()) {
    t.exit = Fail(args.db + " holds no runs yet — run the script under gpuprof.profile() first");
    return t;
  }
  std::vector<int64_t> ids;
  for (const store::RunInfo& r : *runs) ids.push_back(r.run_id);
  const store::RunInfo* run = &runs->back();
  if (!args.run.empty() && args.run != "latest") {
    int64_t id = 0;
    const char* end = args.run.data() + args.run.size();
    auto [ptr, perr] = std::from_chars(args.run.data(), end, id);
    const bool digits = std::all_of(args.run.begin(), args.run.end(),
                                    [](unsigned char c) { return c >= '0' && c <= '9'; });
    if (!digits) {
      t.exit = Fail("--run must be a run id (an integer) or 'latest', got '" + args.run + "'",
                    kUsageError);
      return t;
    }
    auto it = std::find_if(runs->begin(), runs->end(),
                           [&](const store::RunInfo& r) { return r.run_id == id; });
    if (perr != std::errc() || ptr != end || it == runs->end()) {
      t.exit = Fail("no run " + args.run + " in " + args.db +
                    " (run ids: " + analysis::NumberRanges(ids) + ")");
      return t;
    }
    run = &*it;
  }
  t.run_id = run->run_id;
  t.run = *run;
  auto steps = (*store)->LoadSteps(t.run_id);
  if (!steps) {
    t.exit = Fail(steps.error());
    return t;
  }
  if (steps->empty()) {
    t.exit = Fail("run " + std::to_string(t.run_id) + " of " + args.db + " has no steps: the " +
                  "import attaches kernels to the run's steps (gpuprof.profile() auto mode, or "
                  "prof.step(i))");
    return t;
  }
  t.steps = std::move(*steps);
  auto kernels = (*store)->LoadKernels(t.run_id);
  if (!kernels) {
    t.exit = Fail(kernels.error());
    return t;
  }
  t.nsys_rows = static_cast<size_t>(
      std::count_if(kernels->begin(), kernels->end(),
                    [](const store::KernelRow& k) { return k.source == kSource; }));
  return t;
}

int RunNsysImport(const NsysImportArgs& args) {
  if (args.pid && *args.pid <= 0) return Fail("--pid must be a process id (> 0)", kUsageError);
  Target t = ReadTarget(args);
  if (t.exit) return t.exit;
  const std::string run_text = "run " + std::to_string(t.run_id) + " of " + args.db;
  traces::NsysImportOptions options;
  options.pid = args.pid;
  options.run_pid = t.run.pid;
  auto imported = traces::ImportNsysKernels(args.file, t.steps, options);
  if (!imported) return Fail(imported.error());
  if (imported->rows.empty()) {
    return Fail(args.file + ": no kernel ran inside a `gpuprof step` range (" +
                analysis::Plural(imported->outside_kernels, "kernel", "kernels") +
                " outside them); nothing imported");
  }
  if (t.nsys_rows > 0 && !args.replace) {
    return Fail(run_text + " already has kernels imported from nsys (" +
                std::to_string(t.nsys_rows) + " rows); pass --replace to replace them");
  }

  auto store = store::SqliteStore::Open(args.db, store::SqliteStore::Mode::kReadWrite);
  if (!store) return Fail(store.error());
  std::vector<store::Row> rows(imported->rows.begin(), imported->rows.end());
  const Status written = args.replace ? (*store)->ReplaceKernels(t.run_id, kSource, rows)
                                      : (*store)->WriteRows(t.run_id, rows);
  if (!written.ok()) return Fail(written.message());

  std::cout << "imported " << analysis::Plural(imported->kernels, "kernel", "kernels") << " ("
            << analysis::Plural(imported->rows.size(), "row", "rows") << ") into "
            << (imported->steps.size() == 1 ? "step " : "steps ")
            << analysis::NumberRanges(imported->steps) << " of " << run_text << " from "
            << args.file << " (nsys export schema " << imported->schema_version << ")";
  if (args.replace && t.nsys_rows > 0) {
    std::cout << ", replacing " << t.nsys_rows << " earlier nsys rows";
  }
  std::cout << "\n";
  if (imported->outside_kernels > 0) {
    std::cout << imported->outside_kernels << " kernel"
              << (imported->outside_kernels == 1 ? " was" : "s were")
              << " outside gpuprof step ranges and not imported\n";
  }
  return 0;
}

}  // namespace

Subcommand AddNsysImportCommand(CLI::App& app) {
  auto args = std::make_shared<NsysImportArgs>();
  Subcommand cmd;
  cmd.command = app.add_subcommand(
      "nsys-import",
      "Attach the kernel timings of an Nsight Systems capture to the steps of a stored run "
      "(profile under `with prof.nsys_capture():` with `nsys profile "
      "--capture-range=cudaProfilerApi --trace=cuda,nvtx`, then `nsys export --type sqlite`).");
  cmd.command->add_option("file", args->file, "The .sqlite file of `nsys export --type sqlite`")
      ->required()
      ->type_name("FILE.sqlite");
  cmd.command->add_option("--db", args->db, "gpuprof SQLite file (default: ./gpuprof.db)")
      ->type_name("DB");
  cmd.command->add_option("--run", args->run, "Run id or 'latest' (the default)")->type_name("N");
  cmd.command->add_flag("--replace", args->replace,
                        "Replace the run's kernels from an earlier nsys import (refused without)");
  cmd.command
      ->add_option("--pid", args->pid,
                   "Import the steps of this process only (a capture of several ranks; "
                   "default: the run's own pid when several processes have steps)")
      ->type_name("PID");
  cmd.run = [args] { return RunNsysImport(*args); };
  return cmd;
}

}  // namespace gpuprof::cli
