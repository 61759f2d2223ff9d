// The SQL of store schema v1 shared by every backend (SQLite: sqlite_store.cc, PostgreSQL:
// pg_store.cc): per table the write statement and its bind order, the SELECT list and its read
// code, all made from the table's column list (store/tables.h); plus the reads that compute
// (series, progress, step breakdown). Written in the common subset of both dialects, with `?`
// placeholders (PgStore numbers them). Templates over the backend's binder and reader:
//   Binder: Int(int64_t | optional), Real(double | optional), Text(string | optional), Null()
//           bind parameters 1, 2, 3, ... in call order (nullopt binds NULL);
//   Reader: Int(), Real(), Text(), OptInt(), OptReal(), OptText() read columns 0, 1, 2, ...;
//           Int() and Text() of a NULL read 0 and "".
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "store/rows.h"
#include "store/run_store.h"
#include "store/tables.h"
#include "util/status.h"

namespace gpuprof::store::sql {

// The nullable reads of a backend's reader (CRTP), from its IsNull(), Int(), Real(), Text() and
// Skip() (passes over the current column): SQL NULL reads as std::nullopt.
template <class Derived>
class NullableReads {
 public:
  std::optional<int64_t> OptInt() { return Read(&Derived::Int); }
  std::optional<double> OptReal() { return Read(&Derived::Real); }
  std::optional<std::string> OptText() { return Read(&Derived::Text); }

 private:
  template <typename T>
  std::optional<T> Read(T (Derived::*read)()) {
    Derived& self = static_cast<Derived&>(*this);
    if (self.IsNull()) {
      self.Skip();
      return std::nullopt;
    }
    return (self.*read)();
  }
};

// ---- values ----------------------------------------------------------------------------------

template <class M>
struct Unwrap {
  using type = M;
};
template <class M>
struct Unwrap<std::optional<M>> {
  using type = M;
};
// A member's value type without std::optional (which means: the column is nullable).
template <class M>
using ValueType = typename Unwrap<M>::type;

// The SQL type of a column held in a member of type M (bool: 0/1 in a BIGINT).
template <class M>
constexpr const char* SqlType() {
  using V = ValueType<M>;
  if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, bool>) {
    return "BIGINT";
  } else if constexpr (std::is_same_v<V, double>) {
    return "DOUBLE PRECISION";
  } else {
    static_assert(std::is_same_v<V, std::string>, "a column is int64_t, double or string");
    return "TEXT";
  }
}

template <class B, class M>
void BindValue(B& b, const M& v) {
  using V = ValueType<M>;
  if constexpr (std::is_same_v<M, bool>) {
    b.Int(int64_t{v ? 1 : 0});
  } else if constexpr (std::is_same_v<V, int64_t>) {
    b.Int(v);
  } else if constexpr (std::is_same_v<V, double>) {
    b.Real(v);
  } else {
    static_assert(std::is_same_v<V, std::string>, "a column is int64_t, double or string");
    b.Text(v);
  }
}

template <class R, class M>
void ReadValue(R& c, M& v) {
  if constexpr (std::is_same_v<M, bool>) {
    v = c.Int() != 0;
  } else if constexpr (std::is_same_v<M, int64_t>) {
    v = c.Int();
  } else if constexpr (std::is_same_v<M, std::optional<int64_t>>) {
    v = c.OptInt();
  } else if constexpr (std::is_same_v<M, double>) {
    v = c.Real();
  } else if constexpr (std::is_same_v<M, std::optional<double>>) {
    v = c.OptReal();
  } else if constexpr (std::is_same_v<M, std::string>) {
    v = c.Text();
  } else {
    static_assert(std::is_same_v<M, std::optional<std::string>>, "an unknown column type");
    v = c.OptText();
  }
}

// ---- statements from the column lists (store/tables.h) ---------------------------------------

// Whether a Table<T> entry is a column of the table that rows are read from / written to.
template <class C>
constexpr bool kStoredColumn = IsFixed<C>::value || !HasFlag<C>(kNotStored);
// ...and one whose value the row binds (not the store's, not a constant).
template <class C>
constexpr bool kBoundColumn =
    !IsFixed<C>::value && !HasFlag<C>(kNotStored) && !HasFlag<C>(kAssigned);

