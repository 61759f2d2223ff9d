// End to end through the native core: Session -> Recorder threads -> StoreWriter -> SQLite ->
// analysis, with mock GPUs and the real /proc.
#include "record/session.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "fake_cupti/fake_cupti.h"

namespace gpuprof::record {
namespace {

namespace fs = std::filesystem;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpuprof_session_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  SessionConfig Config(const std::string& name) {
    SessionConfig c;
    c.db_path = (dir_ / "gpuprof.db").string();
    c.run.run_name = name;
    c.run.device_kind = "cpu";
    c.recorder.sample_hz = 200;
    c.recorder.host_hz = 20;
    c.gpu.backend = "mock";
    c.gpu.mock_gpus = 2;
    return c;
  }

  // One auto iteration with `wait_ms` of loader gap before it.
  static void Iteration(Session* s, int wait_ms, int compute_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    s->Emit(EventKind::kForwardBegin);
    std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms));
    s->Emit(EventKind::kForwardEnd);
    s->Emit(EventKind::kBackwardBegin);
    s->Emit(EventKind::kBackwardEnd);
    s->Emit(EventKind::kOptimizerBegin);
    s->Emit(EventKind::kOptimizerEnd);
  }

  store::RunData Load(int64_t run_id) {
    auto st = store::SqliteStore::Open((dir_ / "gpuprof.db").string(),
                                       store::SqliteStore::Mode::kReadOnly);
    EXPECT_TRUE(st.ok()) << st.error();
    auto data = st.value()->LoadRun(run_id);
    EXPECT_TRUE(data.ok()) << data.error();
    return std::move(data.value());
  }

  store::RawSamples LoadRaw(int64_t run_id) {
    auto st = store::SqliteStore::Open((dir_ / "gpuprof.db").string(),
                                       store::SqliteStore::Mode::kReadOnly);
    EXPECT_TRUE(st.ok()) << st.error();
    auto raw = st.value()->LoadRawSamples(run_id);
    EXPECT_TRUE(raw.ok()) << raw.error();
    return std::move(raw.value());
  }

  fs::path dir_;
};

TEST_F(SessionTest, RowsTheStoreCouldNotTakeAreRecordedAndReported) {
  // GIVEN a session whose writer may hold 20 rows behind a failing commit, and a DB that another
  // connection locks for 400 ms in the middle of the run (past the writer's busy timeout)
  SessionConfig c = Config("locked");
  c.recorder.sample_hz = 500;
  c.writer.busy_timeout_ms = 20;
  c.writer.retry_backoff_ms = 10;
  c.writer.retry_capacity = 20;
  auto s = Session::Start(c);
  ASSERT_TRUE(s.ok()) << s.error();
  Session& session = *s.value();
  for (int i = 0; i < 3; ++i) Iteration(&session, 5, 2);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(c.db_path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr), SQLITE_OK);
    for (int i = 0; i < 20; ++i) Iteration(&session, 10, 10);
    sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  for (int i = 0; i < 5; ++i) Iteration(&session, 5, 2);
  const StopResult r = session.Stop("ok", std::nullopt);
  // THEN the run is stored with a diagnostic that counts what was lost, per table, with when
  const store::RunData d = Load(session.run_id());
  const store::DiagnosticRow* loss = nullptr;
  for (const auto& diag : d.diagnostics) {
    if (diag.source == kStoreDiagnosticSource) loss = &diag;
  }
  ASSERT_NE(loss, nullptr);
  EXPECT_EQ(loss->level, "warning");
  EXPECT_NE(loss->message.find("rows of this run were not stored: "), std::string::npos)
      << loss->message;
  EXPECT_NE(loss->message.find("gpu_samples "), std::string::npos) << loss->message;
  EXPECT_NE(loss->message.find(" to "), std::string::npos) << loss->message;
  EXPECT_NE(loss->message.find("first failure: "), std::string::npos) << loss->message;
  // AND the summary says so, and the caller is told
  EXPECT_NE(r.summary.find("  Data loss: " + loss->message), std::string::npos) << r.summary;
  ASSERT_TRUE(r.error.has_value());
  EXPECT_NE(r.error->find("were not stored"), std::string::npos);
}

