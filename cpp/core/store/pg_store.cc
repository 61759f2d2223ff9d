// PostgreSQL implementation of store schema v1 (pg_store.h). The statements are table_sql.h's,
// shared with SqliteStore; values travel as text (doubles in their shortest exact form, so they
// read back bit for bit).
#include "store/pg_store.h"

#include <libpq-fe.h>

#include <charconv>
#include <chrono>
#include <cstring>
#include <map>
#include <type_traits>
#include <utility>
#include <variant>

#include "store/schema_sql.h"
#include "store/table_sql.h"

#ifndef GPUPROF_VERSION
#define GPUPROF_VERSION "unknown"
#endif

namespace gpuprof::store {

namespace {

// Serializes schema creation between servers starting at once on one database.
constexpr int64_t kSchemaLockKey = 0x6770'7072'6f66;  // "gpprof"
// Statements sent per pipeline round (their small replies must fit the socket buffers).
constexpr size_t kPipelineChunk = 256;
// PostgreSQL's SQLSTATE for a unique-key violation.
constexpr const char* kUniqueViolation = "23505";

struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// "?" placeholders -> "$1", "$2", ... (the shared SQL has no '?' inside a literal).
std::string Numbered(const std::string& sql) {
  std::string out;
  out.reserve(sql.size() + 32);
  int n = 0;
  for (char c : sql) {
    if (c == '?') {
      out += '$';
      out += std::to_string(++n);
    } else {
      out += c;
    }
  }
  return out;
}

std::string TrimmedMessage(const char* message) {
  std::string m = message ? message : "";
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

// Binds parameters 1, 2, 3, ... in call order as text; std::nullopt binds NULL. PostgreSQL text
// cannot hold a NUL byte: such a value fails the statement (error()) instead of being cut.
class PgBinder {
 public:
  PgBinder& Int(int64_t v) {
    values_.push_back(std::to_string(v));
    return *this;
  }
  PgBinder& Real(double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact; nan, inf
    values_.emplace_back(std::string(buf, r.ptr));
    return *this;
  }
  PgBinder& Text(const std::string& v) {
    if (v.find('\0') != std::string::npos && error_.empty()) {
      error_ = "a text value holds a NUL byte (PostgreSQL text cannot)";
    }
    values_.push_back(v);
    return *this;
  }
  PgBinder& Null() {
    values_.push_back(std::nullopt);
    return *this;
  }
  PgBinder& Int(const std::optional<int64_t>& v) { return v ? Int(*v) : Null(); }
  PgBinder& Real(const std::optional<double>& v) { return v ? Real(*v) : Null(); }
  PgBinder& Text(const std::optional<std::string>& v) { return v ? Text(*v) : Null(); }

  int size() const { return static_cast<int>(values_.size()); }
  // Pointers for libpq, valid while this binder lives unchanged.
  std::vector<const char*> Pointers() const {
    std::vector<const char*> p;
    p.reserve(values_.size());
    for (const auto& v : values_) p.push_back(v ? v->c_str() : nullptr);
    return p;
  }
  const std::string& error() const { return error_; }

 private:
  std::vector<std::optional<std::string>> values_;
  std::string error_;
};

// Reads result columns 0, 1, 2, ... of one row in call order; SQL NULL reads as std::nullopt.
class PgReader : public sql::NullableReads<PgReader> {
 public:
  PgReader(const PGresult* r, int row) : r_(r), row_(row) {}
  bool IsNull() const { return PQgetisnull(r_, row_, col_) != 0; }
  int64_t Int() {
    int64_t v = 0;
    const char* p = PQgetvalue(r_, row_, col_);
    std::from_chars(p, p + PQgetlength(r_, row_, col_++), v);
    return v;
  }
  double Real() {
    double v = 0;
    const char* p = PQgetvalue(r_, row_, col_);
    const int n = PQgetlength(r_, row_, col_++);
    // PostgreSQL writes NaN, Infinity, -Infinity; from_chars reads nan, inf, -inf.
    if (n > 0 && (p[0] == 'N' || p[0] == 'I' || (n > 1 && p[0] == '-' && p[1] == 'I'))) {
      return p[0] == 'N' ? std::numeric_limits<double>::quiet_NaN()
                         : (p[0] == '-' ? -1 : 1) * std::numeric_limits<double>::infinity();
    }
    std::from_chars(p, p + n, v);
    return v;
  }
  std::string Text() {
    const char* p = PQgetvalue(r_, row_, col_);
    const int n = PQgetlength(r_, row_, col_++);
    return std::string(p, static_cast<size_t>(n));
  }
  void Skip() { ++col_; }

 private:
  const PGresult* r_;
  int row_;
  int col_ = 0;
};

void IgnoreNotice(void*, const char*) {}  // "relation ... already exists, skipping"

bool Replace(std::string* s, const std::string& from, const std::string& to) {
  const size_t at = s->find(from);
  if (at == std::string::npos) return false;
  s->replace(at, from.size(), to);
  return true;
}

}  // namespace

bool IsPostgresUrl(const std::string& url) {
  return url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0;
}

std::string RedactPostgresUrl(const std::string& url) {
  std::string out;
  size_t from = 0;
  for (const auto& [begin, end] : UrlPasswordSpans(url)) {
    out += url.substr(from, begin - from) + "***";
    from = end;
  }
  return out + url.substr(from);
}

Expected<std::string> PgSchemaSql() {
  std::string s = kSchemaSql;
  bool ok = Replace(&s, "run_id           INTEGER PRIMARY KEY,",
                    "run_id           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,");
  ok = ok && Replace(&s, "CREATE TABLE IF NOT EXISTS diagnostics (\n",
                     "CREATE TABLE IF NOT EXISTS diagnostics (\n  seq     BIGINT GENERATED "
                     "ALWAYS AS IDENTITY,\n");
  if (!ok) return Status::Error("store/schema.sql changed: PgSchemaSql cannot translate it");
  // Byte order for every text column, as SQLite compares.
  std::string out;
  out.reserve(s.size() + 1024);
  for (size_t i = 0; i < s.size();) {
    const bool word_start =
        i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '_');
    if (word_start && s.compare(i, 4, "TEXT") == 0 &&
        (i + 4 == s.size() ||
         !(std::isalnum(static_cast<unsigned char>(s[i + 4])) || s[i + 4] == '_'))) {
      out += "TEXT COLLATE \"C\"";
      i += 4;
    } else {
      out += s[i++];
    }
  }
  return out;
}

// ---- one connection --------------------------------------------------------------------------

class PgStore::Conn {
 public:
  Conn(PGconn* c, const std::string& location) : c_(c), location_(location) {}
  ~Conn() { PQfinish(c_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool broken() const { return PQstatus(c_) != CONNECTION_OK; }
  int server_version() const { return PQserverVersion(c_); }

  // "<redacted url>: <purpose>: <server's message>".
  Status Error(const std::string& purpose, const PGresult* r = nullptr) const {
    const char* m = r ? PQresultErrorMessage(r) : nullptr;
    if (!m || !*m) m = PQerrorMessage(c_);
    return Status::Error(location_ + ": " + purpose + ": " + TrimmedMessage(m));
  }
  // "<redacted url>: <purpose>: <why>" for a refusal of our own.
  Status Refuse(const std::string& purpose, const std::string& why) const {
    return Status::Error(location_ + ": " + purpose + ": " + why);
  }
  static bool IsUniqueViolation(const PGresult* r) {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    return state && std::strcmp(state, kUniqueViolation) == 0;
  }

  // A statement without parameters (DDL, BEGIN/COMMIT); several may be separated by ';'.
  Status Exec(const std::string& sql, const std::string& purpose) {
    Result r(PQexec(c_, sql.c_str()));
    const auto st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return Error(purpose, r.get());
    return Status::Ok();
  }

  // The prepared statement for `sql` ('?' placeholders), prepared on first use.
  Expected<const std::string*> Prepared(const std::string& sql, const std::string& purpose) {
    auto it = prepared_.find(sql);
    if (it != prepared_.end()) return &it->second;
    std::string name = "g" + std::to_string(prepared_.size());
    Result r(PQprepare(c_, name.c_str(), Numbered(sql).c_str(), 0, nullptr));
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      return Error("prepare " + purpose, r.get());
    }
    return &prepared_.emplace(sql, std::move(name)).first->second;
  }

  // Runs `sql` with the binder's parameters; the result when it succeeded (*unique set when it
  // failed on a unique key, if asked).
  Expected<Result> Run(const std::string& sql, const std::string& purpose, const PgBinder& b,
                       bool* unique = nullptr) {
    if (!b.error().empty()) return Refuse(purpose, b.error());
    auto name = Prepared(sql, purpose);
    if (!name) return name.status();
    const std::vector<const char*> values = b.Pointers();
    Result r(PQexecPrepared(c_, (*name)->c_str(), b.size(), values.data(), nullptr, nullptr, 0));
    const auto st = r ? PQresultStatus(r.get()) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
      if (unique) *unique = IsUniqueViolation(r.get());
      return Error(purpose, r.get());
    }
    return r;
  }

