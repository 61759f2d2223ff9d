#include "traces/nsys_import.h"

#include <sqlite3.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "analysis/format.h"

namespace gpuprof::traces {
namespace {

constexpr int64_t kThreadBits = 0x1000000;  // a global id's thread part: globalTid % 2^24
constexpr int64_t kPushPopRange = 59;
constexpr int64_t kStartEndRange = 60;
constexpr const char* kStepPrefix = "gpuprof step ";
constexpr const char* kKernelTable = "CUPTI_ACTIVITY_KIND_KERNEL";
constexpr const char* kRuntimeTable = "CUPTI_ACTIVITY_KIND_RUNTIME";
constexpr const char* kNvtxTable = "NVTX_EVENTS";
constexpr const char* kCaptureHint =
    "profile the loop under `with prof.nsys_capture():` with `nsys profile "
    "--capture-range=cudaProfilerApi --trace=cuda,nvtx ...`, then `nsys export --type sqlite`";

int64_t ProcessOf(int64_t global_id) { return global_id / kThreadBits; }
int64_t PidOf(int64_t global_id) { return ProcessOf(global_id) % kThreadBits; }

// The step index of a `gpuprof step <i>` message, or nullopt for any other text.
std::optional<int64_t> StepOf(const char* text, size_t size) {
  const size_t prefix = std::char_traits<char>::length(kStepPrefix);
  if (size <= prefix || std::string_view(text, prefix) != kStepPrefix) return std::nullopt;
  const char* begin = text + prefix;
  const char* end = text + size;
  if (!std::all_of(begin, end, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return step;
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};

// One read-only connection to the export, with errors that name the file.
class Export {
 public:
  explicit Export(std::string path) : path_(std::move(path)) {}

  Status Open() {
    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(path_.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    db_.reset(db);
    if (rc != SQLITE_OK) return Fail(std::string("cannot open: ") + sqlite3_errstr(rc));
    return Status::Ok();
  }

  Status Fail(const std::string& what) const { return Status::Error(path_ + ": " + what); }

  // Runs `sql` and calls each(stmt) per row, stopping at the first error it returns.
  Status Query(const std::string& sql, const std::string& purpose,
               const std::function<Status(sqlite3_stmt*)>& each) {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql.c_str(), -1, &raw, nullptr) != SQLITE_OK) {
      return Fail(purpose + ": " + sqlite3_errmsg(db_.get()));
    }
    std::unique_ptr<sqlite3_stmt, StmtFinalizer> stmt(raw);
    int rc;
    while ((rc = sqlite3_step(raw)) == SQLITE_ROW) {
      if (Status st = each(raw); !st.ok()) return st;
    }
    if (rc != SQLITE_DONE) return Fail(purpose + ": " + sqlite3_errmsg(db_.get()));
    return Status::Ok();
  }

  // The tables (and views) of the file; the first read, so a file that is not SQLite fails
  // here.
  Status LoadTables() {
    Status st = Query("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')",
                      "read the list of tables", [&](sqlite3_stmt* s) {
                        const unsigned char* name = sqlite3_column_text(s, 0);
                        if (name) tables_.insert(reinterpret_cast<const char*>(name));
                        return Status::Ok();
                      });
    if (!st.ok() && sqlite3_errcode(db_.get()) == SQLITE_NOTADB) {
      return Fail(
          "not an SQLite file: pass the .sqlite file that `nsys export --type sqlite "
          "REPORT.nsys-rep` writes, not the report itself");
    }
    return st;
  }

  bool Has(const std::string& table) const { return tables_.count(table) > 0; }

  // The columns of `table` (declared names).
  Expected<std::set<std::string>> Columns(const std::string& table) {
    std::set<std::string> cols;
    Status st = Query("PRAGMA table_info(\"" + table + "\")", "read the columns of " + table,
                      [&](sqlite3_stmt* s) {
                        const unsigned char* name = sqlite3_column_text(s, 1);
                        if (name) cols.insert(reinterpret_cast<const char*>(name));
                        return Status::Ok();
                      });
    if (!st.ok()) return st;
    return cols;
  }

  // The columns of `table`, or an error naming those of `required` that it lacks.
  Expected<std::set<std::string>> Require(const std::string& table,
                                          const std::vector<std::string>& required) {
    auto cols = Columns(table);
    if (!cols) return cols;
    std::string missing;
    for (const std::string& c : required) {
      if (cols->count(c) == 0) missing += (missing.empty() ? "" : ", ") + c;
    }
    if (!missing.empty()) {
      return Fail("table " + table + " lacks column(s) " + missing +
                  ": not an Nsight Systems export this gpuprof reads (export schema " +
                  kSupportedNsysSchemas + ")");
    }
    return cols;
  }

 private:
  std::string path_;
  std::unique_ptr<sqlite3, DbCloser> db_;
  std::set<std::string> tables_;
};

// Reads typed values of one result row whose column 0 is the rowid; errors name the table,
// the row and the column.
class RowReader {
 public:
  RowReader(const Export& file, sqlite3_stmt* s, const char* table)
      : file_(file), s_(s), table_(table) {}

  bool IsNull(int col) const { return sqlite3_column_type(s_, col) == SQLITE_NULL; }

  Status Int(int col, int64_t* out) const {
    const int type = sqlite3_column_type(s_, col);
    if (type == SQLITE_INTEGER) {
      *out = sqlite3_column_int64(s_, col);
      return Status::Ok();
    }
    std::string got = "NULL";
    if (type == SQLITE_TEXT) {
      got = "text '" + Text(col).substr(0, 40) + "'";
    } else if (type == SQLITE_FLOAT) {
      got = "the real number " + std::to_string(sqlite3_column_double(s_, col));
    } else if (type == SQLITE_BLOB) {
      got = "a blob";
    }
    return Bad(col, "is " + got + ", not an integer");
  }

  // An optional integer: nullopt for NULL, an error for anything but an integer.
  Status OptInt(int col, std::optional<int64_t>* out) const {
    if (IsNull(col)) {
      out->reset();
      return Status::Ok();
    }
    int64_t v = 0;
    if (Status st = Int(col, &v); !st.ok()) return st;
    *out = v;
    return Status::Ok();
  }

  std::string Text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(s_, col)) : "";
  }

