// SQLite store, the writing half (sqlite_store.h): the WAL set-up of a writable file, rows
// written in transactions (WriteRows, WriteBatchOnce, ReplaceKernels, ReplaceInsights), the
// raw-tier prune, and the StoreWriter thread that batches a run's rows into them. Statements
// and bind order come from the tables' column lists (store/tables.h via store/table_sql.h).
#include <pthread.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <type_traits>
#include <utility>

#include "store/sqlite_internal.h"
#include "store/sqlite_store.h"
#include "store/table_sql.h"

namespace gpuprof::store {

using sqlite_internal::Binder;
using sqlite_internal::kBusyTimeoutMs;
using sqlite_internal::Stmt;

// ---- WAL -------------------------------------------------------------------------------------

// WAL: readers (the insights CLI, a second connection) never block the writer and vice versa.
// synchronous=NORMAL: a commit survives a process crash; a power loss may lose the last commits
// but never corrupts the file.
//
// Switching a new file to WAL takes an exclusive lock, and SQLite does not always wait on the
// busy handler for it: several processes opening one new file at once (the ranks of a
// distributed job) would see "database is locked" at once. So a busy switch is retried, with
// short sleeps, for as long as the busy timeout.
Status SqliteStore::EnableWal() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
  for (int attempt = 0;; ++attempt) {
    Stmt wal;
    int rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, wal.out(), nullptr);
    if (rc == SQLITE_OK) rc = sqlite3_step(wal.get());
    if (rc == SQLITE_ROW || rc == SQLITE_DONE) break;
    const int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) ||
        std::chrono::steady_clock::now() >= deadline) {
      return Error("enable WAL journal");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2 + attempt * 2, 50)));
  }
  return Exec("PRAGMA synchronous=NORMAL", "set synchronous");
}

Status SqliteStore::TuneForServer(int64_t cache_mib, int64_t checkpoint_pages) {
  const std::string sql = "PRAGMA cache_size=" + std::to_string(-cache_mib * 1024) +
                          "; PRAGMA wal_autocheckpoint=" + std::to_string(checkpoint_pages);
  return Exec(sql.c_str(), "set the page cache and checkpoint sizes");
}

// ---- rows ------------------------------------------------------------------------------------

template <typename BindFn>
Status SqliteStore::WriteWith(sqlite3_stmt*& stmt, const char* sql, const char* purpose,
                              BindFn bind) {
  if (stmt == nullptr &&
      sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    stmt = nullptr;
    return Error(std::string("prepare ") + purpose);
  }
  Binder b(stmt);
  bind(b);
  const int rc = b.rc() == SQLITE_OK ? sqlite3_step(stmt) : b.rc();
  Status st = rc == SQLITE_DONE ? Status::Ok() : Error(purpose);
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  return st;
}

template <typename T>
Status SqliteStore::WriteOne(size_t index, int64_t run_id, const T& row) {
  Status st = WriteWith(row_stmts_[index], sql::WriteSql<T>().c_str(), sql::WritePurpose<T>(),
                        [&](Binder& b) { sql::BindRow(b, run_id, row); });
  if constexpr (std::is_same_v<T, HostSampleRow>) {
    if (st.ok() && !row.cpu_per_core.empty()) st = WriteCores(run_id, row);
  }
  return st;
}

Status SqliteStore::WriteCores(int64_t run_id, const HostSampleRow& row) {
  const std::optional<std::string> cores = sql::CoresToJson(row.cpu_per_core);  // alive until reset
  return WriteWith(core_stmt_, sql::kHostCoresSql, sql::kHostCoresPurpose,
                   [&](Binder& b) { b.Int(run_id).Int(row.ts_ns).Text(cores); });
}

Status SqliteStore::WriteRows(int64_t run_id, const std::vector<Row>& rows) {
  return WriteRange(run_id, rows.begin(), rows.end());
}

