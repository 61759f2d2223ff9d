#include "export_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis.h"
#include "analysis/format.h"
#include "analysis/group.h"
#include "analysis/run_loader.h"
#include "traces/perfetto_export.h"

namespace gpuprof::cli {
namespace {

// main.cc's exit statuses.
constexpr int kDataError = 1;
constexpr int kUsageError = 2;

struct ExportArgs {
  std::string db = "gpuprof.db";
  std::string run;                   // empty or "latest": the newest run
  std::optional<std::string> group;  // every rank of a group in one trace
  std::string format = "perfetto";
  std::optional<std::string> output;  // "-": stdout
};

int Fail(const std::string& message, int code = kDataError) {
  std::cerr << "gpuprof: " << analysis::ValidUtf8(message) << "\n";
  return code;
}

std::string FormatList() {
  std::string out;
  for (const std::string& f : traces::PerfettoFormatNames()) {
    out += (out.empty() ? "" : ", ") + f;
  }
  return out;
}

// `text` reduced to characters safe in a file name ("run" first when it would be hidden).
std::string SafeName(const std::string& text) {
  std::string name;
  for (unsigned char c : text) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
    name += safe ? static_cast<char>(c) : '_';
  }
  if (name.empty() || name.front() == '.') name = "run" + name;
  return name;
}

// "<run name>-<run id>.trace.json".
std::string DefaultFileName(const store::RunInfo& run) {
  return SafeName(run.run_name) + "-" + std::to_string(run.run_id) + ".trace.json";
}

using TraceFn = std::function<traces::PerfettoSummary(std::ostream&)>;

// Writes the trace to `path` (or stdout for "-") through a temporary file beside it, so that a
// failed export leaves no half-written file (and an existing file untouched); then prints the
// path and `what` with the summary's counts.
int WriteTrace(const TraceFn& write, const std::string& path, const std::string& what) {
  if (path == "-") {
    write(std::cout);
    std::cout.flush();
    if (!std::cout) return Fail("writing the trace to stdout failed");
    return 0;
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Fail("cannot write " + path + ": it is a directory; pass a file name to -o");
  }
  const std::string tmp = path + ".partial-" + std::to_string(::getpid());
  traces::PerfettoSummary summary;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Fail("cannot write " + path + ": " + std::strerror(errno));
    summary = write(out);
    out.close();
    if (out.fail()) {
      const std::string why = std::strerror(errno);
      std::filesystem::remove(tmp, ec);
      return Fail("writing " + path + " failed: " + why);
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    return Fail("cannot write " + path + ": " + ec.message());
  }
  std::cout << path << "\n"
            << what << ", " << summary.events << " trace events on " << summary.tracks
            << " tracks; open it in https://ui.perfetto.dev or chrome://tracing\n";
  return 0;
}

// Every rank of the group NAME (a group id, or the run name of a group's runs) in one trace, on
// the common clock.
int ExportGroup(const ExportArgs& args, const StoreOpener& open) {
  PickedRun opened = open(args.db);
  if (opened.exit) return opened.exit;
  store::RunStore& db = *opened.store;
  auto name = analysis::ResolveGroupName(db, *args.group);
  if (!name) return Fail(name.error());
  auto runs = analysis::LoadGroupRuns(db, name->group_id);
  if (!runs) return Fail(runs.error());
  const analysis::GroupView view = analysis::BuildGroupView(name->group_id, std::move(*runs));
  std::vector<store::RunData> full;
  full.reserve(view.ranks.size());
  int64_t base = 0;
  size_t steps = 0;
  for (size_t i = 0; i < view.ranks.size(); ++i) {
    auto data = db.LoadRun(view.ranks[i].run().run_id);
    if (!data) return Fail(data.error());
    steps += data->steps.size();
    full.push_back(std::move(data).value());
    const int64_t at = view.AlignedNs(i, 0);
    base = i == 0 ? at : std::min(base, at);
  }
  std::vector<traces::GroupTraceRank> ranks;
  for (size_t i = 0; i < full.size(); ++i) ranks.push_back({&full[i], view.AlignedNs(i, 0) - base});
  const traces::GroupTraceInfo info{name->group_id, base, view.AlignmentBasis()};
  std::string what = "group " + analysis::ValidUtf8(name->group_id) + ": " +
                     analysis::Plural(full.size(), "rank", "ranks") + ", " +
                     analysis::Plural(steps, "step", "steps") + " (" + info.alignment + ")";
  if (!view.superseded.empty()) {
    what += "; left out (a newer run of the same rank is used): " +
            analysis::Plural(view.superseded.size(), "older run", "older runs");
  }
  return WriteTrace(
      [&](std::ostream& out) { return traces::WritePerfettoGroupTrace(ranks, info, out); },
      args.output ? *args.output : SafeName(name->group_id) + ".group.trace.json", what);
}

int RunExport(const ExportArgs& args, const RunPicker& pick, const StoreOpener& open) {
  const auto& formats = traces::PerfettoFormatNames();
  if (std::find(formats.begin(), formats.end(), args.format) == formats.end()) {
    return Fail("unknown --format '" + args.format + "'; formats: " + FormatList() +
                    " (Chrome trace-event JSON for ui.perfetto.dev and chrome://tracing; "
                    "'chrome' is the same as 'perfetto')",
                kUsageError);
  }
  if (args.output && args.output->empty()) {
    return Fail("-o needs a file name, or '-' for stdout", kUsageError);
  }
  if (args.group) {
    if (!args.run.empty()) {
      return Fail("give a RUN or --group, not both (--group exports every rank of the group)",
                  kUsageError);
    }
    return ExportGroup(args, open);
  }
  PickedRun picked = pick(args.db, args.run);
  if (picked.exit) return picked.exit;
  auto data = picked.store->LoadRun(picked.run_id);
  if (!data) return Fail(data.error());
  const std::string what = "run " + std::to_string(data->run.run_id) + " (" +
                           analysis::ValidUtf8(data->run.run_name) +
                           "): " + analysis::Plural(data->steps.size(), "step", "steps");
  return WriteTrace([&](std::ostream& out) { return traces::WritePerfettoTrace(*data, out); },
                    args.output ? *args.output : DefaultFileName(data->run), what);
}

}  // namespace

