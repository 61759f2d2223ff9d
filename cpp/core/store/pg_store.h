// PostgreSQL store for schema v1 (a team server's storage: `gpuprof serve --storage-url
// postgres://...`, `gpuprof insights --storage-url postgres://...`). The same tables, SQL and
// orderings as SqliteStore (store/table_sql.h); the DDL is store/schema.sql with three
// translations (pg_store.cc: PgSchemaSql). Built only where libpq is (GPUPROF_WITH_POSTGRES).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/run_store.h"
#include "util/status.h"

namespace gpuprof::store {

// postgres:// or postgresql://
bool IsPostgresUrl(const std::string& url);
// The URL with its passwords replaced by "***" (user:***@host, password=***: UrlPasswordSpans),
// for every message and log line.
std::string RedactPostgresUrl(const std::string& url);
// store/schema.sql as PostgreSQL DDL: runs.run_id an identity column, diagnostics with a `seq`
// identity column (insertion order, SQLite's rowid), every TEXT column COLLATE "C" (orderings by
// name compare bytes, as SQLite does). An error when the schema no longer has what it rewrites.
Expected<std::string> PgSchemaSql();

// A pool of connections to one database; every call borrows one for its duration, so one
// object serves many threads at once (thread_safe()). Writes run in a transaction on one
// connection; a batch's rows are pipelined (libpq pipeline mode), not one round trip each.
class PgStore final : public RunStore {
 public:
  struct Options {
    size_t pool_size = 4;  // connections open at most; a caller waits for a free one
    bool create = true;    // create the schema in an empty database
  };

  // Connects, checks (or, in an empty database, creates) the schema: a database of another
  // schema version ("written by a newer gpuprof (schema 7 > 1); upgrade gpuprof"), or one with a
  // `runs` table that is not gpuprof's, is refused untouched. Errors name the redacted URL.
  static Expected<std::unique_ptr<PgStore>> Open(const std::string& url, Options options);
  static Expected<std::unique_ptr<PgStore>> Open(const std::string& url) {
    return Open(url, Options{});
  }
  ~PgStore() override;
  PgStore(const PgStore&) = delete;
  PgStore& operator=(const PgStore&) = delete;

  const std::string& location() const override { return location_; }
  bool thread_safe() const override { return true; }

  Expected<int64_t> BeginRun(const RunInfo& info) override;
  Status FinishRun(int64_t run_id, const std::string& status, std::optional<int64_t> end_ns,
                   const std::optional<std::string>& error) override;
  Status UpdateRunFields(const RunInfo& info) override;
  Status ReplaceInsights(int64_t run_id, const std::vector<InsightRow>& insights) override;
  Status WriteRows(int64_t run_id, const std::vector<Row>& rows) override;
  Status WriteBatchOnce(int64_t run_id, const std::string& batch_id, const std::vector<Row>& rows,
                        const std::vector<InsightRow>* insights, bool* duplicate) override;
  Expected<std::optional<int64_t>> IngestRunId(const std::string& run_uuid) override;
  Expected<int64_t> BeginIngestRun(const std::string& run_uuid, const RunInfo& info) override;
  Expected<std::vector<std::pair<int64_t, double>>> LoadSeries(int64_t run_id,
                                                               const std::string& metric,
                                                               int64_t gpu_index, int64_t from_ns,
                                                               int64_t to_ns) override;
  Expected<std::optional<int64_t>> LatestRunId() override;
  Expected<bool> RunExists(int64_t run_id) override;
  Expected<std::vector<RunInfo>> ListRuns() override;
  Expected<std::vector<RunInfo>> PreviousRunsNamed(const std::string& run_name,
                                                   int64_t before_run_id, int limit) override;
  Expected<RunData> LoadRun(int64_t run_id) override;
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

  // The meta table's `key`: its stored value, or `value` stored now when there is none (first
  // writer wins when several servers start at once). The team server keeps its session-signing
  // secret here when no --secret-file is given, so every server on the database signs alike.
  Expected<std::string> KeepMetaValue(const std::string& key, const std::string& value);

  class Conn;  // one libpq connection with its prepared statements (pg_store.cc)

 private:
  // A borrowed connection, given back when it goes out of scope (dropped when broken).
  class Lease {
   public:
    Lease(PgStore* store, std::unique_ptr<Conn> conn);
    ~Lease();
    Lease(Lease&&) = default;
    Conn* operator->() const { return conn_.get(); }
    Conn& operator*() const { return *conn_; }

   private:
    PgStore* store_;
    std::unique_ptr<Conn> conn_;
  };

  PgStore(std::string url, std::string location, Options options);
  Expected<Lease> Borrow();
  void GiveBack(std::unique_ptr<Conn> conn);
  // Runs fn(conn) inside BEGIN ... COMMIT (ROLLBACK when fn or the commit fails).
  template <typename Fn>
  Status InTransaction(Conn& conn, Fn fn);
  // Every row `sql` gives on a borrowed connection, each made by read(PgReader&).
  template <typename T, typename BindFn, typename ReadFn>
  Expected<std::vector<T>> Rows(const std::string& sql, const std::string& purpose, BindFn bind,
                                ReadFn read);

  const std::string url_;
  const std::string location_;
  Options options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;  // guarded by mu_
  size_t open_ = 0;                          // connections idle or lent (guarded by mu_)
};

}  // namespace gpuprof::store