  // Runs `sql` with bind(PgBinder&) and calls each(PgReader&) per result row.
  template <typename BindFn, typename RowFn>
  Status Query(const std::string& sql, const std::string& purpose, BindFn bind, RowFn each) {
    PgBinder b;
    bind(b);
    auto r = Run(sql, purpose, b);
    if (!r) return r.status();
    const int rows = PQntuples(r->get());
    for (int i = 0; i < rows; ++i) {
      PgReader c(r->get(), i);
      if (Status st = each(c); !st.ok()) return st;
    }
    return Status::Ok();
  }

  // Rows affected by a command result ("UPDATE 1" -> 1).
  static int64_t Affected(const PGresult* r) {
    int64_t n = 0;
    const char* p = PQcmdTuples(const_cast<PGresult*>(r));
    std::from_chars(p, p + std::strlen(p), n);
    return n;
  }

  // One statement of a pipelined batch.
  struct Queued {
    const std::string* name;
    const char* purpose;
    PgBinder binder;
  };

  // Sends the statements pipelined (kPipelineChunk per round trip), inside the caller's
  // transaction; the first failure is the result (the transaction is then aborted).
  Status Pipeline(const std::vector<Queued>& queued) {
    for (size_t begin = 0; begin < queued.size(); begin += kPipelineChunk) {
      const size_t end = std::min(queued.size(), begin + kPipelineChunk);
      if (PQenterPipelineMode(c_) != 1) return Error("enter pipeline mode");
      Status first;
      for (size_t i = begin; i < end; ++i) {
        const Queued& q = queued[i];
        const std::vector<const char*> values = q.binder.Pointers();
        if (PQsendQueryPrepared(c_, q.name->c_str(), q.binder.size(), values.data(), nullptr,
                                nullptr, 0) != 1) {
          first = Error(q.purpose);
          break;
        }
      }
      if (PQpipelineSync(c_) != 1 && first.ok()) first = Error("pipeline sync");
      // One result per statement sent (each followed by a NULL), then the sync's.
      size_t index = begin;
      int idle = 0;
      for (;;) {
        Result r(PQgetResult(c_));
        if (!r) {
          if (broken() || ++idle > 4) {
            if (first.ok()) first = Error("read pipeline results");
            break;
          }
          continue;
        }
        idle = 0;
        const auto st = PQresultStatus(r.get());
        if (st == PGRES_PIPELINE_SYNC) break;
        if (st == PGRES_FATAL_ERROR && first.ok()) {
          first = Error(index < end ? queued[index].purpose : "pipeline", r.get());
        }
        ++index;
      }
      PQexitPipelineMode(c_);
      if (!first.ok()) return first;
    }
    return Status::Ok();
  }