using sql::kMultiRowInsert;
using sql::kRowsPerInsert;

template <typename T, typename It>
Status SqliteStore::WriteMany(size_t index, int64_t run_id, It first) {
  return WriteWith(many_stmts_[index], sql::WriteManySql<T>().c_str(), sql::WritePurpose<T>(),
                   [&](Binder& b) {
                     for (size_t i = 0; i < kRowsPerInsert; ++i, ++first) {
                       sql::BindRow(b, run_id, std::get<T>(*first));
                     }
                   });
}

template <typename It>
Status SqliteStore::WriteEach(int64_t run_id, It begin, It end) {
  for (It it = begin; it != end;) {
    const size_t index = it->index();
    Status st = std::visit(
        [&](const auto& r) {
          using T = std::decay_t<decltype(r)>;
          if constexpr (kMultiRowInsert<T>) {
            if (sql::SameTableRun(it, end) == kRowsPerInsert) {
              Status many = WriteMany<T>(index, run_id, it);
              it += kRowsPerInsert;
              return many;
            }
          }
          ++it;
          return WriteOne(index, run_id, r);
        },
        *it);
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

template <typename It>
Status SqliteStore::WriteRange(int64_t run_id, It begin, It end) {
  if (begin == end) return Status::Ok();
  if (Status st = Begin(); !st.ok()) return st;
  if (Status st = WriteEach(run_id, begin, end); !st.ok()) {
    Rollback();
    return st;
  }
  return Commit();
}

Status SqliteStore::ReplaceKernels(int64_t run_id, const std::string& source,
                                   const std::vector<Row>& rows) {
  if (Status st = Begin(); !st.ok()) return st;
  Stmt del;
  if (sqlite3_prepare_v2(db_, "DELETE FROM kernels WHERE run_id = ? AND source = ?", -1, del.out(),
                         nullptr) != SQLITE_OK) {
    Status st = Error("prepare the delete of kernels");
    Rollback();
    return st;
  }
  Binder b(del.get());
  b.Int(run_id).Text(source);
  if (b.rc() != SQLITE_OK || sqlite3_step(del.get()) != SQLITE_DONE) {
    Status st = Error("delete the run's " + source + " kernels");
    Rollback();
    return st;
  }
  if (Status st = WriteEach(run_id, rows.begin(), rows.end()); !st.ok()) {
    Rollback();
    return st;
  }
  return Commit();
}

Status SqliteStore::ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights) {
  if (Status st = Begin(); !st.ok()) return st;
  if (Status st = InsertInsights(run_id, insights); !st.ok()) {
    Rollback();
    return st;
  }
  return Commit();
}

Status SqliteStore::InsertInsights(int64_t run_id, const std::vector<InsightRow>& insights) {
  auto fail = [&](const char* purpose) { return Error(purpose); };
  {
    Stmt del;
    if (sqlite3_prepare_v2(db_, sql::kDeleteInsightsSql, -1, del.out(), nullptr) != SQLITE_OK) {
      return fail("prepare delete insights");
    }
    Binder(del.get()).Int(run_id);
    if (sqlite3_step(del.get()) != SQLITE_DONE) return fail("delete insights");
  }
  Stmt ins;
  if (sqlite3_prepare_v2(db_, sql::WriteSql<InsightRow>().c_str(), -1, ins.out(), nullptr) !=
      SQLITE_OK) {
    return fail("prepare insert into insights");
  }
  for (const InsightRow& r : insights) {
    Binder b(ins.get());
    sql::BindRow(b, run_id, r);
    if (b.rc() != SQLITE_OK || sqlite3_step(ins.get()) != SQLITE_DONE) {
      return fail("insert into insights");
    }
    sqlite3_reset(ins.get());
    sqlite3_clear_bindings(ins.get());
  }
  return Status::Ok();
}

Status SqliteStore::WriteBatchOnce(int64_t run_id, const std::string& batch_id,
                                   const std::vector<Row>& rows,
                                   const std::vector<InsightRow>* insights, bool* duplicate) {
  *duplicate = false;
  if (Status st = Begin(); !st.ok()) return st;
  auto fail = [&](Status st) {
    Rollback();
    return st;
  };
  bool seen = false;
  Status st = Query(
      sql::kIngestBatchSeenSql, "look up ingest batch",
      [&](Binder& b) { b.Int(run_id).Text(batch_id); },
      [&](sqlite3_stmt*) {
        seen = true;
        return Status::Ok();
      });
  if (!st.ok()) return fail(st);
  if (seen) {
    Rollback();
    *duplicate = true;
    return Status::Ok();
  }
  if (st = WriteEach(run_id, rows.begin(), rows.end()); !st.ok()) return fail(st);
  if (insights) {
    if (st = InsertInsights(run_id, *insights); !st.ok()) return fail(st);
  }
  Stmt mark;
  if (sqlite3_prepare_v2(db_, sql::kInsertIngestBatchSql, -1, mark.out(), nullptr) != SQLITE_OK) {
    return fail(Error("prepare insert into ingest_batches"));
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  Binder b(mark.get());
  b.Int(run_id).Text(batch_id).Int(static_cast<int64_t>(rows.size())).Int(now);
  if (b.rc() != SQLITE_OK || sqlite3_step(mark.get()) != SQLITE_DONE) {
    return fail(Error("insert into ingest_batches"));
  }
  return Commit();
}

Expected<int64_t> SqliteStore::ImportRun(const std::string& run_uuid, const RunInfo& info,
                                         const std::vector<Row>& rows,
                                         const std::vector<InsightRow>& insights, bool* existed) {
  *existed = false;
  if (Status st = Begin(); !st.ok()) return st;
  auto fail = [&](Status st) {
    Rollback();
    return st;
  };
  std::optional<int64_t> have;
  Status st = Query(
      sql::kIngestRunIdSql, "look up ingest run", [&](Binder& b) { b.Text(run_uuid); },
      [&](sqlite3_stmt* s) {
        have = sqlite3_column_int64(s, 0);
        return Status::Ok();
      });
  if (!st.ok()) return fail(st);
  if (have) {
    Rollback();
    *existed = true;
    return *have;
  }
  auto id = BeginRun(info);
  if (!id) return fail(id.status());
  if (st = InsertIngestRun(run_uuid, *id); !st.ok()) return fail(st);
  if (st = WriteEach(*id, rows.begin(), rows.end()); !st.ok()) return fail(st);
  if (st = InsertInsights(*id, insights); !st.ok()) return fail(st);
  if (st = Commit(); !st.ok()) return st;
  return *id;
}

Status SqliteStore::PruneRawSamples(int64_t run_id, int64_t from_ns, int64_t to_ns) {
  if (to_ns <= from_ns) return Status::Ok();
  if (Status st = Begin(); !st.ok()) return st;
  for (const char* table : {"gpu_samples", "host_core_samples", "worker_samples"}) {
    const std::string purpose = std::string("prune ") + table;
    Stmt del;
    const std::string sql =
        std::string("DELETE FROM ") + table + " WHERE run_id = ? AND ts_ns >= ? AND ts_ns < ?";
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, del.out(), nullptr) != SQLITE_OK) {
      Status st = Error("prepare " + purpose);
      Rollback();
      return st;
    }
    Binder b(del.get());
    b.Int(run_id).Int(from_ns).Int(to_ns);
    if (b.rc() != SQLITE_OK || sqlite3_step(del.get()) != SQLITE_DONE) {
      Status st = Error(purpose);
      Rollback();
      return st;
    }
  }
  return Commit();
}

