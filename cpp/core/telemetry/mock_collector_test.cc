#include "telemetry/mock_collector.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "telemetry/gpu_collector.h"

namespace gpuprof::telemetry {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr int64_t kSec = 1000000000;
constexpr int64_t kGiB = 1024LL * 1024 * 1024;

GpuCollectorOptions MockOptions(int gpus, std::string scenario = "") {
  GpuCollectorOptions o;
  o.backend = "mock";
  o.mock_gpus = gpus;
  o.mock_scenario = std::move(scenario);
  return o;
}

std::vector<store::GpuSampleRow> Tick(GpuCollector& c, int64_t ts, std::vector<int64_t> pids = {}) {
  std::vector<store::GpuSampleRow> rows;
  EXPECT_TRUE(c.Sample(ts, pids, &rows));
  return rows;
}

TEST(MockCollectorTest, GivenDefaultScenario_WhenSampled_ThenValuesFollowTheDocumentedCurves) {
  // GIVEN two mock GPUs with the default scenario
  auto made = MakeGpuCollector(MockOptions(2));
  ASSERT_TRUE(made.ok()) << made.error();
  GpuCollector& c = *made.value();

  // THEN they look like two H100s
  EXPECT_EQ(c.backend(), "mock");
  ASSERT_THAT(c.devices(), SizeIs(2));
  EXPECT_EQ(c.devices()[1].index, 1);
  EXPECT_EQ(c.devices()[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(c.devices()[0].memory_total_bytes, 80 * kGiB);
  EXPECT_EQ(c.devices()[0].sm_clock_max_mhz, 1980);
  EXPECT_NE(c.devices()[0].uuid, c.devices()[1].uuid);

  // WHEN sampled at t=0 and at t=10 s (end of the memory ramp, half a util period)
  auto t0 = Tick(c, 0, {1234});
  auto t10 = Tick(c, 10 * kSec, {1234});

  // THEN at t=0: util = 85 + 10 sin(index), memory at 2%, temperature at idle
  ASSERT_THAT(t0, SizeIs(2));
  EXPECT_DOUBLE_EQ(*t0[0].util_pct, 85.0);
  EXPECT_DOUBLE_EQ(*t0[1].util_pct, 85.0 + 10.0 * std::sin(1.0));
  EXPECT_DOUBLE_EQ(*t0[0].mem_util_pct, 85.0 * 0.6);
  EXPECT_EQ(t0[0].mem_used_bytes, std::llround(80.0 * kGiB * 0.02));
  EXPECT_EQ(t0[0].mem_total_bytes, 80 * kGiB);
  EXPECT_EQ(t0[0].proc_mem_bytes, t0[0].mem_used_bytes);
  EXPECT_EQ(t0[0].power_mw, std::llround((90.0 + 610.0 * 0.85) * 1000.0));
  EXPECT_DOUBLE_EQ(*t0[0].temp_c, 35.0);
  EXPECT_EQ(t0[0].sm_clock_mhz, 1980);
  EXPECT_EQ(t0[0].clock_reasons, 0);
  EXPECT_DOUBLE_EQ(*t0[0].pcie_rx_bps, 2e9 * 0.85);
  EXPECT_DOUBLE_EQ(*t0[0].pcie_tx_bps, 0.5e9 * 0.85);
  // AND at t=10 s: memory at 50%, util back at the mean (sin(pi) ~ 0), temperature rising
  EXPECT_EQ(t10[0].ts_ns, 10 * kSec);
  EXPECT_EQ(t10[0].mem_used_bytes, 40 * kGiB);
  EXPECT_THAT(*t10[0].util_pct, DoubleNear(85.0, 1e-9));
  EXPECT_DOUBLE_EQ(*t10[0].temp_c, 70.0 - 35.0 * std::exp(-10.0 / 30.0));
}

TEST(MockCollectorTest, GivenSameScenarioTwice_WhenSampledAtSameTimes_ThenRowsAreIdentical) {
  auto s = MockScenario::Parse("util=60,util_amp=30,period_s=7");
  ASSERT_TRUE(s.ok()) << s.error();
  MockCollector a(3, s.value());
  MockCollector b(3, s.value());
  for (int64_t ts : {0LL, 1234567890LL, 98765432100LL}) {
    auto ra = Tick(a, ts);
    auto rb = Tick(b, ts);
    ASSERT_THAT(ra, SizeIs(3));
    for (size_t i = 0; i < ra.size(); ++i) {
      EXPECT_EQ(ra[i].util_pct, rb[i].util_pct);
      EXPECT_EQ(ra[i].power_mw, rb[i].power_mw);
      EXPECT_EQ(ra[i].mem_used_bytes, rb[i].mem_used_bytes);
      EXPECT_GE(*ra[i].util_pct, 30.0);
      EXPECT_LE(*ra[i].util_pct, 90.0);
    }
  }
}

TEST(MockCollectorTest,
     GivenThrottlingScenario_WhenSampledAcrossTheOnset_ThenClockDropsWithReasons) {
  // GIVEN an A100 that throttles thermally from t=5 s
  auto s = MockScenario::Parse(
      " model = NVIDIA A100-SXM4-80GB , throttle=1, throttle_after_s=5, sm_clock_max_mhz=1410,"
      "throttle_clock_mhz=1005, temp=70, temp_tau_s=0");
  ASSERT_TRUE(s.ok()) << s.error();
  MockCollector c(1, s.value());
  EXPECT_EQ(c.devices()[0].name, "NVIDIA A100-SXM4-80GB");

  // WHEN sampled before and after the onset
  auto before = Tick(c, 4 * kSec);
  auto after = Tick(c, 6 * kSec);

  // THEN the SM clock falls and the thermal slowdown bits appear, with a hotter GPU
  EXPECT_EQ(before[0].sm_clock_mhz, 1410);
  EXPECT_EQ(before[0].clock_reasons, 0);
  EXPECT_DOUBLE_EQ(*before[0].temp_c, 70.0);
  EXPECT_EQ(after[0].sm_clock_mhz, 1005);
  EXPECT_EQ(after[0].clock_reasons, 0x20 | 0x40);
  EXPECT_DOUBLE_EQ(*after[0].temp_c, 85.0);
}

TEST(MockCollectorTest, GivenMissingFields_WhenSampled_ThenTheyAreUnknownNotZero) {
  auto s = MockScenario::Parse("missing=power+pcie+proc_mem,throttle_reason=power");
  ASSERT_TRUE(s.ok()) << s.error();
  MockCollector c(1, s.value());
  auto rows = Tick(c, kSec, {42});
  EXPECT_FALSE(rows[0].power_mw.has_value());
  EXPECT_FALSE(rows[0].pcie_rx_bps.has_value());
  EXPECT_FALSE(rows[0].pcie_tx_bps.has_value());
  EXPECT_FALSE(rows[0].proc_mem_bytes.has_value());
  EXPECT_TRUE(rows[0].util_pct.has_value());
  EXPECT_EQ(s.value().ThrottleReasonBits(), 0x4);
}

TEST(MockCollectorTest, GivenMemoryPressureScenario_WhenRampDone_ThenMemoryNearlyFull) {
  auto s = MockScenario::Parse("mem_frac=0.98,mem_ramp_s=2,mem_total_gib=40");
  ASSERT_TRUE(s.ok()) << s.error();
  MockCollector c(1, s.value());
  auto rows = Tick(c, 3 * kSec);
  EXPECT_EQ(rows[0].mem_total_bytes, 40 * kGiB);
  EXPECT_EQ(rows[0].mem_used_bytes, std::llround(40.0 * kGiB * 0.98));
  EXPECT_FALSE(rows[0].proc_mem_bytes.has_value());  // no pids given
}

TEST(MockScenarioTest, GivenEmptySpec_WhenParsed_ThenDefaults) {
  auto s = MockScenario::Parse("");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(s.value().util, 85.0);
  EXPECT_FALSE(s.value().throttle);
  auto spaces = MockScenario::Parse(" , ,");
  ASSERT_TRUE(spaces.ok());
}

TEST(MockScenarioTest, GivenBadSpecs_WhenParsed_ThenErrorsNameTheKeyOrValue) {
  auto unknown = MockScenario::Parse("util=80,utl=3");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.error(), HasSubstr("unknown mock scenario key 'utl'"));
  EXPECT_THAT(unknown.error(), HasSubstr("valid keys: model, "));

  auto not_number = MockScenario::Parse("util=lots");
  ASSERT_FALSE(not_number.ok());
  EXPECT_EQ(not_number.error(),
            "mock scenario key 'util' expects a number in [0, 100], got 'lots'");

  auto out_of_range = MockScenario::Parse("mem_frac=1.5");
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_THAT(out_of_range.error(), HasSubstr("'mem_frac' expects a number in [0, 1], got '1.5'"));

  auto bad_bool = MockScenario::Parse("throttle=yes");
  ASSERT_FALSE(bad_bool.ok());
  EXPECT_THAT(bad_bool.error(), HasSubstr("'throttle' expects 0 or 1"));

  auto no_eq = MockScenario::Parse("throttle");
  ASSERT_FALSE(no_eq.ok());
  EXPECT_EQ(no_eq.error(), "mock scenario item 'throttle' is not key=value");

  auto bad_field = MockScenario::Parse("missing=power+fans");
  ASSERT_FALSE(bad_field.ok());
  EXPECT_THAT(bad_field.error(), HasSubstr("unknown field 'fans'"));

  auto bad_clock = MockScenario::Parse("sm_clock_max_mhz=1.5");
  ASSERT_FALSE(bad_clock.ok());
  EXPECT_THAT(bad_clock.error(), HasSubstr("whole number of MHz"));
}

TEST(MockScenarioTest, GivenBadScenarioViaFactory_WhenMade_ThenErrorIsPrefixed) {
  auto made = MakeGpuCollector(MockOptions(1, "temp=hot"));
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.error(), HasSubstr("invalid mock scenario: mock scenario key 'temp'"));
  auto zero = MakeGpuCollector(MockOptions(0));
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.error(), HasSubstr("mock_gpus must be between 1 and 1024, got 0"));
}

}  // namespace
}  // namespace gpuprof::telemetry
