// SQLite store for schema v1: a synchronous connection for cold-path run lifecycle and reads
// (SqliteStore) and a batched writer thread for the sampled/recorded rows (StoreWriter).
// sqlite_store.cc: open, schema, run lifecycle, reads; sqlite_writer.cc: row writes, WAL set-up,
// StoreWriter.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "store/rows.h"
#include "store/run_store.h"
#include "util/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace gpuprof::store {

// The raw telemetry tier of one run, as far as retention kept it.
struct RawSamples {
  std::vector<GpuSampleRow> gpu_samples;        // by (ts_ns, gpu_index)
  std::vector<HostCoreRow> host_cores;          // by ts_ns
  std::vector<WorkerSampleRow> worker_samples;  // by (ts_ns, pid)
};

// Which raw-tier rows (gpu_samples, host_core_samples, worker_samples) a StoreWriter keeps: those
// with ts_ns < head_ns (the start of the run: warmup, compilation) and those within tail_ns of
// the newest raw timestamp written (the end of the run, or the moments before a crash). The
// rows in between are deleted whenever the cut has advanced by prune_every_ns of sample time,
// and once more when the writer stops, so the stored tail is exactly tail_ns long. tail_ns < 0
// keeps everything. Rollups and host_samples are never pruned.
struct RawRetention {
  int64_t head_ns = 600'000'000'000;        // 10 min
  int64_t tail_ns = 600'000'000'000;        // 10 min
  int64_t prune_every_ns = 60'000'000'000;  // 1 min
};

// One connection. Not thread-safe: one owner thread at a time (it may be handed to another
// thread, as StoreWriter does). Every error names the file, what was being done, and SQLite's
// message. Write transactions are BEGIN IMMEDIATE and wait up to 5 s for a lock held by
// another connection (busy_timeout), so several processes may share one file.
class SqliteStore final : public RunStore {
 public:
  enum class Mode { kReadWrite, kReadOnly };