Subcommand AddExportCommand(CLI::App& app, RunPicker pick, StoreOpener open) {
  auto args = std::make_shared<ExportArgs>();
  Subcommand cmd;
  cmd.command = app.add_subcommand(
      "export",
      "Write a stored run as a trace file: --format perfetto is Chrome trace-event JSON (steps, "
      "phases, loader waits, kernels, comm buckets, telemetry counters, insights) for "
      "ui.perfetto.dev and chrome://tracing.");
  cmd.command->add_option("db", args->db, "gpuprof SQLite file (default: ./gpuprof.db)");
  cmd.command->add_option("run", args->run,
                          "Run id or 'latest' (the default). A lone integer or 'latest' is a "
                          "run of ./gpuprof.db unless a file of that name exists");
  cmd.command
      ->add_option("--group", args->group,
                   "Every rank of a multi-rank run in one trace, one process per rank, lined "
                   "up by their measured clock offsets: the runs whose group_id is NAME, or the "
                   "newest group of the runs named NAME (default file: <group>.group.trace.json)")
      ->type_name("NAME");
  cmd.command
      ->add_option("--format", args->format,
                   "Trace format: perfetto (the default; 'chrome' is the same)")
      ->type_name("FORMAT");
  cmd.command
      ->add_option("-o,--output", args->output,
                   "Output file, '-' for stdout (default: <run name>-<run id>.trace.json "
                   "in the current directory)")
      ->type_name("FILE");
  cmd.run = [args, pick = std::move(pick), open = std::move(open)] {
    return RunExport(*args, pick, open);
  };
  return cmd;
}

}  // namespace gpuprof::cli
