#include "clock/clock.h"

#include <gtest/gtest.h>

namespace gpuprof::clock {
namespace {

TEST(ClockTest, MonotonicNeverGoesBack) {
  int64_t prev = NowNs();
  for (int i = 0; i < 10000; ++i) {
    const int64_t now = NowNs();
    ASSERT_GE(now, prev);
    prev = now;
  }
}

TEST(ClockTest, AnchorConvertsToUnixTime) {
  const Anchor a = Anchor::Take();
  const int64_t later = a.mono_ns + 1'500'000'000;
  EXPECT_EQ(a.ToRelative(later), 1'500'000'000);
  EXPECT_EQ(a.ToUnix(later), a.unix_ns + 1'500'000'000);
  // The anchor's wall time is "now" to within a second.
  EXPECT_LT(std::llabs(UnixNowNs() - a.unix_ns), 1'000'000'000);
}

}  // namespace
}  // namespace gpuprof::clock