  // kReadWrite creates the file and schema if needed (schema + meta in one transaction) and
  // enables WAL with synchronous=NORMAL. kReadOnly never creates anything ("no such file: P").
  // A file from a newer schema version ("P was written by a newer gpuprof (schema 7 > 1);
  // upgrade gpuprof"), a non-SQLite file ("P: file is not a database") or a SQLite file
  // without the gpuprof tables ("P: not a gpuprof database ...") is refused untouched.
  static Expected<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                     Mode mode = Mode::kReadWrite);
  ~SqliteStore();
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // For a long-lived writer of many runs (the team server): `cache_mib` of page cache (with
  // SQLite's default 2 MiB the indexes' pages keep being evicted and read again) and the WAL
  // checkpointed once it holds `checkpoint_pages` pages rather than 1000 (fewer fsyncs, and a
  // page that consecutive batches rewrite is copied back once). Measured: docs/benchmarks.md.
  Status TuneForServer(int64_t cache_mib, int64_t checkpoint_pages);

  // Run lifecycle.
  // Inserts a run; info.run_id is ignored and the new id returned. An empty
  // info.gpuprof_version is stored as this build's GPUPROF_VERSION.
  Expected<int64_t> BeginRun(const RunInfo& info) override;
  // Sets status ("ok" or "failed"; anything else is an error), end_ns and error.
  Status FinishRun(int64_t run_id, const std::string& status, std::optional<int64_t> end_ns,
                   const std::optional<std::string>& error) override;
  // Rewrites the mutable columns of info.run_id from info (nullopt writes NULL): group_id,
  // rank, world_size, device_kind, gpu_backend, gpu_model, gpu_count, dtype, flops_per_step,
  // flops_method, sample_hz, python_version, torch_version, config_json. Identity and timing
  // (run_name, hostname, pid, start_*, gpuprof_version) never change; status/end_ns/error
  // belong to FinishRun. A missing run is an error.
  Status UpdateRunFields(const RunInfo& info) override;
  // Deletes the run's insights and inserts `insights`, in one transaction.
  Status ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights) override;
  // Writes rows in one transaction (all or nothing). Steps, phases, gpus and telemetry_status
  // are upserts on their primary key: a re-write replaces. PhaseGpuRow adds to gpu_ns,
  // creating a placeholder phase row (wall_ns 0, calls 0) if absent. A PhaseRow keeps stored
  // GPU time when its gpu_ns is nullopt, adds its gpu_ns to a placeholder's, and otherwise
  // replaces it. Other tables append. The writer thread uses the same code.
  Status WriteRows(int64_t run_id, const std::vector<Row>& rows) override;
  // Deletes the run's kernels rows of `source` and writes `rows`, in one transaction (a
  // re-import: gpuprof nsys-import --replace).
  Status ReplaceKernels(int64_t run_id, const std::string& source, const std::vector<Row>& rows);
  // A team server's write of one client batch: the rows and the batch id in one transaction,
  // unless ingest_batches already holds (run_id, batch_id): then nothing is written and
  // *duplicate is set. Insights, when given, replace the run's in the same transaction.
  Status WriteBatchOnce(int64_t run_id, const std::string& batch_id, const std::vector<Row>& rows,
                        const std::vector<InsightRow>* insights, bool* duplicate) override;
  // One time series of a run: (ts_ns, value) in [from_ns, to_ns], ascending, NULLs left out.
  // `metric` is one of gpu_util, gpu_mem, gpu_power, gpu_temp (gpu_samples_1s of `gpu_index`)
  // or host_cpu (host_samples); anything else is an error naming them.
  Expected<std::vector<std::pair<int64_t, double>>> LoadSeries(int64_t run_id,
                                                               const std::string& metric,
                                                               int64_t gpu_index, int64_t from_ns,
                                                               int64_t to_ns) override;
  // The run a team server created for `run_uuid`, or nullopt.
  Expected<std::optional<int64_t>> IngestRunId(const std::string& run_uuid) override;
  // Creates the run for `run_uuid` (BeginRun + ingest_runs) in one transaction.
  Expected<int64_t> BeginIngestRun(const std::string& run_uuid, const RunInfo& info) override;
  // A whole run copied from another file (gpuprof merge): the runs row from `info`, `rows` and
  // `insights`, registered under `run_uuid` (ingest_runs), in one transaction. When `run_uuid`
  // is already registered nothing is written: *existed is set and its run id returned.
  Expected<int64_t> ImportRun(const std::string& run_uuid, const RunInfo& info,
                              const std::vector<Row>& rows, const std::vector<InsightRow>& insights,
                              bool* existed);

  // Reads.
  Expected<std::optional<int64_t>> LatestRunId() override;  // nullopt when there are no runs
  // SQLite's PRAGMA data_version: changes when another connection commits to the file (a
  // watcher polls it to learn that a live run was written).
  Expected<int64_t> DataVersion();
  Expected<bool> RunExists(int64_t run_id) override;
  Expected<std::vector<RunInfo>> ListRuns() override;  // all runs, ascending run_id
  // Finished runs (status != 'running', i.e. ok or failed; a killed run stays 'running' and is
  // skipped) with the same name and run_id < before_run_id, newest first, at most `limit`
  // (limit < 0: no limit).
  Expected<std::vector<RunInfo>> PreviousRunsNamed(const std::string& run_name,
                                                   int64_t before_run_id, int limit) override;
  // Everything the analysis reads of one run (a missing run is an error): not the raw tier.
  // Ordering: steps by step; phases by (step, name); gpus by gpu_index; gpu_samples_1s by
  // (ts_ns, gpu_index); host_samples by ts_ns; worker_samples_10s by (ts_ns, pid); kernels by
  // (window_start_ns, name); comm_buckets by (step, bucket); telemetry by source; diagnostics by
  // ts_ns (NULL first, then insertion order); insights by ordinal.
  Expected<RunData> LoadRun(int64_t run_id) override;
  // Light reads of one table of a run (multi-run analyses: regression baseline, group ranks):
  // the same rows and order as LoadRun's steps / comm_buckets.
  Expected<std::vector<StepRow>> LoadSteps(int64_t run_id) override;
  Expected<std::vector<CommBucketRow>> LoadCommBuckets(int64_t run_id) override;
  Expected<std::vector<GpuRollupRow>> LatestGpuSecond(int64_t run_id) override;
  Status ScanGpuSeries(int64_t run_id, std::optional<int64_t> gpu, int64_t from_ns, int64_t to_ns,
                       const SeriesRowFn& each) override;
  Status ScanHostSeries(int64_t run_id, int64_t from_ns, int64_t to_ns,
                        const SeriesRowFn& each) override;
  Expected<RunProgress> LoadRunProgress(int64_t run_id) override;
  Expected<std::vector<PhaseRow>> LoadPhases(int64_t run_id) override;
  Status ScanStepBreakdown(int64_t run_id, const StepBreakdownFn& each) override;
  Expected<std::vector<KernelRow>> LoadKernels(int64_t run_id) override;
  Expected<std::vector<CpuOpRow>> LoadCpuOps(int64_t run_id) override;
  Expected<std::vector<InsightRow>> LoadInsights(int64_t run_id) override;
  // The raw tier of one run (a missing run is an error).
  Expected<RawSamples> LoadRawSamples(int64_t run_id);
  // Every row the file holds for one run, table by table (the raw tier included, host samples
  // with their per-core CPU), for writing into another store (gpuprof push, gpuprof merge):
  // `data` is LoadRun's (its run and insights are not repeated in `rows`).
  struct RunRows {
    RunData data;
    std::vector<Row> rows;
  };
  Expected<RunRows> LoadRunRows(int64_t run_id);
  // Deletes the run's raw-tier rows with from_ns <= ts_ns < to_ns, in one transaction.
  Status PruneRawSamples(int64_t run_id, int64_t from_ns, int64_t to_ns);

  const std::string& path() const { return path_; }
  const std::string& location() const override { return path_; }
  sqlite3* handle() { return db_; }
  // How long a write waits for another connection's lock (default 5 s).
  void SetBusyTimeout(int ms);
  // The SQLite result code of the last error this connection returned as a Status (0 if none):
  // lets a caller tell a lock or a full disk (worth retrying) from a bad statement.
  int last_error_code() const { return last_error_code_; }

 private:
  friend class StoreWriter;  // writes its queue through WriteRange without copying
  SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // "<path>: <purpose>: <sqlite3_errmsg>".
  Status Error(const std::string& purpose) const;
  Status Exec(const char* sql, const std::string& purpose);
  Status EnableWal();  // journal_mode=WAL (retried while busy), synchronous=NORMAL
  Status Begin();      // BEGIN IMMEDIATE
  Status Commit();     // rolls back when the commit fails
  void Rollback();     // no-op outside a transaction
  // What an older file lacks of the current schema (tables, kAdded columns): none
  // when all is there. Upgrade adds what is missing in one transaction (a writer's Open).
  Expected<std::vector<std::string>> MissingSchema();
  Status Upgrade();
  // Prepares `stmt` from `sql` on first use (persistent), binds with bind(Binder&), steps and
  // resets it; an error names `purpose`.
  template <typename BindFn>
  Status WriteWith(sqlite3_stmt*& stmt, const char* sql, const char* purpose, BindFn bind);
  template <typename T>
  Status WriteOne(size_t index, int64_t run_id, const T& row);
  // kRowsPerInsert rows of T from `first` in one multi-row INSERT (plain-insert tables only:
  // kMultiRowInsert<T>). SQLite's per-statement work is then paid once for them all.
  template <typename T, typename It>
  Status WriteMany(size_t index, int64_t run_id, It first);
  Status WriteCores(int64_t run_id, const HostSampleRow& row);  // host_core_samples
  Status InsertInsights(int64_t run_id, const std::vector<InsightRow>& insights);  // no txn
  Status InsertIngestRun(const std::string& run_uuid, int64_t run_id);             // no txn
  template <typename It>
  Status WriteRange(int64_t run_id, It begin, It end);  // what WriteRows does, for any range
  template <typename It>
  Status WriteEach(int64_t run_id, It begin, It end);  // the rows, inside the caller's txn
  // Runs `sql` with bind(Binder&) and calls each(sqlite3_stmt*) per result row (defined in
  // sqlite_internal.h, for both halves).
  template <typename BindFn, typename RowFn>
  Status Query(const std::string& sql, const std::string& purpose, BindFn bind, RowFn each);
  // Every row `sql` gives, each made by read(Reader&) (a reader of sqlite_store.cc).
  template <typename T, typename BindFn, typename ReadFn>
  Expected<std::vector<T>> Rows(const std::string& sql, const std::string& purpose, BindFn bind,
                                ReadFn read);

  sqlite3* db_ = nullptr;
  std::string path_;
  mutable int last_error_code_ = 0;
  // WriteRows' prepared statements, one per Row alternative (indexed by Row::index()), plus
  // the host_core_samples insert that a HostSampleRow with per-core CPU adds.
  std::array<sqlite3_stmt*, std::variant_size_v<Row>> row_stmts_{};
  std::array<sqlite3_stmt*, std::variant_size_v<Row>> many_stmts_{};  // WriteMany's
  sqlite3_stmt* core_stmt_ = nullptr;
};

