#include "traces/nsys_import.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "telemetry/telemetry_test_util.h"

namespace gpuprof::traces {
namespace {

using ::gpuprof::telemetry::testing::TempDir;

constexpr int64_t kPid = 4242;
constexpr int64_t kOtherPid = 777;

int64_t Tid(int64_t pid, int64_t tid) { return pid * 0x1000000 + tid; }
int64_t GlobalPid(int64_t pid) { return pid * 0x1000000; }

// An export shaped like `nsys export --type sqlite` writes it (the documented columns this
// reader uses, plus some it does not), built row by row.
class NsysFile {
 public:
  struct Options {
    std::string meta_table = "META_DATA_EXPORT";
    std::vector<std::pair<std::string, std::string>> meta = {
        {"EXPORT_SCHEMA_VERSION", "3.15.1"}, {"EXPORT_PRODUCT_VERSION", "2024.4.1.61"}};
    bool runtime = true;
    bool demangled = true;
  };

  explicit NsysFile(std::string path) : NsysFile(std::move(path), Options()) {}
  NsysFile(std::string path, const Options& o) : path_(std::move(path)) {
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db_), SQLITE_OK);
    Sql("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)");
    Sql("CREATE TABLE " + o.meta_table + " (name TEXT NOT NULL, value TEXT)");
    for (const auto& [k, v] : o.meta) {
      Sql("INSERT INTO " + o.meta_table + " VALUES ('" + k + "', '" + v + "')");
    }
    Sql("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT "
        "NULL, rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, "
        "endGlobalTid INTEGER, textId INTEGER, domainId INTEGER)");
    Sql(std::string("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end "
                    "INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
                    "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, ") +
        (o.demangled ? "demangledName INTEGER NOT NULL, " : "") +
        "shortName INTEGER NOT NULL, mangledName INTEGER, registersPerThread INTEGER, "
        "gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER "
        "NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, gridId INTEGER)");
    demangled_ = o.demangled;
    if (o.runtime) {
      Sql("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT "
          "NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId "
          "INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER)");
      launch_name_ = String("cudaLaunchKernel_v7000");
    }
  }
  ~NsysFile() { sqlite3_close(db_); }
  NsysFile(const NsysFile&) = delete;
  NsysFile& operator=(const NsysFile&) = delete;

  void Sql(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }

  int64_t String(const std::string& s) {
    auto it = ids_.find(s);
    if (it != ids_.end()) return it->second;
    const int64_t id = static_cast<int64_t>(ids_.size()) + 1;
    Sql("INSERT INTO StringIds VALUES (" + std::to_string(id) + ", '" + s + "')");
    return ids_[s] = id;
  }

  // An NVTX range; `registered` puts the message into StringIds (textId) instead of text.
  void Range(int64_t global_tid, int64_t start, int64_t end, const std::string& text,
             bool registered = false, int event_type = 59) {
    const std::string msg = registered ? "NULL" : "'" + text + "'";
    const std::string text_id = registered ? std::to_string(String(text)) : "NULL";
    Sql("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) "
        "VALUES (" +
        std::to_string(start) + ", " + std::to_string(end) + ", " + std::to_string(event_type) +
        ", " + msg + ", " + std::to_string(global_tid) + ", " + text_id + ", 0)");
  }

  // A cudaLaunchKernel call on `global_tid` at `start`; returns its correlation id.
  int64_t Launch(int64_t global_tid, int64_t start) {
    const int64_t corr = ++correlation_;
    Sql("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (" + std::to_string(start) + ", " +
        std::to_string(start + 3) + ", 1, " + std::to_string(global_tid) + ", " +
        std::to_string(corr) + ", " + std::to_string(launch_name_) + ", 0, NULL)");
    return corr;
  }

  struct K {
    int64_t corr = 0;  // 0: NULL
    int64_t pid = kPid;
    int64_t start = 0;
    int64_t end = 0;
    std::string name = "gemm";
    int64_t device = 0;
    int64_t stream = 7;
    std::string grid = "4, 1, 1";
    std::string block = "128, 1, 1";
  };
  void Kernel(const K& k) {
    const std::string corr = k.corr ? std::to_string(k.corr) : "NULL";
    const int64_t short_id = String(k.name);
    const std::string names =
        demangled_ ? std::to_string(String("void " + k.name + "<float>(float*)")) + ", " : "";
    Sql(std::string("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, "
                    "streamId, correlationId, globalPid, ") +
        (demangled_ ? "demangledName, " : "") +
        "shortName, gridX, gridY, gridZ, blockX, blockY, blockZ, gridId) VALUES (" +
        std::to_string(k.start) + ", " + std::to_string(k.end) + ", " + std::to_string(k.device) +
        ", 1, " + std::to_string(k.stream) + ", " + corr + ", " + std::to_string(GlobalPid(k.pid)) +
        ", " + names + std::to_string(short_id) + ", " + k.grid + ", " + k.block + ", 1)");
  }