  Status Bad(int col, const std::string& what) const {
    return file_.Fail(std::string(table_) + " row " + std::to_string(sqlite3_column_int64(s_, 0)) +
                      ": " + sqlite3_column_name(s_, col) + " " + what);
  }

 private:
  const Export& file_;
  sqlite3_stmt* s_;
  const char* table_;
};

// The export schema version ("3.15.1"), or an error when it is missing or not major 3.
Expected<std::string> SchemaVersion(Export& file) {
  const char* table = file.Has("META_DATA_EXPORT")   ? "META_DATA_EXPORT"
                      : file.Has("EXPORT_META_DATA") ? "EXPORT_META_DATA"
                                                     : nullptr;
  if (table == nullptr) {
    return file.Fail(
        "no export schema version (no META_DATA_EXPORT or EXPORT_META_DATA table): "
        "made by an older Nsight Systems? export the report again with a current "
        "`nsys export --type sqlite` (this gpuprof reads export schema " +
        std::string(kSupportedNsysSchemas) + ")");
  }
  if (auto cols = file.Require(table, {"name", "value"}); !cols) return cols.status();
  std::map<std::string, std::string> meta;
  Status st = file.Query(std::string("SELECT rowid, name, value FROM ") + table +
                             " WHERE name LIKE 'EXPORT_SCHEMA_VERSION%'",
                         std::string("read ") + table, [&](sqlite3_stmt* s) {
                           RowReader row(file, s, table);
                           if (row.IsNull(2)) return row.Bad(2, "is NULL");
                           meta[row.Text(1)] = row.Text(2);
                           return Status::Ok();
                         });
  if (!st.ok()) return st;
  std::string version;
  if (auto it = meta.find("EXPORT_SCHEMA_VERSION"); it != meta.end()) {
    version = it->second;
  } else if (auto major = meta.find("EXPORT_SCHEMA_VERSION_MAJOR"); major != meta.end()) {
    version = major->second;
    for (const char* part : {"EXPORT_SCHEMA_VERSION_MINOR", "EXPORT_SCHEMA_VERSION_MICRO"}) {
      if (auto p = meta.find(part); p != meta.end()) version += "." + p->second;
    }
  } else {
    return file.Fail(std::string("no EXPORT_SCHEMA_VERSION in ") + table +
                     ": not an Nsight Systems export this gpuprof reads (export schema " +
                     kSupportedNsysSchemas + ")");
  }
  const std::string major = version.substr(0, version.find('.'));
  if (major != "3") {
    return file.Fail("export schema version '" + version.substr(0, 40) +
                     "' is not one this gpuprof reads: it reads export schema " +
                     kSupportedNsysSchemas);
  }
  return version;
}

Expected<std::unordered_map<int64_t, std::string>> LoadStrings(Export& file) {
  if (!file.Has("StringIds")) {
    return file.Fail("no StringIds table: not an Nsight Systems export");
  }
  if (auto cols = file.Require("StringIds", {"id", "value"}); !cols) return cols.status();
  std::unordered_map<int64_t, std::string> strings;
  Status st =
      file.Query("SELECT rowid, id, value FROM StringIds", "read StringIds", [&](sqlite3_stmt* s) {
        RowReader row(file, s, "StringIds");
        int64_t id = 0;
        if (Status e = row.Int(1, &id); !e.ok()) return e;
        strings[id] = row.Text(2);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return strings;
}

struct StepRange {
  int64_t start = 0;
  int64_t end = 0;
  int64_t step = 0;
};

// The step ranges of one thread or one process, for "which range holds time t".
class RangeIndex {
 public:
  void Add(const StepRange& r) { ranges_.push_back(r); }

  void Finish() {
    std::sort(ranges_.begin(), ranges_.end(),
              [](const StepRange& a, const StepRange& b) { return a.start < b.start; });
    max_end_.resize(ranges_.size());
    int64_t m = INT64_MIN;
    for (size_t i = 0; i < ranges_.size(); ++i) max_end_[i] = m = std::max(m, ranges_[i].end);
  }

  // The innermost (latest-starting) range with start <= t < end, or nullptr.
  const StepRange* Find(int64_t t) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), t,
                               [](int64_t v, const StepRange& r) { return v < r.start; });
    for (size_t i = static_cast<size_t>(it - ranges_.begin()); i > 0 && max_end_[i - 1] > t; --i) {
      if (ranges_[i - 1].end > t) return &ranges_[i - 1];
    }
    return nullptr;
  }