 private:
  PGconn* c_;
  const std::string& location_;
  std::map<std::string, std::string> prepared_;  // SQL -> statement name
};

// ---- pool ------------------------------------------------------------------------------------

PgStore::Lease::Lease(PgStore* store, std::unique_ptr<Conn> conn)
    : store_(store), conn_(std::move(conn)) {}

PgStore::Lease::~Lease() {
  if (conn_) store_->GiveBack(std::move(conn_));
}

PgStore::PgStore(std::string url, std::string location, Options options)
    : url_(std::move(url)), location_(std::move(location)), options_(options) {
  if (options_.pool_size == 0) options_.pool_size = 1;
}

PgStore::~PgStore() = default;

Expected<PgStore::Lease> PgStore::Borrow() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < options_.pool_size; });
    if (!idle_.empty()) {
      std::unique_ptr<Conn> c = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(c));
    }
    ++open_;
  }
  PGconn* c = PQconnectdb(url_.c_str());
  if (!c || PQstatus(c) != CONNECTION_OK) {
    const std::string why = TrimmedMessage(c ? PQerrorMessage(c) : "out of memory");
    PQfinish(c);
    {
      std::lock_guard lock(mu_);
      --open_;
    }
    cv_.notify_one();
    return Status::Error(location_ + ": connect: " + why);
  }
  PQsetNoticeProcessor(c, IgnoreNotice, nullptr);
  return Lease(this, std::make_unique<Conn>(c, location_));
}

void PgStore::GiveBack(std::unique_ptr<Conn> conn) {
  {
    std::lock_guard lock(mu_);
    if (conn->broken()) {
      --open_;  // dropped; the next Borrow connects afresh
    } else {
      idle_.push_back(std::move(conn));
    }
  }
  cv_.notify_one();
}

template <typename Fn>
Status PgStore::InTransaction(Conn& conn, Fn fn) {
  if (Status st = conn.Exec("BEGIN", "begin transaction"); !st.ok()) return st;
  Status st = fn(conn);
  if (st.ok()) st = conn.Exec("COMMIT", "commit");
  if (!st.ok()) conn.Exec("ROLLBACK", "roll back");  // keeps the first error
  return st;
}

// ---- open ------------------------------------------------------------------------------------