  // A kernel launched on `global_tid` at `launch`, running [start, end) on the GPU.
  void Launched(int64_t global_tid, int64_t launch, int64_t start, int64_t end,
                const std::string& name = "gemm") {
    K k;
    k.corr = Launch(global_tid, launch);
    k.pid = global_tid / 0x1000000;
    k.start = start;
    k.end = end;
    k.name = name;
    Kernel(k);
  }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
  std::map<std::string, int64_t> ids_;
  int64_t correlation_ = 1000;
  int64_t launch_name_ = 0;
  bool demangled_ = true;
};

std::vector<store::StepRow> Steps(std::initializer_list<std::tuple<int64_t, int64_t, int64_t>> s) {
  std::vector<store::StepRow> out;
  for (const auto& [step, start, end] : s) {
    store::StepRow r;
    r.step = step;
    r.start_ns = start;
    r.end_ns = end;
    out.push_back(r);
  }
  return out;
}

// The run the captures below belong to: steps 0 and 1 (run-relative times, unrelated to nsys').
const std::vector<store::StepRow> kRunSteps = Steps({{0, 5'000, 9'000}, {1, 9'000, 14'000}});

const int64_t kMain = Tid(kPid, 11);
const int64_t kAutograd = Tid(kPid, 12);

// Two steps on the main thread, with phase ranges inside them.
void TwoSteps(NsysFile& f) {
  f.Range(kMain, 100, 200, "gpuprof step 0");
  f.Range(kMain, 100, 150, "gpuprof forward");
  f.Range(kMain, 150, 190, "gpuprof backward");
  f.Range(kMain, 200, 300, "gpuprof step 1");
  f.Range(kMain, 200, 250, "gpuprof forward");
}

std::string Message(const Expected<NsysImport>& r) { return r.ok() ? "" : r.error(); }

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(NsysImport, AggregatesKernelsOfTwoStepsPerNameAndLaunchConfiguration) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Launched(kMain, 110, 120, 130);  // step 0: gemm twice (10 and 30 ns)
    f.Launched(kMain, 140, 150, 180);
    f.Launched(kMain, 160, 170, 175, "relu");
    f.Launched(kMain, 210, 220, 260);  // step 1: gemm once
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->schema_version, "3.15.1");
  EXPECT_EQ(r->kernels, 4);
  EXPECT_EQ(r->outside_kernels, 0);
  EXPECT_EQ(r->step_ranges, 2);  // the phase ranges are not steps
  EXPECT_TRUE(r->used_runtime);
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(r->rows.size(), 3u);
  const store::KernelRow& gemm0 = r->rows[0];
  EXPECT_EQ(gemm0.step, 0);
  EXPECT_EQ(gemm0.name, "void gemm<float>(float*)");  // the demangled name
  EXPECT_EQ(gemm0.calls, 2);
  EXPECT_EQ(gemm0.gpu_ns, 40);
  EXPECT_EQ(gemm0.min_ns, 10);
  EXPECT_EQ(gemm0.max_ns, 30);
  EXPECT_EQ(gemm0.window_start_ns, 5'000);  // the step's span from the run's steps table
  EXPECT_EQ(gemm0.window_end_ns, 9'000);
  EXPECT_EQ(gemm0.source, "nsys");
  EXPECT_EQ(gemm0.device, 0);
  EXPECT_EQ(gemm0.stream, 7);
  EXPECT_EQ(gemm0.grid, "4,1,1");
  EXPECT_EQ(gemm0.block, "128,1,1");
  EXPECT_EQ(r->rows[1].name, "void relu<float>(float*)");
  EXPECT_EQ(r->rows[1].calls, 1);
  EXPECT_EQ(r->rows[2].step, 1);
  EXPECT_EQ(r->rows[2].window_start_ns, 9'000);
  EXPECT_EQ(r->rows[2].gpu_ns, 40);
}

TEST(NsysImport, SeparateRowsPerDeviceStreamAndGrid) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    NsysFile::K k;
    k.start = 120;
    k.end = 130;
    for (int i = 0; i < 3; ++i) {
      k.corr = f.Launch(kMain, 110 + i);
      k.device = i == 1 ? 1 : 0;
      k.stream = i == 2 ? 9 : 7;
      f.Kernel(k);
    }
    k.corr = f.Launch(kMain, 120);
    k.grid = "8, 2, 1";
    f.Kernel(k);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->rows.size(), 4u);
  for (const store::KernelRow& row : r->rows) EXPECT_EQ(row.calls, 1);
}