 private:
  std::vector<StepRange> ranges_;
  std::vector<int64_t> max_end_;  // max end over ranges_[0..i]
};

struct StepRanges {
  std::unordered_map<int64_t, RangeIndex> by_thread;   // key: globalTid
  std::unordered_map<int64_t, RangeIndex> by_process;  // key: globalTid / 2^24
  int64_t count = 0;
};

// The `gpuprof step <i>` ranges of NVTX_EVENTS, of one process (options.pid, else the only
// process that has them, else the run's).
Expected<StepRanges> LoadStepRanges(Export& file,
                                    const std::unordered_map<int64_t, std::string>& strings,
                                    const NsysImportOptions& options) {
  const std::string none = "no `gpuprof step <i>` NVTX ranges: ";
  if (!file.Has(kNvtxTable)) return file.Fail(none + "no NVTX_EVENTS table; " + kCaptureHint);
  auto cols = file.Require(kNvtxTable, {"start", "end", "eventType", "globalTid", "text"});
  if (!cols) return cols.status();
  const bool text_id = cols->count("textId") > 0;
  struct Found {
    int64_t global_tid;
    StepRange range;
  };
  std::vector<Found> found;
  Status st = file.Query(
      std::string("SELECT rowid, start, \"end\", globalTid, text, ") +
          (text_id ? "textId" : "NULL") + " FROM NVTX_EVENTS WHERE eventType IN (" +
          std::to_string(kPushPopRange) + ", " + std::to_string(kStartEndRange) + ")",
      "read NVTX_EVENTS", [&](sqlite3_stmt* s) {
        RowReader row(file, s, kNvtxTable);
        std::optional<int64_t> step;
        if (!row.IsNull(4)) {
          const std::string text = row.Text(4);
          step = StepOf(text.data(), text.size());
        } else if (!row.IsNull(5)) {
          int64_t id = 0;
          if (Status e = row.Int(5, &id); !e.ok()) return e;
          auto it = strings.find(id);
          if (it == strings.end()) return row.Bad(5, std::to_string(id) + " is not in StringIds");
          step = StepOf(it->second.data(), it->second.size());
        }
        if (!step) return Status::Ok();  // another range: a phase, or the user's own
        Found f;
        f.range.step = *step;
        if (Status e = row.Int(1, &f.range.start); !e.ok()) return e;
        if (row.IsNull(2)) {
          return row.Bad(2, "is NULL: the range 'gpuprof step " + std::to_string(*step) +
                                "' never ended (the capture stopped inside the step?)");
        }
        if (Status e = row.Int(2, &f.range.end); !e.ok()) return e;
        if (Status e = row.Int(3, &f.global_tid); !e.ok()) return e;
        if (f.range.end < f.range.start) {
          return row.Bad(2, std::to_string(f.range.end) + " is before the range's start " +
                                std::to_string(f.range.start));
        }
        found.push_back(f);
        return Status::Ok();
      });
  if (!st.ok()) return st;
  if (found.empty()) return file.Fail(none + kCaptureHint);

  std::set<int64_t> pids;
  for (const Found& f : found) pids.insert(PidOf(f.global_tid));
  std::vector<int64_t> pid_list(pids.begin(), pids.end());
  std::string pid_text;
  for (int64_t p : pid_list) pid_text += (pid_text.empty() ? "" : ", ") + std::to_string(p);
  std::optional<int64_t> pid = options.pid;
  if (pid && pids.count(*pid) == 0) {
    return file.Fail("no `gpuprof step` ranges of process " + std::to_string(*pid) +
                     " (processes with them: " + pid_text + ")");
  }
  if (!pid && pids.size() > 1) {
    if (options.run_pid && pids.count(*options.run_pid)) {
      pid = options.run_pid;
    } else {
      return file.Fail("`gpuprof step` ranges of " + std::to_string(pids.size()) +
                       " processes (pids " + pid_text +
                       "): pass --pid PID to import one "
                       "process's kernels into its run");
    }
  }
  StepRanges out;
  for (const Found& f : found) {
    if (pid && PidOf(f.global_tid) != *pid) continue;
    out.by_thread[f.global_tid].Add(f.range);
    out.by_process[ProcessOf(f.global_tid)].Add(f.range);
    ++out.count;
  }
  for (auto& [_, index] : out.by_thread) index.Finish();
  for (auto& [_, index] : out.by_process) index.Finish();
  return out;
}