// Rows that were never stored, per table: how many and the run-relative time span they cover
// (the row's own timestamp: ts_ns, a step's end, a kernel window's start; none for phase rows).
struct LostRows {
  std::string table;
  uint64_t rows = 0;
  std::optional<int64_t> first_ns;
  std::optional<int64_t> last_ns;
};

// Bounded queue + one writer thread that commits rows of one run in batched transactions on
// its own connection (opened by Start on the calling thread, then owned by the writer thread).
// Push() may be called from any thread (samplers, recorder); it never blocks on I/O: when the
// queue is full the row is dropped and counted. A row is committed at most about
// flush_interval_ms after it was queued (sooner when a batch fills up or on Flush), so a killed
// process loses at most that much.
//
// A batch that fails for a reason that may pass (another connection holding the write lock past
// the busy timeout, a full disk, an I/O error) is rolled back and kept: the writer retries it,
// oldest rows first, with growing pauses (retry_backoff_ms, doubling up to 4 s), while new rows
// keep queueing behind it. Rows are given up only when more than retry_capacity wait behind a
// failing commit (the oldest go), when the batch fails for another reason (a bad row: retrying
// would not help), or when Stop() is still failing after stop_retry_ms. Every row given up or
// dropped at Push is counted per table with its time span (lost()); error() keeps the first
// message.
// The writer enforces the raw-tier retention (RawRetention) after its commits, on its own
// thread: producers never wait for it.
class StoreWriter {
 public:
  struct Options {
    size_t capacity = 1 << 16;    // rows queued before dropping
    int flush_interval_ms = 200;  // longest a queued row waits for its commit
    // Rows per transaction. A commit starts early once max_batch rows (or half the capacity,
    // if that is smaller) are queued.
    size_t max_batch = 8192;
    RawRetention retention;
    size_t retry_capacity = 1 << 18;  // rows held for retry behind a failing commit
    int retry_backoff_ms = 250;       // first pause before a retry (doubles, at most 4 s)
    int stop_retry_ms = 5000;         // how long Stop() keeps retrying before giving rows up
    int busy_timeout_ms = 5000;       // wait for another connection's lock, per attempt
    // Called with every row Push() accepts, on the pushing thread, before it is queued (the
    // live push to a team server, server/live_push.h). Must be cheap; an exception is ignored.
    std::function<void(const Row&)> tee;
  };