TEST(NsysImport, KernelsOutsideStepRangesAreCountedNotImported) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Range(kMain, 40, 90, "gpuprof stepper");  // not a step range: not "gpuprof step <i>"
    f.Range(kMain, 40, 90, "gpuprof step x");
    f.Launched(kMain, 50, 60, 70);     // before the first step
    f.Launched(kMain, 150, 160, 170);  // step 0
    f.Launched(kMain, 300, 310, 320);  // at the end of step 1: outside ([start, end))
    f.Launched(kMain, 400, 410, 420);  // after the last step
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->kernels, 1);
  EXPECT_EQ(r->outside_kernels, 3);
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0}));
  ASSERT_EQ(r->rows.size(), 1u);
}

TEST(NsysImport, AKernelBelongsToTheStepOfItsLaunchNotOfItsExecution) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Launched(kMain, 195, 240, 280);  // queued at the end of step 0, runs during step 1
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->rows[0].step, 0);
}

TEST(NsysImport, LaunchesFromAThreadWithoutStepRangesCountToTheProcessStep) {
  // PyTorch launches backward kernels from autograd's device thread, which has no NVTX ranges.
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Launched(kAutograd, 170, 175, 185);
    f.Launched(kAutograd, 220, 225, 235);
    f.Launched(Tid(kOtherPid, 3), 170, 175, 185);  // another process: outside
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r->kernels, 2);
  EXPECT_EQ(r->outside_kernels, 1);
}

TEST(NsysImport, CorrelationIdsAreMatchedWithinTheirProcess) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    // The other process's launch has the correlation id that our kernel has, at a time in
    // step 1; our own launch of it is in step 0.
    const int64_t corr = f.Launch(kMain, 120);
    f.Sql("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (250, 253, 1, " +
          std::to_string(Tid(kOtherPid, 1)) + ", " + std::to_string(corr) + ", 1, 0, NULL)");
    NsysFile::K k;
    k.corr = corr;
    k.start = 260;
    k.end = 270;
    f.Kernel(k);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->rows[0].step, 0);
}

TEST(NsysImport, WithoutARuntimeTableTheKernelStartCounts) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile::Options o;
    o.runtime = false;
    NsysFile f(path, o);
    TwoSteps(f);
    NsysFile::K k;
    k.corr = 5;
    k.start = 195;  // step 0
    k.end = 199;
    f.Kernel(k);
    k.start = 240;  // step 1
    k.end = 260;
    f.Kernel(k);
    k.start = 320;  // outside
    k.end = 330;
    f.Kernel(k);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_FALSE(r->used_runtime);
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r->outside_kernels, 1);
}

TEST(NsysImport, AKernelWithoutACorrelationIdUsesItsStart) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    NsysFile::K k;  // corr NULL
    k.start = 250;
    k.end = 260;
    f.Kernel(k);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->steps, (std::vector<int64_t>{1}));
}

TEST(NsysImport, RegisteredStringsAndStartEndRanges) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    f.Range(kMain, 100, 200, "gpuprof step 0", /*registered=*/true);
    f.Range(kMain, 200, 300, "gpuprof step 1", /*registered=*/false, /*event_type=*/60);
    f.Range(kMain, 300, 300, "gpuprof step 9", false, /*mark=*/34);  // a mark: not a range
    f.Launched(kMain, 110, 120, 130);
    f.Launched(kMain, 210, 220, 230);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r->step_ranges, 2);
}

TEST(NsysImport, ShortNameWithoutDemangledNames) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile::Options o;
    o.demangled = false;
    NsysFile f(path, o);
    TwoSteps(f);
    f.Launched(kMain, 110, 120, 130, "sgemm_128x64");
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->rows[0].name, "sgemm_128x64");
}

