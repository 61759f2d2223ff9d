// CPU wait: how long this process's threads sat runnable in the kernel's run queue with no CPU
// to run on. Linux keeps it per thread, in nanoseconds, as the second field of
// /proc/<pid>/task/<tid>/schedstat (run_delay; CONFIG_SCHED_INFO, on in every distribution
// kernel). More busy threads than free cores make it grow: other processes on the host, a
// container's CPU quota, or the training's own threads (torch's intra-op pool, user threads)
// beyond the cores it has.
//
// The stall watch cannot see this: its thread sleeps almost always and the scheduler favours
// sleepers, so it wakes on time while the busy training threads queue. The reader sums the
// waits of every thread of the process except gpuprof's own (threads named "gpuprof*": the
// samplers and the writer wait only to take a sample, never on the training's behalf).
// Summed over threads, the wait can exceed wall time when several threads queue at once.
//
// Not thread-safe: one caller (the stall watch thread). Reading costs one directory listing and
// one small procfs read per thread (bench/stall_watch_cost.py measures it with the watch).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

namespace gpuprof::telemetry {

class CpuWaitReader {
 public:
  // `task_dir`: the process's task directory (tests pass a fake tree).
  explicit CpuWaitReader(std::string task_dir = "/proc/self/task");

  // Why the wait cannot be read here (no schedstat file for this process's first thread), or
  // nullopt when it can.
  std::optional<std::string> Unavailable() const;

  // The run-queue wait of the process's threads (gpuprof's left out) since the previous call,
  // in ns summed over threads. The first call primes and returns 0; a thread first seen by a
  // call counts from that call on; a thread gone since the previous call takes its last
  // stretch with it (at most one period's worth, never double counted).
  int64_t Delta();

  size_t threads_seen() const { return threads_.size(); }

 private:
  struct Thread {
    int64_t run_delay_ns = 0;
    bool ours = false;  // named gpuprof*: not counted
    uint64_t seen = 0;  // the Delta() call that last saw it
  };
  std::string task_dir_;
  std::unordered_map<pid_t, Thread> threads_;
  uint64_t calls_ = 0;
};

// Reads the run_delay field (ns) of one schedstat file; nullopt when it cannot.
std::optional<int64_t> ReadRunDelayNs(const std::string& schedstat_path);

}  // namespace gpuprof::telemetry