// ---- StoreWriter -----------------------------------------------------------------------------

namespace {

// The timestamp of a raw-tier row (what retention prunes), nullopt for any other row.
std::optional<int64_t> RawTimestamp(const Row& row) {
  if (const auto* g = std::get_if<GpuSampleRow>(&row)) return g->ts_ns;
  if (const auto* w = std::get_if<WorkerSampleRow>(&row)) return w->ts_ns;
  if (const auto* h = std::get_if<HostSampleRow>(&row)) {
    if (!h->cpu_per_core.empty()) return h->ts_ns;
  }
  return std::nullopt;
}

// The table a queued row goes to, and the run-relative time it describes (for LostRows).
const char* RowTable(const Row& row) {
  return std::visit([](const auto& r) { return Table<std::decay_t<decltype(r)>>::kName; }, row);
}

std::optional<int64_t> RowTime(const Row& row) {
  return std::visit(
      [](const auto& r) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, StepRow>) {
          return r.end_ns;
        } else if constexpr (std::is_same_v<T, KernelRow> || std::is_same_v<T, CpuOpRow>) {
          return r.window_start_ns;
        } else if constexpr (std::is_same_v<T, CommBucketRow> || std::is_same_v<T, StallRow> ||
                             std::is_same_v<T, CpuWaitRow>) {
          return r.start_ns;
        } else if constexpr (std::is_same_v<T, DiagnosticRow>) {
          return r.ts_ns;
        } else if constexpr (requires { r.ts_ns; }) {
          return r.ts_ns;
        } else {
          return std::nullopt;
        }
      },
      row);
}

