#include "analysis/run_loader.h"

#include <sqlite3.h>

#include <set>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/run_view.h"

namespace gpuprof::analysis {
namespace {

// Runs `sql` with one integer parameter and calls `each` per row.
template <typename Fn>
Status QueryByRun(store::SqliteStore& store, const char* sql, int64_t run_id,
                  const char* purpose, Fn each) {
  auto error = [&](sqlite3* db) {
    return Status::Error(StrFormat("%s: %s: %s", store.path().c_str(), purpose,
                                   db ? sqlite3_errmsg(db) : "no connection"));
  };
  sqlite3* db = store.handle();
  if (!db) return error(db);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) return error(db);
  sqlite3_bind_int64(stmt, 1, run_id);
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) each(stmt);
  Status st = rc == SQLITE_DONE ? Status::Ok() : error(db);
  sqlite3_finalize(stmt);
  return st;
}

std::optional<int64_t> OptInt(sqlite3_stmt* s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL) return std::nullopt;
  return sqlite3_column_int64(s, col);
}

std::optional<std::string> OptText(sqlite3_stmt* s, int col) {
  if (sqlite3_column_type(s, col) == SQLITE_NULL) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(sqlite3_column_text(s, col)));
}

}  // namespace

Expected<std::vector<store::StepRow>> LoadSteps(store::SqliteStore& store, int64_t run_id) {
  std::vector<store::StepRow> rows;
  Status st = QueryByRun(
      store,
      "SELECT step, start_ns, end_ns, wait_ns, wait_source, forward_calls, backward_calls, "
      "optimizer_calls FROM steps WHERE run_id = ? ORDER BY step",
      run_id, "load steps", [&](sqlite3_stmt* s) {
        store::StepRow& r = rows.emplace_back();
        r.step = sqlite3_column_int64(s, 0);
        r.start_ns = sqlite3_column_int64(s, 1);
        r.end_ns = sqlite3_column_int64(s, 2);
        r.wait_ns = OptInt(s, 3);
        r.wait_source = OptText(s, 4);
        r.forward_calls = sqlite3_column_int64(s, 5);
        r.backward_calls = sqlite3_column_int64(s, 6);
        r.optimizer_calls = sqlite3_column_int64(s, 7);
      });
  if (!st.ok()) return st;
  return rows;
}

Expected<std::vector<store::CommBucketRow>> LoadCommBuckets(store::SqliteStore& store,
                                                            int64_t run_id) {
  std::vector<store::CommBucketRow> rows;
  Status st = QueryByRun(
      store,
      "SELECT step, bucket, start_ns, end_ns, bytes FROM comm_buckets WHERE run_id = ? "
      "ORDER BY step, bucket, start_ns",
      run_id, "load comm_buckets", [&](sqlite3_stmt* s) {
        store::CommBucketRow& r = rows.emplace_back();
        r.step = sqlite3_column_int64(s, 0);
        r.bucket = sqlite3_column_int64(s, 1);
        r.start_ns = sqlite3_column_int64(s, 2);
        r.end_ns = sqlite3_column_int64(s, 3);
        r.bytes = OptInt(s, 4);
      });
  if (!st.ok()) return st;
  return rows;
}

Expected<std::vector<PriorRun>> LoadPriorRuns(store::SqliteStore& store,
                                              const store::RunInfo& run) {
  auto previous = store.PreviousRunsNamed(run.run_name, run.run_id,
                                          static_cast<int>(thresholds::kRegressionLookback));
  if (!previous) return previous.status();
  std::vector<PriorRun> out;
  size_t comparable = 0;
  for (const store::RunInfo& info : *previous) {
    if (comparable == thresholds::kRegressionRuns) break;
    auto steps = LoadSteps(store, info.run_id);
    if (!steps) return steps.status();
    store::RunData d;
    d.run = info;
    d.steps = std::move(steps).value();
    const RunView v = BuildRunView(std::move(d));
    PriorRun p;
    p.run_id = info.run_id;
    p.status = info.status;
    p.steps = v.steps.size();
    if (v.steady) {
      p.steady_median_ns = v.steady->p50_ns;
      ++comparable;
    }
    out.push_back(std::move(p));
  }
  return out;
}

Expected<std::vector<store::RunData>> LoadGroupRuns(store::SqliteStore& store,
                                                    const std::string& group_id) {
  auto runs = store.ListRuns();
  if (!runs) return runs.status();
  std::vector<store::RunData> out;
  for (store::RunInfo& info : *runs) {
    if (!info.group_id || *info.group_id != group_id) continue;
    store::RunData d;
    d.run = std::move(info);
    auto steps = LoadSteps(store, d.run.run_id);
    if (!steps) return steps.status();
    d.steps = std::move(steps).value();
    auto comm = LoadCommBuckets(store, d.run.run_id);
    if (!comm) return comm.status();
    d.comm_buckets = std::move(comm).value();
    out.push_back(std::move(d));
  }
  return out;
}

Expected<std::vector<std::string>> ListGroupIds(store::SqliteStore& store) {
  auto runs = store.ListRuns();
  if (!runs) return runs.status();
  std::set<std::string> ids;
  for (const auto& r : *runs) {
    if (r.group_id) ids.insert(*r.group_id);
  }
  return std::vector<std::string>(ids.begin(), ids.end());
}

}  // namespace gpuprof::analysis