Expected<std::unique_ptr<PgStore>> PgStore::Open(const std::string& url, Options options) {
  if (!IsPostgresUrl(url)) {
    return Status::Error("'" + RedactPostgresUrl(url) + "' is not a postgres:// URL");
  }
  std::unique_ptr<PgStore> store(new PgStore(url, RedactPostgresUrl(url), options));
  auto lease = store->Borrow();
  if (!lease) return lease.status();
  Conn& c = **lease;
  if (c.server_version() < 100000) {  // identity columns, pipeline-capable protocol
    return Status::Error(store->location_ + ": PostgreSQL " +
                         std::to_string(c.server_version() / 10000) +
                         " is too old (gpuprof needs 10 or newer)");
  }
  // What the database holds: nothing of ours, gpuprof's tables (which schema version), or a
  // `runs` table of something else.
  auto inspect = [&](bool* has_runs, std::optional<std::string>* version) -> Status {
    *has_runs = false;
    version->reset();
    bool has_meta = false;
    Status st = c.Query(
        "SELECT to_regclass('runs') IS NOT NULL, to_regclass('meta') IS NOT NULL", "read schema",
        [](PgBinder&) {},
        [&](PgReader& r) {
          *has_runs = r.Text() == "t";
          has_meta = r.Text() == "t";
          return Status::Ok();
        });
    if (!st.ok() || !has_meta) return st;
    return c.Query(
        "SELECT value FROM meta WHERE key = 'schema_version'", "read meta", [](PgBinder&) {},
        [&](PgReader& r) {
          *version = r.Text();
          return Status::Ok();
        });
  };
  auto validate = [&](bool has_runs, const std::optional<std::string>& v) -> Status {
    if (!has_runs || !v) {
      return Status::Error(store->location_ +
                           ": not a gpuprof database (a runs table without gpuprof's "
                           "schema_version); use an empty database for gpuprof");
    }
    int64_t version = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), version);
    if (ec != std::errc() || end != v->data() + v->size() || version < 1) {
      return Status::Error(store->location_ + ": not a gpuprof database (schema_version '" + *v +
                           "')");
    }
    if (version > kSchemaVersion) {
      return Status::Error(store->location_ + " was written by a newer gpuprof (schema " +
                           std::to_string(version) + " > " + std::to_string(kSchemaVersion) +
                           "); upgrade gpuprof");
    }
    if (version < kSchemaVersion) {
      return Status::Error(store->location_ + " holds schema " + std::to_string(version) +
                           ", this gpuprof reads schema " + std::to_string(kSchemaVersion) +
                           " (no migration exists)");
    }
    return Status::Ok();
  };
  bool has_runs = false;
  std::optional<std::string> version;
  if (Status st = inspect(&has_runs, &version); !st.ok()) return st;
  // A database created before cpu_ops and the kAdded columns (store/tables.h: kernels' launch
  // columns) existed gets them (one server at a time, under the schema lock), so that this
  // build's writes and reads work.
  auto upgrade = [&]() -> Status {
    const std::vector<sql::AddedColumn> added = sql::AddedColumns();
    std::string pairs;
    for (const sql::AddedColumn& a : added) {
      pairs += std::string(pairs.empty() ? "" : ", ") + "('" + a.table + "', '" + a.column + "')";
    }
    const std::string has_added =
        added.empty() ? std::string("true")
                      : "(SELECT count(*) FROM information_schema.columns WHERE table_schema = "
                        "current_schema() AND (table_name, column_name) IN (" +
                            pairs + ")) = " + std::to_string(added.size());
    bool current = false;
    Status st = c.Query(
        "SELECT to_regclass('cpu_ops') IS NOT NULL AND " + has_added, "read schema",
        [](PgBinder&) {},
        [&](PgReader& r) {
          current = r.Text() == "t";
          return Status::Ok();
        });
    if (!st.ok() || current) return st;
    auto ddl = PgSchemaSql();
    if (!ddl) return ddl.status();
    std::string sql = *ddl;
    for (const sql::AddedColumn& a : added) {
      sql += std::string("ALTER TABLE ") + a.table + " ADD COLUMN IF NOT EXISTS " + a.column + " " +
             a.type + (std::string(a.type) == "TEXT" ? " COLLATE \"C\"" : "") + ";\n";
    }
    const std::string key = std::to_string(kSchemaLockKey);
    if (Status s = c.Exec("SELECT pg_advisory_lock(" + key + ")", "lock schema creation");
        !s.ok()) {
      return s;
    }
    st = store->InTransaction(
        c, [&](Conn& conn) { return conn.Exec(sql, "add what this database lacks"); });
    c.Exec("SELECT pg_advisory_unlock(" + key + ")", "unlock schema creation");
    return st;
  };
  if (has_runs || version) {
    if (Status st = validate(has_runs, version); !st.ok()) return st;
    if (options.create) {
      if (Status st = upgrade(); !st.ok()) return st;
    }
    return store;
  }
  if (!options.create) {
    return Status::Error(store->location_ +
                         ": no gpuprof schema in this database (gpuprof serve --storage-url "
                         "creates it)");
  }
  auto ddl = PgSchemaSql();
  if (!ddl) return ddl.status();
  // Another server may be creating it right now: one at a time (a session lock, taken before
  // the transaction, so that the transaction's start sees the other's committed tables), then
  // look again.
  const std::string key = std::to_string(kSchemaLockKey);
  if (Status s = c.Exec("SELECT pg_advisory_lock(" + key + ")", "lock schema creation"); !s.ok()) {
    return s;
  }
  Status st = store->InTransaction(c, [&](Conn& conn) -> Status {
    if (Status s = inspect(&has_runs, &version); !s.ok()) return s;
    if (has_runs || version) return validate(has_runs, version);
    if (Status s = conn.Exec(*ddl, "create schema v1"); !s.ok()) return s;
    for (const auto& [k, value] :
         {std::pair<std::string, std::string>{"schema_version", std::to_string(kSchemaVersion)},
          {"created_by", std::string("gpuprof ") + GPUPROF_VERSION}}) {
      PgBinder b;
      b.Text(k).Text(value);
      auto r = conn.Run("INSERT INTO meta(key, value) VALUES(?, ?)", "write meta", b);
      if (!r) return r.status();
    }
    return Status::Ok();
  });
  c.Exec("SELECT pg_advisory_unlock(" + key + ")", "unlock schema creation");
  if (!st.ok()) return st;
  return store;
}

