// Host telemetry from /proc: CPU (total and per core), memory, page cache, swap-in rate, disk
// read throughput and IOPS, and the training process tree (main process + children, i.e.
// dataloader workers) CPU% and RSS. Rates are computed between consecutive Sample() calls;
// the first call primes the counters and yields rates of nullopt.
//
// Sources and definitions (see docs/telemetry.md):
//   cpu_pct, cpu_per_core  /proc/stat: busy = user+nice+system+irq+softirq+steal, over the same
//                          plus idle+iowait (guest time is already inside user/nice). Per-core
//                          values are in cpuN order; empty on the priming tick and on a tick
//                          where the set of online cores changed.
//   mem_used_bytes         /proc/meminfo: MemTotal - MemAvailable
//   page_cache_bytes       /proc/meminfo: Cached + Buffers
//   swap_in_bps            /proc/vmstat: pswpin (pages) * page size / s
//   disk_read_bps / _iops  /proc/diskstats: sectors read * 512 / s and reads completed / s,
//                          summed over whole disks only: partitions (a name that is another
//                          listed device's name plus digits, optionally after a 'p': sda1,
//                          nvme0n1p2, mmcblk0p1) and loop*, ram*, zram*, dm-*, md*, sr*, fd*
//                          (virtual devices whose I/O the physical disks already count, or no
//                          disk at all) are skipped.
//   process tree           root_pid and every descendant but the job's other ranks given to
//                          SetJobRoots (and theirs), found by scanning <proc_root>/*/stat
//                          for parent pids (at most once per tree_rescan_interval, default 1 s;
//                          the known pids are re-read on the ticks between). Per pid: cpu% of one
//                          core from utime+stime, RSS from statm resident pages * page size. A pid
//                          seen for the first time (or reused: its start time changed) has no cpu%
//                          yet.
//   proc_cpu_pct           sum of the tree's per-pid cpu% (pids with a rate); nullopt while the
//                          root has none. CPU of children that exited between ticks is not seen.
//   proc_rss_bytes         sum of the tree's RSS (pages shared between forked workers count once
//                          per process, as in `ps`).
//   job_cpu_pct            only with set_job_parent() or SetJobRoots(): the launcher's other
//                          children (or the given pids) and their descendants (the job's other
//                          ranks on this host, with their loader workers), found by the same
//                          scan and re-read the same way; the sum of their cpu% of one core, set
//                          on the ticks proc_cpu_pct is, except a tick that has just found them
//                          all (none has a rate yet). A sibling seen for the first time counts
//                          from its next tick.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/rows.h"

namespace gpuprof::telemetry {

class HostSampler {
 public:
  // root_pid: the training process. proc_root: "/proc" (tests point it at a fake tree).
  explicit HostSampler(int64_t root_pid, std::string proc_root = "/proc");
  HostSampler(const HostSampler&) = delete;
  HostSampler& operator=(const HostSampler&) = delete;

  // One tick. noexcept; fields that could not be read stay nullopt. Called by one thread.
  // *host is overwritten; *workers is cleared, then gets one row per pid of the tree (root
  // first, role "main"; descendants "child"). Returns false when nothing at all could be read.
  bool Sample(int64_t now_rel_ns, store::HostSampleRow* host,
              std::vector<store::WorkerSampleRow>* workers) noexcept;

  // The pids of the process tree as of the last Sample() (root first). Sampling thread only.
  const std::vector<int64_t>& tree_pids() const { return tree_pids_; }
  // The same list for another thread (e.g. the GPU collector thread, which needs the pids for
  // per-process device memory): copies it into *out, reusing out's capacity. Thread-safe.
  void CopyTreePids(std::vector<int64_t>* out) const;

  // Notes gathered while sampling (the first failure to read each source). Thread-safe.
  std::vector<std::string> TakeNotes();

  // How often the process tree is rediscovered by scanning every <proc_root>/*/stat (the costly
  // part of a tick: one file per process on the machine). Between scans only the known tree
  // pids are read, so a new worker shows up at the next scan. Default 1 s of now_rel_ns; 0 =
  // every tick. Call before sampling starts (same thread as Sample()).
  void set_tree_rescan_interval_ns(int64_t ns) { tree_rescan_interval_ns_ = ns; }

