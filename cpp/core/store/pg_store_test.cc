// PgStore against a real PostgreSQL: ctest starts a throwaway cluster (fixture pg_cluster,
// scripts/pg_cluster.sh) and names its state file in GPUPROF_TEST_PG_STATE; or point
// GPUPROF_TEST_PG_URL at a database whose user may CREATE DATABASE. Every test gets a fresh
// database. What is checked: the schema's creation and its version check, and that every row
// written reads back exactly as SQLite gives it back (same rows, same order, doubles bit for bit).
#include "store/pg_store.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "store/row_json.h"
#include "store/schema_test_util.h"
#include "store/sqlite_store.h"
#include "store/table_sql.h"

namespace gpuprof::store {
namespace {

std::string BaseUrl() {
  if (const char* url = std::getenv("GPUPROF_TEST_PG_URL"); url && *url) return url;
  if (const char* state = std::getenv("GPUPROF_TEST_PG_STATE"); state && *state) {
    std::ifstream in(state);
    std::string line;
    if (std::getline(in, line)) return line;
  }
  return "";
}

// The URL with its database name replaced (postgresql://.../NAME?query).
std::string WithDatabase(const std::string& url, const std::string& name) {
  const size_t q = url.find('?');
  const std::string head = url.substr(0, q);
  const size_t slash = head.rfind('/');
  return head.substr(0, slash + 1) + name + (q == std::string::npos ? "" : url.substr(q));
}

bool Exec(const std::string& url, const std::string& sql, std::string* error = nullptr) {
  PGconn* c = PQconnectdb(url.c_str());
  bool ok = PQstatus(c) == CONNECTION_OK;
  if (ok) {
    PGresult* r = PQexec(c, sql.c_str());
    ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
  }
  if (!ok && error) *error = PQerrorMessage(c);
  PQfinish(c);
  return ok;
}

class PgStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = BaseUrl();
    if (base_.empty()) {
      GTEST_SKIP() << "no PostgreSQL: run through ctest (fixture pg_cluster) or set "
                      "GPUPROF_TEST_PG_URL";
    }
    static std::atomic<int> counter{0};
    name_ = "t_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    std::string error;
    ASSERT_TRUE(Exec(base_, "CREATE DATABASE " + name_, &error)) << error;
    url_ = WithDatabase(base_, name_);
  }
  void TearDown() override {
    if (!name_.empty()) Exec(base_, "DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
  }
  std::unique_ptr<PgStore> OpenPg() {
    auto s = PgStore::Open(url_);
    EXPECT_TRUE(s.ok()) << s.error();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::string base_, name_, url_;
};

// A run with a row of every table, with NULLs, extreme integers and awkward doubles.
std::vector<Row> EveryTable() {
  std::vector<Row> rows;
  rows.emplace_back(StepRow{0, 0, 5'000'000, 1'000'000, "gap", 3, 1, 1});
  rows.emplace_back(StepRow{1, 5'000'000, 9'000'000, std::nullopt, std::nullopt, 0, 0, 0});
  rows.emplace_back(PhaseRow{0, "forward", 2'000'000, std::nullopt, 3});
  rows.emplace_back(PhaseRow{0, "backward", 1'500'000, 1'400'000, 1});
  rows.emplace_back(PhaseGpuRow{0, "forward", 700});
  rows.emplace_back(PhaseGpuRow{1, "optimizer", 900});  // placeholder phase
  rows.emplace_back(GpuInfoRow{0, "H200 \"NVL\" é", "GPU-1", 150'000'000'000, std::nullopt});
  GpuSampleRow g;
  g.ts_ns = 100;
  g.util_pct = 0.1;
  g.mem_used_bytes = std::numeric_limits<int64_t>::max();
  g.temp_c = 1e-300;
  g.pcie_rx_bps = 123456789.123456789;
  rows.emplace_back(g);
  HostSampleRow h;
  h.ts_ns = 200;
  h.cpu_pct = 33.333333333333336;
  h.cpu_per_core = {1.5, 2.25};
  h.mem_total_bytes = std::numeric_limits<int64_t>::min();
  rows.emplace_back(h);
  rows.emplace_back(WorkerSampleRow{300, 42, "child", 99.5, std::nullopt});
  rows.emplace_back(KernelRow{0, 1000, "sm90_xmma_gemm", 7, 12345, "cupti"});
  rows.emplace_back(KernelRow{0, 1000, "Zeta", 1, 1, "cupti"});
  rows.emplace_back(KernelRow{0, 1000, "alpha", 1, 1, "cupti"});  // byte order: Z < a
  KernelRow launch{0, 1000, "flash_fwd", 2, 800, "nsys", 4, 0, 7, "16,8,1", "128,1,1", 350, 450};
  rows.emplace_back(launch);
  rows.emplace_back(CpuOpRow{0, 1000, 4, "aten::bmm", 3, 9000, 9500, "torch_profiler"});
  rows.emplace_back(CpuOpRow{0, 1000, std::nullopt, "(12 other operators)", 40, 700, std::nullopt,
                             "torch_profiler"});
  rows.emplace_back(CommBucketRow{0, 3, 10, 20, std::nullopt});
  rows.emplace_back(TelemetryStatusRow{"gpu", true, "mock", std::nullopt});
  rows.emplace_back(TelemetryStatusRow{"cuda_events", false, std::nullopt, "no CUDA"});
  rows.emplace_back(DiagnosticRow{std::nullopt, "info", "core", "first, untimed"});
  rows.emplace_back(DiagnosticRow{5, "warning", "ring", "b at 5"});
  rows.emplace_back(DiagnosticRow{5, "warning", "ring", "a at 5, written second"});
  rows.emplace_back(DiagnosticRow{std::nullopt, "info", "core", "second, untimed"});
  GpuRollupRow r;
  r.ts_ns = 0;
  r.samples = 10;
  r.util_samples = 10;
  r.util_mean_pct = 2.0 / 3.0;
  r.power_max_mw = 700'000;
  rows.emplace_back(r);
  rows.emplace_back(WorkerRollupRow{0, 42, "main", 5, 5, 12.5, 50, 1 << 30});
  rows.emplace_back(StallRow{1000, 20'000'000});
  rows.emplace_back(CpuWaitRow{0, 100, 7});
  return rows;
}

RunInfo Info(const std::string& name) {
  RunInfo info;
  info.run_name = name;
  info.hostname = "host";
  info.pid = 1;
  info.start_unix_ns = 1'700'000'000'000'000'000;
  info.flops_per_step = 3.5e12;
  info.config_json = R"({"a": 1})";
  return info;
}

// Everything LoadRun gives back, as JSON (every column of every table, in load order).
nlohmann::json AsJson(const RunData& d) {
  std::vector<Row> rows;
  auto add = [&](const auto& v) {
    for (const auto& r : v) rows.emplace_back(r);
  };
  add(d.steps);
  add(d.phases);
  add(d.gpus);
  add(d.gpu_samples_1s);
  add(d.host_samples);
  add(d.worker_samples_10s);
  add(d.kernels);
  add(d.cpu_ops);
  add(d.comm_buckets);
  add(d.stalls);
  add(d.cpu_waits);
  add(d.telemetry);
  add(d.diagnostics);
  nlohmann::json j = RowsToJson(rows);
  nlohmann::json run = RunInfoToJson(d.run);
  j["run"] = run;
  j["insights"] = InsightsToJson(d.insights);
  return j;
}

TEST_F(PgStoreTest, ADatabaseWithoutTheTraceSchemaIsUpgradedWhenOpenedForWriting) {
  // GIVEN a database as an earlier server created it: no cpu_ops, kernels without the launch
  // columns, one run with a kernel row
  {
    auto pg = OpenPg();
    ASSERT_TRUE(pg);
    auto id = pg->BeginRun(Info("old"));
    ASSERT_TRUE(id.ok()) << id.error();
    ASSERT_TRUE(pg->WriteRows(*id, {Row(KernelRow{0, 10, "gemm", 1, 5, "cupti"})}).ok());
  }
  std::string error;
  ASSERT_TRUE(Exec(url_,
                   "DROP TABLE cpu_ops; ALTER TABLE kernels DROP COLUMN step, DROP COLUMN "
                   "device, DROP COLUMN stream, DROP COLUMN grid, DROP COLUMN block, "
                   "DROP COLUMN min_ns, DROP COLUMN max_ns",
                   &error))
      << error;
  // WHEN a server opens it to write
  auto pg = OpenPg();
  ASSERT_TRUE(pg);
  // THEN the old row reads back and the new rows are stored
  KernelRow k{20, 30, "gemm", 2, 9, "cupti"};
  k.step = 3;
  k.block = "64,1,1";
  ASSERT_TRUE(
      pg->WriteRows(1, {Row(k), Row(CpuOpRow{20, 30, 3, "aten::mm", 1, 4, 6, "torch_profiler"})})
          .ok());
  auto d = pg->LoadRun(1);
  ASSERT_TRUE(d.ok()) << d.error();
  ASSERT_EQ(d->kernels.size(), 2u);
  EXPECT_EQ(d->kernels[0].step, std::nullopt);
  EXPECT_EQ(d->kernels[1].step, 3);
  EXPECT_EQ(d->kernels[1].block, "64,1,1");
  ASSERT_EQ(d->cpu_ops.size(), 1u);
  EXPECT_EQ(d->cpu_ops[0].name, "aten::mm");
}

TEST_F(PgStoreTest, EveryDescriptorMatchesTheSchema) {
  // GIVEN a freshly created database (schema.sql, translated by PgSchemaSql)
  ASSERT_TRUE(OpenPg());
  PGconn* c = PQconnectdb(url_.c_str());
  ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  // WHEN each table's column list (store/tables.h) is compared with information_schema
  ForEachTable([&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::string table = Table<T>::kName;
    const char* params[] = {table.c_str()};
    PGresult* r = PQexecParams(
        c,
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        1, nullptr, params, nullptr, nullptr, 0);
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK) << PQerrorMessage(c);
    struct Info {
      std::string name, type;
      bool nullable;
    };
    std::vector<Info> ddl;
    for (int i = 0; i < PQntuples(r); ++i) {
      const std::string name = PQgetvalue(r, i, 0);
      if (table == "diagnostics" && name == "seq") continue;  // PostgreSQL's insertion order
      ddl.push_back({name, PQgetvalue(r, i, 1), std::string(PQgetvalue(r, i, 2)) == "YES"});
    }
    PQclear(r);
    // THEN the table has exactly those columns, in that order, with the member's type and
    // nullability
    const std::vector<sql::ColumnDesc> want = sql::Columns<T>();
    ASSERT_EQ(ddl.size(), want.size()) << table;
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string where = table + "." + want[i].name;
      EXPECT_EQ(ddl[i].name, want[i].name) << table << " column " << i;
      if (want[i].type == nullptr) continue;
      std::string type = want[i].type;
      for (char& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      EXPECT_EQ(ddl[i].type, type) << where;
      if (want[i].nullable) {
        EXPECT_TRUE(ddl[i].nullable) << where;
      } else if (!schema_check::PlainMemberMayBeNullable<T>(where)) {
        EXPECT_FALSE(ddl[i].nullable) << where;
      }
    }
  });
  PQfinish(c);
}

TEST_F(PgStoreTest, EveryRowReadsBackAsSqliteGivesItBack) {
  auto pg = OpenPg();
  ASSERT_TRUE(pg);
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / ("pg_compare_" + name_ + ".db")).string();
  std::filesystem::remove(path);
  auto lite = SqliteStore::Open(path);
  ASSERT_TRUE(lite.ok()) << lite.error();
  std::vector<InsightRow> insights = {
      {0, "dataloader_stall", "data_pipeline", "high", "msg", std::nullopt, R"({"x": 0.1})"}};
  for (RunStore* s : std::initializer_list<RunStore*>{pg.get(), lite->get()}) {
    auto id = s->BeginRun(Info("every"));
    ASSERT_TRUE(id.ok()) << id.error();
    EXPECT_EQ(*id, 1);
    ASSERT_TRUE(s->WriteRows(*id, EveryTable()).ok());
    // A re-write upserts (steps, phases with GPU time kept), as on SQLite.
    ASSERT_TRUE(s->WriteRows(*id, {Row(PhaseRow{1, "optimizer", 50, std::nullopt, 1})}).ok());
    ASSERT_TRUE(s->ReplaceInsights(*id, insights).ok());
    ASSERT_TRUE(s->FinishRun(*id, "ok", 9'000'000, std::nullopt).ok());
  }
  auto from_pg = pg->LoadRun(1);
  auto from_lite = (*lite)->LoadRun(1);
  ASSERT_TRUE(from_pg.ok()) << from_pg.error();
  ASSERT_TRUE(from_lite.ok()) << from_lite.error();
  EXPECT_EQ(AsJson(*from_pg).dump(1), AsJson(*from_lite).dump(1));
  // Doubles bit for bit, not only as printed.
  EXPECT_EQ(from_pg->gpu_samples_1s.at(0).util_mean_pct, 2.0 / 3.0);
  EXPECT_EQ(from_pg->host_samples.at(0).cpu_pct, 33.333333333333336);
  EXPECT_EQ(from_pg->kernels.at(0).name, "Zeta");  // byte order, as SQLite
  EXPECT_EQ(from_pg->kernels.at(1).name, "alpha");
  EXPECT_EQ(from_pg->kernels.at(2).grid, "16,8,1");  // launch detail and null alike
  EXPECT_EQ(from_pg->kernels.at(2).max_ns, 450);
  EXPECT_EQ(from_pg->kernels.at(0).step, std::nullopt);
  ASSERT_EQ(from_pg->cpu_ops.size(), 2u);
  EXPECT_EQ(from_pg->cpu_ops.at(1).cpu_ns, 9500);
  EXPECT_EQ(from_pg->cpu_ops.at(0).cpu_ns, std::nullopt);
  EXPECT_EQ(from_pg->diagnostics.at(1).message, "second, untimed");
  EXPECT_EQ(from_pg->diagnostics.at(3).message, "a at 5, written second");
  // The light reads agree too.
  auto kernels_pg = pg->LoadKernels(1), kernels_lite = (*lite)->LoadKernels(1);
  ASSERT_TRUE(kernels_pg.ok() && kernels_lite.ok());
  ASSERT_EQ(kernels_pg->size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(kernels_pg->at(i).name, kernels_lite->at(i).name);
  auto latest_pg = pg->LatestGpuSecond(1), latest_lite = (*lite)->LatestGpuSecond(1);
  ASSERT_TRUE(latest_pg.ok() && latest_lite.ok());
  ASSERT_EQ(latest_pg->size(), 1u);
  EXPECT_EQ(latest_pg->at(0).util_mean_pct, latest_lite->at(0).util_mean_pct);
  EXPECT_EQ(latest_pg->at(0).temp_max_c, std::nullopt);
  // The dashboard's reads: rollups of every GPU, host series, a run's progress and headline.
  auto scan = [](RunStore& s, bool gpu, std::optional<int64_t> index) {
    std::vector<SeriesRow> rows;
    auto keep = [&](const SeriesRow& r) { rows.push_back(r); };
    Status st = gpu ? s.ScanGpuSeries(1, index, 0, INT64_MAX, keep)
                    : s.ScanHostSeries(1, 0, INT64_MAX, keep);
    EXPECT_TRUE(st.ok()) << st.message();
    return rows;
  };
  for (bool gpu : {true, false}) {
    const auto a = scan(*pg, gpu, std::nullopt), b = scan(**lite, gpu, std::nullopt);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].ts_ns, b[i].ts_ns);
      EXPECT_EQ(a[i].gpu_index, b[i].gpu_index);
      EXPECT_EQ(a[i].known, b[i].known);
      for (int c = 0; c < 5; ++c) EXPECT_EQ(a[i].v[c], b[i].v[c]);
    }
  }
  EXPECT_TRUE(scan(*pg, true, 99).empty());
  auto progress_pg = pg->LoadRunProgress(1), progress_lite = (*lite)->LoadRunProgress(1);
  ASSERT_TRUE(progress_pg.ok() && progress_lite.ok()) << progress_pg.error();
  EXPECT_GT(progress_pg->steps, 0);
  EXPECT_EQ(progress_pg->steps, progress_lite->steps);
  EXPECT_EQ(progress_pg->last_step, progress_lite->last_step);
  EXPECT_EQ(progress_pg->last_step_end_ns, progress_lite->last_step_end_ns);
  EXPECT_EQ(progress_pg->last_sample_ns, progress_lite->last_sample_ns);
  ASSERT_TRUE(progress_pg->headline.has_value());
  EXPECT_EQ(progress_pg->headline->rule_id, "dataloader_stall");
  EXPECT_EQ(progress_pg->headline->fix, std::nullopt);
  auto empty = pg->LoadRunProgress(42);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->steps, 0);
  EXPECT_EQ(empty->last_step, std::nullopt);
  EXPECT_FALSE(empty->headline.has_value());
  std::filesystem::remove(path);
}