struct Kernel {
  int64_t start = 0;
  int64_t duration = 0;
  std::optional<int64_t> correlation;
  std::optional<int64_t> process;  // globalPid / 2^24
  int64_t device = 0;
  int64_t stream = 0;
  std::string name;
  std::string grid;
  std::string block;
};

Expected<std::vector<Kernel>> LoadKernels(Export& file,
                                          const std::unordered_map<int64_t, std::string>& strings) {
  if (!file.Has(kKernelTable)) {
    return file.Fail("no CUDA kernels (no CUPTI_ACTIVITY_KIND_KERNEL table): " +
                     std::string(kCaptureHint));
  }
  auto cols =
      file.Require(kKernelTable, {"start", "end", "deviceId", "streamId", "correlationId", "gridX",
                                  "gridY", "gridZ", "blockX", "blockY", "blockZ", "shortName"});
  if (!cols) return cols.status();
  const bool demangled = cols->count("demangledName") > 0;
  const bool global_pid = cols->count("globalPid") > 0;
  std::vector<Kernel> kernels;
  Status st = file.Query(
      std::string("SELECT rowid, start, \"end\", deviceId, streamId, correlationId, ") +
          (global_pid ? "globalPid" : "NULL") +
          ", gridX, gridY, gridZ, blockX, blockY, blockZ, shortName, " +
          (demangled ? "demangledName" : "NULL") + " FROM CUPTI_ACTIVITY_KIND_KERNEL",
      "read CUPTI_ACTIVITY_KIND_KERNEL", [&](sqlite3_stmt* s) {
        RowReader row(file, s, kKernelTable);
        Kernel k;
        int64_t end = 0;
        std::optional<int64_t> gpid;
        int64_t dims[6] = {};
        int64_t short_id = 0;
        std::optional<int64_t> long_id;
        Status e = row.Int(1, &k.start);
        if (e.ok()) e = row.Int(2, &end);
        if (e.ok()) e = row.Int(3, &k.device);
        if (e.ok()) e = row.Int(4, &k.stream);
        if (e.ok()) e = row.OptInt(5, &k.correlation);
        if (e.ok()) e = row.OptInt(6, &gpid);
        for (int i = 0; i < 6 && e.ok(); ++i) e = row.Int(7 + i, &dims[i]);
        if (e.ok()) e = row.Int(13, &short_id);
        if (e.ok()) e = row.OptInt(14, &long_id);
        if (!e.ok()) return e;
        if (end < k.start) {
          return row.Bad(
              2, std::to_string(end) + " is before the kernel's start " + std::to_string(k.start));
        }
        k.duration = end - k.start;
        if (gpid) k.process = ProcessOf(*gpid);
        // The demangled name when there is one, else the short name.
        auto short_name = strings.find(short_id);
        if (short_name == strings.end()) {
          return row.Bad(13, std::to_string(short_id) + " is not in StringIds");
        }
        k.name = short_name->second;
        if (long_id) {
          auto it = strings.find(*long_id);
          if (it == strings.end()) {
            return row.Bad(14, std::to_string(*long_id) + " is not in StringIds");
          }
          if (!it->second.empty()) k.name = it->second;
        }
        k.grid =
            std::to_string(dims[0]) + "," + std::to_string(dims[1]) + "," + std::to_string(dims[2]);
        k.block =
            std::to_string(dims[3]) + "," + std::to_string(dims[4]) + "," + std::to_string(dims[5]);
        kernels.push_back(std::move(k));
        return Status::Ok();
      });
  if (!st.ok()) return st;
  return kernels;
}

