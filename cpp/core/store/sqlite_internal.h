// What the two halves of SqliteStore share (sqlite_store.cc: open, schema, run lifecycle and
// reads; sqlite_writer.cc: row writes, WAL set-up and the StoreWriter thread): statement
// ownership, the binder and reader that store/table_sql.h's templates drive, and Query.
// Internal to gpuprof_store: include only from those two files.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>

#include "store/sqlite_store.h"
#include "store/table_sql.h"

#ifndef GPUPROF_VERSION
#define GPUPROF_VERSION "unknown"
#endif

namespace gpuprof::store::sqlite_internal {

// How long a write waits for another connection's lock by default.
inline constexpr int kBusyTimeoutMs = 5000;

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
    return Check(
        sqlite3_bind_text(stmt_, ++index_, v.data(), static_cast<int>(v.size()), SQLITE_STATIC));
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

// Reads result columns 0, 1, 2, ... in call order; SQL NULL reads as std::nullopt (Int() and
// Text() of a NULL: 0 and "").
class Reader : public sql::NullableReads<Reader> {
 public:
  explicit Reader(sqlite3_stmt* stmt) : stmt_(stmt) {}
  Reader& Self() { return *this; }  // a temporary as an lvalue: Read(Reader(s).Self(), row)
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

}  // namespace gpuprof::store::sqlite_internal

namespace gpuprof::store {

// Runs `sql` with `bind(Binder&)` and calls `each(sqlite3_stmt*)` per result row.
template <typename BindFn, typename RowFn>
Status SqliteStore::Query(const std::string& sql, const std::string& purpose, BindFn bind,
                          RowFn each) {
  sqlite_internal::Stmt stmt;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, stmt.out(), nullptr) != SQLITE_OK) {
    return Error("prepare " + purpose);
  }
  sqlite_internal::Binder b(stmt.get());
  bind(b);
  if (b.rc() != SQLITE_OK) return Error(purpose);
  int rc;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    if (Status st = each(stmt.get()); !st.ok()) return st;
  }
  if (rc != SQLITE_DONE) return Error(purpose);
  return Status::Ok();
}

}  // namespace gpuprof::store
