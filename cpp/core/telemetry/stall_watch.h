// Stall watch: notices the stretches when the process got no CPU at all. A thread sleeps for a
// short tick again and again and measures how late each wake-up comes; a wake-up at least
// `threshold` late means nothing woke this process's threads for that long: CPU steal in a VM,
// a container's CPU quota running out, other processes or too many busy threads for the cores,
// swapping, SIGSTOP. The same idea as a "hiccup meter": it costs one short wake-up per tick
// (about 200 a second at the default 5 ms; bench/stall_watch_cost.py measures it) and sees every
// such stall of the whole process, whatever its cause, without reading any counter.
//
// With WatchCpuWait(), the same thread also reads how long the process's threads queued for a
// CPU (telemetry/cpu_wait.h) every few ticks: the contention the sleeping watch itself does
// not feel.
//
// Each stall is handed to the sink as (start, duration) on clock::NowNs: start = when the
// thread should have woken, duration = how much later it did. Start() once; Stop() is
// idempotent and joins within one tick; the destructor stops. The sink runs on the watch
// thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "telemetry/cpu_wait.h"

namespace gpuprof::telemetry {

inline constexpr std::chrono::nanoseconds kStallWatchTick{5'000'000};        // 5 ms
inline constexpr std::chrono::nanoseconds kStallWatchThreshold{10'000'000};  // 10 ms
// The CPU wait (telemetry/cpu_wait.h) is read every this many ticks (20 ms at the default
// tick), and a period is handed on when its wait is at least kCpuWaitMin (in a quiet run most
// 20 ms periods have far less).
inline constexpr int kCpuWaitEveryTicks = 4;
inline constexpr std::chrono::nanoseconds kCpuWaitMin{1'000'000};  // 1 ms

class StallWatch {
 public:
  using Sink = std::function<void(int64_t start_ns, int64_t duration_ns)>;
  using Clock = std::function<int64_t()>;  // monotonic ns; clock::NowNs unless a test's

  StallWatch(std::chrono::nanoseconds tick, std::chrono::nanoseconds threshold, Sink sink,
             Clock now = {});
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Also reads the process's CPU wait with `reader` every `every_ticks` ticks and hands each
  // period whose wait is at least `min_wait` to `sink` as (start, end, wait_ns) on the watch's
  // clock (wait summed over threads: it may exceed end - start). Call before Start().
  using WaitSink = std::function<void(int64_t start_ns, int64_t end_ns, int64_t wait_ns)>;
  void WatchCpuWait(std::unique_ptr<CpuWaitReader> reader, int every_ticks,
                    std::chrono::nanoseconds min_wait, WaitSink sink);

  void Start();
  void Stop();

  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }
  uint64_t stalls() const { return stalls_.load(std::memory_order_relaxed); }
  bool watching_cpu_wait() const { return cpu_wait_ != nullptr; }
  // The CPU wait handed to the sink so far (ns, summed over threads).
  int64_t cpu_wait_ns() const { return cpu_wait_ns_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  const std::chrono::nanoseconds tick_;
  const std::chrono::nanoseconds threshold_;
  Sink sink_;
  Clock now_;
  std::atomic<bool> stop_flag_{false};
  std::thread thread_;
  std::atomic<uint64_t> ticks_{0};
  std::atomic<uint64_t> stalls_{0};
  std::unique_ptr<CpuWaitReader> cpu_wait_;
  int cpu_wait_every_ = kCpuWaitEveryTicks;
  int64_t cpu_wait_min_ns_ = kCpuWaitMin.count();
  WaitSink wait_sink_;
  std::atomic<int64_t> cpu_wait_ns_{0};
};

}  // namespace gpuprof::telemetry