namespace internal {

template <class T>
std::string MakeWriteSql() {
  using Tb = Table<T>;
  std::string cols = Tb::kPerRun ? "run_id" : "";
  std::string values = Tb::kPerRun ? "?" : "";
  std::string keys = "run_id";
  std::string set;
  auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  auto add_value = [&](const char* v) { values += std::string(values.empty() ? "" : ",") + v; };
  ForEachColumn<T>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (IsFixed<C>::value) {
      add(cols, c.name);
      add_value(c.value);
    } else if constexpr (kBoundColumn<C>) {
      add(cols, c.name);
      add_value("?");
      if constexpr (HasFlag<C>(kKey)) {
        add(keys, c.name);
      } else {
        add(set,
            std::string(c.name) + " = " +
                (c.on_conflict ? std::string(c.on_conflict) : std::string("excluded.") + c.name));
      }
    }
  });
  std::string sql =
      std::string("INSERT INTO ") + Tb::kName + "(" + cols + ") VALUES(" + values + ")";
  if constexpr (Tb::kUpsert) sql += " ON CONFLICT(" + keys + ") DO UPDATE SET " + set;
  return sql;
}

template <class T>
std::string MakeSelectSql(bool with_added) {
  std::string cols;
  ForEachColumn<T>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (!IsFixed<C>::value && kStoredColumn<C>) {
      if (with_added || !HasFlag<C>(kAdded))
        cols += (cols.empty() ? "" : ", ") + std::string(c.name);
    }
  });
  return "SELECT " + cols + " FROM " + Table<T>::kName;
}

}  // namespace internal

// The statement that writes a row of T: INSERT, or for an upsert table INSERT ... ON CONFLICT(
// run_id, keys) DO UPDATE SET (each other column to its on_conflict expression, by default the
// new value); parameter 1 is run_id (per-run tables). Made once per process.
template <class T>
const std::string& WriteSql() {
  static const std::string sql = internal::MakeWriteSql<T>();
  return sql;
}

// Rows of a plain-insert table (not an upsert; no side table, as host samples' per-core list
// has) may be written kRowsPerInsert to one statement, WriteManySql<T>(): the per-statement work
// of either backend is then paid once for them all (docs/benchmarks.md, "Team server").
constexpr size_t kRowsPerInsert = 32;
template <class T>
constexpr bool kMultiRowInsert = !Table<T>::kUpsert && !std::is_same_v<T, HostSampleRow>;

// WriteSql<T>() with its VALUES tuple repeated kRowsPerInsert times; parameters: each row's
// BindRow in turn. Made once per process.
template <class T>
requires kMultiRowInsert<T>
const std::string& WriteManySql() {
  static const std::string sql = [] {
    const std::string& one = WriteSql<T>();
    const size_t values = one.rfind(" VALUES(");
    const std::string tuple = one.substr(values + 7);
    std::string many = one.substr(0, values) + " VALUES";
    for (size_t i = 0; i < kRowsPerInsert; ++i) many += (i == 0 ? "" : ",") + tuple;
    return many;
  }();
  return sql;
}

// How many rows from `first` (at most kRowsPerInsert) hold the same Row alternative as *first:
// kRowsPerInsert means a WriteManySql statement's worth.
template <class It>
size_t SameTableRun(It first, It last) {
  size_t same = 0;
  for (It it = first; it != last && it->index() == first->index() && same < kRowsPerInsert; ++it) {
    ++same;
  }
  return same;
}

// What a write of T is called in an error message: "upsert into steps", "insert into kernels".
template <class T>
const char* WritePurpose() {
  if constexpr (requires { Table<T>::kPurpose; }) {
    return Table<T>::kPurpose;
  } else {
    static const std::string purpose =
        std::string(Table<T>::kUpsert ? "upsert into " : "insert into ") + Table<T>::kName;
    return purpose.c_str();
  }
}

// Binds the columns of `row` in WriteSql's order, after run_id (the caller's, per-run tables).
template <class B, class T>
void Bind(B& b, const T& row) {
  ForEachColumn<T>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (kBoundColumn<C>) BindValue(b, row.*c.member);
  });
}
// run_id, then the row: every parameter of WriteSql<T>() of a per-run table.
template <class B, class T>
void BindRow(B& b, int64_t run_id, const T& row) {
  b.Int(run_id);
  Bind(b, row);
}

// "SELECT <columns> FROM <table>" (run_id only where it is a member: runs). `with_added` false
// leaves out the kAdded columns, for a file that predates them.
template <class T>
std::string Select(bool with_added = true) {
  return internal::MakeSelectSql<T>(with_added);
}

