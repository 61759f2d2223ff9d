// SQLite implementation of store schema v1. Contracts are documented in sqlite_store.h and
// docs/schema.md.
#include "store/sqlite_store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "store/schema_sql.h"

#ifndef GPUPROF_VERSION
#define GPUPROF_VERSION "unknown"
#endif

namespace gpuprof::store {
namespace {

constexpr int kBusyTimeoutMs = 5000;

// ---- statements ------------------------------------------------------------------------------

// Owns one prepared statement (one-shot reads and lifecycle writes).
class Stmt {
 public:
  Stmt() = default;
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  sqlite3_stmt** out() { return &stmt_; }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Binds parameters 1, 2, 3, ... in call order; std::nullopt binds NULL. Remembers the first
// failing bind. Text is bound SQLITE_STATIC: the caller keeps it alive until the statement is
// reset and its bindings cleared.
class Binder {
 public:
  explicit Binder(sqlite3_stmt* stmt) : stmt_(stmt) {}
  Binder& Int(int64_t v) { return Check(sqlite3_bind_int64(stmt_, ++index_, v)); }
  Binder& Real(double v) { return Check(sqlite3_bind_double(stmt_, ++index_, v)); }
  Binder& Text(const std::string& v) {
    return Check(sqlite3_bind_text(stmt_, ++index_, v.data(), static_cast<int>(v.size()),
                                   SQLITE_STATIC));
  }
  Binder& Null() { return Check(sqlite3_bind_null(stmt_, ++index_)); }
  Binder& Int(const std::optional<int64_t>& v) { return v ? Int(*v) : Null(); }
  Binder& Real(const std::optional<double>& v) { return v ? Real(*v) : Null(); }
  Binder& Text(const std::optional<std::string>& v) { return v ? Text(*v) : Null(); }
  int rc() const { return rc_; }

 private:
  Binder& Check(int rc) {
    if (rc_ == SQLITE_OK) rc_ = rc;
    return *this;
  }
  sqlite3_stmt* stmt_;
  int index_ = 0;
  int rc_ = SQLITE_OK;
};

// Reads result columns 0, 1, 2, ... in call order; SQL NULL reads as std::nullopt.
class Reader {
 public:
  explicit Reader(sqlite3_stmt* stmt) : stmt_(stmt) {}
  bool IsNull() const { return sqlite3_column_type(stmt_, index_) == SQLITE_NULL; }
  int64_t Int() { return sqlite3_column_int64(stmt_, index_++); }
  double Real() { return sqlite3_column_double(stmt_, index_++); }
  std::string Text() {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index_));
    int n = sqlite3_column_bytes(stmt_, index_++);
    return p ? std::string(p, static_cast<size_t>(n)) : std::string();
  }
  std::optional<int64_t> OptInt() {
    if (IsNull()) return Skip<int64_t>();
    return Int();
  }
  std::optional<double> OptReal() {
    if (IsNull()) return Skip<double>();
    return Real();
  }
  std::optional<std::string> OptText() {
    if (IsNull()) return Skip<std::string>();
    return Text();
  }

 private:
  template <typename T>
  std::optional<T> Skip() {
    ++index_;
    return std::nullopt;
  }
  sqlite3_stmt* stmt_;
  int index_ = 0;
};

// ---- row types -> SQL ------------------------------------------------------------------------
// One RowTraits<T> per alternative of Row: the statement (parameter 1 is always run_id) and how
// to bind a row. Upserts on primary keys make a re-write replace the earlier row.

template <typename T>
struct RowTraits;

template <>
struct RowTraits<StepRow> {
  static constexpr const char* kPurpose = "upsert into steps";
  static constexpr const char* kSql =
      "INSERT INTO steps(run_id, step, start_ns, end_ns, wait_ns, wait_source, forward_calls,"
      " backward_calls, optimizer_calls) VALUES(?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, step) DO UPDATE SET start_ns = excluded.start_ns,"
      " end_ns = excluded.end_ns, wait_ns = excluded.wait_ns, wait_source = excluded.wait_source,"
      " forward_calls = excluded.forward_calls, backward_calls = excluded.backward_calls,"
      " optimizer_calls = excluded.optimizer_calls";
  static void Bind(Binder& b, const StepRow& r) {
    b.Int(r.step).Int(r.start_ns).Int(r.end_ns).Int(r.wait_ns).Text(r.wait_source);
    b.Int(r.forward_calls).Int(r.backward_calls).Int(r.optimizer_calls);
  }
};

template <>
struct RowTraits<PhaseRow> {
  static constexpr const char* kPurpose = "upsert into phases";
  // A re-write replaces wall_ns and calls. gpu_ns: a NULL in the new row keeps the stored
  // value (GPU time added by PhaseGpuRow); over a placeholder made by PhaseGpuRow (calls 0)
  // the new row's GPU time is added to the deltas already there; otherwise it replaces.
  static constexpr const char* kSql =
      "INSERT INTO phases(run_id, step, name, wall_ns, gpu_ns, calls) VALUES(?,?,?,?,?,?)"
      " ON CONFLICT(run_id, step, name) DO UPDATE SET wall_ns = excluded.wall_ns,"
      " gpu_ns = CASE WHEN excluded.gpu_ns IS NULL THEN phases.gpu_ns"
      " WHEN phases.calls = 0 THEN coalesce(phases.gpu_ns, 0) + excluded.gpu_ns"
      " ELSE excluded.gpu_ns END,"
      " calls = excluded.calls";
  static void Bind(Binder& b, const PhaseRow& r) {
    b.Int(r.step).Text(r.name).Int(r.wall_ns).Int(r.gpu_ns).Int(r.calls);
  }
};

template <>
struct RowTraits<PhaseGpuRow> {
  static constexpr const char* kPurpose = "add gpu_ns to phases";
  // Creates a placeholder phase row (wall_ns 0, calls 0) when the CPU side is not written yet.
  static constexpr const char* kSql =
      "INSERT INTO phases(run_id, step, name, wall_ns, gpu_ns, calls) VALUES(?,?,?,0,?,0)"
      " ON CONFLICT(run_id, step, name) DO UPDATE SET"
      " gpu_ns = coalesce(phases.gpu_ns, 0) + excluded.gpu_ns";
  static void Bind(Binder& b, const PhaseGpuRow& r) { b.Int(r.step).Text(r.name).Int(r.gpu_ns); }
};

template <>
struct RowTraits<GpuInfoRow> {
  static constexpr const char* kPurpose = "upsert into gpus";
  static constexpr const char* kSql =
      "INSERT INTO gpus(run_id, gpu_index, name, uuid, memory_total_bytes, sm_clock_max_mhz)"
      " VALUES(?,?,?,?,?,?) ON CONFLICT(run_id, gpu_index) DO UPDATE SET name = excluded.name,"
      " uuid = excluded.uuid, memory_total_bytes = excluded.memory_total_bytes,"
      " sm_clock_max_mhz = excluded.sm_clock_max_mhz";
  static void Bind(Binder& b, const GpuInfoRow& r) {
    b.Int(r.gpu_index).Text(r.name).Text(r.uuid).Int(r.memory_total_bytes).Int(r.sm_clock_max_mhz);
  }
};

template <>
struct RowTraits<GpuSampleRow> {
  static constexpr const char* kPurpose = "insert into gpu_samples";
  static constexpr const char* kSql =
      "INSERT INTO gpu_samples(run_id, ts_ns, gpu_index, util_pct, mem_util_pct, mem_used_bytes,"
      " mem_total_bytes, proc_mem_bytes, power_mw, temp_c, sm_clock_mhz, clock_reasons,"
      " pcie_rx_bps, pcie_tx_bps) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  static void Bind(Binder& b, const GpuSampleRow& r) {
    b.Int(r.ts_ns).Int(r.gpu_index).Real(r.util_pct).Real(r.mem_util_pct).Int(r.mem_used_bytes);
    b.Int(r.mem_total_bytes).Int(r.proc_mem_bytes).Int(r.power_mw).Real(r.temp_c);
    b.Int(r.sm_clock_mhz).Int(r.clock_reasons).Real(r.pcie_rx_bps).Real(r.pcie_tx_bps);
  }
};