// Failures that may pass if the commit is tried again later: a lock held by another connection
// past the busy timeout, a full disk, an I/O error, no memory.
bool Retryable(int code) {
  switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_NOMEM:
    case SQLITE_CANTOPEN:
      return true;
    default:
      return false;
  }
}

// "10 min", "90 s", "1.5 s".
std::string StrMinutes(int64_t ns) {
  char buf[48];
  if (ns % 60'000'000'000 == 0) {
    std::snprintf(buf, sizeof buf, "%lld min", static_cast<long long>(ns / 60'000'000'000));
  } else {
    std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(ns) / 1e9);
  }
  return buf;
}

}  // namespace

Expected<std::unique_ptr<StoreWriter>> StoreWriter::Start(const std::string& path, int64_t run_id,
                                                          Options options) {
  if (options.capacity == 0 || options.max_batch == 0 || options.flush_interval_ms <= 0) {
    return Status::Error("store writer: capacity, max_batch and flush_interval_ms must be > 0");
  }
  Expected<std::unique_ptr<SqliteStore>> store =
      SqliteStore::Open(path, SqliteStore::Mode::kReadWrite);
  if (!store.ok()) return store.status();
  Expected<bool> exists = (*store)->RunExists(run_id);
  if (!exists.ok()) return exists.status();
  if (!*exists) return Status::Error(path + ": store writer: no run " + std::to_string(run_id));
  (*store)->SetBusyTimeout(options.busy_timeout_ms);
  std::unique_ptr<StoreWriter> writer(new StoreWriter(std::move(*store), run_id, options));
  writer->thread_ = std::thread(&StoreWriter::Loop, writer.get());
  return writer;
}

StoreWriter::StoreWriter(std::unique_ptr<SqliteStore> store, int64_t run_id, Options options)
    : store_(std::move(store)),
      run_id_(run_id),
      options_(options),
      // Waking at half the capacity leaves room for producers while a batch commits.
      batch_trigger_(std::min(options.max_batch, std::max<size_t>(1, options.capacity / 2))) {}

StoreWriter::~StoreWriter() { Stop(); }

