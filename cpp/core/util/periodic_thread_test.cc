// PeriodicThread: ticks at its period, stops at once, and never spins on a degenerate period.
#include "util/periodic_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>

namespace gpuprof::util {
namespace {

using namespace std::chrono_literals;

int TicksIn(std::chrono::nanoseconds period, std::chrono::milliseconds run_for) {
  std::atomic<int> ticks{0};
  PeriodicThread t;
  t.Start(period, [&] { ++ticks; });
  std::this_thread::sleep_for(run_for);
  t.Stop();
  return ticks.load();
}

TEST(PeriodicThread, TicksAtItsPeriod) {
  const int n = TicksIn(10ms, 200ms);
  EXPECT_GE(n, 5);
  EXPECT_LE(n, 25);
}

TEST(PeriodicThread, DegeneratePeriodsNeverSpin) {
  // GIVEN a zero, a negative and an overflowed period (1e9 / 1e-10 Hz cast to int64)
  for (auto period : {std::chrono::nanoseconds(0), std::chrono::nanoseconds(-5),
                      std::chrono::nanoseconds(std::numeric_limits<int64_t>::min())}) {
    // THEN the thread ticks at most every microsecond, not in a busy loop
    EXPECT_LE(TicksIn(period, 50ms), 50'000) << period.count();
  }
  // AND a huge period ticks once and stops at once
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(TicksIn(std::chrono::nanoseconds(std::numeric_limits<int64_t>::max()), 30ms), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

}  // namespace
}  // namespace gpuprof::util