// cpu_per_core is stored as JSON array text in host_core_samples; an empty vector (not
// measured) stores no row there.
std::optional<std::string> CoresToJson(const std::vector<double>& cores) {
  if (cores.empty()) return std::nullopt;
  return nlohmann::json(cores).dump();
}

template <>
struct RowTraits<HostSampleRow> {
  static constexpr const char* kPurpose = "insert into host_samples";
  static constexpr const char* kSql =
      "INSERT INTO host_samples(run_id, ts_ns, cpu_pct, ncores, mem_used_bytes,"
      " mem_total_bytes, page_cache_bytes, swap_in_bps, disk_read_bps, disk_read_iops,"
      " proc_cpu_pct, proc_rss_bytes) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)";
  static void Bind(Binder& b, const HostSampleRow& r) {
    b.Int(r.ts_ns).Real(r.cpu_pct).Int(r.ncores).Int(r.mem_used_bytes);
    b.Int(r.mem_total_bytes).Int(r.page_cache_bytes).Real(r.swap_in_bps).Real(r.disk_read_bps);
    b.Real(r.disk_read_iops).Real(r.proc_cpu_pct).Int(r.proc_rss_bytes);
  }
  static constexpr const char* kCorePurpose = "insert into host_core_samples";
  static constexpr const char* kCoreSql =
      "INSERT INTO host_core_samples(run_id, ts_ns, cpu_per_core) VALUES(?,?,?)";
};

template <>
struct RowTraits<GpuRollupRow> {
  static constexpr const char* kPurpose = "upsert into gpu_samples_1s";
  static constexpr const char* kSql =
      "INSERT INTO gpu_samples_1s(run_id, ts_ns, gpu_index, samples, util_samples, util_mean_pct,"
      " util_min_pct, util_max_pct, mem_util_mean_pct, mem_used_max_bytes, mem_total_bytes,"
      " proc_mem_max_bytes, power_samples, power_mean_mw, power_max_mw, temp_max_c,"
      " sm_clock_min_mhz, sm_clock_max_mhz, clock_reasons_or, thermal_samples, throttled_samples,"
      " throttled_by_reason_samples, throttled_temp_max_c, throttled_sm_clock_min_mhz,"
      " pcie_rx_samples, pcie_rx_mean_bps, pcie_rx_max_bps, pcie_rx_high_samples,"
      " pcie_tx_max_bps) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, ts_ns, gpu_index) DO UPDATE SET samples = excluded.samples,"
      " util_samples = excluded.util_samples, util_mean_pct = excluded.util_mean_pct,"
      " util_min_pct = excluded.util_min_pct, util_max_pct = excluded.util_max_pct,"
      " mem_util_mean_pct = excluded.mem_util_mean_pct,"
      " mem_used_max_bytes = excluded.mem_used_max_bytes,"
      " mem_total_bytes = excluded.mem_total_bytes,"
      " proc_mem_max_bytes = excluded.proc_mem_max_bytes,"
      " power_samples = excluded.power_samples, power_mean_mw = excluded.power_mean_mw,"
      " power_max_mw = excluded.power_max_mw, temp_max_c = excluded.temp_max_c,"
      " sm_clock_min_mhz = excluded.sm_clock_min_mhz, sm_clock_max_mhz = excluded.sm_clock_max_mhz,"
      " clock_reasons_or = excluded.clock_reasons_or, thermal_samples = excluded.thermal_samples,"
      " throttled_samples = excluded.throttled_samples,"
      " throttled_by_reason_samples = excluded.throttled_by_reason_samples,"
      " throttled_temp_max_c = excluded.throttled_temp_max_c,"
      " throttled_sm_clock_min_mhz = excluded.throttled_sm_clock_min_mhz,"
      " pcie_rx_samples = excluded.pcie_rx_samples, pcie_rx_mean_bps = excluded.pcie_rx_mean_bps,"
      " pcie_rx_max_bps = excluded.pcie_rx_max_bps,"
      " pcie_rx_high_samples = excluded.pcie_rx_high_samples,"
      " pcie_tx_max_bps = excluded.pcie_tx_max_bps";
  static void Bind(Binder& b, const GpuRollupRow& r) {
    b.Int(r.ts_ns).Int(r.gpu_index).Int(r.samples).Int(r.util_samples).Real(r.util_mean_pct);
    b.Real(r.util_min_pct).Real(r.util_max_pct).Real(r.mem_util_mean_pct);
    b.Int(r.mem_used_max_bytes).Int(r.mem_total_bytes).Int(r.proc_mem_max_bytes);
    b.Int(r.power_samples).Real(r.power_mean_mw).Int(r.power_max_mw).Real(r.temp_max_c);
    b.Int(r.sm_clock_min_mhz).Int(r.sm_clock_max_mhz).Int(r.clock_reasons_or);
    b.Int(r.thermal_samples).Int(r.throttled_samples).Int(r.throttled_by_reason_samples);
    b.Real(r.throttled_temp_max_c).Int(r.throttled_sm_clock_min_mhz);
    b.Int(r.pcie_rx_samples).Real(r.pcie_rx_mean_bps).Real(r.pcie_rx_max_bps);
    b.Int(r.pcie_rx_high_samples).Real(r.pcie_tx_max_bps);
  }
};

template <>
struct RowTraits<WorkerRollupRow> {
  static constexpr const char* kPurpose = "upsert into worker_samples_10s";
  static constexpr const char* kSql =
      "INSERT INTO worker_samples_10s(run_id, ts_ns, pid, role, samples, cpu_samples,"
      " cpu_mean_pct, cpu_max_pct, rss_max_bytes) VALUES(?,?,?,?,?,?,?,?,?)"
      " ON CONFLICT(run_id, ts_ns, pid) DO UPDATE SET role = excluded.role,"
      " samples = excluded.samples, cpu_samples = excluded.cpu_samples,"
      " cpu_mean_pct = excluded.cpu_mean_pct, cpu_max_pct = excluded.cpu_max_pct,"
      " rss_max_bytes = excluded.rss_max_bytes";
  static void Bind(Binder& b, const WorkerRollupRow& r) {
    b.Int(r.ts_ns).Int(r.pid).Text(r.role).Int(r.samples).Int(r.cpu_samples);
    b.Real(r.cpu_mean_pct).Real(r.cpu_max_pct).Int(r.rss_max_bytes);
  }
};

