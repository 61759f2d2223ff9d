#include "telemetry/stall_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace gpuprof::telemetry {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kMs = 1'000'000;

struct Collected {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> stalls;
  StallWatch::Sink sink() {
    return [this](int64_t start, int64_t duration) {
      std::lock_guard lock(mu);
      stalls.emplace_back(start, duration);
    };
  }
  std::vector<std::pair<int64_t, int64_t>> get() {
    std::lock_guard lock(mu);
    return stalls;
  }
};

// A clock that advances 1 ms per read (so every tick looks early, whatever the machine does)
// and jumps by `jump` at read number `at`.
StallWatch::Clock SteppingClock(std::atomic<int>* reads, int at, int64_t jump) {
  return [reads, at, jump] {
    const int n = reads->fetch_add(1) + 1;
    return int64_t{1'000} * kMs + n * kMs + (n >= at ? jump : 0);
  };
}

void WaitForReads(const std::atomic<int>& reads, int n) {
  for (int i = 0; i < 2000 && reads.load() < n; ++i) std::this_thread::sleep_for(1ms);
}

TEST(StallWatchTest, AWakeUpPastTheThresholdIsOneStallFromWhenItShouldHaveWoken) {
  // GIVEN a watch whose clock jumps 50 ms between the 7th read (before its 4th sleep) and the
  // 8th (after it)
  std::atomic<int> reads{0};
  Collected got;
  StallWatch watch(2ms, 10ms, got.sink(), SteppingClock(&reads, 8, 50 * kMs));
  watch.Start();
  WaitForReads(reads, 20);
  watch.Stop();
  // THEN exactly that sleep is a stall: it should have woken at read 7 + the 2 ms tick, and
  // woke 1 ms (the clock's step) + 50 ms - 2 ms later than that
  const auto stalls = got.get();
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].first, 1'000 * kMs + 7 * kMs + 2 * kMs);
  EXPECT_EQ(stalls[0].second, 49 * kMs);
  EXPECT_EQ(watch.stalls(), 1u);
  EXPECT_GE(watch.ticks(), 9u);
}

TEST(StallWatchTest, LatenessBelowTheThresholdIsNoStall) {
  // GIVEN a clock that jumps 11 ms once within a sleep: 10 ms late, just under an 11 ms
  // threshold
  std::atomic<int> reads{0};
  Collected got;
  StallWatch watch(2ms, 11ms, got.sink(), SteppingClock(&reads, 8, 11 * kMs));
  watch.Start();
  WaitForReads(reads, 20);
  watch.Stop();
  // THEN nothing is reported, though the watch kept ticking
  EXPECT_TRUE(got.get().empty());
  EXPECT_GE(watch.ticks(), 9u);
}

TEST(StallWatchTest, StopEndsTheThreadWithinATickAndIsIdempotent) {
  // A fake clock that never runs late: whatever the machine does, no stall is reported.
  std::atomic<int> reads{0};
  Collected got;
  StallWatch watch(20ms, 10ms, got.sink(), SteppingClock(&reads, 1 << 30, 0));
  watch.Start();
  std::this_thread::sleep_for(5ms);
  const auto t0 = std::chrono::steady_clock::now();
  watch.Stop();
  watch.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms);
  EXPECT_TRUE(got.get().empty());
}

TEST(StallWatchTest, AStoppedProcessIsSeenAsAStallOfAboutTheStoppedTime) {
  // GIVEN a child process running a real watch, stopped (SIGSTOP) for 150 ms
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    int64_t longest = 0;
    std::mutex mu;
    {
      StallWatch watch(2ms, 10ms, [&](int64_t, int64_t d) {
        std::lock_guard lock(mu);
        longest = std::max(longest, d);
      });
      watch.Start();
      std::this_thread::sleep_for(600ms);
    }
    const ssize_t n = write(fds[1], &longest, sizeof longest);
    _exit(n == sizeof longest ? 0 : 1);
  }
  close(fds[1]);
  std::this_thread::sleep_for(150ms);
  ASSERT_EQ(kill(child, SIGSTOP), 0);
  std::this_thread::sleep_for(150ms);
  ASSERT_EQ(kill(child, SIGCONT), 0);
  int64_t longest = -1;
  ASSERT_EQ(read(fds[0], &longest, sizeof longest), static_cast<ssize_t>(sizeof longest));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // THEN its longest stall covers the stop (less the tick; a busy machine can only add)
  EXPECT_GE(longest, 140 * kMs);
}

TEST(StallWatchTest, ReadsTheCpuWaitEveryFewTicksAndHandsOnPeriodsAboveTheMinimum) {
  // GIVEN a fake task tree with one training thread, read every tick
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("gpuprof_watch_wait_" + std::to_string(getpid()));
  fs::create_directories(dir / "5");
  auto set = [&](int64_t delay) {
    std::ofstream(dir / "5" / "comm") << "python\n";
    std::ofstream(dir / "5" / "schedstat") << "1 " << delay << " 1\n";
  };
  set(0);
  std::mutex mu;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> waits;
  StallWatch watch(2ms, 10s, {});
  watch.WatchCpuWait(std::make_unique<CpuWaitReader>(dir.string()), 1, 1ms,
                     [&](int64_t start, int64_t end, int64_t wait) {
                       std::lock_guard lock(mu);
                       waits.emplace_back(start, end, wait);
                     });
  watch.Start();
  std::this_thread::sleep_for(20ms);
  // WHEN the thread queues 0.5 ms (below the minimum), then 3 ms more
  set(500'000);
  std::this_thread::sleep_for(20ms);
  set(3'500'000);
  for (int i = 0; i < 2000 && watch.cpu_wait_ns() == 0; ++i) std::this_thread::sleep_for(1ms);
  watch.Stop();
  fs::remove_all(dir);
  // THEN one period is handed on, with the 3 ms, and it spans forward in time
  std::lock_guard lock(mu);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(std::get<2>(waits[0]), 3 * kMs);
  EXPECT_LT(std::get<0>(waits[0]), std::get<1>(waits[0]));
  EXPECT_EQ(watch.cpu_wait_ns(), 3 * kMs);
  EXPECT_TRUE(watch.watching_cpu_wait());
}

}  // namespace
}  // namespace gpuprof::telemetry