TEST_F(PgStoreTest, LongRunsOfOneTableReadBackAsSqliteGivesThemBack) {
  // GIVEN runs of comm buckets and diagnostics of every length around the 32 rows a multi-row
  // INSERT takes, between steps, written to PostgreSQL and to SQLite
  auto pg = OpenPg();
  ASSERT_TRUE(pg);
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / ("pg_long_" + name_ + ".db")).string();
  std::filesystem::remove(path);
  auto lite = SqliteStore::Open(path);
  ASSERT_TRUE(lite.ok()) << lite.error();
  std::vector<Row> rows;
  int64_t n = 0;
  for (const int run : {1, 31, 32, 33, 64, 100}) {
    for (int i = 0; i < run; ++i, ++n) {
      rows.emplace_back(CommBucketRow{n, n % 7, n * 10, n * 10 + 5,
                                      n % 5 ? std::optional<int64_t>(n << 20) : std::nullopt});
    }
    for (int i = 0; i < run; ++i, ++n) {
      rows.emplace_back(DiagnosticRow{n, "info", "test", "diagnostic " + std::to_string(n)});
    }
    rows.emplace_back(StepRow{n, n, n + 1, std::nullopt, std::nullopt, 1, 1, 1});
  }
  for (RunStore* s : std::initializer_list<RunStore*>{pg.get(), lite->get()}) {
    auto id = s->BeginRun(Info("long"));
    ASSERT_TRUE(id.ok()) << id.error();
    ASSERT_TRUE(s->WriteRows(*id, rows).ok());
  }
  // THEN both give back every row, with its own values
  auto from_pg = pg->LoadRun(1);
  auto from_lite = (*lite)->LoadRun(1);
  ASSERT_TRUE(from_pg.ok()) << from_pg.error();
  ASSERT_TRUE(from_lite.ok()) << from_lite.error();
  EXPECT_EQ(from_pg->comm_buckets.size(), 261u);
  EXPECT_EQ(from_pg->diagnostics.size(), 261u);
  EXPECT_EQ(AsJson(*from_pg).dump(1), AsJson(*from_lite).dump(1));
}