struct Launch {
  int64_t global_tid = 0;
  int64_t start = 0;
  bool found = false;
  bool ambiguous = false;  // several processes launched with this correlation id
};

struct PairHash {
  size_t operator()(const std::pair<int64_t, int64_t>& p) const {
    return std::hash<int64_t>()(p.first) * 1000003u ^ std::hash<int64_t>()(p.second);
  }
};

// The CUDA API calls that launched `kernels`, by (process, correlationId); kernels without a
// process (no globalPid) are looked up by correlationId alone (process -1).
using Launches = std::unordered_map<std::pair<int64_t, int64_t>, Launch, PairHash>;

Status LoadLaunches(Export& file, const std::vector<Kernel>& kernels, Launches* launches) {
  auto cols = file.Require(kRuntimeTable, {"start", "globalTid", "correlationId"});
  if (!cols) return cols.status();
  bool any_unknown_process = false;
  for (const Kernel& k : kernels) {
    if (!k.correlation) continue;
    (*launches)[{k.process.value_or(-1), *k.correlation}];
    any_unknown_process |= !k.process;
  }
  if (launches->empty()) return Status::Ok();
  return file.Query(
      "SELECT rowid, start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
      "WHERE correlationId IS NOT NULL",
      "read CUPTI_ACTIVITY_KIND_RUNTIME", [&](sqlite3_stmt* s) {
        RowReader row(file, s, kRuntimeTable);
        int64_t corr = 0;
        if (Status e = row.Int(3, &corr); !e.ok()) return e;
        if (row.IsNull(2)) return Status::Ok();  // no thread: the kernel's own start counts
        const int64_t tid_key = sqlite3_column_int64(s, 2);
        std::vector<Launch*> wanted;
        if (auto it = launches->find({ProcessOf(tid_key), corr}); it != launches->end()) {
          wanted.push_back(&it->second);
        }
        if (any_unknown_process) {
          if (auto it = launches->find({-1, corr}); it != launches->end()) {
            if (it->second.found) {
              it->second.ambiguous = true;
            } else {
              wanted.push_back(&it->second);
            }
          }
        }
        if (wanted.empty()) return Status::Ok();
        Launch l;
        if (Status e = row.Int(1, &l.start); !e.ok()) return e;
        if (Status e = row.Int(2, &l.global_tid); !e.ok()) return e;
        l.found = true;
        for (Launch* w : wanted) *w = l;
        return Status::Ok();
      });
}

struct Agg {
  int64_t calls = 0;
  int64_t gpu_ns = 0;
  int64_t min_ns = INT64_MAX;
  int64_t max_ns = 0;
};

}  // namespace