template <>
struct RowTraits<WorkerSampleRow> {
  static constexpr const char* kPurpose = "insert into worker_samples";
  static constexpr const char* kSql =
      "INSERT INTO worker_samples(run_id, ts_ns, pid, role, cpu_pct, rss_bytes)"
      " VALUES(?,?,?,?,?,?)";
  static void Bind(Binder& b, const WorkerSampleRow& r) {
    b.Int(r.ts_ns).Int(r.pid).Text(r.role).Real(r.cpu_pct).Int(r.rss_bytes);
  }
};

template <>
struct RowTraits<KernelRow> {
  static constexpr const char* kPurpose = "insert into kernels";
  static constexpr const char* kSql =
      "INSERT INTO kernels(run_id, window_start_ns, window_end_ns, name, calls, gpu_ns, source)"
      " VALUES(?,?,?,?,?,?,?)";
  static void Bind(Binder& b, const KernelRow& r) {
    b.Int(r.window_start_ns).Int(r.window_end_ns).Text(r.name).Int(r.calls).Int(r.gpu_ns);
    b.Text(r.source);
  }
};

template <>
struct RowTraits<CommBucketRow> {
  static constexpr const char* kPurpose = "insert into comm_buckets";
  static constexpr const char* kSql =
      "INSERT INTO comm_buckets(run_id, step, bucket, start_ns, end_ns, bytes) VALUES(?,?,?,?,?,?)";
  static void Bind(Binder& b, const CommBucketRow& r) {
    b.Int(r.step).Int(r.bucket).Int(r.start_ns).Int(r.end_ns).Int(r.bytes);
  }
};

template <>
struct RowTraits<StallRow> {
  static constexpr const char* kPurpose = "insert into host_stalls";
  static constexpr const char* kSql =
      "INSERT INTO host_stalls(run_id, start_ns, duration_ns) VALUES(?,?,?)";
  static void Bind(Binder& b, const StallRow& r) { b.Int(r.start_ns).Int(r.duration_ns); }
};

template <>
struct RowTraits<CpuWaitRow> {
  static constexpr const char* kPurpose = "insert into cpu_waits";
  static constexpr const char* kSql =
      "INSERT INTO cpu_waits(run_id, start_ns, end_ns, wait_ns) VALUES(?,?,?,?)";
  static void Bind(Binder& b, const CpuWaitRow& r) {
    b.Int(r.start_ns).Int(r.end_ns).Int(r.wait_ns);
  }
};

template <>
struct RowTraits<TelemetryStatusRow> {
  static constexpr const char* kPurpose = "upsert into telemetry_status";
  static constexpr const char* kSql =
      "INSERT INTO telemetry_status(run_id, source, available, backend, reason) VALUES(?,?,?,?,?)"
      " ON CONFLICT(run_id, source) DO UPDATE SET available = excluded.available,"
      " backend = excluded.backend, reason = excluded.reason";
  static void Bind(Binder& b, const TelemetryStatusRow& r) {
    b.Text(r.source).Int(int64_t{r.available ? 1 : 0}).Text(r.backend).Text(r.reason);
  }
};

template <>
struct RowTraits<DiagnosticRow> {
  static constexpr const char* kPurpose = "insert into diagnostics";
  static constexpr const char* kSql =
      "INSERT INTO diagnostics(run_id, ts_ns, level, source, message) VALUES(?,?,?,?,?)";
  static void Bind(Binder& b, const DiagnosticRow& r) {
    b.Int(r.ts_ns).Text(r.level).Text(r.source).Text(r.message);
  }
};

// ---- runs ------------------------------------------------------------------------------------

constexpr const char* kRunColumns =
    "run_id, run_name, group_id, rank, world_size, hostname, pid, start_unix_ns, start_mono_ns,"
    " end_ns, status, error, device_kind, gpu_backend, gpu_model, gpu_count, dtype,"
    " flops_per_step, flops_method, sample_hz, gpuprof_version, python_version, torch_version,"
    " config_json";

RunInfo ReadRunInfo(sqlite3_stmt* stmt) {
  Reader c(stmt);
  RunInfo r;
  r.run_id = c.Int();
  r.run_name = c.Text();
  r.group_id = c.OptText();
  r.rank = c.OptInt();
  r.world_size = c.OptInt();
  r.hostname = c.OptText().value_or("");
  r.pid = c.OptInt().value_or(0);
  r.start_unix_ns = c.Int();
  r.start_mono_ns = c.Int();
  r.end_ns = c.OptInt();
  r.status = c.Text();
  r.error = c.OptText();
  r.device_kind = c.OptText();
  r.gpu_backend = c.OptText();
  r.gpu_model = c.OptText();
  r.gpu_count = c.OptInt();
  r.dtype = c.OptText();
  r.flops_per_step = c.OptReal();
  r.flops_method = c.OptText();
  r.sample_hz = c.OptReal();
  r.gpuprof_version = c.Text();
  r.python_version = c.OptText();
  r.torch_version = c.OptText();
  r.config_json = c.OptText();
  return r;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// True when PATH-wal exists and holds frames not yet checkpointed into PATH.
bool HasWalContent(const std::string& path) {
  struct stat st;
  return ::stat((path + "-wal").c_str(), &st) == 0 && st.st_size > 0;
}

// An SQLite URI that opens PATH immutable (no locks, no -shm, no -wal): for a read-only
// reader of a WAL database in a directory it may not write, where SQLite cannot create the
// -shm file it needs otherwise.
std::string ImmutableUri(const std::string& path) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  const std::string p = ec ? path : abs.string();
  std::string uri = "file://";
  static const char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : p) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 0xF];
    }
  }
  return uri + "?immutable=1";
}

}  // namespace

// ---- SqliteStore: errors and helpers ---------------------------------------------------------

Status SqliteStore::Error(const std::string& purpose) const {
  last_error_code_ = sqlite3_extended_errcode(db_);
  return Status::Error(path_ + ": " + purpose + ": " + sqlite3_errmsg(db_));
}

void SqliteStore::SetBusyTimeout(int ms) { sqlite3_busy_timeout(db_, ms); }

Status SqliteStore::Exec(const char* sql, const std::string& purpose) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return Error(purpose);
  return Status::Ok();
}

Status SqliteStore::Begin() { return Exec("BEGIN IMMEDIATE", "begin transaction"); }

Status SqliteStore::Commit() {
  Status st = Exec("COMMIT", "commit");
  if (!st.ok()) Rollback();
  return st;
}

