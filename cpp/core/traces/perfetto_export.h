// A stored run as a Chrome trace-event file (the JSON Object Format), which ui.perfetto.dev and
// chrome://tracing open: `gpuprof export --format perfetto`.
//
// File layout:
//   {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {run facts, time base}}
// Every ts / dur is in microseconds since the run's start (runs.start_unix_ns, in otherData,
// anchors it to wall time so that the traces of several ranks can be lined up), written with
// at most three decimals, so that it is exactly the stored nanoseconds.
//
// One process per run (pid = runs.pid; process_name "gpuprof <run name> (rank R)"), one thread
// per track (thread_name + thread_sort_index metadata events, "M"):
//   steps                   "X" per step: step, duration, loader wait, per-phase CPU and GPU
//                           time (the step's breakdown)
//   dataloader              "X" per measured wait, at the step's start (the wait precedes the
//                           step's first forward), named by its source
//   phases                  "X" per phases row with CPU time, inside its step: the store keeps
//                           a phase's summed CPU time per step, not when it ran, so a step's
//                           phases are laid end to end after its wait in the order forward,
//                           backward, comm, optimizer, then other names (clipped at the step's
//                           end). GPU time (phases.gpu_ns) is an arg of its own (gpu_ms), never
//                           added to or mixed with the CPU time (cpu_ms)
//   comm                    "X" per DDP bucket (comm_buckets), as recorded
//   kernels [GPU d]         "X" per kernels window and device: name the top kernel or "N
//                           kernels", args the top kernels (calls, gpu_ms, grid, block, stream)
//   CPU operators           "X" per cpu_ops window, likewise (host time)
//   host stalls, CPU wait   "X" per host_stalls / cpu_waits row
//   diagnostics, insights   "i" (thread scope): diagnostics at their time, insights at the end
// Counter tracks ("C", process-scoped; a counter's name is the quantity, its one arg key the
// unit, so Perfetto shows "GPU 0 utilization %"): per GPU utilization, memory used, power,
// temperature and SM clock (gpu_samples_1s), host CPU, memory, disk and the training
// process's CPU and RSS (host_samples), kernel GPU time per window and CPU operator self time
// per window. Slices that overlap on one track (comm buckets, windows from two sources) go to
// numbered lanes ("comm", "comm 2", ...), so that the slices of one thread always nest.
//
// Unknown stays unknown: a NULL column is left out (an arg omitted, no counter point), never
// written as 0. Counters hold their last value until the next point (the trace-event format
// has no "unknown"): the kernels and CPU operators slices show which stretches were traced.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "store/run_store.h"

namespace gpuprof::traces {

struct PerfettoOptions {
  size_t top_entries = 10;      // kernels / CPU operators listed per window slice
  size_t max_name_chars = 120;  // longer kernel names are cut (the full name stays in args)
};

// What a written trace holds, for the CLI's message.
struct PerfettoSummary {
  size_t events = 0;
  size_t tracks = 0;  // thread tracks (named) + counter series
};

// Writes `run` to `out` as described above. Does not throw on bad data (invalid UTF-8 in a
// name becomes U+FFFD); `out`'s state tells whether writing failed.
PerfettoSummary WritePerfettoTrace(const store::RunData& run, std::ostream& out,
                                   const PerfettoOptions& options = {});

// Several runs in one trace, one process each (the ranks of a distributed job): a rank's events
// are its run-relative times plus its `shift_ns`, where its run clock's 0 falls after the
// group's base (its start_unix_ns minus its measured clock offset, minus the base; the CLI
// computes them with analysis::GroupView). Processes keep their run's pid unless another rank
// took it (then the next free one; otherData.ranks[].trace_pid says which). otherData holds the
// group facts and one run's otherData per rank, with its shift.
struct GroupTraceRank {
  const store::RunData* data = nullptr;
  int64_t shift_ns = 0;
};
struct GroupTraceInfo {
  std::string group_id;
  int64_t base_unix_ns = 0;  // the time line's 0 (wall clock of the reference rank)
  std::string alignment;     // how the ranks' clocks were aligned, for a reader
};
PerfettoSummary WritePerfettoGroupTrace(const std::vector<GroupTraceRank>& ranks,
                                        const GroupTraceInfo& info, std::ostream& out,
                                        const PerfettoOptions& options = {});

// The same as one string.
std::string PerfettoTraceJson(const store::RunData& run, const PerfettoOptions& options = {});

// The names `gpuprof export --format` accepts for this writer ("perfetto", "chrome").
const std::vector<std::string>& PerfettoFormatNames();

}  // namespace gpuprof::traces