bool StoreWriter::Push(Row row) noexcept {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || queue_.size() >= options_.capacity) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      try {
        RecordLost(row);
      } catch (...) {  // allocation failure: counted in dropped() only
      }
      return false;
    }
    if (options_.tee) {
      try {
        options_.tee(row);
      } catch (...) {
      }
    }
    try {
      queue_.push_back(std::move(row));
    } catch (...) {  // allocation failure: drop, never throw into a sampler
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    ++pushed_seq_;
    // The writer sleeps until the queue becomes non-empty, then until a batch is full.
    wake = queue_.size() == 1 || queue_.size() == batch_trigger_;
  }
  if (wake) cv_.notify_one();
  return true;
}

void StoreWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = pushed_seq_;
  if (committed_seq_ >= target || exited_) return;
  flush_target_seq_ = std::max(flush_target_seq_, target);
  cv_.notify_one();
  // A failing commit ends the wait too: its rows are kept for a retry, and a flush must not
  // block its caller for as long as another process holds the lock.
  flushed_cv_.wait(lock, [&] { return committed_seq_ >= target || exited_ || retrying_; });
}

void StoreWriter::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

size_t StoreWriter::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t StoreWriter::uncommitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + held_.load(std::memory_order_relaxed);
}

std::optional<std::string> StoreWriter::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::vector<LostRows> StoreWriter::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

bool StoreWriter::retrying() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retrying_;
}

void StoreWriter::RecordLost(const Row& row) {
  const char* table = RowTable(row);
  auto it =
      std::find_if(lost_.begin(), lost_.end(), [&](const LostRows& l) { return l.table == table; });
  if (it == lost_.end()) it = lost_.insert(lost_.end(), LostRows{table, 0, {}, {}});
  ++it->rows;
  if (const std::optional<int64_t> t = RowTime(row)) {
    it->first_ns = std::min(it->first_ns.value_or(*t), *t);
    it->last_ns = std::max(it->last_ns.value_or(*t), *t);
  }
}

