// Host telemetry from /proc: CPU (total and per core), memory, page cache, swap-in rate, disk
// read throughput and IOPS, and the training process tree (main process + children, i.e.
// dataloader workers) CPU% and RSS. Rates are computed between consecutive Sample() calls;
// the first call primes the counters and yields rates of nullopt.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "store/rows.h"

namespace gpuprof::telemetry {

class HostSampler {
 public:
  // root_pid: the training process. proc_root: "/proc" (tests point it at a fake tree).
  explicit HostSampler(int64_t root_pid, std::string proc_root = "/proc");

  // One tick. noexcept; fields that could not be read stay nullopt. Called by one thread.
  bool Sample(int64_t now_rel_ns, store::HostSampleRow* host,
              std::vector<store::WorkerSampleRow>* workers) noexcept;

  // The pids of the process tree as of the last Sample() (root first).
  const std::vector<int64_t>& tree_pids() const { return tree_pids_; }

 private:
  // (Implementation state: previous counters for rate computation.)
  int64_t root_pid_;
  std::string proc_root_;
  std::vector<int64_t> tree_pids_;
  struct CpuTimes { uint64_t busy = 0, total = 0; };
  std::vector<CpuTimes> prev_cpu_;          // [0] = aggregate, [1..] = cores
  std::map<int64_t, uint64_t> prev_proc_ticks_;
  std::optional<uint64_t> prev_swap_in_pages_;
  std::optional<uint64_t> prev_disk_sectors_;
  std::optional<uint64_t> prev_disk_ios_;
  std::optional<int64_t> prev_ts_ns_;
  long clk_tck_ = 100;
  long page_size_ = 4096;
};

}  // namespace gpuprof::telemetry
