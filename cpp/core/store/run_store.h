// The store of runs as the analysis and the team server see it, whatever holds it: a SQLite file
// (SqliteStore, the client and a small server) or a PostgreSQL database (PgStore, a team
// server). Same schema (store/schema.sql, docs/schema.md), same orderings, same errors' shape
// ("<where>: <what was being done>: <the backend's message>").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::store {

// What the analysis reads of one run, as loaded back: everything but the raw telemetry tier
// (RawSamples), which retention keeps only for bounded windows. Vectors are ordered by time /
// step.
struct RunData {
  RunInfo run;
  std::vector<StepRow> steps;
  std::vector<PhaseRow> phases;
  std::vector<GpuInfoRow> gpus;
  std::vector<GpuRollupRow> gpu_samples_1s;
  std::vector<HostSampleRow> host_samples;  // cpu_per_core empty (raw tier)
  std::vector<WorkerRollupRow> worker_samples_10s;
  std::vector<KernelRow> kernels;
  std::vector<CpuOpRow> cpu_ops;  // empty in a file older than the table
  std::vector<CommBucketRow> comm_buckets;
  std::vector<StallRow> stalls;  // host_stalls by start_ns (empty in a file older than the table)
  std::vector<CpuWaitRow> cpu_waits;  // cpu_waits by start_ns (likewise)
  std::vector<TelemetryStatusRow> telemetry;
  std::vector<DiagnosticRow> diagnostics;
  std::vector<InsightRow> insights;
};

// What a runs list shows of a run beside its runs row (LoadRunProgress).
struct RunProgress {
  int64_t steps = 0;                        // rows in steps
  std::optional<int64_t> last_step;         // the highest step number
  std::optional<int64_t> last_step_end_ns;  // the newest step's end (run-relative)
  std::optional<int64_t> last_sample_ns;    // the newest GPU rollup or host sample
  std::optional<InsightRow> headline;       // the first insight stored (ordinal order)
};

inline constexpr int kGpuSeriesColumns = 4;   // ScanGpuSeries: util, mem, power, temp
inline constexpr int kHostSeriesColumns = 6;  // ScanHostSeries: kHostSeriesSql's value columns
// One row of a series scan (ScanGpuSeries, ScanHostSeries): bit i of `known` is set when v[i]
// was measured (a NULL column leaves it clear and v[i] 0).
struct SeriesRow {
  int64_t ts_ns = 0;
  int64_t gpu_index = 0;
  double v[kHostSeriesColumns] = {};
  uint32_t known = 0;
};
using SeriesRowFn = std::function<void(const SeriesRow&)>;

// One step with its phases summed (ScanStepBreakdown): the per-step bars of a step-time chart.
struct StepBreakdownRow {
  int64_t step = 0;
  int64_t duration_ns = 0;             // end - start
  std::optional<int64_t> wait_ns;      // loader wait (steps.wait_ns)
  int64_t phase_ns[4] = {0, 0, 0, 0};  // forward, backward, optimizer, comm (wall)
  int64_t other_phase_ns = 0;          // phases of other names (wall)
  bool comm = false;       // a comm phase was recorded, or derived from comm_buckets, for the step
  int64_t gpu_ns = 0;      // sum of the phases' GPU time
  bool gpu_known = false;  // some phase of the step had a GPU time
};
using StepBreakdownFn = std::function<void(const StepBreakdownRow&)>;

// Contracts of each call are SqliteStore's (sqlite_store.h). Whether one object may be used
// from several threads at once is thread_safe(): SqliteStore is one connection (no), PgStore a
// pool (yes).
class RunStore {
 public:
  virtual ~RunStore() = default;

  // Where the runs are, for messages: a file path, or a URL without its password.
  virtual const std::string& location() const = 0;
  virtual bool thread_safe() const { return false; }

