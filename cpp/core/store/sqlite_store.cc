// SQLite implementation of store schema v1: opening a file (creation, version check, upgrade),
// the run lifecycle and every read. The row writes, the WAL set-up and the StoreWriter thread
// are in sqlite_writer.cc. Contracts are documented in sqlite_store.h and docs/schema.md.
#include "store/sqlite_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "store/schema_sql.h"
#include "store/sqlite_internal.h"
#include "store/table_sql.h"

namespace gpuprof::store {

using sqlite_internal::Binder;
using sqlite_internal::kBusyTimeoutMs;
using sqlite_internal::Reader;
using sqlite_internal::Stmt;

namespace {

// Whether MissingSchema's entries name a kAdded column of `table` (an older file).
bool LacksAddedColumns(const std::vector<std::string>& missing, const std::string& table) {
  return std::any_of(missing.begin(), missing.end(), [&](const std::string& m) {
    return m.size() > table.size() && m.compare(0, table.size(), table) == 0 &&
           m[table.size()] == '.';
  });
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
  bool empty = false;  // no tables at all: a new database
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
        "writing), and SQLite needs to create " +
        path +
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

  if (Status st = store->EnableWal(); !st.ok()) return st;  // sqlite_writer.cc
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

// Entries: "table T" for the tables that came after the first files (host_stalls, cpu_waits,
// cpu_ops), "T.C" for each kAdded column (store/tables.h) that table T lacks.
Expected<std::vector<std::string>> SqliteStore::MissingSchema() {
  std::vector<std::string> missing;
  std::set<std::string> tables;
  Status st = Query(
      "SELECT name FROM sqlite_master WHERE type = 'table'", "read schema", [](Binder&) {},
      [&](sqlite3_stmt* s) {
        tables.insert(Reader(s).Text());
        return Status::Ok();
      });
  if (!st.ok()) return st;
  for (const char* t : {"host_stalls", "cpu_waits", "cpu_ops"}) {
    if (!tables.count(t)) missing.push_back(std::string("table ") + t);
  }
  std::map<std::string, std::set<std::string>> columns;  // of the tables with kAdded columns
  for (const sql::AddedColumn& a : sql::AddedColumns()) {
    // (no structured binding: clang before 16 cannot capture one in the lambdas below)
    const auto emplaced = columns.try_emplace(a.table);
    const auto it = emplaced.first;
    if (emplaced.second) {
      st = Query(
          "SELECT name FROM pragma_table_info(?)", std::string("read the ") + a.table + " columns",
          [&](Binder& b) { b.Text(it->first); },
          [&](sqlite3_stmt* s) {
            it->second.insert(Reader(s).Text());
            return Status::Ok();
          });
      if (!st.ok()) return st;
    }
    if (!it->second.count(a.column)) missing.push_back(std::string(a.table) + "." + a.column);
  }
  return missing;
}

Status SqliteStore::Upgrade() {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  if (missing->empty()) return Status::Ok();  // nothing to write: no write lock taken
  if (Status st = Begin(); !st.ok()) return st;
  // Another writer may have upgraded meanwhile: look again under the write lock, after the
  // missing tables are made (with every column).
  Status st = Exec(kSchemaSql, "add the tables this file lacks");
  if (st.ok()) {
    missing = MissingSchema();
    if (!missing) st = missing.status();
  }
  for (const sql::AddedColumn& a : sql::AddedColumns()) {
    const std::string name = std::string(a.table) + "." + a.column;
    if (!st.ok()) break;
    if (std::find(missing->begin(), missing->end(), name) == missing->end()) continue;
    st = Exec(
        ("ALTER TABLE " + std::string(a.table) + " ADD COLUMN " + a.column + " " + a.type).c_str(),
        "add column " + name);
  }
  if (!st.ok()) {
    Rollback();
    return st;
  }
  return Commit();
}

SqliteStore::~SqliteStore() {
  for (auto* stmts : {&row_stmts_, &many_stmts_}) {
    for (sqlite3_stmt*& stmt : *stmts) {
      sqlite3_finalize(stmt);
      stmt = nullptr;
    }
  }
  sqlite3_finalize(core_stmt_);
  core_stmt_ = nullptr;
  sqlite3_close_v2(db_);
}

// ---- run lifecycle ---------------------------------------------------------------------------

Expected<int64_t> SqliteStore::BeginRun(const RunInfo& info) {
  Stmt stmt;
  if (sqlite3_prepare_v2(db_, sql::InsertRunSql().c_str(), -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare insert into runs");
  }
  RunInfo row = info;
  if (row.gpuprof_version.empty()) row.gpuprof_version = GPUPROF_VERSION;
  Binder b(stmt.get());
  sql::Bind(b, row);
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
  if (sqlite3_prepare_v2(db_, sql::UpdateRunSql().c_str(), -1, stmt.out(), nullptr) != SQLITE_OK) {
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

// ---- team server ingest ----------------------------------------------------------------------

Expected<std::vector<std::pair<int64_t, double>>> SqliteStore::LoadSeries(
    int64_t run_id, const std::string& metric, int64_t gpu_index, int64_t from_ns, int64_t to_ns) {
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
      [](Reader& r) {
        return Point{r.Int(), r.Real()};
      });
}

Expected<std::optional<int64_t>> SqliteStore::IngestRunId(const std::string& run_uuid) {
  std::optional<int64_t> id;
  Status st = Query(
      sql::kIngestRunIdSql, "look up ingest run", [&](Binder& b) { b.Text(run_uuid); },
      [&](sqlite3_stmt* s) {
        id = sqlite3_column_int64(s, 0);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return id;
}

Status SqliteStore::InsertIngestRun(const std::string& run_uuid, int64_t run_id) {
  Stmt stmt;
  if (sqlite3_prepare_v2(db_, sql::kInsertIngestRunSql, -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare insert into ingest_runs");
  }
  Binder b(stmt.get());
  b.Text(run_uuid).Int(run_id);
  if (b.rc() != SQLITE_OK || sqlite3_step(stmt.get()) != SQLITE_DONE) {
    return Error("insert into ingest_runs");
  }
  return Status::Ok();
}

Expected<int64_t> SqliteStore::BeginIngestRun(const std::string& run_uuid, const RunInfo& info) {
  if (Status st = Begin(); !st.ok()) return st;
  auto id = BeginRun(info);
  if (!id) {
    Rollback();
    return id.status();
  }
  if (Status st = InsertIngestRun(run_uuid, *id); !st.ok()) {
    Rollback();
    return st;
  }
  if (Status st = Commit(); !st.ok()) return st;
  return *id;
}

// ---- reads -----------------------------------------------------------------------------------

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
  return Rows<RunInfo>(
      sql::Select<RunInfo>() + " ORDER BY run_id", "list runs", [](Binder&) {},
      [](Reader& c) { return sql::Read<RunInfo>(c); });
}

Expected<std::vector<RunInfo>> SqliteStore::PreviousRunsNamed(const std::string& run_name,
                                                              int64_t before_run_id, int limit) {
  return Rows<RunInfo>(
      sql::kPreviousRunsSql, "read previous runs",
      [&](Binder& b) { b.Text(run_name).Int(before_run_id).Int(sql::Limit(limit)); },
      [](Reader& c) { return sql::Read<RunInfo>(c); });
}

Expected<std::vector<StepRow>> SqliteStore::LoadSteps(int64_t run_id) {
  return Rows<StepRow>(
      sql::kStepsSql, "load steps", [run_id](Binder& b) { b.Int(run_id); },
      [](Reader& c) { return sql::Read<StepRow>(c); });
}

Expected<std::vector<CommBucketRow>> SqliteStore::LoadCommBuckets(int64_t run_id) {
  return Rows<CommBucketRow>(
      sql::kCommBucketsSql, "load comm_buckets", [run_id](Binder& b) { b.Int(run_id); },
      [](Reader& c) { return sql::Read<CommBucketRow>(c); });
}

Expected<std::vector<KernelRow>> SqliteStore::LoadKernels(int64_t run_id) {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  const bool added = !LacksAddedColumns(*missing, Table<KernelRow>::kName);
  return Rows<KernelRow>(
      added ? sql::kKernelsSql : sql::kKernelsOldSql, "load kernels",
      [run_id](Binder& b) { b.Int(run_id); },
      [added](Reader& c) { return sql::Read<KernelRow>(c, added); });
}

Expected<std::vector<CpuOpRow>> SqliteStore::LoadCpuOps(int64_t run_id) {
  Expected<std::vector<std::string>> missing = MissingSchema();
  if (!missing) return missing.status();
  if (std::find(missing->begin(), missing->end(), "table cpu_ops") != missing->end()) {
    return std::vector<CpuOpRow>{};
  }
  return Rows<CpuOpRow>(
      sql::kCpuOpsSql, "load cpu_ops", [run_id](Binder& b) { b.Int(run_id); },
      [](Reader& c) { return sql::Read<CpuOpRow>(c); });
}

Expected<std::vector<InsightRow>> SqliteStore::LoadInsights(int64_t run_id) {
  return Rows<InsightRow>(
      sql::kInsightsSql, "load insights", [run_id](Binder& b) { b.Int(run_id); },
      [](Reader& r) { return sql::Read<InsightRow>(r); });
}

Expected<std::vector<GpuRollupRow>> SqliteStore::LatestGpuSecond(int64_t run_id) {
  return Rows<GpuRollupRow>(
      sql::kLatestGpuSecondSql, "load the latest GPU second",
      [run_id](Binder& b) { b.Int(run_id).Int(run_id); },
      [](Reader& c) { return sql::ReadLatestGpu(c); });
}

Expected<int64_t> SqliteStore::DataVersion() {
  int64_t v = 0;
  Status st = Query(
      "PRAGMA data_version", "read data_version", [](Binder&) {},
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
        each(sql::ReadSeriesRow(c, true, kGpuSeriesColumns));
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
        each(sql::ReadSeriesRow(c, false, kHostSeriesColumns));
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
  return Rows<PhaseRow>(
      sql::kPhasesSql, "load phases", [&](Binder& b) { b.Int(run_id); },
      [](Reader& r) { return sql::Read<PhaseRow>(r); });
}

Expected<RunProgress> SqliteStore::LoadRunProgress(int64_t run_id) {
  auto progress = Rows<RunProgress>(
      sql::kRunProgressSql, "load run progress",
      [&](Binder& b) { b.Int(run_id).Int(run_id).Int(run_id).Int(run_id).Int(run_id); },
      [](Reader& r) { return sql::ReadRunProgress(r); });
  if (!progress) return progress.status();
  auto headline = Rows<InsightRow>(
      sql::kHeadlineSql, "load the headline insight", [&](Binder& b) { b.Int(run_id); },
      [](Reader& r) { return sql::Read<InsightRow>(r); });
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

  Status st =
      Query(sql::Select<RunInfo>() + " WHERE run_id = ?", "load run", by_run, [&](sqlite3_stmt* s) {
        sql::Read(Reader(s).Self(), d.run);
        found = true;
        return ok();
      });
  if (!st.ok()) return st;
  if (!found) return Status::Error(path_ + ": no run " + std::to_string(run_id));

  // host_stalls, cpu_waits, cpu_ops and the kAdded columns (kernels' launch columns) came after
  // the first files were written: a file opened read-only may predate them (then nothing of
  // theirs was recorded).
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
  ForEachTable([&](auto tag) {
    const char* table = Table<typename decltype(tag)::type>::kName;
    if (LacksAddedColumns(*missing, table) &&
        std::find(dialect.old_tables.begin(), dialect.old_tables.end(), table) ==
            dialect.old_tables.end()) {
      dialect.old_tables.push_back(table);
    }
  });
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

Expected<SqliteStore::RunRows> SqliteStore::LoadRunRows(int64_t run_id) {
  auto data = LoadRun(run_id);
  if (!data) return data.status();
  auto raw = LoadRawSamples(run_id);
  if (!raw) return raw.status();
  RunRows out;
  out.data = std::move(data).value();
  const RunData& d = out.data;
  std::vector<Row>& rows = out.rows;
  for (const auto& r : d.telemetry) rows.emplace_back(r);
  for (const auto& r : d.gpus) rows.emplace_back(r);
  for (const auto& r : d.steps) rows.emplace_back(r);
  for (const auto& r : d.phases) rows.emplace_back(r);
  std::map<int64_t, const std::vector<double>*> cores;
  for (const auto& c : raw->host_cores) cores[c.ts_ns] = &c.cpu_per_core;
  for (auto h : d.host_samples) {
    if (auto it = cores.find(h.ts_ns); it != cores.end()) h.cpu_per_core = *it->second;
    rows.emplace_back(std::move(h));
  }
  for (const auto& r : raw->gpu_samples) rows.emplace_back(r);
  for (const auto& r : d.gpu_samples_1s) rows.emplace_back(r);
  for (const auto& r : raw->worker_samples) rows.emplace_back(r);
  for (const auto& r : d.worker_samples_10s) rows.emplace_back(r);
  for (const auto& r : d.kernels) rows.emplace_back(r);
  for (const auto& r : d.cpu_ops) rows.emplace_back(r);
  for (const auto& r : d.comm_buckets) rows.emplace_back(r);
  for (const auto& r : d.stalls) rows.emplace_back(r);
  for (const auto& r : d.cpu_waits) rows.emplace_back(r);
  for (const auto& r : d.diagnostics) rows.emplace_back(r);
  return out;
}

Expected<RawSamples> SqliteStore::LoadRawSamples(int64_t run_id) {
  Expected<bool> exists = RunExists(run_id);
  if (!exists) return exists.status();
  if (!*exists) return Status::Error(path_ + ": no run " + std::to_string(run_id));
  RawSamples raw;
  auto by_run = [run_id](Binder& b) { b.Int(run_id); };
  Status st = Query(sql::Select<GpuSampleRow>() + " WHERE run_id = ? ORDER BY ts_ns, gpu_index",
                    "load gpu_samples", by_run, [&](sqlite3_stmt* s) {
                      Reader c(s);
                      sql::Read(c, raw.gpu_samples.emplace_back());
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
  st = Query(sql::Select<WorkerSampleRow>() + " WHERE run_id = ? ORDER BY ts_ns, pid",
             "load worker_samples", by_run, [&](sqlite3_stmt* s) {
               Reader c(s);
               sql::Read(c, raw.worker_samples.emplace_back());
               return Status::Ok();
             });
  if (!st.ok()) return st;
  return raw;
}

}  // namespace gpuprof::store
