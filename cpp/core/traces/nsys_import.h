// Kernel timings from an Nsight Systems capture (`nsys export --type sqlite`), attributed to
// the steps of a gpuprof run and aggregated into rows of the kernels table (source "nsys").
//
// What is read (all read-only; the export has no indexes, so every table is scanned once):
//   META_DATA_EXPORT(name, value), or EXPORT_META_DATA in older exports: the export schema
//     version, EXPORT_SCHEMA_VERSION "3.15.1" or EXPORT_SCHEMA_VERSION_MAJOR/_MINOR/_MICRO.
//     Major version 3 is read (kSupportedNsysSchemas lists the versions known to work).
//   StringIds(id, value): the strings that other tables refer to by id.
//   NVTX_EVENTS(start, end, eventType, globalTid, text, textId): ranges (eventType 59 push/pop,
//     60 start/end); the message is `text`, or StringIds[textId] for a registered string.
//   CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId, correlationId, globalPid,
//     gridX/Y/Z, blockX/Y/Z, shortName, demangledName -> StringIds): one row per kernel run.
//   CUPTI_ACTIVITY_KIND_RUNTIME(start, globalTid, correlationId), optional: the CUDA API call
//     that launched each kernel (same correlationId in the same process).
// Timestamps are nanoseconds on nsys' session clock. A serialized global id packs the process
// above bit 24 (globalTid / 0x1000000 = process, globalTid % 0x1000000 = thread).
//
// Attribution. prof.nsys_capture() emits an NVTX range `gpuprof step <i>` around every step i
// (i as in the run's steps table) and `gpuprof <phase>` ranges inside (ignored here). A kernel
// belongs to step i when the CUDA API call that launched it starts inside a `gpuprof step <i>`
// range of the same thread; when no step range of that thread encloses the call (PyTorch
// launches backward kernels from autograd's device threads), a step range of another thread of
// the same process does. Without a runtime table (or for a kernel whose launch is not in it)
// the kernel's own start is used, against the step ranges of its process. Kernels outside every
// step range are only counted.
//
// Rows: one per (step, name, device, stream, grid, block), name = the demangled name when the
// export has one, else the short name; window = the step's [start_ns, end_ns) from the steps
// table (run-relative: nsys' clock is never mapped onto the run's).
//
// Every problem is an error with a message naming the file and what to do; nothing partial is
// returned: a file that is not SQLite, a SQLite file without the export's tables or columns, an
// unknown schema version, NULL or non-integer values where a number is needed, a range or
// kernel that ends before it starts, a name id missing from StringIds, no `gpuprof step`
// ranges at all, or kernels in a step that the run's steps table does not have.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::traces {

// The export schema versions this reader was written against (major version 3); any 3.x is
// read, anything else refused with this list.
inline constexpr const char* kSupportedNsysSchemas =
    "3.x (known: 3.1.7, 3.15.1, 3.20.7, 3.22.1, 3.23.2, 3.24.14)";

struct NsysImportOptions {
  // Only the step ranges of this process id (the pid, not nsys' global id). Needed when the
  // capture holds gpuprof step ranges of several processes (one per rank).
  std::optional<int64_t> pid;
  // The run's pid (runs.pid): picks the process when several have step ranges and `pid` is
  // not given.
  std::optional<int64_t> run_pid;
};

struct NsysImport {
  std::vector<store::KernelRow> rows;  // by (step, name, device, stream, grid, block)
  std::string schema_version;          // "3.15.1"
  int64_t kernels = 0;                 // kernels attributed to a step
  int64_t outside_kernels = 0;         // kernels outside every step range (not imported)
  std::vector<int64_t> steps;          // the steps that got kernels, ascending
  int64_t step_ranges = 0;             // `gpuprof step` ranges read (of the chosen process)
  bool used_runtime = false;           // launches joined through CUPTI_ACTIVITY_KIND_RUNTIME
};

// Reads the export at `path` and aggregates its kernels onto `steps` (the run's steps table).
Expected<NsysImport> ImportNsysKernels(const std::string& path,
                                       const std::vector<store::StepRow>& steps,
                                       const NsysImportOptions& options = {});

}  // namespace gpuprof::traces