void SqliteStore::Rollback() {
  if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

// ---- open ------------------------------------------------------------------------------------

namespace {

// What Open finds in an existing file.
struct FileState {
  bool empty = false;        // no tables at all: a new database
  bool has_runs = false;
  std::optional<std::string> schema_version;  // meta.schema_version, if meta exists
};

}  // namespace

Expected<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path, Mode mode) {
  const bool read_only = mode == Mode::kReadOnly;
  if (read_only && !FileExists(path)) return Status::Error("no such file: " + path);

  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_NOMUTEX |
              (read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return Status::Error(path + ": cannot open: " + msg);
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db, path));
  sqlite3_busy_timeout(db, kBusyTimeoutMs);

  // Inspects the file without writing to it, so that a foreign or newer file stays untouched.
  auto inspect = [&]() -> Expected<FileState> {
    FileState fs;
    Stmt tables;
    rc = sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table'", -1,
                            tables.out(), nullptr);
    bool has_meta = false;
    int ntables = 0;
    if (rc == SQLITE_OK) {
      while ((rc = sqlite3_step(tables.get())) == SQLITE_ROW) {
        std::string name = Reader(tables.get()).Text();
        ++ntables;
        has_meta |= name == "meta";
        fs.has_runs |= name == "runs";
      }
    }
    if (rc != SQLITE_DONE) {
      if (sqlite3_errcode(db) == SQLITE_NOTADB) {
        return Status::Error(path + ": file is not a database");
      }
      return store->Error("read schema");
    }
    fs.empty = ntables == 0;
    if (has_meta) {
      Stmt meta;
      rc = sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1,
                              meta.out(), nullptr);
      if (rc == SQLITE_OK && (rc = sqlite3_step(meta.get())) == SQLITE_ROW) {
        fs.schema_version = Reader(meta.get()).Text();
      } else if (rc != SQLITE_DONE) {
        return store->Error("read meta.schema_version");
      }
    }
    return fs;
  };
  // Accepts exactly a gpuprof file of a schema version this build reads.
  auto validate = [&](const FileState& fs) -> Status {
    if (!fs.has_runs || !fs.schema_version) {
      return Status::Error(path + ": not a gpuprof database (no runs table or schema_version)");
    }
    int64_t version = 0;
    const std::string& v = *fs.schema_version;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), version);
    if (ec != std::errc() || end != v.data() + v.size() || version < 1) {
      return Status::Error(path + ": not a gpuprof database (schema_version '" + v + "')");
    }
    if (version > kSchemaVersion) {
      return Status::Error(path + " was written by a newer gpuprof (schema " +
                           std::to_string(version) + " > " + std::to_string(kSchemaVersion) +
                           "); upgrade gpuprof");
    }
    return Status::Ok();
  };

  Expected<FileState> fs = inspect();
  // A WAL database that this user may read but whose directory it may not write (another
  // user's directory: "attempt to write a readonly database"; a read-only mount: "unable to
  // open database file"): SQLite cannot create the -shm file it needs. With no un-checkpointed
  // -wal content there is nothing a writer could be adding, so the file is read as immutable.
  // With -wal content (a run killed before SQLite folded its log into the file), reading the
  // file alone would miss what the log holds: the error says so and what to do.
  const int open_error = sqlite3_errcode(db) & 0xff;
  const bool cannot_write_beside =
      !fs.ok() && read_only && (open_error == SQLITE_READONLY || open_error == SQLITE_CANTOPEN);
  if (cannot_write_beside && HasWalContent(path)) {
    return Status::Error(
        path + ": cannot be read here: its write-ahead log (" + path +
        "-wal) holds data not yet folded into the file (a run that was killed, or is still "
        "writing), and SQLite needs to create " + path +
        "-shm beside it to read that log, which this directory does not allow (read-only "
        "mount or permissions). Copy the file with its -wal to a writable directory, or read "
        "it once where it is writable");
  }
  if (cannot_write_beside) {
    store.reset();
    db = nullptr;
    rc = sqlite3_open_v2(ImmutableUri(path).c_str(), &db,
                         SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
    if (rc != SQLITE_OK) {
      std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
      sqlite3_close_v2(db);
      return Status::Error(path + ": cannot open: " + msg);
    }
    store.reset(new SqliteStore(db, path));
    fs = inspect();
  }
  if (!fs.ok()) return fs.status();
  if (read_only || !fs->empty) {
    if (Status st = validate(*fs); !st.ok()) return st;
  }
  if (read_only) return store;

  // WAL: readers (the insights CLI, a second connection) never block the writer and vice
  // versa. synchronous=NORMAL: a commit survives a process crash; a power loss may lose the
  // last commits but never corrupts the file.
  //
  // Switching a new file to WAL takes an exclusive lock, and SQLite does not always wait on the
  // busy handler for it: several processes opening one new file at once (the ranks of a
  // distributed job) would see "database is locked" at once. So a busy switch is retried, with
  // short sleeps, for as long as the busy timeout.
  {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(kBusyTimeoutMs);
    for (int attempt = 0;; ++attempt) {
      Stmt wal;
      rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, wal.out(), nullptr);
      if (rc == SQLITE_OK) rc = sqlite3_step(wal.get());
      if (rc == SQLITE_ROW || rc == SQLITE_DONE) break;
      const int primary = rc & 0xff;
      if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) ||
          std::chrono::steady_clock::now() >= deadline) {
        return store->Error("enable WAL journal");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2 + attempt * 2, 50)));
    }
  }
  if (Status st = store->Exec("PRAGMA synchronous=NORMAL", "set synchronous"); !st.ok()) {
    return st;
  }
  if (!fs->empty) return store;

  // A new file: schema and meta in one transaction. Another process may have created it
  // meanwhile; the write lock serializes us, and we look again once we hold it.
  if (Status st = store->Begin(); !st.ok()) return st;
  fs = inspect();
  if (!fs.ok()) {
    store->Rollback();
    return fs.status();
  }
  if (!fs->empty) {
    store->Rollback();
    if (Status st = validate(*fs); !st.ok()) return st;
    return store;
  }
  if (Status st = store->Exec(kSchemaSql, "create schema v1"); !st.ok()) {
    store->Rollback();
    return st;
  }
  {
    Stmt meta;
    rc = sqlite3_prepare_v2(db, "INSERT INTO meta(key, value) VALUES(?, ?)", -1, meta.out(),
                            nullptr);
    const std::pair<std::string, std::string> entries[] = {
        {"schema_version", std::to_string(kSchemaVersion)},
        {"created_by", std::string("gpuprof ") + GPUPROF_VERSION}};
    for (const auto& [key, value] : entries) {
      if (rc != SQLITE_OK) break;
      Binder(meta.get()).Text(key).Text(value);
      rc = sqlite3_step(meta.get()) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
      sqlite3_reset(meta.get());
    }
    if (rc != SQLITE_OK) {
      Status st = store->Error("write meta");
      store->Rollback();
      return st;
    }
  }
  if (Status st = store->Commit(); !st.ok()) return st;
  return store;
}

SqliteStore::~SqliteStore() {
  for (sqlite3_stmt*& stmt : row_stmts_) {
    sqlite3_finalize(stmt);
    stmt = nullptr;
  }
  sqlite3_finalize(core_stmt_);
  core_stmt_ = nullptr;
  sqlite3_close_v2(db_);
}

// ---- run lifecycle ---------------------------------------------------------------------------