template <typename T, typename BindFn, typename ReadFn>
Expected<std::vector<T>> PgStore::Rows(const std::string& sql, const std::string& purpose,
                                       BindFn bind, ReadFn read) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  std::vector<T> rows;
  Status st = (*lease)->Query(sql, purpose, bind, [&](PgReader& r) {
    rows.push_back(read(r));
    return Status::Ok();
  });
  if (!st.ok()) return st;
  return rows;
}

// ---- run lifecycle ---------------------------------------------------------------------------

Expected<int64_t> PgStore::BeginRun(const RunInfo& info) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  RunInfo row = info;
  if (row.gpuprof_version.empty()) row.gpuprof_version = GPUPROF_VERSION;
  PgBinder b;
  sql::Bind(b, row);
  auto r = (*lease)->Run(sql::InsertRunSql() + " RETURNING run_id", "insert into runs", b);
  if (!r) return r.status();
  return PgReader(r->get(), 0).Int();
}

Status PgStore::FinishRun(int64_t run_id, const std::string& status, std::optional<int64_t> end_ns,
                          const std::optional<std::string>& error) {
  if (status != "ok" && status != "failed") {
    return Status::Error(location_ + ": finish run " + std::to_string(run_id) + ": status '" +
                         status + "' is not ok or failed");
  }
  auto lease = Borrow();
  if (!lease) return lease.status();
  PgBinder b;
  b.Text(status).Int(end_ns).Text(error).Int(run_id);
  auto r = (*lease)->Run(sql::kFinishRunSql, "finish run", b);
  if (!r) return r.status();
  if (Conn::Affected(r->get()) == 0) {
    return Status::Error(location_ + ": finish run: no run " + std::to_string(run_id));
  }
  return Status::Ok();
}

Status PgStore::UpdateRunFields(const RunInfo& info) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  PgBinder b;
  sql::BindRunUpdate(b, info);
  auto r = (*lease)->Run(sql::UpdateRunSql(), "update run fields", b);
  if (!r) return r.status();
  if (Conn::Affected(r->get()) == 0) {
    return Status::Error(location_ + ": update run fields: no run " + std::to_string(info.run_id));
  }
  return Status::Ok();
}