  // Fails if the file cannot be opened for writing or has no run `run_id`.
  static Expected<std::unique_ptr<StoreWriter>> Start(const std::string& path, int64_t run_id,
                                                      Options options);
  static Expected<std::unique_ptr<StoreWriter>> Start(const std::string& path, int64_t run_id) {
    return Start(path, run_id, Options{});
  }
  ~StoreWriter();  // Stop()
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Queues a row; false (and dropped() + 1) when the queue is full or the writer stopped.
  bool Push(Row row) noexcept;
  // Blocks until every row pushed before the call is committed (or failed). Any thread.
  void Flush();
  // Drains, commits, closes the connection, joins. Idempotent; any thread but the writer's.
  void Stop();

  // Rows queued and not yet taken by the writer thread.
  size_t queued() const;
  // Rows pushed and not yet committed: queued plus those the writer holds. Producers that must
  // not drop (the long-run benchmark) wait while it is high: the writer takes the queue
  // quickly, and the rows it holds beyond retry_capacity are given up.
  size_t uncommitted() const;
  uint64_t written() const { return written_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // First write error, if any (the writer keeps going and counts failed rows as dropped).
  std::optional<std::string> error() const;
  // Rows dropped or given up so far, per table (in table order of first loss).
  std::vector<LostRows> lost() const;
  // Whether the last commit failed and its rows wait for a retry.
  bool retrying() const;

 private:
  StoreWriter(std::unique_ptr<SqliteStore> store, int64_t run_id, Options options);
  void Loop();
  // Counts `row` as lost (caller holds mu_).
  void RecordLost(const Row& row);
  // Writes up to max_batch rows from the front of pending_; returns false when the commit
  // failed and should be retried later (the rows stay). Writer thread, mu_ not held.
  bool CommitFront();
  // Deletes raw rows between the head and the tail once the cut has moved far enough (or, with
  // `final`, whenever it moved). Writer thread only.
  void Prune(bool final);

  std::unique_ptr<SqliteStore> store_;  // used by the writer thread only
  const int64_t run_id_;
  const Options options_;
  const size_t batch_trigger_;  // queue size that starts a commit before the interval ends
  std::mutex stop_mu_;          // serializes Stop() callers around join()
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable flushed_cv_;
  std::deque<Row> queue_;
  uint64_t pushed_seq_ = 0;        // rows accepted so far (guarded by mu_)
  uint64_t committed_seq_ = 0;     // rows handled so far (guarded by mu_)
  uint64_t flush_target_seq_ = 0;  // commit without waiting until this many rows are handled
  bool stopping_ = false;
  bool exited_ = false;
  std::optional<std::string> error_;
  std::vector<LostRows> lost_;   // guarded by mu_
  bool retrying_ = false;        // guarded by mu_
  std::deque<Row> pending_;      // writer thread only: taken from queue_, not yet committed
  std::atomic<size_t> held_{0};  // pending_.size(), for uncommitted() on other threads
  std::atomic<uint64_t> written_{0};
  std::atomic<uint64_t> dropped_{0};
  // Retention state, writer thread only.
  std::optional<int64_t> newest_raw_ns_;  // newest raw-tier timestamp committed
  int64_t pruned_to_ns_ = 0;              // raw rows in [head, pruned_to) are gone
  bool pruned_once_ = false;
  std::thread thread_;
};

}  // namespace gpuprof::store
