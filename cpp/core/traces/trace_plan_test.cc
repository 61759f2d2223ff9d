#include "traces/trace_plan.h"

#include <gtest/gtest.h>

namespace gpuprof::traces {
namespace {

TEST(TracePlan, EveryNAddsWarmupSteps) {
  auto plan = TracePlan::Make({.every_n_steps = 10});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::vector<int64_t> traced;
  for (int64_t s = 0; s < 31; ++s) {
    if (plan->StepTraced(s)) traced.push_back(s);
  }
  EXPECT_EQ(traced, (std::vector<int64_t>{0, 1, 5, 10, 20, 30}));
  EXPECT_TRUE(plan->step_mode());
  EXPECT_FALSE(plan->continuous());
  EXPECT_EQ(plan->Describe(), "steps 0, 1, 5 and every 10th step");
}

TEST(TracePlan, RangeIsHalfOpenLikePythonRange) {
  auto plan = TracePlan::Make({.range_begin = 3, .range_end = 6});
  ASSERT_TRUE(plan.ok());
  for (int64_t s : {0, 1, 2, 6, 7}) EXPECT_FALSE(plan->StepTraced(s)) << s;
  for (int64_t s : {3, 4, 5}) EXPECT_TRUE(plan->StepTraced(s)) << s;
  EXPECT_EQ(plan->Describe(), "steps 3..5");
}

TEST(TracePlan, ContinuousWindows) {
  auto plan = TracePlan::Make({.continuous_hz = 4});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->continuous());
  EXPECT_FALSE(plan->step_mode());
  EXPECT_FALSE(plan->StepTraced(0));
  EXPECT_EQ(plan->window_ns(), 250'000'000);
  EXPECT_EQ(plan->WindowOf(249'999'999), 0);
  EXPECT_EQ(plan->WindowOf(250'000'000), 1);
  EXPECT_EQ(plan->Describe(), "0.25 s windows");
}

TEST(TracePlan, OffTracesNothing) {
  TracePlan plan;
  EXPECT_FALSE(plan.enabled());
  EXPECT_FALSE(plan.StepTraced(0));
  EXPECT_EQ(plan.Describe(), "nothing");
}

TEST(TracePlan, BadOptionsNameTheOption) {
  auto neg = TracePlan::Make({.every_n_steps = -1});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("trace_every_n_steps"), std::string::npos);
  auto empty = TracePlan::Make({.range_begin = 5, .range_end = 5});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("b > a"), std::string::npos);
  auto hz = TracePlan::Make({.continuous_hz = 1000});
  ASSERT_FALSE(hz.ok());
  EXPECT_NE(hz.status().message().find("continuous_traces_hz"), std::string::npos);
}

}  // namespace
}  // namespace gpuprof::traces