  // This process is one of several ranks a launcher (torchrun's agent) started on this host,
  // and launcher_pid is that launcher: its other children's trees are the job's other ranks,
  // sampled into job_cpu_pct (not into the worker rows). Call before sampling starts.
  void set_job_parent(int64_t launcher_pid) { job_parent_ = launcher_pid; }
  // The job's other ranks on this host by pid, as the ranks told each other (any launcher:
  // torchrun, mp.spawn, srun, mpirun); replaces set_job_parent's discovery from the next tick.
  // Their trees are read as job_cpu_pct. Thread-safe (another thread learns them).
  void SetJobRoots(std::vector<int64_t> pids);

  int64_t root_pid() const { return root_pid_; }
  const std::string& proc_root() const { return proc_root_; }
  long clk_tck() const { return clk_tck_; }
  long page_size() const { return page_size_; }

 private:
  struct CpuTimes {
    uint64_t busy = 0, total = 0;
    bool valid = false;
  };
  struct ProcEntry {  // one line of the process scan
    int64_t pid = 0, ppid = 0;
    uint64_t ticks = 0;      // utime + stime
    uint64_t starttime = 0;  // clock ticks after boot; tells a reused pid apart
  };
  struct ProcPrev {
    int64_t pid = 0;
    uint64_t starttime = 0, ticks = 0;
    bool job = false;  // a pid of the job's other ranks (job_pids_), not of the tree
  };
  struct DiskLine {
    std::string name;
    uint64_t reads = 0, sectors = 0;
  };
  enum Source : int { kStat, kMeminfo, kVmstat, kDiskstats, kProcScan, kSourceCount };

  bool ReadFile(const char* path, std::string* buf) noexcept;
  void NoteFailure(Source source, const char* path) noexcept;
  void SampleCpu(double dt_s, store::HostSampleRow* host) noexcept;
  void SampleMemory(store::HostSampleRow* host) noexcept;
  void SampleSwap(double dt_s, store::HostSampleRow* host) noexcept;
  void SampleDisk(double dt_s, store::HostSampleRow* host) noexcept;
  bool ReadProcStat(int64_t pid, ProcEntry* e) noexcept;
  bool ScanTree() noexcept;    // full scan: rebuilds tree_pids_, job_pids_ and cur_proc_
  bool RereadTree() noexcept;  // known pids only
  // Breadth-first over entries_ (sorted by ppid) from the pids already in *pids (their
  // children, theirs, ...), skipping `skip`'s subtree and those of `skip_too`'s pids; appends
  // to *pids and cur_proc_.
  void CollectDescendants(std::vector<int64_t>* pids, int64_t skip, bool job,
                          const std::vector<int64_t>* skip_too = nullptr);
  void SampleTree(double dt_s, int64_t now_rel_ns, store::HostSampleRow* host,
                  std::vector<store::WorkerSampleRow>* workers) noexcept;

  int64_t root_pid_;
  std::string proc_root_;
  std::vector<int64_t> tree_pids_;
  std::optional<int64_t> job_parent_;
  std::optional<std::vector<int64_t>> job_roots_;  // SetJobRoots' pids, taken by Sample()
  std::mutex job_roots_mu_;
  std::optional<std::vector<int64_t>> pending_job_roots_;  // guarded by job_roots_mu_
  std::vector<int64_t> job_pids_;   // the job's other ranks on this host and their children
  std::vector<CpuTimes> prev_cpu_;  // [0] = aggregate, [1 + N] = core N
  std::vector<CpuTimes> cur_cpu_;
  std::vector<ProcPrev> prev_proc_;  // sorted by pid
  std::vector<ProcPrev> cur_proc_;
  std::vector<ProcEntry> entries_;
  std::vector<DiskLine> disks_;
  std::optional<uint64_t> prev_swap_in_pages_;
  std::optional<uint64_t> prev_disk_sectors_;
  std::optional<uint64_t> prev_disk_ios_;
  std::optional<int64_t> prev_ts_ns_;
  std::vector<int64_t> scratch_pids_;
  int64_t tree_rescan_interval_ns_ = 1000000000;
  std::optional<int64_t> last_scan_ns_;
  bool force_scan_ = false;
  bool read_anything_ = false;
  std::string buf_;  // file contents, reused across ticks
  std::string path_;
  long clk_tck_ = 100;
  long page_size_ = 4096;
  bool noted_[kSourceCount] = {};
  mutable std::mutex tree_mu_;
  std::vector<int64_t> shared_tree_pids_;  // guarded by tree_mu_
  std::mutex notes_mu_;
  std::vector<std::string> notes_;
};

}  // namespace gpuprof::telemetry