Expected<NsysImport> ImportNsysKernels(const std::string& path,
                                       const std::vector<store::StepRow>& steps,
                                       const NsysImportOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return Status::Error("no such file: " + path +
                         " (the .sqlite file of `nsys export --type "
                         "sqlite`)");
  }
  if (std::filesystem::is_directory(path, ec)) {
    return Status::Error(path + " is a directory; pass the .sqlite file of `nsys export`");
  }
  Export file(path);
  if (Status st = file.Open(); !st.ok()) return st;
  if (Status st = file.LoadTables(); !st.ok()) return st;
  if (!file.Has("META_DATA_EXPORT") && !file.Has("EXPORT_META_DATA") && !file.Has(kNvtxTable) &&
      !file.Has(kKernelTable)) {
    return file.Fail(
        "not an Nsight Systems export (it has none of META_DATA_EXPORT, "
        "NVTX_EVENTS, CUPTI_ACTIVITY_KIND_KERNEL): make one with `nsys export "
        "--type sqlite REPORT.nsys-rep`");
  }
  NsysImport out;
  auto version = SchemaVersion(file);
  if (!version) return version.status();
  out.schema_version = *version;
  auto strings = LoadStrings(file);
  if (!strings) return strings.status();
  auto ranges = LoadStepRanges(file, *strings, options);
  if (!ranges) return ranges.status();
  out.step_ranges = ranges->count;
  auto kernels = LoadKernels(file, *strings);
  if (!kernels) return kernels.status();

  Launches launches;
  out.used_runtime = file.Has(kRuntimeTable);
  if (out.used_runtime) {
    if (Status st = LoadLaunches(file, *kernels, &launches); !st.ok()) return st;
  }

  // Kernels onto steps. A kernel of an unknown process (no globalPid) may fall into the step
  // ranges of any process read (only one, unless the ranges of several nest in time).
  auto in_process = [&](std::optional<int64_t> process, int64_t t) -> const StepRange* {
    if (process) {
      auto it = ranges->by_process.find(*process);
      return it == ranges->by_process.end() ? nullptr : it->second.Find(t);
    }
    for (const auto& [_, index] : ranges->by_process) {
      if (const StepRange* r = index.Find(t)) return r;
    }
    return nullptr;
  };
  using Key = std::tuple<int64_t, std::string, int64_t, int64_t, std::string, std::string>;
  std::map<Key, Agg> aggs;
  for (const Kernel& k : *kernels) {
    const StepRange* range = nullptr;
    const Launch* launch = nullptr;
    if (k.correlation) {
      auto it = launches.find({k.process.value_or(-1), *k.correlation});
      if (it != launches.end() && it->second.found && !it->second.ambiguous) {
        launch = &it->second;
      }
    }
    if (launch) {
      if (auto t = ranges->by_thread.find(launch->global_tid); t != ranges->by_thread.end()) {
        range = t->second.Find(launch->start);
      }
      if (!range) range = in_process(ProcessOf(launch->global_tid), launch->start);
    } else {
      range = in_process(k.process, k.start);
    }
    if (!range) {
      ++out.outside_kernels;
      continue;
    }
    ++out.kernels;
    Agg& a = aggs[Key{range->step, k.name, k.device, k.stream, k.grid, k.block}];
    ++a.calls;
    a.gpu_ns += k.duration;
    a.min_ns = std::min(a.min_ns, k.duration);
    a.max_ns = std::max(a.max_ns, k.duration);
  }

  // Steps of the run.
  std::map<int64_t, const store::StepRow*> run_steps;
  for (const store::StepRow& s : steps) run_steps[s.step] = &s;
  std::vector<int64_t> missing;
  for (const auto& [key, _] : aggs) {
    const int64_t step = std::get<0>(key);
    if (out.steps.empty() || out.steps.back() != step) out.steps.push_back(step);
  }
  for (int64_t step : out.steps) {
    if (run_steps.count(step) == 0) missing.push_back(step);
  }
  if (!missing.empty()) {
    std::vector<int64_t> have;
    for (const auto& [step, _] : run_steps) have.push_back(step);
    return file.Fail("kernels in `gpuprof step` " + analysis::NumberRanges(missing) +
                     ", which the run does not have (its steps: " +
                     (have.empty() ? std::string("none") : analysis::NumberRanges(have)) +
                     "): is the capture of another run? pick that run with --run");
  }
  for (const auto& [key, a] : aggs) {
    const store::StepRow& s = *run_steps.at(std::get<0>(key));
    store::KernelRow row;
    row.window_start_ns = s.start_ns;
    row.window_end_ns = s.end_ns;
    row.name = std::get<1>(key);
    row.calls = a.calls;
    row.gpu_ns = a.gpu_ns;
    row.source = "nsys";
    row.step = s.step;
    row.device = std::get<2>(key);
    row.stream = std::get<3>(key);
    row.grid = std::get<4>(key);
    row.block = std::get<5>(key);
    row.min_ns = a.min_ns;
    row.max_ns = a.max_ns;
    out.rows.push_back(std::move(row));
  }
  return out;
}

}  // namespace gpuprof::traces