TEST_F(PgStoreTest, RunsListPreviousRunsAndSeriesMatchSqlite) {
  auto pg = OpenPg();
  ASSERT_TRUE(pg);
  EXPECT_EQ(*pg->LatestRunId(), std::nullopt);
  for (int i = 0; i < 4; ++i) {
    auto id = pg->BeginRun(Info(i == 2 ? "other" : "same"));
    ASSERT_TRUE(id.ok());
    if (i != 1) ASSERT_TRUE(pg->FinishRun(*id, "ok", 10, std::nullopt).ok());
  }
  EXPECT_EQ(*pg->LatestRunId(), std::optional<int64_t>(4));
  EXPECT_TRUE(*pg->RunExists(3));
  EXPECT_FALSE(*pg->RunExists(5));
  auto previous = pg->PreviousRunsNamed("same", 4, -1);
  ASSERT_TRUE(previous.ok()) << previous.error();
  ASSERT_EQ(previous->size(), 1u);  // run 2 is still running, run 3 is "other"
  EXPECT_EQ(previous->at(0).run_id, 1);
  EXPECT_EQ(pg->ListRuns()->size(), 4u);

  std::vector<Row> rows;
  for (int s = 0; s < 5; ++s) {
    GpuRollupRow r;
    r.ts_ns = s * 1'000'000'000LL;
    r.gpu_index = 1;
    r.util_mean_pct = s == 2 ? std::optional<double>() : std::optional<double>(s * 10.0);
    rows.emplace_back(r);
  }
  ASSERT_TRUE(pg->WriteRows(1, rows).ok());
  auto series = pg->LoadSeries(1, "gpu_util", 1, 0, 3'000'000'000LL);
  ASSERT_TRUE(series.ok()) << series.error();
  ASSERT_EQ(series->size(), 3u);  // the NULL second left out, the window closed
  EXPECT_EQ(series->at(2), std::make_pair(int64_t{3'000'000'000LL}, 30.0));
  auto bad = pg->LoadSeries(1, "gpu_fan", 1, 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("gpu_util, gpu_mem"), std::string::npos) << bad.error();
  EXPECT_FALSE(pg->FinishRun(99, "ok", 1, std::nullopt).ok());
  EXPECT_NE(pg->FinishRun(1, "done", 1, std::nullopt).message().find("not ok or failed"),
            std::string::npos);
}

TEST_F(PgStoreTest, ABatchIsStoredOnceEvenWhenItsRetryArrivesAtTheSameTime) {
  auto pg = OpenPg();
  ASSERT_TRUE(pg);
  auto id = pg->BeginIngestRun("uuid-1", Info("pushed"));
  ASSERT_TRUE(id.ok()) << id.error();
  EXPECT_EQ(*pg->IngestRunId("uuid-1"), std::optional<int64_t>(*id));
  EXPECT_EQ(*pg->IngestRunId("uuid-2"), std::nullopt);
  // The same UUID created again (a client's retry racing its first PUT) is the same run.
  auto again = pg->BeginIngestRun("uuid-1", Info("pushed"));
  ASSERT_TRUE(again.ok()) << again.error();
  EXPECT_EQ(*again, *id);

  std::vector<Row> rows;
  for (int s = 0; s < 600; ++s) rows.emplace_back(StepRow{s, s * 10, s * 10 + 10});
  // Eight threads send the same batch at once: one stores it, seven find it stored.
  std::atomic<int> stored{0}, duplicates{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      bool duplicate = false;
      Status st = pg->WriteBatchOnce(*id, "batch-1", rows, nullptr, &duplicate);
      if (!st.ok()) {
        ++failed;
      } else {
        ++(duplicate ? duplicates : stored);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(stored.load(), 1);
  EXPECT_EQ(duplicates.load(), 7);
  EXPECT_EQ(pg->LoadSteps(*id)->size(), 600u);

  // A batch with a bad row stores nothing, and its id stays free for the corrected retry.
  std::vector<Row> bad = {Row(StepRow{1000, 0, 1}),
                          Row(KernelRow{0, 1, std::string("nul\0byte", 8), 1, 1, "cupti"})};
  bool duplicate = false;
  Status st = pg->WriteBatchOnce(*id, "batch-2", bad, nullptr, &duplicate);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("NUL byte"), std::string::npos) << st.message();
  EXPECT_EQ(pg->LoadSteps(*id)->size(), 600u);
  bad.pop_back();
  ASSERT_TRUE(pg->WriteBatchOnce(*id, "batch-2", bad, nullptr, &duplicate).ok());
  EXPECT_FALSE(duplicate);
  EXPECT_EQ(pg->LoadSteps(*id)->size(), 601u);
}

TEST_F(PgStoreTest, ASchemaOfAnotherVersionOrAForeignRunsTableIsRefusedUntouched) {
  { ASSERT_TRUE(OpenPg()); }
  ASSERT_TRUE(OpenPg());  // reopening is fine
  ASSERT_TRUE(Exec(url_, "UPDATE meta SET value = '7' WHERE key = 'schema_version'"));
  auto newer = PgStore::Open(url_);
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.error().find("newer gpuprof (schema 7 > 1); upgrade gpuprof"), std::string::npos)
      << newer.error();

  ASSERT_TRUE(Exec(url_, "DROP TABLE meta; DROP TABLE runs; CREATE TABLE runs (x int)"));
  auto foreign = PgStore::Open(url_);
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.error().find("not a gpuprof database"), std::string::npos) << foreign.error();
}

TEST_F(PgStoreTest, ManyStoresOpeningAnEmptyDatabaseAtOnceCreateTheSchemaOnce) {
  std::atomic<int> ok{0};
  std::vector<std::string> errors(6);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      auto s = PgStore::Open(url_);
      if (s.ok()) {
        ++ok;
      } else {
        errors[t] = s.error();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 6) << errors[0] << errors[1] << errors[2];
}

TEST(PgStoreUrl, PasswordsNeverReachAMessage) {
  EXPECT_EQ(RedactPostgresUrl("postgres://me:s3cret@db.example/gp"),
            "postgres://me:***@db.example/gp");
  EXPECT_EQ(RedactPostgresUrl("postgresql://me@db/gp"), "postgresql://me@db/gp");
  EXPECT_EQ(RedactPostgresUrl("postgresql:///gp?host=/tmp"), "postgresql:///gp?host=/tmp");
  EXPECT_EQ(RedactPostgresUrl("postgresql://me:a@db/gp?host=/tmp&password=b&sslpassword=c"),
            "postgresql://me:***@db/gp?host=/tmp&password=***&sslpassword=***");
  EXPECT_EQ(RedactPostgresUrl("postgresql:///gp?password=b"), "postgresql:///gp?password=***");
  EXPECT_EQ(RedactPostgresUrl("postgresql:///gp?mypassword=b"), "postgresql:///gp?mypassword=b");
  auto st = PgStore::Open("postgres://me:s3cret@127.0.0.1:1/gp?connect_timeout=2");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().find("s3cret"), std::string::npos) << st.error();
  EXPECT_NE(st.error().find("postgres://me:***@127.0.0.1:1/gp"), std::string::npos) << st.error();
  EXPECT_FALSE(IsPostgresUrl("sqlite://x.db"));
  EXPECT_FALSE(PgStore::Open("mysql://x").ok());
}

TEST(PgStoreSchema, TheDdlIsSchemaSqlWithIdentityRunIdsAndByteOrder) {
  auto ddl = PgSchemaSql();
  ASSERT_TRUE(ddl.ok()) << ddl.error();
  EXPECT_NE(ddl->find("BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"), std::string::npos);
  EXPECT_NE(ddl->find("seq     BIGINT GENERATED ALWAYS AS IDENTITY"), std::string::npos);
  EXPECT_NE(ddl->find("run_name         TEXT COLLATE \"C\" NOT NULL"), std::string::npos);
  EXPECT_EQ(ddl->find("INTEGER PRIMARY KEY"), std::string::npos);
}

}  // namespace
}  // namespace gpuprof::store