// Reads one row in Select<T>'s column order; columns left out (with_added false) keep their
// defaults.
template <class R, class T>
void Read(R& c, T& row, bool with_added = true) {
  ForEachColumn<T>([&](const auto& col) {
    using C = std::decay_t<decltype(col)>;
    if constexpr (!IsFixed<C>::value && kStoredColumn<C>) {
      if (with_added || !HasFlag<C>(kAdded)) ReadValue(c, row.*col.member);
    }
  });
}
template <class T, class R>
T Read(R& c, bool with_added = true) {
  T row{};
  Read(c, row, with_added);
  return row;
}

// One stored column of Table<T>, as the DDL must have it (the schema test compares the two).
struct ColumnDesc {
  std::string name;
  const char* type = nullptr;  // BIGINT | DOUBLE PRECISION | TEXT; nullptr: a FixedColumn
  bool nullable = false;       // the member is std::optional
  bool key = false;            // in the primary key (kKey, kAssigned; run_id when keyed)
};
// Table<T>'s columns in the table, in order: run_id first for a per-run table.
template <class T>
std::vector<ColumnDesc> Columns() {
  std::vector<ColumnDesc> out;
  bool keyed = false;
  ForEachColumn<T>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (IsFixed<C>::value) {
      out.push_back({c.name, nullptr, false, false});
    } else if constexpr (kStoredColumn<C>) {
      using M = typename C::Member;
      const bool key = HasFlag<C>(kKey) || HasFlag<C>(kAssigned);
      keyed = keyed || HasFlag<C>(kKey);
      out.push_back({c.name, SqlType<M>(), !std::is_same_v<M, ValueType<M>>, key});
    }
  });
  if (Table<T>::kPerRun) out.insert(out.begin(), {"run_id", "BIGINT", false, keyed});
  return out;
}

// A column added after the first files were written (kAdded) and its SQL type: a writer opening
// an older file or database adds it (and creates tables it lacks) before writing.
struct AddedColumn {
  const char* table;
  const char* column;
  const char* type;
};
inline std::vector<AddedColumn> AddedColumns() {
  std::vector<AddedColumn> out;
  ForEachTable([&](auto tag) {
    using T = typename decltype(tag)::type;
    ForEachColumn<T>([&](const auto& c) {
      using C = std::decay_t<decltype(c)>;
      if constexpr (!IsFixed<C>::value) {
        if constexpr (HasFlag<C>(kAdded) && kStoredColumn<C>) {
          const bool seen = std::any_of(out.begin(), out.end(), [&](const AddedColumn& a) {
            return std::string(a.table) == Table<T>::kName && std::string(a.column) == c.name;
          });
          if (!seen) out.push_back({Table<T>::kName, c.name, SqlType<typename C::Member>()});
        }
      }
    });
  });
  return out;
}

// cpu_per_core is stored as JSON array text in host_core_samples; an empty vector (not
// measured) stores no row there. Parameters: run_id, ts_ns, CoresToJson.
inline std::optional<std::string> CoresToJson(const std::vector<double>& cores) {
  if (cores.empty()) return std::nullopt;
  return nlohmann::json(cores).dump();
}
inline constexpr const char* kHostCoresPurpose = "insert into host_core_samples";
inline constexpr const char* kHostCoresSql =
    "INSERT INTO host_core_samples(run_id, ts_ns, cpu_per_core) VALUES(?,?,?)";

// ---- runs ------------------------------------------------------------------------------------

// BeginRun's insert: every column but run_id (the store assigns it).
inline const std::string& InsertRunSql() { return WriteSql<RunInfo>(); }

inline constexpr const char* kFinishRunSql =
    "UPDATE runs SET status = ?, end_ns = ?, error = ? WHERE run_id = ?";

// UpdateRunFields' statement: the kMutable columns, then run_id; BindRunUpdate binds them.
inline const std::string& UpdateRunSql() {
  static const std::string sql = [] {
    std::string set;
    ForEachColumn<RunInfo>([&](const auto& c) {
      using C = std::decay_t<decltype(c)>;
      if constexpr (HasFlag<C>(kMutable))
        set += (set.empty() ? "" : ", ") + std::string(c.name) + " = ?";
    });
    return "UPDATE runs SET " + set + " WHERE run_id = ?";
  }();
  return sql;
}
template <class B>
void BindRunUpdate(B& b, const RunInfo& info) {
  ForEachColumn<RunInfo>([&](const auto& c) {
    using C = std::decay_t<decltype(c)>;
    if constexpr (HasFlag<C>(kMutable)) BindValue(b, info.*c.member);
  });
  b.Int(info.run_id);
}

