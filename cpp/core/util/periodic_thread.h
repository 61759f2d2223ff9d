// A background thread that calls `tick` every `period` until Stop(). Owns its thread: Stop()
// is idempotent, wakes the thread at once, runs `on_stop` on the worker thread after the
// last tick, and joins; the destructor calls Stop(). The thread is named `name` (at most 15
// characters; top -H and /proc show it): gpuprof's threads are named "gpuprof*", which is how
// telemetry/cpu_wait.h tells them from the training's.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#ifdef __linux__
#include <pthread.h>
#endif

namespace gpuprof::util {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread() { Stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread. Must be called at most once.
  // `period` is taken within [1 µs, 1 day]: a zero, negative or overflowed period never spins,
  // a huge one never overflows the clock.
  void Start(std::chrono::nanoseconds period, std::function<void()> tick,
             std::function<void()> on_stop = {}, std::string name = "gpuprof") {
    period_ = std::clamp(period, std::chrono::nanoseconds(1000),
                         std::chrono::nanoseconds(std::chrono::hours(24)));
    tick_ = std::move(tick);
    on_stop_ = std::move(on_stop);
    name_ = name.substr(0, 15);
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  bool running() const { return thread_.joinable(); }

 private:
  void Loop() {
#ifdef __linux__
    pthread_setname_np(pthread_self(), name_.c_str());
#endif
    auto next = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      tick_();
      lock.lock();
      next += period_;
      const auto now = std::chrono::steady_clock::now();
      if (next < now) next = now;  // fell behind: do not burst to catch up
      cv_.wait_until(lock, next, [this] { return stop_; });
    }
    lock.unlock();
    if (on_stop_) on_stop_();
  }

  std::chrono::nanoseconds period_{};
  std::function<void()> tick_;
  std::function<void()> on_stop_;
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpuprof::util