TEST_F(SessionTest, RecordsStepsTelemetryAndInsightsAndPrintsTheSummary) {
  // GIVEN a session with two mock GPUs
  auto s = Session::Start(Config("e2e"));
  ASSERT_TRUE(s.ok()) << s.error();
  Session& session = *s.value();
  // WHEN ten iterations run, each waiting 8 ms on the "loader" and computing 2 ms
  for (int i = 0; i < 10; ++i) Iteration(&session, 8, 2);
  const StopResult r = session.Stop("ok", std::nullopt);
  // THEN stopping succeeded and the summary names the run and the stall
  ASSERT_FALSE(r.error.has_value()) << *r.error;
  EXPECT_NE(r.summary.find("gpuprof · e2e  (10 steps"), std::string::npos) << r.summary;
  EXPECT_NE(r.summary.find("waiting on the loader"), std::string::npos) << r.summary;
  // AND the store holds the run, its steps with gap waits, telemetry and the insight
  const store::RunData d = Load(session.run_id());
  EXPECT_EQ(d.run.status, "ok");
  EXPECT_EQ(d.run.gpu_backend, "mock");
  EXPECT_EQ(d.run.gpu_count, 2);
  ASSERT_EQ(d.steps.size(), 10u);
  for (size_t i = 1; i < d.steps.size(); ++i) {
    ASSERT_TRUE(d.steps[i].wait_ns.has_value());
    EXPECT_GE(*d.steps[i].wait_ns, 7'000'000);
    EXPECT_EQ(d.steps[i].start_ns, d.steps[i - 1].end_ns);
  }
  EXPECT_EQ(d.gpus.size(), 2u);
  // Raw samples (a short run is inside the retention window) and their per-second rollups,
  // which account for every one of them.
  const store::RawSamples raw = LoadRaw(session.run_id());
  EXPECT_GT(raw.gpu_samples.size(), 10u);
  ASSERT_GE(d.gpu_samples_1s.size(), 2u);
  int64_t rolled_up = 0;
  for (const auto& r : d.gpu_samples_1s) rolled_up += r.samples;
  EXPECT_EQ(rolled_up, static_cast<int64_t>(raw.gpu_samples.size()));
  EXPECT_GE(d.host_samples.size(), 2u);
  bool stall = false;
  for (const auto& in : d.insights) stall |= in.rule_id == "dataloader_stall";
  EXPECT_TRUE(stall);
}

TEST_F(SessionTest, StopIsIdempotentAndFailedStatusKeepsTheError) {
  auto s = Session::Start(Config("failing"));
  ASSERT_TRUE(s.ok()) << s.error();
  Iteration(s.value().get(), 0, 1);
  const StopResult first = s.value()->Stop("failed", std::string("ValueError: bad batch"));
  const StopResult second = s.value()->Stop("ok", std::nullopt);
  EXPECT_EQ(first.summary, second.summary);
  const store::RunData d = Load(s.value()->run_id());
  EXPECT_EQ(d.run.status, "failed");
  EXPECT_EQ(d.run.error, "ValueError: bad batch");
  EXPECT_NE(first.summary.find("failed: ValueError: bad batch"), std::string::npos);
}