// Parameters: run_name, before_run_id, Limit(limit).
inline const std::string kPreviousRunsSql =
    Select<RunInfo>() +
    " WHERE run_name = ? AND run_id < ? AND status <> 'running' ORDER BY run_id DESC LIMIT ?";

inline constexpr const char* kDeleteInsightsSql = "DELETE FROM insights WHERE run_id = ?";

// A team server's bookkeeping.
inline constexpr const char* kIngestRunIdSql = "SELECT run_id FROM ingest_runs WHERE run_uuid = ?";
inline constexpr const char* kInsertIngestRunSql =
    "INSERT INTO ingest_runs(run_uuid, run_id) VALUES(?, ?)";
inline constexpr const char* kIngestBatchSeenSql =
    "SELECT 1 FROM ingest_batches WHERE run_id = ? AND batch_id = ?";
inline constexpr const char* kInsertIngestBatchSql =
    "INSERT INTO ingest_batches(run_id, batch_id, row_count, received_unix_ns) VALUES(?, ?, ?, ?)";

// Reads of one run's rows (parameter: run_id) shared by LoadRun and the light per-table loads,
// in LoadRun's orders.
inline const std::string kStepsSql = Select<StepRow>() + " WHERE run_id = ? ORDER BY step";
inline const std::string kPhasesSql = Select<PhaseRow>() + " WHERE run_id = ? ORDER BY step, name";
inline const std::string kCommBucketsSql =
    Select<CommBucketRow>() + " WHERE run_id = ? ORDER BY step, bucket, start_ns";
// kKernelsOldSql reads a file older than the launch columns (LoadDialect::old_tables).
inline const std::string kKernelsSql =
    Select<KernelRow>() + " WHERE run_id = ? ORDER BY window_start_ns, name, source";
inline const std::string kKernelsOldSql =
    Select<KernelRow>(false) + " WHERE run_id = ? ORDER BY window_start_ns, name, source";
inline const std::string kCpuOpsSql =
    Select<CpuOpRow>() + " WHERE run_id = ? ORDER BY window_start_ns, name";

// LatestGpuSecond's query (parameters: run_id twice) and its row.
inline constexpr const char* kLatestGpuSecondSql =
    "SELECT ts_ns, gpu_index, util_mean_pct, mem_used_max_bytes, power_mean_mw, temp_max_c"
    " FROM gpu_samples_1s WHERE run_id = ? AND ts_ns = (SELECT max(ts_ns) FROM gpu_samples_1s"
    " WHERE run_id = ?) ORDER BY gpu_index";
template <class R>
GpuRollupRow ReadLatestGpu(R& c) {
  GpuRollupRow r;
  r.ts_ns = c.Int();
  r.gpu_index = c.Int();
  r.util_mean_pct = c.OptReal();
  r.mem_used_max_bytes = c.OptInt();
  r.power_mean_mw = c.OptReal();
  r.temp_max_c = c.OptReal();
  return r;
}

// ScanGpuSeries' query (parameters: run_id, from_ns, to_ns, and gpu_index when `one_gpu`);
// its rows read with ReadSeriesRow(c, true, 4). The index gpu_samples_1s_series covers it.
inline std::string GpuSeriesSql(bool one_gpu) {
  return std::string(
             "SELECT ts_ns, gpu_index, util_mean_pct, mem_used_max_bytes, power_mean_mw,"
             " temp_max_c FROM gpu_samples_1s WHERE run_id = ? AND ts_ns BETWEEN ? AND ?") +
         (one_gpu ? " AND gpu_index = ?" : "") + " ORDER BY gpu_index, ts_ns";
}

// ScanHostSeries' query (parameters: run_id, from_ns, to_ns); rows: ReadSeriesRow(c, false,
// kHostSeriesColumns).
inline constexpr const char* kHostSeriesSql =
    "SELECT ts_ns, cpu_pct, mem_used_bytes, disk_read_bps, proc_cpu_pct, proc_rss_bytes,"
    " job_cpu_pct FROM host_samples WHERE run_id = ? AND ts_ns BETWEEN ? AND ? ORDER BY ts_ns";
template <class R>
SeriesRow ReadSeriesRow(R& c, bool gpu, int values) {
  SeriesRow r;
  r.ts_ns = c.Int();
  if (gpu) r.gpu_index = c.Int();
  for (int i = 0; i < values; ++i) {
    if (const std::optional<double> v = c.OptReal()) {
      r.v[i] = *v;
      r.known |= 1u << i;
    }
  }
  return r;
}

