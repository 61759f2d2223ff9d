#include "traces/kernel_capture.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "fake_cupti/fake_cupti.h"

namespace gpuprof::traces {
namespace {

std::string FakeLibrary() {
  const char* env = std::getenv("GPUPROF_FAKE_CUPTI_DIR");
  std::string dir = env != nullptr && *env != '\0' ? env : GPUPROF_FAKE_CUPTI_DIR_DEFAULT;
  return dir + "/libcupti.so";
}

struct Fake {
  Fake() {
    handle = dlopen(FakeLibrary().c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle, nullptr) << dlerror();
    launch = reinterpret_cast<decltype(launch)>(dlsym(handle, "fake_cupti_launch"));
    reset = reinterpret_cast<decltype(reset)>(dlsym(handle, "fake_cupti_reset"));
    EXPECT_NE(launch, nullptr);
    EXPECT_NE(reset, nullptr);
    reset();
  }
  ~Fake() {
    if (handle != nullptr) dlclose(handle);
  }
  void* handle = nullptr;
  decltype(fake_cupti_launch)* launch = nullptr;
  decltype(fake_cupti_reset)* reset = nullptr;
};

int64_t g_now = 0;
int64_t FakeNow() { return g_now; }

struct Captured {
  std::vector<store::KernelRow> rows;
  KernelCapture::RowSink Sink() {
    return [this](std::vector<store::Row>&& batch) {
      for (auto& r : batch) rows.push_back(std::get<store::KernelRow>(r));
    };
  }
  std::vector<store::KernelRow> OfStep(int64_t step) const {
    std::vector<store::KernelRow> out;
    for (const auto& r : rows) {
      if (r.step == step) out.push_back(r);
    }
    return out;
  }
};

KernelCaptureOptions Options(TraceOptions t) {
  KernelCaptureOptions o;
  auto plan = TracePlan::Make(t);
  EXPECT_TRUE(plan.ok());
  o.plan = *plan;
  o.cupti_library = FakeLibrary();
  o.poll_period = std::chrono::hours(1);  // the tests poll themselves
  o.settle_ns = 1'000'000'000;
  return o;
}

store::StepRow Step(int64_t index, int64_t start, int64_t end) {
  store::StepRow s;
  s.step = index;
  s.start_ns = start;
  s.end_ns = end;
  return s;
}

TEST(KernelCapture, ManualStepsTraceOnlyPlannedSteps) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap = KernelCapture::Open(Options({.every_n_steps = 4}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok()) << cap.status().message();
  KernelCapture& c = **cap;
  c.OnEvent(StepEdge::kStepBegin, 0);
  fake.launch("gemm", 100, 1);
  fake.launch("gemm", 300, 1);
  c.OnEvent(StepEdge::kStepEnd);
  fake.launch("between_steps", 50, 1);  // outside any step block
  c.OnEvent(StepEdge::kStepBegin, 1);   // warm-up step
  fake.launch("softmax", 70, 1);
  c.OnEvent(StepEdge::kStepEnd);
  c.OnEvent(StepEdge::kStepBegin, 2);  // not traced
  fake.launch("gemm", 1000, 1);
  c.OnEvent(StepEdge::kStepEnd);
  c.OnStepRow(Step(0, 0, 10));
  c.OnStepRow(Step(1, 10, 20));
  c.OnStepRow(Step(2, 20, 30));
  c.Stop();

  auto s0 = got.OfStep(0);
  ASSERT_EQ(s0.size(), 1u);
  EXPECT_EQ(s0[0].name, "gemm");
  EXPECT_EQ(s0[0].calls, 2);
  EXPECT_EQ(s0[0].gpu_ns, 400);
  EXPECT_EQ(s0[0].min_ns, 100);
  EXPECT_EQ(s0[0].max_ns, 300);
  EXPECT_EQ(s0[0].source, "cupti");
  EXPECT_EQ(s0[0].window_start_ns, 0);
  EXPECT_EQ(s0[0].window_end_ns, 10);
  EXPECT_TRUE(s0[0].grid.has_value());
  auto s1 = got.OfStep(1);
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1[0].name, "softmax");
  EXPECT_TRUE(got.OfStep(2).empty());
  EXPECT_EQ(got.rows.size(), 2u);
  EXPECT_EQ(c.stats().traced_kernels, 3u);
  EXPECT_EQ(c.stats().untraced_kernels, 2u);
}

TEST(KernelCapture, AutoModeAdvancesAtTheFirstActivityAfterTheOptimizer) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap =
      KernelCapture::Open(Options({.range_begin = 1, .range_end = 2}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok()) << cap.status().message();
  KernelCapture& c = **cap;
  fake.launch("step0", 10, 1);
  c.OnEvent(StepEdge::kOptimizerEnd);
  c.OnEvent(StepEdge::kOptimizerEnd);  // a second optimizer: still step 0
  fake.launch("zero_grad", 5, 1);      // before the next forward: step 0's
  c.OnEvent(StepEdge::kForwardBegin);
  fake.launch("step1_fwd", 20, 1);
  c.OnEvent(StepEdge::kBackwardBegin);
  fake.launch("step1_bwd", 40, 1);
  c.OnEvent(StepEdge::kOptimizerEnd);
  c.OnEvent(StepEdge::kWaitBegin);  // step 2 begins
  fake.launch("step2", 10, 1);
  c.OnStepRow(Step(0, 0, 100));
  c.OnStepRow(Step(1, 100, 200));
  c.OnStepRow(Step(2, 200, 300));
  c.Stop();
  std::vector<std::string> names;
  for (const auto& r : got.rows) {
    EXPECT_EQ(r.step, 1);
    names.push_back(r.name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step1_bwd", "step1_fwd"}));
}

TEST(KernelCapture, AnEvaluationBetweenStepsIsInNoStep) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap =
      KernelCapture::Open(Options({.range_begin = 0, .range_end = 2}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok()) << cap.status().message();
  KernelCapture& c = **cap;
  c.OnEvent(StepEdge::kForwardBegin);
  fake.launch("step0", 10, 1);
  c.OnEvent(StepEdge::kOptimizerEnd);
  c.OnEvent(StepEdge::kExcludeBegin);  // validation: its forwards advance nothing
  c.OnEvent(StepEdge::kForwardBegin);
  fake.launch("eval", 30, 1);
  c.OnEvent(StepEdge::kExcludeEnd);
  c.OnEvent(StepEdge::kForwardBegin);  // step 1 begins here
  fake.launch("step1", 20, 1);
  c.OnEvent(StepEdge::kOptimizerEnd);
  c.OnStepRow(Step(0, 0, 100));
  c.OnStepRow(Step(1, 150, 200));
  c.Stop();
  std::map<std::string, int64_t> step_of;
  for (const auto& r : got.rows) step_of[r.name] = r.step.value_or(-1);
  EXPECT_EQ(step_of, (std::map<std::string, int64_t>{{"step0", 0}, {"step1", 1}}));
  EXPECT_EQ(c.stats().untraced_kernels, 1);  // the evaluation's
}

TEST(KernelCapture, StepRowsWaitForTheSettleTime) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap = KernelCapture::Open(Options({.every_n_steps = 1}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok());
  KernelCapture& c = **cap;
  c.OnEvent(StepEdge::kStepBegin, 0);
  fake.launch("gemm", 100, 1);
  c.OnEvent(StepEdge::kStepEnd);
  c.Poll(false);
  EXPECT_TRUE(got.rows.empty()) << "no step row yet";
  c.OnStepRow(Step(0, 0, 500'000'000));
  g_now = 1'000'000'000;  // 0.5 s after the end: not settled
  c.Poll(false);
  EXPECT_TRUE(got.rows.empty());
  g_now = 1'600'000'000;
  c.Poll(false);
  ASSERT_EQ(got.rows.size(), 1u);
  c.Stop();
  EXPECT_EQ(c.stats().late_rows, 0u);
  EXPECT_EQ(c.stats().unplaced_kernels, 0u);
}

TEST(KernelCapture, ContinuousWindowsByLaunchTime) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap = KernelCapture::Open(Options({.continuous_hz = 2}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok());
  KernelCapture& c = **cap;
  g_now = 100'000'000;
  fake.launch("a", 10, 1);
  fake.launch("a", 30, 1);
  g_now = 600'000'000;  // window 1
  fake.launch("a", 20, 1);
  fake.launch("b", 5, 2);
  g_now = 1'400'000'000;  // window 0 ended 0.9 s ago: not settled; nothing written
  c.Poll(false);
  EXPECT_TRUE(got.rows.empty());
  g_now = 1'600'000'000;  // window 0 settled, window 1 not
  c.Poll(false);
  ASSERT_EQ(got.rows.size(), 1u);
  EXPECT_EQ(got.rows[0].name, "a");
  EXPECT_EQ(got.rows[0].calls, 2);
  EXPECT_EQ(got.rows[0].gpu_ns, 40);
  EXPECT_EQ(got.rows[0].window_start_ns, 0);
  EXPECT_EQ(got.rows[0].window_end_ns, 500'000'000);
  EXPECT_FALSE(got.rows[0].step.has_value());
  c.Stop();
  ASSERT_EQ(got.rows.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(got.rows[i].window_start_ns, 500'000'000);
    EXPECT_EQ(got.rows[i].window_end_ns, 1'000'000'000);
  }
}

TEST(KernelCapture, FoldsTheTailIntoOneOtherRow) {
  Fake fake;
  g_now = 0;
  Captured got;
  KernelCaptureOptions o = Options({.every_n_steps = 1});
  o.max_rows_per_window = 2;
  auto cap = KernelCapture::Open(o, 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok());
  KernelCapture& c = **cap;
  c.OnEvent(StepEdge::kStepBegin, 0);
  fake.launch("big", 1000, 1);
  fake.launch("mid", 500, 1);
  fake.launch("small1", 10, 1);
  fake.launch("small2", 20, 1);
  c.OnEvent(StepEdge::kStepEnd);
  c.OnStepRow(Step(0, 0, 10));
  c.Stop();
  ASSERT_EQ(got.rows.size(), 3u);
  EXPECT_EQ(got.rows[0].name, "big");
  EXPECT_EQ(got.rows[1].name, "mid");
  EXPECT_EQ(got.rows[2].name, "(2 other kernels)");
  EXPECT_EQ(got.rows[2].calls, 2);
  EXPECT_EQ(got.rows[2].gpu_ns, 30);
  EXPECT_EQ(got.rows[2].min_ns, 10);
  EXPECT_EQ(got.rows[2].max_ns, 20);
  EXPECT_FALSE(got.rows[2].grid.has_value());
}

TEST(KernelCapture, UnstoredStepIsCountedNotWritten) {
  Fake fake;
  g_now = 0;
  Captured got;
  auto cap = KernelCapture::Open(Options({.every_n_steps = 1}), 0, got.Sink(), &FakeNow);
  ASSERT_TRUE(cap.ok());
  (*cap)->OnEvent(StepEdge::kStepBegin, 0);
  fake.launch("gemm", 100, 1);
  (*cap)->Stop();
  EXPECT_TRUE(got.rows.empty());
  EXPECT_EQ((*cap)->stats().unplaced_kernels, 1u);
}

TEST(KernelCapture, OpenFailsWithoutCuptiAndWithNoMode) {
  Captured got;
  KernelCaptureOptions o = Options({.every_n_steps = 1});
  o.cupti_library = "/nonexistent/libcupti.so";
  auto cap = KernelCapture::Open(o, 0, got.Sink(), &FakeNow);
  ASSERT_FALSE(cap.ok());
  EXPECT_NE(cap.status().message().find("CUPTI"), std::string::npos) << cap.status().message();
  auto off = KernelCapture::Open(KernelCaptureOptions{}, 0, got.Sink(), &FakeNow);
  ASSERT_FALSE(off.ok());
}

}  // namespace
}  // namespace gpuprof::traces