namespace {

// The statements that write `rows` (and the insights, when given) for `run_id`, prepared on
// `conn`, ready for Conn::Pipeline.
template <typename Conn, typename Queued>
Status QueueRows(Conn& conn, int64_t run_id, const std::vector<Row>& rows,
                 const std::vector<InsightRow>* insights, std::vector<Queued>* out) {
  out->reserve(rows.size() + (insights ? insights->size() + 1 : 0));
  for (size_t at = 0; at < rows.size();) {
    const Row& row = rows[at];
    Status st = std::visit(
        [&](const auto& r) -> Status {
          using T = std::decay_t<decltype(r)>;
          const char* purpose = sql::WritePurpose<T>();
          if constexpr (sql::kMultiRowInsert<T>) {
            // A run of kRowsPerInsert rows of T: one statement
            if (sql::SameTableRun(rows.begin() + at, rows.end()) == sql::kRowsPerInsert) {
              auto name = conn.Prepared(sql::WriteManySql<T>(), purpose);
              if (!name) return name.status();
              Queued q{*name, purpose, {}};
              for (size_t i = 0; i < sql::kRowsPerInsert; ++i) {
                sql::BindRow(q.binder, run_id, std::get<T>(rows[at + i]));
              }
              out->push_back(std::move(q));
              at += sql::kRowsPerInsert;
              return Status::Ok();
            }
          }
          ++at;
          auto name = conn.Prepared(sql::WriteSql<T>(), purpose);
          if (!name) return name.status();
          Queued q{*name, purpose, {}};
          sql::BindRow(q.binder, run_id, r);
          out->push_back(std::move(q));
          if constexpr (std::is_same_v<T, HostSampleRow>) {
            if (!r.cpu_per_core.empty()) {
              static const std::string kCoresSql = sql::kHostCoresSql;
              auto core = conn.Prepared(kCoresSql, sql::kHostCoresPurpose);
              if (!core) return core.status();
              Queued c{*core, sql::kHostCoresPurpose, {}};
              c.binder.Int(run_id).Int(r.ts_ns).Text(sql::CoresToJson(r.cpu_per_core));
              out->push_back(std::move(c));
            }
          }
          return Status::Ok();
        },
        row);
    if (!st.ok()) return st;
  }
  if (insights) {
    auto del = conn.Prepared(sql::kDeleteInsightsSql, "delete insights");
    if (!del) return del.status();
    Queued d{*del, "delete insights", {}};
    d.binder.Int(run_id);
    out->push_back(std::move(d));
    auto ins = conn.Prepared(sql::WriteSql<InsightRow>(), "insert into insights");
    if (!ins) return ins.status();
    for (const InsightRow& i : *insights) {
      Queued q{*ins, "insert into insights", {}};
      sql::BindRow(q.binder, run_id, i);
      out->push_back(std::move(q));
    }
  }
  for (const auto& q : *out) {
    if (!q.binder.error().empty()) return conn.Refuse(q.purpose, q.binder.error());
  }
  return Status::Ok();
}

}  // namespace

Status PgStore::ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  return InTransaction(**lease, [&](Conn& c) -> Status {
    std::vector<Conn::Queued> queued;
    if (Status st = QueueRows(c, run_id, {}, &insights, &queued); !st.ok()) return st;
    return c.Pipeline(queued);
  });
}

Status PgStore::WriteRows(int64_t run_id, const std::vector<Row>& rows) {
  if (rows.empty()) return Status::Ok();
  auto lease = Borrow();
  if (!lease) return lease.status();
  return InTransaction(**lease, [&](Conn& c) -> Status {
    std::vector<Conn::Queued> queued;
    if (Status st = QueueRows(c, run_id, rows, nullptr, &queued); !st.ok()) return st;
    return c.Pipeline(queued);
  });
}

Status PgStore::WriteBatchOnce(int64_t run_id, const std::string& batch_id,
                               const std::vector<Row>& rows,
                               const std::vector<InsightRow>* insights, bool* duplicate) {
  *duplicate = false;
  auto lease = Borrow();
  if (!lease) return lease.status();
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  bool seen = false;
  Status st = InTransaction(**lease, [&](Conn& c) -> Status {
    // The batch's mark first: a concurrent request with the same id waits on this row's lock and
    // then finds it, so a batch is stored once even when its retry arrives mid-write.
    PgBinder b;
    b.Int(run_id).Text(batch_id).Int(static_cast<int64_t>(rows.size())).Int(now);
    auto mark = c.Run(std::string(sql::kInsertIngestBatchSql) + " ON CONFLICT DO NOTHING",
                      "insert into ingest_batches", b);
    if (!mark) return mark.status();
    if (Conn::Affected(mark->get()) == 0) {
      seen = true;
      return Status::Error("duplicate");  // rolls back (nothing was written)
    }
    std::vector<Conn::Queued> queued;
    if (Status s = QueueRows(c, run_id, rows, insights, &queued); !s.ok()) return s;
    return c.Pipeline(queued);
  });
  if (seen) {
    *duplicate = true;
    return Status::Ok();
  }
  return st;
}

