#include "telemetry/cpu_wait.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

namespace gpuprof::telemetry {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMs = 1'000'000;

// A fake /proc/<pid>/task: one directory per thread with comm and schedstat.
class FakeTasks {
 public:
  FakeTasks() {
    dir_ = fs::temp_directory_path() /
           ("gpuprof_cpu_wait_" + std::to_string(getpid()) + "_" + std::to_string(++count_));
    fs::create_directories(dir_);
  }
  ~FakeTasks() { fs::remove_all(dir_); }
  void Set(int tid, const std::string& comm, int64_t run_delay_ns) {
    const fs::path t = dir_ / std::to_string(tid);
    fs::create_directories(t);
    std::ofstream(t / "comm") << comm << "\n";
    std::ofstream(t / "schedstat") << 123456 << " " << run_delay_ns << " " << 7 << "\n";
  }
  void Remove(int tid) { fs::remove_all(dir_ / std::to_string(tid)); }
  std::string path() const { return dir_.string(); }

 private:
  static inline int count_ = 0;
  fs::path dir_;
};

TEST(CpuWaitReaderTest, SumsTheTrainingThreadsWaitSinceTheLastCallLeavingGpuprofsOwnOut) {
  // GIVEN a process with a training thread and a gpuprof thread
  FakeTasks tasks;
  tasks.Set(101, "python", 40 * kMs);
  tasks.Set(102, "gpuprof-host", 10 * kMs);
  CpuWaitReader reader(tasks.path());
  ASSERT_FALSE(reader.Unavailable().has_value());
  // WHEN primed, then both wait more
  EXPECT_EQ(reader.Delta(), 0);
  tasks.Set(101, "python", 45 * kMs);
  tasks.Set(102, "gpuprof-host", 17 * kMs);
  // THEN only the training thread's 5 ms count
  EXPECT_EQ(reader.Delta(), 5 * kMs);
  // AND a thread born since counts from when it is first seen, not its whole life
  tasks.Set(103, "pt_main_thread", 100 * kMs);
  EXPECT_EQ(reader.Delta(), 0);
  tasks.Set(103, "pt_main_thread", 102 * kMs);
  EXPECT_EQ(reader.Delta(), 2 * kMs);
  // AND a thread that exited is forgotten (a new thread reusing its id starts from scratch)
  tasks.Remove(101);
  EXPECT_EQ(reader.Delta(), 0);
  EXPECT_EQ(reader.threads_seen(), 2u);
  tasks.Set(101, "worker", 3 * kMs);
  EXPECT_EQ(reader.Delta(), 0);
  tasks.Set(101, "worker", 4 * kMs);
  EXPECT_EQ(reader.Delta(), 1 * kMs);
}

TEST(CpuWaitReaderTest, SaysWhyWhenTheWaitCannotBeRead) {
  // GIVEN no task directory
  CpuWaitReader missing("/nonexistent/gpuprof/task");
  const auto why = missing.Unavailable();
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("/nonexistent/gpuprof/task cannot be listed"), std::string::npos) << *why;
  EXPECT_EQ(missing.Delta(), 0);
  // AND a kernel without schedstat files
  FakeTasks tasks;
  fs::create_directories(tasks.path() + "/7");
  const auto no_sched = CpuWaitReader(tasks.path()).Unavailable();
  ASSERT_TRUE(no_sched.has_value());
  EXPECT_NE(no_sched->find("CONFIG_SCHED_INFO"), std::string::npos) << *no_sched;
  // AND this machine's own process is readable
  EXPECT_FALSE(CpuWaitReader().Unavailable().has_value());
}

// One busy thread pinned to `cpu` for `busy`, then parked until released; its tid and name.
class PinnedSpinner {
 public:
  PinnedSpinner(const char* name, int cpu, std::chrono::milliseconds busy) {
    thread_ = std::thread([=, this] {
      pthread_setname_np(pthread_self(), name);
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof set, &set);
      tid_.store(static_cast<pid_t>(syscall(SYS_gettid)));
      const auto until = std::chrono::steady_clock::now() + busy;
      while (std::chrono::steady_clock::now() < until) {
      }
      spun_.store(true);
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return released_; });
    });
    while (tid_.load() == 0) std::this_thread::yield();
  }
  ~PinnedSpinner() {
    {
      std::lock_guard lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  pid_t tid() const { return tid_.load(); }
  void WaitSpun() const {
    while (!spun_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> spun_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::thread thread_;
};

int64_t RunDelayOf(pid_t tid) {
  return ReadRunDelayNs("/proc/self/task/" + std::to_string(tid) + "/schedstat").value_or(-1);
}

TEST(CpuWaitReaderTest, TwoBusyThreadsSharingOneCoreQueueAndOnlyTheTrainingsWaitCounts) {
  // GIVEN a training thread and a gpuprof thread spinning on the same core for 300 ms
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  CpuWaitReader reader;
  reader.Delta();
  int64_t a0 = 0, b0 = 0;
  {
    PinnedSpinner a("busy-training", cpu, std::chrono::milliseconds(300));
    PinnedSpinner b("gpuprof-busy", cpu, std::chrono::milliseconds(300));
    reader.Delta();  // both are seen from here on
    a0 = RunDelayOf(a.tid());
    b0 = RunDelayOf(b.tid());
    a.WaitSpun();
    b.WaitSpun();
    const int64_t a_wait = RunDelayOf(a.tid()) - a0;
    const int64_t b_wait = RunDelayOf(b.tid()) - b0;
    const int64_t counted = reader.Delta();
    // THEN each queued while the other ran
    EXPECT_GE(a_wait, 50 * kMs);
    EXPECT_GE(b_wait, 50 * kMs);
    // AND the reader counted the training thread's wait, not gpuprof's (the test's other,
    // idle threads add at most a little)
    EXPECT_GE(counted, a_wait);
    EXPECT_LT(counted, a_wait + b_wait / 2);
  }
}

}  // namespace
}  // namespace gpuprof::telemetry
