// SQLite store for schema v1: a synchronous connection for cold-path run lifecycle and reads
// (SqliteStore) and a batched writer thread for the sampled/recorded rows (StoreWriter).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

struct sqlite3;

namespace gpuprof::store {

// Everything stored for one run, as loaded back. Vectors are ordered by time / step.
struct RunData {
  RunInfo run;
  std::vector<StepRow> steps;
  std::vector<PhaseRow> phases;
  std::vector<GpuInfoRow> gpus;
  std::vector<GpuSampleRow> gpu_samples;
  std::vector<HostSampleRow> host_samples;
  std::vector<WorkerSampleRow> worker_samples;
  std::vector<KernelRow> kernels;
  std::vector<CommBucketRow> comm_buckets;
  std::vector<TelemetryStatusRow> telemetry;
  std::vector<DiagnosticRow> diagnostics;
  std::vector<InsightRow> insights;
};

// One connection. Not thread-safe: one owner thread at a time.
class SqliteStore {
 public:
  enum class Mode { kReadWrite, kReadOnly };

  // Creates the file and schema if needed (kReadWrite), enables WAL. A file from a newer
  // schema version, or one that is not a gpuprof DB, is an error naming the file.
  static Expected<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                     Mode mode = Mode::kReadWrite);
  ~SqliteStore();
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Run lifecycle.
  Expected<int64_t> BeginRun(const RunInfo& info);  // returns the new run_id
  Status FinishRun(int64_t run_id, const std::string& status, std::optional<int64_t> end_ns,
                   const std::optional<std::string>& error);
  Status UpdateRunFields(const RunInfo& info);  // rewrites the mutable columns of info.run_id
  Status ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights);
  // Synchronous write of rows (tests, importers). The writer thread uses the same code.
  Status WriteRows(int64_t run_id, const std::vector<Row>& rows);

  // Reads.
  Expected<std::optional<int64_t>> LatestRunId();
  Expected<bool> RunExists(int64_t run_id);
  Expected<std::vector<RunInfo>> ListRuns();  // all runs, ascending run_id
  // Previous runs with the same name, newest first, excluding `before_run_id` and later.
  Expected<std::vector<RunInfo>> PreviousRunsNamed(const std::string& run_name,
                                                   int64_t before_run_id, int limit);
  Expected<RunData> LoadRun(int64_t run_id);

  const std::string& path() const { return path_; }
  sqlite3* handle() { return db_; }

 private:
  SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_ = nullptr;
  std::string path_;
};

// Bounded queue + one writer thread that commits rows of one run in batched transactions.
// Push() may be called from any thread (samplers, recorder); it never blocks on I/O: when the
// queue is full the row is dropped and counted. A batch is committed at least every
// flush_interval_ms, so a killed process loses at most that much.
class StoreWriter {
 public:
  struct Options {
    size_t capacity = 1 << 16;     // rows queued before dropping
    int flush_interval_ms = 200;
    size_t max_batch = 8192;       // rows per transaction
  };

  static Expected<std::unique_ptr<StoreWriter>> Start(const std::string& path, int64_t run_id,
                                                      Options options);
  static Expected<std::unique_ptr<StoreWriter>> Start(const std::string& path, int64_t run_id) {
    return Start(path, run_id, Options{});
  }
  ~StoreWriter();  // Stop()
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  bool Push(Row row) noexcept;
  // Blocks until every row pushed before the call is committed (or failed).
  void Flush();
  // Drains, commits, joins. Idempotent.
  void Stop();

  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // First write error, if any (the writer keeps going and counts failed rows as dropped).
  std::optional<std::string> error() const;

 private:
  StoreWriter(std::unique_ptr<SqliteStore> store, int64_t run_id, Options options);
  void Loop();

  std::unique_ptr<SqliteStore> store_;
  const int64_t run_id_;
  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;
  std::deque<Row> queue_;
  uint64_t pushed_seq_ = 0;     // rows accepted so far (guarded by mu_)
  uint64_t committed_seq_ = 0;  // rows handled so far (guarded by mu_)
  bool stopping_ = false;
  bool flush_requested_ = false;
  std::optional<std::string> error_;
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace gpuprof::store