TEST(NsysImport, OlderMetaTableAndVersionParts) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile::Options o;
    o.meta_table = "EXPORT_META_DATA";
    o.meta = {{"EXPORT_SCHEMA_VERSION_MAJOR", "3"},
              {"EXPORT_SCHEMA_VERSION_MINOR", "22"},
              {"EXPORT_SCHEMA_VERSION_MICRO", "1"}};
    NsysFile f(path, o);
    TwoSteps(f);
    f.Launched(kMain, 110, 120, 130);
  }
  auto r = ImportNsysKernels(path, kRunSteps);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->schema_version, "3.22.1");
}

TEST(NsysImport, UnknownSchemaVersionListsTheKnownOnes) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile::Options o;
    o.meta = {{"EXPORT_SCHEMA_VERSION", "4.0.2"}};
    NsysFile f(path, o);
    TwoSteps(f);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "'4.0.2' is not one this gpuprof reads")) << e;
  EXPECT_TRUE(Contains(e, "3.x (known: 3.1.7, 3.15.1")) << e;
}

TEST(NsysImport, MissingSchemaVersionIsAnError) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile::Options o;
    o.meta = {{"EXPORT_PRODUCT_VERSION", "2024.4.1.61"}};
    NsysFile f(path, o);
    TwoSteps(f);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "no EXPORT_SCHEMA_VERSION in META_DATA_EXPORT")) << e;
  {
    NsysFile f(dir.path() + "/nometa.sqlite");
    f.Sql("DROP TABLE META_DATA_EXPORT");
  }
  const std::string e2 = Message(ImportNsysKernels(dir.path() + "/nometa.sqlite", kRunSteps));
  EXPECT_TRUE(Contains(e2, "no export schema version")) << e2;
}

TEST(NsysImport, ForeignSqliteFileIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/other.db";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, "CREATE TABLE runs (run_id INTEGER); INSERT INTO runs VALUES (1)", nullptr,
                 nullptr, nullptr);
    sqlite3_close(db);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, path + ": not an Nsight Systems export")) << e;
  EXPECT_TRUE(Contains(e, "nsys export --type sqlite")) << e;
}

TEST(NsysImport, NotSqliteAndMissingFilesAreRefused) {
  TempDir dir;
  const std::string report = dir.Write("capture.nsys-rep", std::string(4096, 'x'));
  const std::string e = Message(ImportNsysKernels(report, kRunSteps));
  EXPECT_TRUE(Contains(e, "not an SQLite file")) << e;
  const std::string e2 = Message(ImportNsysKernels(dir.path() + "/none.sqlite", kRunSteps));
  EXPECT_TRUE(Contains(e2, "no such file: " + dir.path() + "/none.sqlite")) << e2;
  const std::string e3 = Message(ImportNsysKernels(dir.path(), kRunSteps));
  EXPECT_TRUE(Contains(e3, "is a directory")) << e3;
}

TEST(NsysImport, MissingColumnsAreNamed) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Sql("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL");
    f.Sql(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId "
        "INTEGER, streamId INTEGER, correlationId INTEGER, shortName INTEGER)");
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "table CUPTI_ACTIVITY_KIND_KERNEL lacks column(s) gridX, gridY")) << e;
}