TEST_F(SessionTest, UnavailableGpuIsRecordedWithItsReason) {
  SessionConfig c = Config("no-gpu");
  c.gpu.backend = "nvml";
  c.gpu.nvml_library = (dir_ / "no-such-libnvidia-ml.so.1").string();
  auto s = Session::Start(c);
  ASSERT_TRUE(s.ok()) << s.error();
  s.value()->Stop("ok", std::nullopt);
  const store::RunData d = Load(s.value()->run_id());
  EXPECT_EQ(d.run.gpu_backend, "none");
  EXPECT_TRUE(d.gpu_samples_1s.empty());
  EXPECT_TRUE(LoadRaw(s.value()->run_id()).gpu_samples.empty());
  bool found = false;
  for (const auto& t : d.telemetry) {
    if (t.source == "gpu") {
      found = true;
      EXPECT_FALSE(t.available);
      ASSERT_TRUE(t.reason.has_value());
      EXPECT_NE(t.reason->find("no-such-libnvidia-ml.so.1"), std::string::npos) << *t.reason;
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(SessionTest, DisabledHostTelemetryNamesTheOptionThatTurnedItOff) {
  // GIVEN host=False (host_hz left at 20), and host=True with host_hz=0
  struct Case {
    bool host;
    double hz;
    const char* reason;
  };
  for (const Case& k : {Case{false, 20, "host telemetry disabled (host=False)"},
                        Case{true, 0, "host telemetry disabled (host_hz=0)"}}) {
    SessionConfig c = Config("host-off");
    c.host_telemetry = k.host;
    c.recorder.host_hz = k.hz;
    // WHEN a short run records
    auto s = Session::Start(c);
    ASSERT_TRUE(s.ok()) << s.error();
    Iteration(s.value().get(), 0, 1);
    s.value()->Stop("ok", std::nullopt);
    // THEN no host samples exist and the host status is unavailable with that option's reason
    const store::RunData d = Load(s.value()->run_id());
    EXPECT_TRUE(d.host_samples.empty());
    int found = 0;
    for (const auto& t : d.telemetry) {
      if (t.source != "host") continue;
      ++found;
      EXPECT_FALSE(t.available);
      EXPECT_EQ(t.reason.value_or(""), k.reason);
    }
    EXPECT_EQ(found, 1);
  }
}

TEST_F(SessionTest, UnwritableDbIsAnErrorNamingThePath) {
  SessionConfig c = Config("bad");
  c.db_path = (dir_ / "missing" / "x.db").string();
  auto s = Session::Start(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("x.db"), std::string::npos) << s.error();
}

TEST_F(SessionTest, FullRingDropsAndCountsInsteadOfBlocking) {
  SessionConfig c = Config("flood");
  c.recorder.ring_capacity = 64;
  c.recorder.drain_interval_ms = 1000;  // the drain thread will not keep up
  auto s = Session::Start(c);
  ASSERT_TRUE(s.ok()) << s.error();
  for (int i = 0; i < 10000; ++i) s.value()->Emit(EventKind::kForwardBegin);
  EXPECT_GT(s.value()->recorder().dropped_events(), 0u);
  s.value()->Stop("ok", std::nullopt);
  const store::RunData d = Load(s.value()->run_id());
  bool noted = false;
  for (const auto& diag : d.diagnostics) {
    noted |= diag.message.find("events dropped") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace gpuprof::record

namespace gpuprof::record {
namespace {

// The fake CUPTI (telemetry/fake_cupti) that the session's kernel capture loads.
std::string FakeCupti() {
  const char* env = std::getenv("GPUPROF_FAKE_CUPTI_DIR");
  std::string dir = env != nullptr && *env != '\0' ? env : GPUPROF_FAKE_CUPTI_DIR_DEFAULT;
  return dir + "/libcupti.so";
}

TEST_F(SessionTest, TracedStepsKernelsAreStoredPerStepAndJudgedByTheRules) {
  // GIVEN the fake CUPTI and a session tracing every 2nd step (plus the warm-up steps 0, 1, 5)
  void* lib = dlopen(FakeCupti().c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto reset = reinterpret_cast<decltype(fake_cupti_reset)*>(dlsym(lib, "fake_cupti_reset"));
  auto launch =
      reinterpret_cast<decltype(fake_cupti_launch_config)*>(dlsym(lib, "fake_cupti_launch_config"));
  ASSERT_TRUE(reset && launch);
  reset();
  SessionConfig c = Config("traced");
  traces::TraceOptions t;
  t.every_n_steps = 2;
  auto plan = traces::TracePlan::Make(t);
  ASSERT_TRUE(plan.ok()) << plan.error();
  c.trace_plan = *plan;
  c.trace_backend = "cupti";
  c.cupti_library = FakeCupti();
  auto s = Session::Start(c);
  ASSERT_TRUE(s.ok()) << s.error();
  Session& session = *s.value();
  // WHEN 7 auto-mode iterations each launch attention as bmm + softmax + bmm and one GEMM
  const int32_t grid[3] = {64, 8, 1}, block[3] = {256, 1, 1};
  for (int i = 0; i < 7; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    session.Emit(EventKind::kForwardBegin);
    launch("ampere_bmm_kernel", 300'000, 7, 0, grid, block);
    launch("softmax_warp_forward", 200'000, 7, 0, grid, block);
    launch("ampere_bmm_kernel", 300'000, 7, 0, grid, block);
    launch("sm90_xmma_gemm", 400'000, 7, 0, grid, block);
    session.Emit(EventKind::kForwardEnd);
    session.Emit(EventKind::kBackwardBegin);
    session.Emit(EventKind::kBackwardEnd);
    session.Emit(EventKind::kOptimizerBegin);
    session.Emit(EventKind::kOptimizerEnd);
  }
  const StopResult r = session.Stop("ok", std::nullopt);
  ASSERT_FALSE(r.error.has_value()) << *r.error;
  // THEN the kernels of steps 0, 1, 2, 4, 5 and 6 are stored, per step, with launch detail
  const store::RunData d = Load(session.run_id());
  ASSERT_EQ(d.steps.size(), 7u);
  std::set<int64_t> traced;
  for (const store::KernelRow& k : d.kernels) {
    ASSERT_TRUE(k.step.has_value()) << k.name;
    traced.insert(*k.step);
    EXPECT_EQ(k.source, "cupti");
    EXPECT_EQ(k.stream, 7);
    EXPECT_EQ(k.device, 0);
    EXPECT_EQ(k.grid, "64,8,1");
    EXPECT_EQ(k.block, "256,1,1");
    const store::StepRow& step = d.steps[static_cast<size_t>(*k.step)];
    EXPECT_EQ(k.window_start_ns, step.start_ns);
    EXPECT_EQ(k.window_end_ns, step.end_ns);
    if (k.name == "ampere_bmm_kernel") {
      EXPECT_EQ(k.calls, 2);
      EXPECT_EQ(k.gpu_ns, 600'000);
      EXPECT_EQ(k.min_ns, 300'000);
      EXPECT_EQ(k.max_ns, 300'000);
    }
  }
  EXPECT_EQ(traced, (std::set<int64_t>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(d.kernels.size(), 6u * 3u);
  // AND sdpa_suboptimal fires from them (bmm + softmax: 800 of 1200 µs per step)
  bool sdpa = false;
  for (const auto& in : d.insights) sdpa |= in.rule_id == "sdpa_suboptimal";
  EXPECT_TRUE(sdpa);
  bool status = false;
  for (const auto& ts : d.telemetry) {
    if (ts.source == "kernels") {
      status = true;
      EXPECT_TRUE(ts.available);
      EXPECT_NE(ts.backend.value_or("").find("cupti"), std::string::npos);
    }
  }
  EXPECT_TRUE(status);
  dlclose(lib);
}

}  // namespace
}  // namespace gpuprof::record