Expected<int64_t> SqliteStore::BeginRun(const RunInfo& info) {
  Stmt stmt;
  if (sqlite3_prepare_v2(db_,
                         "INSERT INTO runs(run_name, group_id, rank, world_size, hostname, pid,"
                         " start_unix_ns, start_mono_ns, end_ns, status, error, device_kind,"
                         " gpu_backend, gpu_model, gpu_count, dtype, flops_per_step, flops_method,"
                         " sample_hz, gpuprof_version, python_version, torch_version, config_json)"
                         " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                         -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare insert into runs");
  }
  const std::string version = info.gpuprof_version.empty() ? GPUPROF_VERSION : info.gpuprof_version;
  Binder b(stmt.get());
  b.Text(info.run_name).Text(info.group_id).Int(info.rank).Int(info.world_size);
  b.Text(info.hostname).Int(info.pid).Int(info.start_unix_ns).Int(info.start_mono_ns);
  b.Int(info.end_ns).Text(info.status).Text(info.error).Text(info.device_kind);
  b.Text(info.gpu_backend).Text(info.gpu_model).Int(info.gpu_count).Text(info.dtype);
  b.Real(info.flops_per_step).Text(info.flops_method).Real(info.sample_hz).Text(version);
  b.Text(info.python_version).Text(info.torch_version).Text(info.config_json);
  if (b.rc() != SQLITE_OK || sqlite3_step(stmt.get()) != SQLITE_DONE) {
    return Error("insert into runs");
  }
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Status SqliteStore::FinishRun(int64_t run_id, const std::string& status,
                              std::optional<int64_t> end_ns,
                              const std::optional<std::string>& error) {
  if (status != "ok" && status != "failed") {
    return Status::Error(path_ + ": finish run " + std::to_string(run_id) + ": status '" + status +
                         "' is not ok or failed");
  }
  Stmt stmt;
  if (sqlite3_prepare_v2(db_, "UPDATE runs SET status = ?, end_ns = ?, error = ? WHERE run_id = ?",
                         -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare finish run");
  }
  Binder b(stmt.get());
  b.Text(status).Int(end_ns).Text(error).Int(run_id);
  if (b.rc() != SQLITE_OK || sqlite3_step(stmt.get()) != SQLITE_DONE) return Error("finish run");
  if (sqlite3_changes(db_) == 0) {
    return Status::Error(path_ + ": finish run: no run " + std::to_string(run_id));
  }
  return Status::Ok();
}

Status SqliteStore::UpdateRunFields(const RunInfo& info) {
  Stmt stmt;
  if (sqlite3_prepare_v2(db_,
                         "UPDATE runs SET group_id = ?, rank = ?, world_size = ?, device_kind = ?,"
                         " gpu_backend = ?, gpu_model = ?, gpu_count = ?, dtype = ?,"
                         " flops_per_step = ?, flops_method = ?, sample_hz = ?,"
                         " python_version = ?, torch_version = ?, config_json = ?"
                         " WHERE run_id = ?",
                         -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare update run fields");
  }
  Binder b(stmt.get());
  b.Text(info.group_id).Int(info.rank).Int(info.world_size).Text(info.device_kind);
  b.Text(info.gpu_backend).Text(info.gpu_model).Int(info.gpu_count).Text(info.dtype);
  b.Real(info.flops_per_step).Text(info.flops_method).Real(info.sample_hz);
  b.Text(info.python_version).Text(info.torch_version).Text(info.config_json).Int(info.run_id);
  if (b.rc() != SQLITE_OK || sqlite3_step(stmt.get()) != SQLITE_DONE) {
    return Error("update run fields");
  }
  if (sqlite3_changes(db_) == 0) {
    return Status::Error(path_ + ": update run fields: no run " + std::to_string(info.run_id));
  }
  return Status::Ok();
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
    if (sqlite3_prepare_v2(db_, "DELETE FROM insights WHERE run_id = ?", -1, del.out(),
                           nullptr) != SQLITE_OK) {
      return fail("prepare delete insights");
    }
    Binder(del.get()).Int(run_id);
    if (sqlite3_step(del.get()) != SQLITE_DONE) return fail("delete insights");
  }
  Stmt ins;
  if (sqlite3_prepare_v2(db_,
                         "INSERT INTO insights(run_id, ordinal, rule_id, family, severity, message,"
                         " fix, evidence_json) VALUES(?,?,?,?,?,?,?,?)",
                         -1, ins.out(), nullptr) != SQLITE_OK) {
    return fail("prepare insert into insights");
  }
  for (const InsightRow& r : insights) {
    Binder b(ins.get());
    b.Int(run_id).Int(r.ordinal).Text(r.rule_id).Text(r.family).Text(r.severity);
    b.Text(r.message).Text(r.fix).Text(r.evidence_json);
    if (b.rc() != SQLITE_OK || sqlite3_step(ins.get()) != SQLITE_DONE) {
      return fail("insert into insights");
    }
    sqlite3_reset(ins.get());
    sqlite3_clear_bindings(ins.get());
  }
  return Status::Ok();
}

// ---- team server ingest ----------------------------------------------------------------------

Expected<std::vector<std::pair<int64_t, double>>> SqliteStore::LoadSeries(
    int64_t run_id, const std::string& metric, int64_t gpu_index, int64_t from_ns,
    int64_t to_ns) {
  static const std::map<std::string, std::string> kColumns = {
      {"gpu_util", "util_mean_pct"}, {"gpu_mem", "mem_used_max_bytes"},
      {"gpu_power", "power_mean_mw"}, {"gpu_temp", "temp_max_c"}, {"host_cpu", "cpu_pct"}};
  auto it = kColumns.find(metric);
  if (it == kColumns.end()) {
    return Status::Error("no metric '" + metric +
                         "' (metrics: gpu_util, gpu_mem, gpu_power, gpu_temp, host_cpu)");
  }
  const bool host = metric == "host_cpu";
  const std::string sql =
      "SELECT ts_ns, " + it->second + " FROM " + (host ? "host_samples" : "gpu_samples_1s") +
      " WHERE run_id = ? AND ts_ns BETWEEN ? AND ? AND " + it->second + " IS NOT NULL" +
      (host ? "" : " AND gpu_index = ?") + " ORDER BY ts_ns";
  std::vector<std::pair<int64_t, double>> out;
  Status st = Query(sql, "load series " + metric,
                    [&](Binder& b) {
                      b.Int(run_id).Int(from_ns).Int(to_ns);
                      if (!host) b.Int(gpu_index);
                    },
                    [&](sqlite3_stmt* q) {
                      out.emplace_back(sqlite3_column_int64(q, 0), sqlite3_column_double(q, 1));
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  return out;
}

Expected<std::optional<int64_t>> SqliteStore::IngestRunId(const std::string& run_uuid) {
  std::optional<int64_t> id;
  Status st = Query("SELECT run_id FROM ingest_runs WHERE run_uuid = ?", "look up ingest run",
                    [&](Binder& b) { b.Text(run_uuid); },
                    [&](sqlite3_stmt* s) {
                      id = sqlite3_column_int64(s, 0);
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  return id;
}

Expected<int64_t> SqliteStore::BeginIngestRun(const std::string& run_uuid, const RunInfo& info) {
  if (Status st = Begin(); !st.ok()) return st;
  auto id = BeginRun(info);
  if (!id) {
    Rollback();
    return id.status();
  }
  Stmt stmt;
  if (sqlite3_prepare_v2(db_, "INSERT INTO ingest_runs(run_uuid, run_id) VALUES(?, ?)", -1,
                         stmt.out(), nullptr) != SQLITE_OK) {
    Status st = Error("prepare insert into ingest_runs");
    Rollback();
    return st;
  }
  Binder b(stmt.get());
  b.Text(run_uuid).Int(*id);
  if (b.rc() != SQLITE_OK || sqlite3_step(stmt.get()) != SQLITE_DONE) {
    Status st = Error("insert into ingest_runs");
    Rollback();
    return st;
  }
  if (Status st = Commit(); !st.ok()) return st;
  return *id;
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
  Status st = Query("SELECT 1 FROM ingest_batches WHERE run_id = ? AND batch_id = ?",
                    "look up ingest batch", [&](Binder& b) { b.Int(run_id).Text(batch_id); },
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
  if (sqlite3_prepare_v2(db_,
                         "INSERT INTO ingest_batches(run_id, batch_id, row_count, received_unix_ns)"
                         " VALUES(?, ?, ?, ?)",
                         -1, mark.out(), nullptr) != SQLITE_OK) {
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

// ---- rows ------------------------------------------------------------------------------------

template <typename T>
Status SqliteStore::WriteOne(size_t index, int64_t run_id, const T& row) {
  using Traits = RowTraits<T>;
  sqlite3_stmt*& stmt = row_stmts_[index];
  if (stmt == nullptr &&
      sqlite3_prepare_v3(db_, Traits::kSql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr) !=
          SQLITE_OK) {
    sqlite3_finalize(stmt);
    stmt = nullptr;
    return Error(std::string("prepare ") + Traits::kPurpose);
  }
  Binder b(stmt);
  b.Int(run_id);
  Traits::Bind(b, row);
  const int rc = b.rc() == SQLITE_OK ? sqlite3_step(stmt) : b.rc();
  Status st = rc == SQLITE_DONE ? Status::Ok() : Error(Traits::kPurpose);
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
  if constexpr (std::is_same_v<T, HostSampleRow>) {
    if (st.ok() && !row.cpu_per_core.empty()) st = WriteCores(run_id, row);
  }
  return st;
}

Status SqliteStore::WriteCores(int64_t run_id, const HostSampleRow& row) {
  using Traits = RowTraits<HostSampleRow>;
  if (core_stmt_ == nullptr &&
      sqlite3_prepare_v3(db_, Traits::kCoreSql, -1, SQLITE_PREPARE_PERSISTENT, &core_stmt_,
                         nullptr) != SQLITE_OK) {
    sqlite3_finalize(core_stmt_);
    core_stmt_ = nullptr;
    return Error(std::string("prepare ") + Traits::kCorePurpose);
  }
  const std::optional<std::string> cores = CoresToJson(row.cpu_per_core);  // alive until reset
  Binder b(core_stmt_);
  b.Int(run_id).Int(row.ts_ns).Text(cores);
  const int rc = b.rc() == SQLITE_OK ? sqlite3_step(core_stmt_) : b.rc();
  Status st = rc == SQLITE_DONE ? Status::Ok() : Error(Traits::kCorePurpose);
  sqlite3_reset(core_stmt_);
  sqlite3_clear_bindings(core_stmt_);
  return st;
}

Status SqliteStore::WriteRows(int64_t run_id, const std::vector<Row>& rows) {
  return WriteRange(run_id, rows.begin(), rows.end());
}

template <typename It>
Status SqliteStore::WriteEach(int64_t run_id, It begin, It end) {
  for (It it = begin; it != end; ++it) {
    const Row& row = *it;
    Status st = std::visit([&](const auto& r) { return WriteOne(row.index(), run_id, r); }, row);
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

// ---- reads -----------------------------------------------------------------------------------

// Runs `sql` with `bind` and calls `each(stmt)` per result row.
template <typename BindFn, typename RowFn>
Status SqliteStore::Query(const std::string& sql, const std::string& purpose, BindFn bind,
                          RowFn each) {
  Stmt stmt;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare " + purpose);
  }
  Binder b(stmt.get());
  bind(b);
  if (b.rc() != SQLITE_OK) return Error(purpose);
  int rc;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    if (Status st = each(stmt.get()); !st.ok()) return st;
  }
  if (rc != SQLITE_DONE) return Error(purpose);
  return Status::Ok();
}

Expected<std::optional<int64_t>> SqliteStore::LatestRunId() {
  std::optional<int64_t> id;
  Status st = Query(
      "SELECT max(run_id) FROM runs", "read latest run id", [](Binder&) {},
      [&](sqlite3_stmt* s) {
        id = Reader(s).OptInt();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return id;
}

Expected<bool> SqliteStore::RunExists(int64_t run_id) {
  bool found = false;
  Status st = Query(
      "SELECT 1 FROM runs WHERE run_id = ?", "look up run", [&](Binder& b) { b.Int(run_id); },
      [&](sqlite3_stmt*) {
        found = true;
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return found;
}

Expected<std::vector<RunInfo>> SqliteStore::ListRuns() {
  std::vector<RunInfo> runs;
  Status st = Query(
      std::string("SELECT ") + kRunColumns + " FROM runs ORDER BY run_id", "list runs",
      [](Binder&) {},
      [&](sqlite3_stmt* s) {
        runs.push_back(ReadRunInfo(s));
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return runs;
}

Expected<std::vector<RunInfo>> SqliteStore::PreviousRunsNamed(const std::string& run_name,
                                                              int64_t before_run_id, int limit) {
  std::vector<RunInfo> runs;
  Status st = Query(
      std::string("SELECT ") + kRunColumns +
          " FROM runs WHERE run_name = ? AND run_id < ? AND status <> 'running'"
          " ORDER BY run_id DESC LIMIT ?",
      "read previous runs",
      [&](Binder& b) { b.Text(run_name).Int(before_run_id).Int(int64_t{limit < 0 ? -1 : limit}); },
      [&](sqlite3_stmt* s) {
        runs.push_back(ReadRunInfo(s));
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return runs;
}

namespace {

// Row readers shared by LoadRun and the light per-table loads.
constexpr const char* kStepsSql =
    "SELECT step, start_ns, end_ns, wait_ns, wait_source, forward_calls, backward_calls,"
    " optimizer_calls FROM steps WHERE run_id = ? ORDER BY step";
constexpr const char* kCommBucketsSql =
    "SELECT step, bucket, start_ns, end_ns, bytes FROM comm_buckets WHERE run_id = ?"
    " ORDER BY step, bucket, start_ns";

StepRow ReadStep(sqlite3_stmt* s) {
  Reader c(s);
  StepRow r;
  r.step = c.Int();
  r.start_ns = c.Int();
  r.end_ns = c.Int();
  r.wait_ns = c.OptInt();
  r.wait_source = c.OptText();
  r.forward_calls = c.Int();
  r.backward_calls = c.Int();
  r.optimizer_calls = c.Int();
  return r;
}

CommBucketRow ReadCommBucket(sqlite3_stmt* s) {
  Reader c(s);
  CommBucketRow r;
  r.step = c.Int();
  r.bucket = c.Int();
  r.start_ns = c.Int();
  r.end_ns = c.Int();
  r.bytes = c.OptInt();
  return r;
}

}  // namespace

Expected<std::vector<StepRow>> SqliteStore::LoadSteps(int64_t run_id) {
  std::vector<StepRow> rows;
  Status st = Query(kStepsSql, "load steps", [run_id](Binder& b) { b.Int(run_id); },
                    [&](sqlite3_stmt* s) {
                      rows.push_back(ReadStep(s));
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  return rows;
}

Expected<std::vector<CommBucketRow>> SqliteStore::LoadCommBuckets(int64_t run_id) {
  std::vector<CommBucketRow> rows;
  Status st = Query(kCommBucketsSql, "load comm_buckets", [run_id](Binder& b) { b.Int(run_id); },
                    [&](sqlite3_stmt* s) {
                      rows.push_back(ReadCommBucket(s));
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  return rows;
}

Expected<RunData> SqliteStore::LoadRun(int64_t run_id) {
  RunData d;
  bool found = false;
  auto by_run = [run_id](Binder& b) { b.Int(run_id); };
  auto ok = [] { return Status::Ok(); };

  Status st = Query(
      std::string("SELECT ") + kRunColumns + " FROM runs WHERE run_id = ?", "load run", by_run,
      [&](sqlite3_stmt* s) {
        d.run = ReadRunInfo(s);
        found = true;
        return ok();
      });
  if (!st.ok()) return st;
  if (!found) return Status::Error(path_ + ": no run " + std::to_string(run_id));

  // One (sql, reader) pair per table; the first error wins.
  auto load = [&](const char* sql, const char* purpose, auto each) {
    if (st.ok()) st = Query(sql, purpose, by_run, each);
  };
  // Sizes the long tables first (an indexed count), so that a long run's rows are not copied
  // through doubling vectors: that would briefly hold up to three times their memory.
  auto reserve = [&](auto& rows, const char* table) {
    if (!st.ok()) return;
    st = Query(
        std::string("SELECT count(*) FROM ") + table + " WHERE run_id = ?",
        std::string("count ") + table, by_run, [&](sqlite3_stmt* s) {
          rows.reserve(static_cast<size_t>(sqlite3_column_int64(s, 0)));
          return ok();
        });
  };
  reserve(d.steps, "steps");
  reserve(d.phases, "phases");
  reserve(d.gpu_samples_1s, "gpu_samples_1s");
  reserve(d.host_samples, "host_samples");
  reserve(d.worker_samples_10s, "worker_samples_10s");
  load(kStepsSql, "load steps", [&](sqlite3_stmt* s) {
    d.steps.push_back(ReadStep(s));
    return ok();
  });
  load(
      "SELECT step, name, wall_ns, gpu_ns, calls FROM phases WHERE run_id = ?"
      " ORDER BY step, name",
      "load phases", [&](sqlite3_stmt* s) {
        Reader c(s);
        PhaseRow& r = d.phases.emplace_back();
        r.step = c.Int();
        r.name = c.Text();
        r.wall_ns = c.Int();
        r.gpu_ns = c.OptInt();
        r.calls = c.Int();
        return ok();
      });
  load(
      "SELECT gpu_index, name, uuid, memory_total_bytes, sm_clock_max_mhz FROM gpus"
      " WHERE run_id = ? ORDER BY gpu_index",
      "load gpus", [&](sqlite3_stmt* s) {
        Reader c(s);
        GpuInfoRow& r = d.gpus.emplace_back();
        r.gpu_index = c.Int();
        r.name = c.OptText();
        r.uuid = c.OptText();
        r.memory_total_bytes = c.OptInt();
        r.sm_clock_max_mhz = c.OptInt();
        return ok();
      });
  load(
      "SELECT ts_ns, gpu_index, samples, util_samples, util_mean_pct, util_min_pct,"
      " util_max_pct, mem_util_mean_pct, mem_used_max_bytes, mem_total_bytes,"
      " proc_mem_max_bytes, power_samples, power_mean_mw, power_max_mw, temp_max_c,"
      " sm_clock_min_mhz, sm_clock_max_mhz, clock_reasons_or, thermal_samples,"
      " throttled_samples, throttled_by_reason_samples, throttled_temp_max_c,"
      " throttled_sm_clock_min_mhz, pcie_rx_samples, pcie_rx_mean_bps, pcie_rx_max_bps,"
      " pcie_rx_high_samples, pcie_tx_max_bps"
      " FROM gpu_samples_1s WHERE run_id = ? ORDER BY ts_ns, gpu_index",
      "load gpu_samples_1s", [&](sqlite3_stmt* s) {
        Reader c(s);
        GpuRollupRow& r = d.gpu_samples_1s.emplace_back();
        r.ts_ns = c.Int();
        r.gpu_index = c.Int();
        r.samples = c.Int();
        r.util_samples = c.Int();
        r.util_mean_pct = c.OptReal();
        r.util_min_pct = c.OptReal();
        r.util_max_pct = c.OptReal();
        r.mem_util_mean_pct = c.OptReal();
        r.mem_used_max_bytes = c.OptInt();
        r.mem_total_bytes = c.OptInt();
        r.proc_mem_max_bytes = c.OptInt();
        r.power_samples = c.Int();
        r.power_mean_mw = c.OptReal();
        r.power_max_mw = c.OptInt();
        r.temp_max_c = c.OptReal();
        r.sm_clock_min_mhz = c.OptInt();
        r.sm_clock_max_mhz = c.OptInt();
        r.clock_reasons_or = c.OptInt();
        r.thermal_samples = c.Int();
        r.throttled_samples = c.Int();
        r.throttled_by_reason_samples = c.Int();
        r.throttled_temp_max_c = c.OptReal();
        r.throttled_sm_clock_min_mhz = c.OptInt();
        r.pcie_rx_samples = c.Int();
        r.pcie_rx_mean_bps = c.OptReal();
        r.pcie_rx_max_bps = c.OptReal();
        r.pcie_rx_high_samples = c.Int();
        r.pcie_tx_max_bps = c.OptReal();
        return ok();
      });
  load(
      "SELECT ts_ns, cpu_pct, ncores, mem_used_bytes, mem_total_bytes, page_cache_bytes,"
      " swap_in_bps, disk_read_bps, disk_read_iops, proc_cpu_pct, proc_rss_bytes"
      " FROM host_samples WHERE run_id = ? ORDER BY ts_ns",
      "load host_samples", [&](sqlite3_stmt* s) {
        Reader c(s);
        HostSampleRow& r = d.host_samples.emplace_back();
        r.ts_ns = c.Int();
        r.cpu_pct = c.OptReal();
        r.ncores = c.OptInt();
        r.mem_used_bytes = c.OptInt();
        r.mem_total_bytes = c.OptInt();
        r.page_cache_bytes = c.OptInt();
        r.swap_in_bps = c.OptReal();
        r.disk_read_bps = c.OptReal();
        r.disk_read_iops = c.OptReal();
        r.proc_cpu_pct = c.OptReal();
        r.proc_rss_bytes = c.OptInt();
        return ok();
      });
  load(
      "SELECT ts_ns, pid, role, samples, cpu_samples, cpu_mean_pct, cpu_max_pct, rss_max_bytes"
      " FROM worker_samples_10s WHERE run_id = ? ORDER BY ts_ns, pid",
      "load worker_samples_10s", [&](sqlite3_stmt* s) {
        Reader c(s);
        WorkerRollupRow& r = d.worker_samples_10s.emplace_back();
        r.ts_ns = c.Int();
        r.pid = c.Int();
        r.role = c.Text();
        r.samples = c.Int();
        r.cpu_samples = c.Int();
        r.cpu_mean_pct = c.OptReal();
        r.cpu_max_pct = c.OptReal();
        r.rss_max_bytes = c.OptInt();
        return ok();
      });
  load(
      "SELECT window_start_ns, window_end_ns, name, calls, gpu_ns, source FROM kernels"
      " WHERE run_id = ? ORDER BY window_start_ns, name, source",
      "load kernels", [&](sqlite3_stmt* s) {
        Reader c(s);
        KernelRow& r = d.kernels.emplace_back();
        r.window_start_ns = c.Int();
        r.window_end_ns = c.Int();
        r.name = c.Text();
        r.calls = c.Int();
        r.gpu_ns = c.Int();
        r.source = c.Text();
        return ok();
      });
  load(kCommBucketsSql, "load comm_buckets", [&](sqlite3_stmt* s) {
    d.comm_buckets.push_back(ReadCommBucket(s));
    return ok();
  });
  // host_stalls and cpu_waits came after the first files were written: a file opened read-only
  // may predate them (no stall watch then: telemetry_status has no such source either).
  std::set<std::string> tables;
  if (st.ok()) {
    st = Query("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN "
               "('host_stalls', 'cpu_waits')",
               "look for host_stalls and cpu_waits", [](Binder&) {}, [&](sqlite3_stmt* s) {
                 tables.insert(Reader(s).Text());
                 return ok();
               });
  }
  if (tables.count("host_stalls")) {
    load("SELECT start_ns, duration_ns FROM host_stalls WHERE run_id = ? ORDER BY start_ns",
         "load host_stalls", [&](sqlite3_stmt* s) {
           Reader c(s);
           StallRow& r = d.stalls.emplace_back();
           r.start_ns = c.Int();
           r.duration_ns = c.Int();
           return ok();
         });
  }
  if (tables.count("cpu_waits")) {
    load("SELECT start_ns, end_ns, wait_ns FROM cpu_waits WHERE run_id = ? ORDER BY start_ns",
         "load cpu_waits", [&](sqlite3_stmt* s) {
           Reader c(s);
           CpuWaitRow& r = d.cpu_waits.emplace_back();
           r.start_ns = c.Int();
           r.end_ns = c.Int();
           r.wait_ns = c.Int();
           return ok();
         });
  }
  load(
      "SELECT source, available, backend, reason FROM telemetry_status WHERE run_id = ?"
      " ORDER BY source",
      "load telemetry_status", [&](sqlite3_stmt* s) {
        Reader c(s);
        TelemetryStatusRow& r = d.telemetry.emplace_back();
        r.source = c.Text();
        r.available = c.Int() != 0;
        r.backend = c.OptText();
        r.reason = c.OptText();
        return ok();
      });
  load(
      // Rows without a timestamp come first; equal timestamps keep insertion order.
      "SELECT ts_ns, level, source, message FROM diagnostics WHERE run_id = ?"
      " ORDER BY ts_ns, rowid",
      "load diagnostics", [&](sqlite3_stmt* s) {
        Reader c(s);
        DiagnosticRow& r = d.diagnostics.emplace_back();
        r.ts_ns = c.OptInt();
        r.level = c.Text();
        r.source = c.Text();
        r.message = c.Text();
        return ok();
      });
  load(
      "SELECT ordinal, rule_id, family, severity, message, fix, evidence_json FROM insights"
      " WHERE run_id = ? ORDER BY ordinal",
      "load insights", [&](sqlite3_stmt* s) {
        Reader c(s);
        InsightRow& r = d.insights.emplace_back();
        r.ordinal = c.Int();
        r.rule_id = c.Text();
        r.family = c.Text();
        r.severity = c.Text();
        r.message = c.Text();
        r.fix = c.OptText();
        r.evidence_json = c.OptText();
        return ok();
      });
  if (!st.ok()) return st;
  return d;
}

Expected<RawSamples> SqliteStore::LoadRawSamples(int64_t run_id) {
  Expected<bool> exists = RunExists(run_id);
  if (!exists) return exists.status();
  if (!*exists) return Status::Error(path_ + ": no run " + std::to_string(run_id));
  RawSamples raw;
  auto by_run = [run_id](Binder& b) { b.Int(run_id); };
  Status st = Query(
      "SELECT ts_ns, gpu_index, util_pct, mem_util_pct, mem_used_bytes, mem_total_bytes,"
      " proc_mem_bytes, power_mw, temp_c, sm_clock_mhz, clock_reasons, pcie_rx_bps, pcie_tx_bps"
      " FROM gpu_samples WHERE run_id = ? ORDER BY ts_ns, gpu_index",
      "load gpu_samples", by_run, [&](sqlite3_stmt* s) {
        Reader c(s);
        GpuSampleRow& r = raw.gpu_samples.emplace_back();
        r.ts_ns = c.Int();
        r.gpu_index = c.Int();
        r.util_pct = c.OptReal();
        r.mem_util_pct = c.OptReal();
        r.mem_used_bytes = c.OptInt();
        r.mem_total_bytes = c.OptInt();
        r.proc_mem_bytes = c.OptInt();
        r.power_mw = c.OptInt();
        r.temp_c = c.OptReal();
        r.sm_clock_mhz = c.OptInt();
        r.clock_reasons = c.OptInt();
        r.pcie_rx_bps = c.OptReal();
        r.pcie_tx_bps = c.OptReal();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  st = Query(
      "SELECT ts_ns, cpu_per_core FROM host_core_samples WHERE run_id = ? ORDER BY ts_ns, rowid",
      "load host_core_samples", by_run, [&](sqlite3_stmt* s) -> Status {
        Reader c(s);
        HostCoreRow& r = raw.host_cores.emplace_back();
        r.ts_ns = c.Int();
        const std::string cores = c.Text();
        nlohmann::json j = nlohmann::json::parse(cores, nullptr, /*allow_exceptions=*/false);
        if (!j.is_array()) {
          return Status::Error(path_ + ": load host_core_samples: cpu_per_core at ts_ns " +
                               std::to_string(r.ts_ns) + " is not a JSON array");
        }
        r.cpu_per_core.reserve(j.size());
        for (const auto& v : j) {
          // JSON has no NaN; nlohmann writes it as null.
          r.cpu_per_core.push_back(v.is_number() ? v.get<double>()
                                                 : std::numeric_limits<double>::quiet_NaN());
        }
        return Status::Ok();
      });
  if (!st.ok()) return st;
  st = Query(
      "SELECT ts_ns, pid, role, cpu_pct, rss_bytes FROM worker_samples WHERE run_id = ?"
      " ORDER BY ts_ns, pid",
      "load worker_samples", by_run, [&](sqlite3_stmt* s) {
        Reader c(s);
        WorkerSampleRow& r = raw.worker_samples.emplace_back();
        r.ts_ns = c.Int();
        r.pid = c.Int();
        r.role = c.Text();
        r.cpu_pct = c.OptReal();
        r.rss_bytes = c.OptInt();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return raw;
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
  static constexpr const char* kNames[] = {
      "steps",       "phases",       "phases",         "gpus",
      "gpu_samples", "host_samples", "worker_samples", "kernels",
      "comm_buckets", "telemetry_status", "diagnostics", "gpu_samples_1s",
      "worker_samples_10s", "host_stalls", "cpu_waits"};
  static_assert(std::size(kNames) == std::variant_size_v<Row>);
  return kNames[row.index()];
}

std::optional<int64_t> RowTime(const Row& row) {
  return std::visit(
      [](const auto& r) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, StepRow>) {
          return r.end_ns;
        } else if constexpr (std::is_same_v<T, KernelRow>) {
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
  Expected<std::unique_ptr<SqliteStore>> store = SqliteStore::Open(path, SqliteStore::Mode::kReadWrite);
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
  auto it = std::find_if(lost_.begin(), lost_.end(),
                         [&](const LostRows& l) { return l.table == table; });
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