Expected<std::optional<int64_t>> PgStore::IngestRunId(const std::string& run_uuid) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  std::optional<int64_t> id;
  Status st = (*lease)->Query(
      sql::kIngestRunIdSql, "look up ingest run", [&](PgBinder& b) { b.Text(run_uuid); },
      [&](PgReader& r) {
        id = r.Int();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return id;
}

Expected<int64_t> PgStore::BeginIngestRun(const std::string& run_uuid, const RunInfo& info) {
  std::optional<int64_t> id;
  bool taken = false;
  {
    auto lease = Borrow();
    if (!lease) return lease.status();
    RunInfo row = info;
    if (row.gpuprof_version.empty()) row.gpuprof_version = GPUPROF_VERSION;
    Status st = InTransaction(**lease, [&](Conn& c) -> Status {
      PgBinder b;
      sql::Bind(b, row);
      auto r = c.Run(sql::InsertRunSql() + " RETURNING run_id", "insert into runs", b);
      if (!r) return r.status();
      id = PgReader(r->get(), 0).Int();
      PgBinder m;
      m.Text(run_uuid).Int(*id);
      auto mark = c.Run(sql::kInsertIngestRunSql, "insert into ingest_runs", m, &taken);
      return mark ? Status::Ok() : mark.status();
    });
    if (st.ok()) return *id;
    if (!taken) return st;
  }
  // Another request created the run for this UUID at the same moment: that one is the run.
  auto existing = IngestRunId(run_uuid);
  if (!existing) return existing.status();
  if (!*existing) return Status::Error(location_ + ": insert into ingest_runs: lost a race");
  return **existing;
}

Expected<std::string> PgStore::KeepMetaValue(const std::string& key, const std::string& value) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  PgBinder b;
  b.Text(key).Text(value);
  auto ins = (*lease)->Run("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT DO NOTHING",
                           "write meta " + key, b);
  if (!ins) return ins.status();
  std::optional<std::string> stored;
  Status st = (*lease)->Query(
      "SELECT value FROM meta WHERE key = ?", "read meta " + key, [&](PgBinder& q) { q.Text(key); },
      [&](PgReader& r) {
        stored = r.Text();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  if (!stored) return Status::Error(location_ + ": read meta " + key + ": not there");
  return *stored;
}

// ---- reads -----------------------------------------------------------------------------------

Expected<std::vector<std::pair<int64_t, double>>> PgStore::LoadSeries(
    int64_t run_id, const std::string& metric, int64_t gpu_index, int64_t from_ns, int64_t to_ns) {
  const std::optional<SeriesColumn> column = SeriesMetric(metric);
  if (!column) {
    return Status::Error("no metric '" + metric + "' (metrics: " + MetricNames() + ")");
  }
  using Point = std::pair<int64_t, double>;
  return Rows<Point>(
      sql::SeriesSql(*column), "load series " + metric,
      [&](PgBinder& b) {
        b.Int(run_id).Int(from_ns).Int(to_ns);
        if (column->per_gpu) b.Int(gpu_index);
      },
      [](PgReader& r) {
        return Point{r.Int(), r.Real()};
      });
}

Expected<std::optional<int64_t>> PgStore::LatestRunId() {
  auto lease = Borrow();
  if (!lease) return lease.status();
  std::optional<int64_t> id;
  Status st = (*lease)->Query(
      "SELECT max(run_id) FROM runs", "read latest run id", [](PgBinder&) {},
      [&](PgReader& r) {
        id = r.OptInt();
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return id;
}

Expected<bool> PgStore::RunExists(int64_t run_id) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  bool found = false;
  Status st = (*lease)->Query(
      "SELECT 1 FROM runs WHERE run_id = ?", "look up run", [&](PgBinder& b) { b.Int(run_id); },
      [&](PgReader&) {
        found = true;
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return found;
}

Expected<std::vector<RunInfo>> PgStore::ListRuns() {
  return Rows<RunInfo>(
      sql::Select<RunInfo>() + " ORDER BY run_id", "list runs", [](PgBinder&) {},
      [](PgReader& r) { return sql::Read<RunInfo>(r); });
}

Expected<std::vector<RunInfo>> PgStore::PreviousRunsNamed(const std::string& run_name,
                                                          int64_t before_run_id, int limit) {
  return Rows<RunInfo>(
      sql::kPreviousRunsSql, "read previous runs",
      [&](PgBinder& b) { b.Text(run_name).Int(before_run_id).Int(sql::Limit(limit)); },
      [](PgReader& r) { return sql::Read<RunInfo>(r); });
}

Expected<RunData> PgStore::LoadRun(int64_t run_id) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  RunData d;
  // One snapshot for every table: a live run keeps being written while it is read.
  Conn& c = **lease;
  if (Status st = c.Exec("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "begin snapshot");
      !st.ok()) {
    return st;
  }
  auto body = [&]() -> Status {
    bool found = false;
    Status st = c.Query(
        sql::Select<RunInfo>() + " WHERE run_id = ?", "load run",
        [&](PgBinder& b) { b.Int(run_id); },
        [&](PgReader& r) {
          sql::Read(r, d.run);
          found = true;
          return Status::Ok();
        });
    if (!st.ok()) return st;
    if (!found) return Status::Error(location_ + ": no run " + std::to_string(run_id));
    sql::LoadDialect dialect;
    dialect.insertion_order = "seq";
    return sql::LoadRunTables([&](const std::string& text, const std::string& purpose, auto bind,
                                  auto each) { return c.Query(text, purpose, bind, each); },
                              run_id, dialect, d);
  };
  Status st = body();
  c.Exec(st.ok() ? "COMMIT" : "ROLLBACK", "end snapshot");
  if (!st.ok()) return st;
  return d;
}

Expected<std::vector<StepRow>> PgStore::LoadSteps(int64_t run_id) {
  return Rows<StepRow>(
      sql::kStepsSql, "load steps", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<StepRow>(r); });
}

Expected<std::vector<KernelRow>> PgStore::LoadKernels(int64_t run_id) {
  return Rows<KernelRow>(
      sql::kKernelsSql, "load kernels", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<KernelRow>(r); });
}

Expected<std::vector<CpuOpRow>> PgStore::LoadCpuOps(int64_t run_id) {
  return Rows<CpuOpRow>(
      sql::kCpuOpsSql, "load cpu_ops", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<CpuOpRow>(r); });
}

Expected<std::vector<InsightRow>> PgStore::LoadInsights(int64_t run_id) {
  return Rows<InsightRow>(
      sql::kInsightsSql, "load insights", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<InsightRow>(r); });
}

Expected<std::vector<GpuRollupRow>> PgStore::LatestGpuSecond(int64_t run_id) {
  return Rows<GpuRollupRow>(
      sql::kLatestGpuSecondSql, "load the latest GPU second",
      [&](PgBinder& b) { b.Int(run_id).Int(run_id); },
      [](PgReader& r) { return sql::ReadLatestGpu(r); });
}

Status PgStore::ScanGpuSeries(int64_t run_id, std::optional<int64_t> gpu, int64_t from_ns,
                              int64_t to_ns, const SeriesRowFn& each) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  return (*lease)->Query(
      sql::GpuSeriesSql(gpu.has_value()), "scan GPU series",
      [&](PgBinder& b) {
        b.Int(run_id).Int(from_ns).Int(to_ns);
        if (gpu) b.Int(*gpu);
      },
      [&](PgReader& r) {
        each(sql::ReadSeriesRow(r, true, kGpuSeriesColumns));
        return Status::Ok();
      });
}