TEST(NsysImport, NullsAndGarbageAreErrorsNamingTheRow) {
  TempDir dir;
  struct Case {
    const char* name;
    std::string sql;
    std::string expected;
  };
  // The kernel table without its NOT NULL constraints (a damaged or hand-made file).
  const std::string kLoose =
      "CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL; DROP TABLE "
      "CUPTI_ACTIVITY_KIND_KERNEL; ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL; ";
  const std::vector<Case> cases = {
      {"null_start", kLoose + "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = NULL",
       "CUPTI_ACTIVITY_KIND_KERNEL row 1: start is NULL, not an integer"},
      {"text_device", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 'gpu0'",
       "CUPTI_ACTIVITY_KIND_KERNEL row 1: deviceId is text 'gpu0', not an integer"},
      {"real_grid", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridY = 1.5",
       "gridY is the real number 1.5"},
      {"backwards", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 1",
       "end 1 is before the kernel's start 120"},
      {"unknown_name", "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 999",
       "demangledName 999 is not in StringIds"},
      {"open_range", "UPDATE NVTX_EVENTS SET end = NULL WHERE text = 'gpuprof step 1'",
       "end is NULL: the range 'gpuprof step 1' never ended"},
      {"range_thread", "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE text = 'gpuprof step 0'",
       "globalTid is NULL"},
      {"launch_start", "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'soon'",
       "CUPTI_ACTIVITY_KIND_RUNTIME row 1: start is text 'soon'"},
      {"null_meta", "UPDATE META_DATA_EXPORT SET value = NULL",
       "META_DATA_EXPORT row 1: value is NULL"},
      {"text_id",
       "UPDATE NVTX_EVENTS SET text = NULL, textId = 'abc' WHERE text = 'gpuprof step 0'",
       "NVTX_EVENTS row 1: textId is text 'abc'"},
      {"short_name", kLoose + "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = NULL",
       "shortName is NULL"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.path() + "/" + c.name + ".sqlite";
    {
      NsysFile f(path);
      TwoSteps(f);
      f.Launched(kMain, 110, 120, 130);
      f.Sql(c.sql);
    }
    const std::string e = Message(ImportNsysKernels(path, kRunSteps));
    EXPECT_TRUE(Contains(e, path + ": ") && Contains(e, c.expected)) << c.name << ": " << e;
  }
}

TEST(NsysImport, NoStepRangesSaysHowToCapture) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    f.Range(kMain, 100, 200, "my_forward");
    f.Launched(kMain, 110, 120, 130);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "no `gpuprof step <i>` NVTX ranges")) << e;
  EXPECT_TRUE(Contains(e, "with prof.nsys_capture():")) << e;
  EXPECT_TRUE(Contains(e, "--capture-range=cudaProfilerApi --trace=cuda,nvtx")) << e;
  {
    NsysFile f(dir.path() + "/nonvtx.sqlite");
    f.Sql("DROP TABLE NVTX_EVENTS");
  }
  const std::string e2 = Message(ImportNsysKernels(dir.path() + "/nonvtx.sqlite", kRunSteps));
  EXPECT_TRUE(Contains(e2, "no NVTX_EVENTS table")) << e2;
}

TEST(NsysImport, NoKernelTableIsAnError) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Sql("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL");
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "no CUDA kernels (no CUPTI_ACTIVITY_KIND_KERNEL table)")) << e;
}

TEST(NsysImport, KernelsInAStepTheRunLacksAreAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Range(kMain, 300, 400, "gpuprof step 2");
    f.Range(kMain, 400, 500, "gpuprof step 3");
    f.Range(kMain, 500, 600, "gpuprof step 4");  // no kernels: not checked
    f.Launched(kMain, 110, 120, 130);
    f.Launched(kMain, 310, 320, 330);
    f.Launched(kMain, 410, 420, 430);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e,
                       "kernels in `gpuprof step` 2–3, which the run does not have "
                       "(its steps: 0–1)"))
      << e;
  EXPECT_TRUE(Contains(e, "--run")) << e;
  // The run that has them.
  auto r = ImportNsysKernels(path, Steps({{0, 0, 1}, {1, 1, 2}, {2, 2, 3}, {3, 3, 4}}));
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->steps, (std::vector<int64_t>{0, 2, 3}));
}

TEST(NsysImport, StepRangesOfSeveralProcessesNeedAPid) {
  TempDir dir;
  const std::string path = dir.path() + "/capture.sqlite";
  const int64_t other_main = Tid(kOtherPid, 5);
  {
    NsysFile f(path);
    TwoSteps(f);
    f.Range(other_main, 100, 200, "gpuprof step 0");
    f.Launched(kMain, 110, 120, 130);
    f.Launched(other_main, 110, 120, 130);
    f.Launched(other_main, 120, 130, 140);
  }
  const std::string e = Message(ImportNsysKernels(path, kRunSteps));
  EXPECT_TRUE(Contains(e, "ranges of 2 processes (pids 777, 4242): pass --pid PID")) << e;

  NsysImportOptions options;
  options.pid = kOtherPid;
  auto other = ImportNsysKernels(path, kRunSteps, options);
  ASSERT_TRUE(other.ok()) << other.error();
  EXPECT_EQ(other->kernels, 2);
  EXPECT_EQ(other->outside_kernels, 1);

  options.pid.reset();
  options.run_pid = kPid;  // the run's own process is picked
  auto own = ImportNsysKernels(path, kRunSteps, options);
  ASSERT_TRUE(own.ok()) << own.error();
  EXPECT_EQ(own->kernels, 1);
  EXPECT_EQ(own->outside_kernels, 2);

  options.pid = 99;
  const std::string e2 = Message(ImportNsysKernels(path, kRunSteps, options));
  EXPECT_TRUE(Contains(e2,
                       "no `gpuprof step` ranges of process 99 (processes with them: 777, "
                       "4242)"))
      << e2;
}

}  // namespace
}  // namespace gpuprof::traces
