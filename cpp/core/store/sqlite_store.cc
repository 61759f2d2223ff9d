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
#include "store/table_sql.h"

#ifndef GPUPROF_VERSION
#define GPUPROF_VERSION "unknown"
#endif

namespace gpuprof::store {

using sql::CoresToJson;
using sql::kCommBucketsSql;
using sql::kRunColumns;
using sql::kStepsSql;
using sql::ReadCommBucket;
using sql::ReadRunInfo;
using sql::ReadStep;
using sql::RowTraits;
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
class Reader : public sql::NullableReads<Reader> {
 public:
  explicit Reader(sqlite3_stmt* stmt) : stmt_(stmt) {}
  Reader& Self() { return *this; }  // a temporary as an lvalue: ReadStep(Reader(s).Self())
  bool IsNull() const { return sqlite3_column_type(stmt_, index_) == SQLITE_NULL; }
  int64_t Int() { return sqlite3_column_int64(stmt_, index_++); }
  double Real() { return sqlite3_column_double(stmt_, index_++); }
  std::string Text() {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index_));
    int n = sqlite3_column_bytes(stmt_, index_++);
    return p ? std::string(p, static_cast<size_t>(n)) : std::string();
  }
  void Skip() { ++index_; }

 private:
  sqlite3_stmt* stmt_;
  int index_ = 0;
};

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
  if (!fs->empty) {
    if (Status st = store->Upgrade(); !st.ok()) return st;
    return store;
  }

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

