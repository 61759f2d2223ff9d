#include "telemetry/stall_watch.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>

#include "clock/clock.h"

namespace gpuprof::telemetry {

StallWatch::StallWatch(std::chrono::nanoseconds tick, std::chrono::nanoseconds threshold, Sink sink,
                       Clock now)
    : tick_(std::clamp(tick, std::chrono::nanoseconds(100'000),
                       std::chrono::nanoseconds(1'000'000'000))),
      threshold_(std::max(threshold, std::chrono::nanoseconds(1))),
      sink_(std::move(sink)),
      now_(now ? std::move(now) : Clock([] { return clock::NowNs(); })) {}

StallWatch::~StallWatch() { Stop(); }

void StallWatch::WatchCpuWait(std::unique_ptr<CpuWaitReader> reader, int every_ticks,
                              std::chrono::nanoseconds min_wait, WaitSink sink) {
  if (thread_.joinable()) return;
  cpu_wait_ = std::move(reader);
  cpu_wait_every_ = std::max(1, every_ticks);
  cpu_wait_min_ns_ = std::max<int64_t>(1, min_wait.count());
  wait_sink_ = std::move(sink);
}

void StallWatch::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

void StallWatch::Stop() {
  stop_flag_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

void StallWatch::Loop() {
#ifdef __linux__
  pthread_setname_np(pthread_self(), "gpuprof-stalls");  // as top -H and /proc show it
#endif
  // A plain relative sleep per tick (no lock, no condition variable: the cheapest wake-up);
  // Stop() sets the flag and is seen within one tick.
  const int64_t tick = tick_.count();
  const timespec ts{static_cast<time_t>(tick / 1'000'000'000),
                    static_cast<long>(tick % 1'000'000'000)};
  int64_t wait_from = 0;
  int until_wait_read = cpu_wait_every_;
  if (cpu_wait_) {
    cpu_wait_->Delta();  // primes every thread's count
    wait_from = now_();
  }
  while (!stop_flag_.load(std::memory_order_acquire)) {
    const int64_t before = now_();
    nanosleep(&ts, nullptr);
    if (stop_flag_.load(std::memory_order_acquire)) break;
    const int64_t late = now_() - before - tick;
    ticks_.fetch_add(1, std::memory_order_relaxed);
    if (late >= threshold_.count()) {
      stalls_.fetch_add(1, std::memory_order_relaxed);
      if (sink_) sink_(before + tick, late);
    }
    if (cpu_wait_ && --until_wait_read == 0) {
      until_wait_read = cpu_wait_every_;
      const int64_t wait = cpu_wait_->Delta();
      const int64_t now = now_();
      if (wait >= cpu_wait_min_ns_) {
        cpu_wait_ns_.fetch_add(wait, std::memory_order_relaxed);
        if (wait_sink_) wait_sink_(wait_from, now, wait);
      }
      wait_from = now;
    }
  }
}

}  // namespace gpuprof::telemetry