// ScanStepBreakdown for a backend whose query(sql, purpose, bind, row) calls row(reader) per
// result row: the phases as (step, kind, wall, gpu) numbers first, then the comm_buckets summed
// per step, then the steps in order, merged. A step with comm_buckets rows and no recorded
// "comm" phase gets the one analysis::BuildRunView derives (run_view.h): its exposed
// communication, max(end_ns) - max(start_ns) of its buckets, at least 0 and at most its backward
// phase's wall, which loses as much.
template <class QueryFn>
Status ScanStepBreakdownWith(QueryFn query, int64_t run_id, const StepBreakdownFn& each) {
  struct Phase {
    int64_t step, wall, gpu;
    int kind;  // 0-3: forward, backward, optimizer, comm; 4: another name
    bool has_gpu;
  };
  std::vector<Phase> phases;
  Status st = query(
      "SELECT step, CASE name WHEN 'forward' THEN 0 WHEN 'backward' THEN 1"
      " WHEN 'optimizer' THEN 2 WHEN 'comm' THEN 3 ELSE 4 END, wall_ns, gpu_ns"
      " FROM phases WHERE run_id = ? ORDER BY step",
      "scan phases", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        Phase p{};
        p.step = c.Int();
        p.kind = static_cast<int>(c.Int());
        p.wall = c.Int();
        const std::optional<int64_t> gpu = c.OptInt();
        p.gpu = gpu.value_or(0);
        p.has_gpu = gpu.has_value();
        phases.push_back(p);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  struct Comm {
    int64_t step, exposed;
  };
  std::vector<Comm> comms;
  st = query(
      "SELECT step, MAX(end_ns) - MAX(start_ns) FROM comm_buckets WHERE run_id = ?"
      " GROUP BY step ORDER BY step",
      "scan comm_buckets", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        Comm m{};
        m.step = c.Int();
        m.exposed = c.Int();
        comms.push_back(m);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  size_t k = 0, m = 0;
  return query(
      "SELECT step, end_ns - start_ns, wait_ns FROM steps WHERE run_id = ? ORDER BY step",
      "scan steps", [&](auto& b) { b.Int(run_id); },
      [&](auto& c) {
        StepBreakdownRow r;
        r.step = c.Int();
        r.duration_ns = c.Int();
        r.wait_ns = c.OptInt();
        bool backward = false;
        while (k < phases.size() && phases[k].step < r.step) ++k;
        for (; k < phases.size() && phases[k].step == r.step; ++k) {
          const Phase& p = phases[k];
          if (p.kind < 4) {
            r.phase_ns[p.kind] += p.wall;
          } else {
            r.other_phase_ns += p.wall;
          }
          r.comm = r.comm || p.kind == 3;
          backward = backward || p.kind == 1;
          if (p.has_gpu) {
            r.gpu_ns += p.gpu;
            r.gpu_known = true;
          }
        }
        while (m < comms.size() && comms[m].step < r.step) ++m;
        if (m < comms.size() && comms[m].step == r.step && !r.comm) {
          int64_t exposed = std::max<int64_t>(0, comms[m].exposed);
          if (backward) {
            exposed = std::min(exposed, std::max<int64_t>(0, r.phase_ns[1]));
            r.phase_ns[1] -= exposed;
          }
          r.phase_ns[3] = exposed;
          r.comm = true;
        }
        each(r);
        return Status::Ok();
      });
}

// LoadRunProgress' two queries: the counts and newest times (parameters: run_id five times),
// and the headline insight (parameter: run_id).
inline constexpr const char* kRunProgressSql =
    "SELECT (SELECT count(*) FROM steps WHERE run_id = ?),"
    " (SELECT max(step) FROM steps WHERE run_id = ?),"
    " (SELECT max(end_ns) FROM steps WHERE run_id = ?),"
    " (SELECT max(ts_ns) FROM gpu_samples_1s WHERE run_id = ?),"
    " (SELECT max(ts_ns) FROM host_samples WHERE run_id = ?)";
template <class R>
RunProgress ReadRunProgress(R& c) {
  RunProgress p;
  p.steps = c.Int();
  p.last_step = c.OptInt();
  p.last_step_end_ns = c.OptInt();
  const std::optional<int64_t> gpu = c.OptInt();
  const std::optional<int64_t> host = c.OptInt();
  p.last_sample_ns = gpu && host ? std::max(*gpu, *host) : gpu ? gpu : host;
  return p;
}
// A run's insights in ordinal order (parameter: run_id), read with Read<InsightRow>; LIMIT 1
// of it is the headline (LoadRunProgress).
inline const std::string kInsightsSql = Select<InsightRow>() + " WHERE run_id = ? ORDER BY ordinal";
inline const std::string kHeadlineSql = kInsightsSql + " LIMIT 1";

// LIMIT's operand for "at most `limit` rows, all when negative" (both dialects take a bound).
inline int64_t Limit(int limit) { return limit < 0 ? INT64_MAX : int64_t{limit}; }

// One series metric's (ts_ns, value) rows of a run in [from, to]: parameters run_id, from_ns,
// to_ns and, per GPU, gpu_index.
inline std::string SeriesSql(const SeriesColumn& c) {
  return std::string("SELECT ts_ns, ") + c.column + " FROM " + c.table +
         " WHERE run_id = ? AND ts_ns BETWEEN ? AND ? AND " + c.column + " IS NOT NULL" +
         (c.per_gpu ? " AND gpu_index = ?" : "") + " ORDER BY ts_ns";
}

// What differs between the backends in LoadRunTables.
struct LoadDialect {
  // Whether host_stalls and cpu_waits exist (a read-only SQLite file may predate them).
  bool has_stalls_tables = true;
  // Whether cpu_ops exists.
  bool has_cpu_ops_table = true;
  // Tables that lack their kAdded columns (store/tables.h): read without them (null).
  std::vector<std::string> old_tables;
  // The column that orders rows inserted with equal keys (SQLite's rowid, Postgres' seq).
  std::string insertion_order = "rowid";

  template <class T>
  bool HasAddedColumns() const {
    return std::find(old_tables.begin(), old_tables.end(), Table<T>::kName) == old_tables.end();
  }
};

// Loads every table of RunData but `run` into *d, through the backend's
//   query(sql, purpose, bind(Binder&), each(Reader&) -> Status) -> Status
// with LoadRun's orderings (sqlite_store.h). The first error wins.
template <class QueryFn>
Status LoadRunTables(QueryFn&& query, int64_t run_id, const LoadDialect& dialect, RunData& d) {
  Status st;
  auto by_run = [run_id](auto& b) { b.Int(run_id); };
  // Every row of one table in `order` (an ORDER BY list), appended to `rows`.
  auto load = [&]<class T>(std::vector<T>& rows, const std::string& order) {
    if (!st.ok()) return;
    const bool added = dialect.HasAddedColumns<T>();
    st = query(Select<T>(added) + " WHERE run_id = ? ORDER BY " + order,
               std::string("load ") + Table<T>::kName, by_run, [&](auto& c) {
                 Read(c, rows.emplace_back(), added);
                 return Status::Ok();
               });
  };
  // Sizes the long tables first (an indexed count), so that a long run's rows are not copied
  // through doubling vectors: that would briefly hold up to three times their memory.
  auto reserve = [&]<class T>(std::vector<T>& rows) {
    if (!st.ok()) return;
    st = query(std::string("SELECT count(*) FROM ") + Table<T>::kName + " WHERE run_id = ?",
               std::string("count ") + Table<T>::kName, by_run, [&](auto& c) {
                 rows.reserve(static_cast<size_t>(c.Int()));
                 return Status::Ok();
               });
  };
  reserve(d.steps);
  reserve(d.phases);
  reserve(d.gpu_samples_1s);
  reserve(d.host_samples);
  reserve(d.worker_samples_10s);
  load(d.steps, "step");
  load(d.phases, "step, name");
  load(d.gpus, "gpu_index");
  load(d.gpu_samples_1s, "ts_ns, gpu_index");
  load(d.host_samples, "ts_ns");
  load(d.worker_samples_10s, "ts_ns, pid");
  load(d.kernels, "window_start_ns, name, source");
  if (dialect.has_cpu_ops_table) load(d.cpu_ops, "window_start_ns, name");
  load(d.comm_buckets, "step, bucket, start_ns");
  if (dialect.has_stalls_tables) {
    load(d.stalls, "start_ns");
    load(d.cpu_waits, "start_ns");
  }
  load(d.telemetry, "source");
  // Rows without a timestamp come first; equal timestamps keep insertion order.
  load(d.diagnostics, "ts_ns NULLS FIRST, " + dialect.insertion_order);
  load(d.insights, "ordinal");
  return st;
}

}  // namespace gpuprof::store::sql