Status PgStore::ScanHostSeries(int64_t run_id, int64_t from_ns, int64_t to_ns,
                               const SeriesRowFn& each) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  return (*lease)->Query(
      sql::kHostSeriesSql, "scan host series",
      [&](PgBinder& b) { b.Int(run_id).Int(from_ns).Int(to_ns); },
      [&](PgReader& r) {
        each(sql::ReadSeriesRow(r, false, kHostSeriesColumns));
        return Status::Ok();
      });
}

Status PgStore::ScanStepBreakdown(int64_t run_id, const StepBreakdownFn& each) {
  auto lease = Borrow();
  if (!lease) return lease.status();
  return sql::ScanStepBreakdownWith(
      [&](const char* sql, const char* purpose, auto bind, auto row) {
        return (*lease)->Query(sql, purpose, bind, [&](PgReader& r) { return row(r); });
      },
      run_id, each);
}

Expected<std::vector<PhaseRow>> PgStore::LoadPhases(int64_t run_id) {
  return Rows<PhaseRow>(
      sql::kPhasesSql, "load phases", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<PhaseRow>(r); });
}

Expected<RunProgress> PgStore::LoadRunProgress(int64_t run_id) {
  auto progress = Rows<RunProgress>(
      sql::kRunProgressSql, "load run progress",
      [&](PgBinder& b) { b.Int(run_id).Int(run_id).Int(run_id).Int(run_id).Int(run_id); },
      [](PgReader& r) { return sql::ReadRunProgress(r); });
  if (!progress) return progress.status();
  auto headline = Rows<InsightRow>(
      sql::kHeadlineSql, "load the headline insight", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<InsightRow>(r); });
  if (!headline) return headline.status();
  RunProgress p = progress->empty() ? RunProgress{} : progress->front();
  if (!headline->empty()) p.headline = headline->front();
  return p;
}

Expected<std::vector<CommBucketRow>> PgStore::LoadCommBuckets(int64_t run_id) {
  return Rows<CommBucketRow>(
      sql::kCommBucketsSql, "load comm_buckets", [&](PgBinder& b) { b.Int(run_id); },
      [](PgReader& r) { return sql::Read<CommBucketRow>(r); });
}

}  // namespace gpuprof::store