  // Run lifecycle.
  virtual Expected<int64_t> BeginRun(const RunInfo& info) = 0;
  virtual Status FinishRun(int64_t run_id, const std::string& status, std::optional<int64_t> end_ns,
                           const std::optional<std::string>& error) = 0;
  virtual Status UpdateRunFields(const RunInfo& info) = 0;
  virtual Status ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights) = 0;
  virtual Status WriteRows(int64_t run_id, const std::vector<Row>& rows) = 0;

  // A team server's ingest.
  virtual Status WriteBatchOnce(int64_t run_id, const std::string& batch_id,
                                const std::vector<Row>& rows,
                                const std::vector<InsightRow>* insights, bool* duplicate) = 0;
  virtual Expected<std::optional<int64_t>> IngestRunId(const std::string& run_uuid) = 0;
  virtual Expected<int64_t> BeginIngestRun(const std::string& run_uuid, const RunInfo& info) = 0;
  virtual Expected<std::vector<std::pair<int64_t, double>>> LoadSeries(int64_t run_id,
                                                                       const std::string& metric,
                                                                       int64_t gpu_index,
                                                                       int64_t from_ns,
                                                                       int64_t to_ns) = 0;

  // Reads.
  virtual Expected<std::optional<int64_t>> LatestRunId() = 0;
  virtual Expected<bool> RunExists(int64_t run_id) = 0;
  virtual Expected<std::vector<RunInfo>> ListRuns() = 0;
  virtual Expected<std::vector<RunInfo>> PreviousRunsNamed(const std::string& run_name,
                                                           int64_t before_run_id, int limit) = 0;
  virtual Expected<RunData> LoadRun(int64_t run_id) = 0;
  virtual Expected<std::vector<StepRow>> LoadSteps(int64_t run_id) = 0;
  // Each step of a run with its phases summed, by step (two ordered scans merged, no row
  // held beyond the run's phases' four numbers).
  virtual Status ScanStepBreakdown(int64_t run_id, const StepBreakdownFn& each) = 0;
  // The run's phases rows, in LoadRun's order (by step, then name).
  virtual Expected<std::vector<PhaseRow>> LoadPhases(int64_t run_id) = 0;
  virtual Expected<std::vector<CommBucketRow>> LoadCommBuckets(int64_t run_id) = 0;
  // The run's kernels rows, in LoadRun's order.
  virtual Expected<std::vector<KernelRow>> LoadKernels(int64_t run_id) = 0;
  // The run's cpu_ops rows, in LoadRun's order (empty for a file that predates the table).
  virtual Expected<std::vector<CpuOpRow>> LoadCpuOps(int64_t run_id) = 0;
  // The run's stored insights in ordinal order (its report's order).
  virtual Expected<std::vector<InsightRow>> LoadInsights(int64_t run_id) = 0;
  // The newest second of gpu_samples_1s of a run, one row per GPU (by gpu_index), with
  // ts_ns, gpu_index, util_mean_pct, mem_used_max_bytes, power_mean_mw and temp_max_c read;
  // empty when the run has none (/metrics' latest GPU values).
  virtual Expected<std::vector<GpuRollupRow>> LatestGpuSecond(int64_t run_id) = 0;
  // The series columns of a run's 1 s GPU rollups with ts_ns in [from_ns, to_ns], of one GPU
  // (gpu) or all, by gpu_index then ts_ns, one row at a time (a 24 h x 8 GPU window is 691,200
  // rows: streamed, never held): v = util_mean_pct, mem_used_max_bytes, power_mean_mw,
  // temp_max_c.
  virtual Status ScanGpuSeries(int64_t run_id, std::optional<int64_t> gpu, int64_t from_ns,
                               int64_t to_ns, const SeriesRowFn& each) = 0;
  // Likewise the host samples, by ts_ns: v = cpu_pct, mem_used_bytes, disk_read_bps,
  // proc_cpu_pct, proc_rss_bytes (gpu_index 0).
  virtual Status ScanHostSeries(int64_t run_id, int64_t from_ns, int64_t to_ns,
                                const SeriesRowFn& each) = 0;
  // Steps count, newest times and headline insight of a run (a runs list's columns).
  virtual Expected<RunProgress> LoadRunProgress(int64_t run_id) = 0;
};

// The one column of a series metric (LoadSeries), with its table, or nullopt for an unknown
// metric; MetricNames() lists them for the error.
struct SeriesColumn {
  const char* table;
  const char* column;
  bool per_gpu;
};
std::optional<SeriesColumn> SeriesMetric(const std::string& metric);

// Where a storage URL holds a password, as [begin, end) offsets: the user info's
// (scheme://user:PASSWORD@host) and every `password=` / `sslpassword=` query value. Messages show a
// URL with these replaced; the CLI overwrites them in its arguments.
std::vector<std::pair<size_t, size_t>> UrlPasswordSpans(const std::string& url);
const char* MetricNames();

}  // namespace gpuprof::store
