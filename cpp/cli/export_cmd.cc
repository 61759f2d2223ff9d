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

#include "analysis/format.h"
#include "traces/perfetto_export.h"

namespace gpuprof::cli {
namespace {

// main.cc's exit statuses.
constexpr int kDataError = 1;
constexpr int kUsageError = 2;

struct ExportArgs {
  std::string db = "gpuprof.db";
  std::string run;  // empty or "latest": the newest run
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

// "<run name>-<run id>.trace.json", the name reduced to characters safe in a file name.
std::string DefaultFileName(const store::RunInfo& run) {
  std::string name;
  for (unsigned char c : run.run_name) {
    const bool safe = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
    name += safe ? static_cast<char>(c) : '_';
  }
  if (name.empty() || name.front() == '.') name = "run" + name;
  return name + "-" + std::to_string(run.run_id) + ".trace.json";
}

// Writes the trace to `path` through a temporary file beside it, so that a failed export
// leaves no half-written file (and an existing file untouched).
int WriteFile(const store::RunData& data, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Fail("cannot write " + path + ": it is a directory; pass a file name to -o");
  }
  const std::string tmp = path + ".partial-" + std::to_string(::getpid());
  traces::PerfettoSummary summary;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Fail("cannot write " + path + ": " + std::strerror(errno));
    summary = traces::WritePerfettoTrace(data, out);
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
            << "run " << data.run.run_id << " (" << analysis::ValidUtf8(data.run.run_name)
            << "): " << analysis::Plural(data.steps.size(), "step", "steps") << ", "
            << summary.events << " trace events on " << summary.tracks
            << " tracks; open it in https://ui.perfetto.dev or chrome://tracing\n";
  return 0;
}

int RunExport(const ExportArgs& args, const RunPicker& pick) {
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
  PickedRun picked = pick(args.db, args.run);
  if (picked.exit) return picked.exit;
  auto data = picked.store->LoadRun(picked.run_id);
  if (!data) return Fail(data.error());
  if (args.output && *args.output == "-") {
    traces::WritePerfettoTrace(*data, std::cout);
    std::cout.flush();
    if (!std::cout) return Fail("writing the trace to stdout failed");
    return 0;
  }
  return WriteFile(*data, args.output ? *args.output : DefaultFileName(data->run));
}

}  // namespace

Subcommand AddExportCommand(CLI::App& app, RunPicker pick) {
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
      ->add_option("--format", args->format,
                   "Trace format: perfetto (the default; 'chrome' is the same)")
      ->type_name("FORMAT");
  cmd.command
      ->add_option("-o,--output", args->output,
                   "Output file, '-' for stdout (default: <run name>-<run id>.trace.json "
                   "in the current directory)")
      ->type_name("FILE");
  cmd.run = [args, pick = std::move(pick)] { return RunExport(*args, pick); };
  return cmd;
}

}  // namespace gpuprof::cli