Expected<std::vector<std::string>> SqliteStore::MissingSchema() {
  std::vector<std::string> missing;
  std::set<std::string> tables, kernel_columns;
  Status st = Query("SELECT name FROM sqlite_master WHERE type = 'table'", "read schema",
                    [](Binder&) {}, [&](sqlite3_stmt* s) {
                      tables.insert(Reader(s).Text());
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  st = Query("SELECT name FROM pragma_table_info('kernels')", "read the kernels columns",
             [](Binder&) {}, [&](sqlite3_stmt* s) {
               kernel_columns.insert(Reader(s).Text());
               return Status::Ok();
             });
  if (!st.ok()) return st;
  for (const char* t : {"host_stalls", "cpu_waits", "cpu_ops"}) {
    if (!tables.count(t)) missing.push_back(std::string("table ") + t);
  }
  for (const auto& [column, type] : sql::kKernelLaunchColumns) {
    if (!kernel_columns.count(column)) missing.push_back(std::string("kernels.") + column);
  }
  return missing;
}

Status SqliteStore::Upgrade() {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  if (missing->empty()) return Status::Ok();  // nothing to write: no write lock taken
  if (Status st = Begin(); !st.ok()) return st;
  // Another writer may have upgraded meanwhile: look again under the write lock.
  missing = MissingSchema();
  Status st = missing.ok() ? Exec(kSchemaSql, "add the tables this file lacks")
                           : missing.status();
  for (size_t i = 0; st.ok() && i < missing->size(); ++i) {
    const std::string& m = (*missing)[i];
    if (m.rfind("kernels.", 0) != 0) continue;
    for (const auto& [column, type] : sql::kKernelLaunchColumns) {
      if (m == std::string("kernels.") + column) {
        st = Exec(("ALTER TABLE kernels ADD COLUMN " + std::string(column) + " " + type).c_str(),
                  "add column kernels." + std::string(column));
      }
    }
  }
  if (!st.ok()) {
    Rollback();
    return st;
  }
  return Commit();
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
  if (sqlite3_prepare_v2(db_, sql::kInsertRunSql, -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare insert into runs");
  }
  const std::string version = info.gpuprof_version.empty() ? GPUPROF_VERSION : info.gpuprof_version;
  Binder b(stmt.get());
  sql::BindRunInsert(b, info, version);
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
  if (sqlite3_prepare_v2(db_, sql::kFinishRunSql, -1, stmt.out(), nullptr) != SQLITE_OK) {
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
  if (sqlite3_prepare_v2(db_, sql::kUpdateRunSql, -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare update run fields");
  }
  Binder b(stmt.get());
  sql::BindRunUpdate(b, info);
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
    if (sqlite3_prepare_v2(db_, sql::kDeleteInsightsSql, -1, del.out(), nullptr) != SQLITE_OK) {
      return fail("prepare delete insights");
    }
    Binder(del.get()).Int(run_id);
    if (sqlite3_step(del.get()) != SQLITE_DONE) return fail("delete insights");
  }
  Stmt ins;
  if (sqlite3_prepare_v2(db_, sql::kInsertInsightSql, -1, ins.out(), nullptr) != SQLITE_OK) {
    return fail("prepare insert into insights");
  }
  for (const InsightRow& r : insights) {
    Binder b(ins.get());
    sql::BindInsight(b, run_id, r);
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
  const std::optional<SeriesColumn> c = SeriesMetric(metric);
  if (!c) {
    return Status::Error("no metric '" + metric + "' (metrics: " + MetricNames() + ")");
  }
  using Point = std::pair<int64_t, double>;
  return Rows<Point>(
      sql::SeriesSql(*c), "load series " + metric,
      [&](Binder& b) {
        b.Int(run_id).Int(from_ns).Int(to_ns);
        if (c->per_gpu) b.Int(gpu_index);
      },
      [](Reader& r) { return Point{r.Int(), r.Real()}; });
}

Expected<std::optional<int64_t>> SqliteStore::IngestRunId(const std::string& run_uuid) {
  std::optional<int64_t> id;
  Status st = Query(sql::kIngestRunIdSql, "look up ingest run",
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
  if (sqlite3_prepare_v2(db_, sql::kInsertIngestRunSql, -1, stmt.out(), nullptr) != SQLITE_OK) {
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
  Status st = Query(sql::kIngestBatchSeenSql,
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

Status SqliteStore::ReplaceKernels(int64_t run_id, const std::string& source,
                                   const std::vector<Row>& rows) {
  if (Status st = Begin(); !st.ok()) return st;
  Stmt del;
  if (sqlite3_prepare_v2(db_, "DELETE FROM kernels WHERE run_id = ? AND source = ?", -1,
                         del.out(), nullptr) != SQLITE_OK) {
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

template <typename T, typename BindFn, typename ReadFn>
Expected<std::vector<T>> SqliteStore::Rows(const std::string& sql, const std::string& purpose,
                                           BindFn bind, ReadFn read) {
  std::vector<T> rows;
  Status st = Query(sql, purpose, bind, [&](sqlite3_stmt* s) {
    Reader c(s);
    rows.push_back(read(c));
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return rows;
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
  return Rows<RunInfo>(std::string("SELECT ") + kRunColumns + " FROM runs ORDER BY run_id",
                       "list runs", [](Binder&) {}, [](Reader& c) { return ReadRunInfo(c); });
}

Expected<std::vector<RunInfo>> SqliteStore::PreviousRunsNamed(const std::string& run_name,
                                                              int64_t before_run_id, int limit) {
  return Rows<RunInfo>(
      sql::kPreviousRunsSql, "read previous runs",
      [&](Binder& b) { b.Text(run_name).Int(before_run_id).Int(sql::Limit(limit)); },
      [](Reader& c) { return ReadRunInfo(c); });
}


Expected<std::vector<StepRow>> SqliteStore::LoadSteps(int64_t run_id) {
  return Rows<StepRow>(kStepsSql, "load steps", [run_id](Binder& b) { b.Int(run_id); },
                       [](Reader& c) { return ReadStep(c); });
}

Expected<std::vector<CommBucketRow>> SqliteStore::LoadCommBuckets(int64_t run_id) {
  return Rows<CommBucketRow>(kCommBucketsSql, "load comm_buckets",
                             [run_id](Binder& b) { b.Int(run_id); },
                             [](Reader& c) { return ReadCommBucket(c); });
}

Expected<std::vector<KernelRow>> SqliteStore::LoadKernels(int64_t run_id) {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  const bool launch =
      std::find(missing->begin(), missing->end(), "kernels.step") == missing->end();
  return Rows<KernelRow>(launch ? sql::kKernelsSql : sql::kKernelsOldSql, "load kernels",
                         [run_id](Binder& b) { b.Int(run_id); },
                         [launch](Reader& c) { return sql::ReadKernel(c, launch); });
}

Expected<std::vector<CpuOpRow>> SqliteStore::LoadCpuOps(int64_t run_id) {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  if (std::find(missing->begin(), missing->end(), "table cpu_ops") != missing->end()) {
    return std::vector<CpuOpRow>{};
  }
  return Rows<CpuOpRow>(sql::kCpuOpsSql, "load cpu_ops", [run_id](Binder& b) { b.Int(run_id); },
                        [](Reader& c) { return sql::ReadCpuOp(c); });
}

Expected<std::vector<GpuRollupRow>> SqliteStore::LatestGpuSecond(int64_t run_id) {
  return Rows<GpuRollupRow>(sql::kLatestGpuSecondSql, "load the latest GPU second",
                            [run_id](Binder& b) { b.Int(run_id).Int(run_id); },
                            [](Reader& c) { return sql::ReadLatestGpu(c); });
}

Expected<int64_t> SqliteStore::DataVersion() {
  int64_t v = 0;
  Status st = Query("PRAGMA data_version", "read data_version", [](Binder&) {},
                    [&](sqlite3_stmt* s) {
                      v = sqlite3_column_int64(s, 0);
                      return Status::Ok();
                    });
  if (!st.ok()) return st;
  return v;
}

Status SqliteStore::ScanGpuSeries(int64_t run_id, std::optional<int64_t> gpu, int64_t from_ns,
                                  int64_t to_ns, const SeriesRowFn& each) {
  return Query(
      sql::GpuSeriesSql(gpu.has_value()), "scan GPU series",
      [&](Binder& b) {
        b.Int(run_id).Int(from_ns).Int(to_ns);
        if (gpu) b.Int(*gpu);
      },
      [&](sqlite3_stmt* s) {
        Reader c(s);
        each(sql::ReadSeriesRow(c, true, 4));
        return Status::Ok();
      });
}

Status SqliteStore::ScanHostSeries(int64_t run_id, int64_t from_ns, int64_t to_ns,
                                   const SeriesRowFn& each) {
  return Query(
      sql::kHostSeriesSql, "scan host series",
      [&](Binder& b) { b.Int(run_id).Int(from_ns).Int(to_ns); },
      [&](sqlite3_stmt* s) {
        Reader c(s);
        each(sql::ReadSeriesRow(c, false, 5));
        return Status::Ok();
      });
}

Status SqliteStore::ScanStepBreakdown(int64_t run_id, const StepBreakdownFn& each) {
  return sql::ScanStepBreakdownWith(
      [&](const char* sql, const char* purpose, auto bind, auto row) {
        return Query(sql, purpose, bind, [&](sqlite3_stmt* s) {
          Reader c(s);
          return row(c);
        });
      },
      run_id, each);
}

Expected<std::vector<PhaseRow>> SqliteStore::LoadPhases(int64_t run_id) {
  return Rows<PhaseRow>(sql::kPhasesSql, "load phases", [&](Binder& b) { b.Int(run_id); },
                        [](Reader& r) { return sql::ReadPhase(r); });
}

Expected<RunProgress> SqliteStore::LoadRunProgress(int64_t run_id) {
  auto progress = Rows<RunProgress>(
      sql::kRunProgressSql, "load run progress",
      [&](Binder& b) { b.Int(run_id).Int(run_id).Int(run_id).Int(run_id).Int(run_id); },
      [](Reader& r) { return sql::ReadRunProgress(r); });
  if (!progress) return progress.status();
  auto headline = Rows<InsightRow>(sql::kHeadlineSql, "load the headline insight",
                                   [&](Binder& b) { b.Int(run_id); },
                                   [](Reader& r) { return sql::ReadInsight(r); });
  if (!headline) return headline.status();
  RunProgress p = progress->empty() ? RunProgress{} : progress->front();
  if (!headline->empty()) p.headline = headline->front();
  return p;
}

Expected<RunData> SqliteStore::LoadRun(int64_t run_id) {
  RunData d;
  bool found = false;
  auto by_run = [run_id](Binder& b) { b.Int(run_id); };
  auto ok = [] { return Status::Ok(); };

  Status st = Query(
      std::string("SELECT ") + kRunColumns + " FROM runs WHERE run_id = ?", "load run", by_run,
      [&](sqlite3_stmt* s) {
        d.run = ReadRunInfo(Reader(s).Self());
        found = true;
        return ok();
      });
  if (!st.ok()) return st;
  if (!found) return Status::Error(path_ + ": no run " + std::to_string(run_id));

  // host_stalls, cpu_waits, cpu_ops and kernels' launch columns came after the first files were
  // written: a file opened read-only may predate them (then nothing of theirs was recorded).
  sql::LoadDialect dialect;
  dialect.insertion_order = "rowid";
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  auto lacks = [&](const std::string& what) {
    return std::find(missing->begin(), missing->end(), what) != missing->end();
  };
  const int stall_tables =
      (lacks("table host_stalls") ? 0 : 1) + (lacks("table cpu_waits") ? 0 : 1);
  dialect.has_cpu_ops_table = !lacks("table cpu_ops");
  dialect.has_kernel_launch_columns = !lacks("kernels.step");
  dialect.has_stalls_tables = stall_tables == 2;
  st = sql::LoadRunTables(
      [this](const std::string& sql, const std::string& purpose, auto bind, auto each) {
        return Query(sql, purpose, bind, [&](sqlite3_stmt* s) {
          Reader c(s);
          return each(c);
        });
      },
      run_id, dialect, d);
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
      "worker_samples_10s", "host_stalls", "cpu_waits", "cpu_ops"};
  static_assert(std::size(kNames) == std::variant_size_v<Row>);
  return kNames[row.index()];
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