bool StoreWriter::CommitFront() {
  const size_t n = std::min(pending_.size(), options_.max_batch);
  const auto end = pending_.begin() + static_cast<ptrdiff_t>(n);
  Status st = store_->WriteRange(run_id_, pending_.begin(), end);
  const bool retry = !st.ok() && Retryable(store_->last_error_code());
  if (st.ok()) {
    for (auto it = pending_.begin(); it != end; ++it) {
      if (std::optional<int64_t> ts = RawTimestamp(*it)) {
        newest_raw_ns_ = std::max(newest_raw_ns_.value_or(*ts), *ts);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!st.ok() && !error_) error_ = st.message();
  retrying_ = retry;
  if (retry) return false;
  if (st.ok()) {
    written_.fetch_add(n, std::memory_order_relaxed);
  } else {  // this batch fails whatever the timing: give it up, keep the writer going
    dropped_.fetch_add(n, std::memory_order_relaxed);
    for (auto it = pending_.begin(); it != end; ++it) RecordLost(*it);
  }
  pending_.erase(pending_.begin(), end);
  held_.store(pending_.size(), std::memory_order_relaxed);
  committed_seq_ += n;
  flushed_cv_.notify_all();
  return true;
}

void StoreWriter::Loop() {
#ifdef __linux__
  pthread_setname_np(pthread_self(), "gpuprof-writer");  // top -H; telemetry/cpu_wait.h
#endif
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::milliseconds(options_.flush_interval_ms);
  std::unique_lock<std::mutex> lock(mu_);
  // Rows not yet committed: queue_ (not taken yet) and pending_ (taken). Commit at once when a
  // batch is full, a flush waits, or the writer stops; otherwise once per interval.
  auto urgent = [&] {
    return stopping_ || queue_.size() + pending_.size() >= batch_trigger_ ||
           committed_seq_ < flush_target_seq_;
  };
  auto backoff = std::chrono::milliseconds(std::max(1, options_.retry_backoff_ms));
  std::optional<Clock::time_point> give_up_at;  // set once Stop() finds a failing commit
  // Gives up every row the writer holds or has queued (Stop() could not commit them in time).
  auto give_up_all = [&] {
    for (const Row& r : pending_) RecordLost(r);
    for (const Row& r : queue_) RecordLost(r);
    const uint64_t n = pending_.size() + queue_.size();
    dropped_.fetch_add(n, std::memory_order_relaxed);
    committed_seq_ += n;
    pending_.clear();
    held_.store(0, std::memory_order_relaxed);
    queue_.clear();
    retrying_ = false;
  };
  while (true) {
    if (!retrying_) {
      // Idle until the first row; then the oldest queued row waits at most one interval.
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || !pending_.empty(); });
      if (queue_.empty() && pending_.empty()) break;  // stopping and drained
      cv_.wait_until(lock, Clock::now() + interval, urgent);
    } else {
      // The last commit failed with a lock held elsewhere or a full disk: pause, then retry.
      if (stopping_ && !give_up_at) {
        give_up_at = Clock::now() + std::chrono::milliseconds(options_.stop_retry_ms);
      }
      if (give_up_at && Clock::now() >= *give_up_at) {
        give_up_all();
        break;
      }
      auto until = Clock::now() + backoff;
      if (give_up_at) until = std::min(until, *give_up_at);
      cv_.wait_until(lock, until, [&] { return stopping_ && !give_up_at; });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(4000));
    }
    // Takes what is queued behind the rows already held; when a failing commit holds more
    // than retry_capacity rows, the oldest go. Caller holds mu_.
    auto take_queued = [&] {
      for (Row& r : queue_) pending_.push_back(std::move(r));
      queue_.clear();
      while (pending_.size() > options_.retry_capacity) {
        RecordLost(pending_.front());
        pending_.pop_front();
        dropped_.fetch_add(1, std::memory_order_relaxed);
        ++committed_seq_;
      }
      held_.store(pending_.size(), std::memory_order_relaxed);
    };
    take_queued();
    // The first batch goes now (its interval elapsed, or something was urgent); more only while
    // something is urgent: a part batch waits for the next interval.
    bool failed = false;
    for (bool first = true; !pending_.empty() && (first || urgent()); first = false) {
      lock.unlock();
      failed = !CommitFront();
      if (!failed) Prune(/*final=*/false);
      lock.lock();
      if (failed) break;
      take_queued();
    }
    if (!failed) backoff = std::chrono::milliseconds(std::max(1, options_.retry_backoff_ms));
    flushed_cv_.notify_all();
  }
  lock.unlock();
  Prune(/*final=*/true);  // before Stop() returns: the stored tail is exactly tail_ns
  lock.lock();
  exited_ = true;
  flushed_cv_.notify_all();
  lock.unlock();
  store_.reset();  // closes the connection on its owning thread (checkpoints the WAL)
}

void StoreWriter::Prune(bool final) {
  const RawRetention& r = options_.retention;
  if (r.tail_ns < 0 || !newest_raw_ns_) return;
  const int64_t cut = *newest_raw_ns_ - r.tail_ns;
  if (cut <= r.head_ns) return;
  const int64_t from = std::max(r.head_ns, pruned_to_ns_);
  if (cut <= from) return;
  if (!final && cut - from < r.prune_every_ns) return;
  Status st = store_->PruneRawSamples(run_id_, from, cut);
  if (st.ok() && !pruned_once_) {
    pruned_once_ = true;
    // Tells a reader of the raw tables why they have a gap.
    std::vector<Row> note{DiagnosticRow{
        cut, "info", "store",
        "raw-sample retention: the first " + StrMinutes(r.head_ns) + " and the last " +
            StrMinutes(r.tail_ns) +
            " of raw samples are kept (gpu_samples, host_core_samples, worker_samples); "
            "gpu_samples_1s and worker_samples_10s cover the whole run"}};
    st = store_->WriteRows(run_id_, note);
  }
  if (st.ok()) {
    pruned_to_ns_ = cut;
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = st.message();
  }
}

}  // namespace gpuprof::store
