#include "telemetry/host_sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>

namespace gpuprof::telemetry {

namespace {

constexpr size_t kInitialBuffer = 64 * 1024;
constexpr uint64_t kSectorBytes = 512;  // diskstats counts 512-byte sectors on every device

// Parses an unsigned decimal at *p, skipping leading blanks; advances *p. False if none.
bool NextU64(const char** p, const char* end, uint64_t* out) {
  const char* s = *p;
  while (s < end && (*s == ' ' || *s == '\t')) ++s;
  if (s >= end || *s < '0' || *s > '9') return false;
  uint64_t v = 0;
  while (s < end && *s >= '0' && *s <= '9') v = v * 10 + static_cast<uint64_t>(*s++ - '0');
  *out = v;
  *p = s;
  return true;
}

// Like NextU64 for a possibly negative decimal (tpgid is -1 without a terminal; nice can be < 0).
bool NextI64(const char** p, const char* end, int64_t* out) {
  const char* s = *p;
  while (s < end && (*s == ' ' || *s == '\t')) ++s;
  bool neg = s < end && *s == '-';
  if (neg) ++s;
  uint64_t v = 0;
  if (!NextU64(&s, end, &v)) return false;
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  *p = s;
  return true;
}

// Skips blanks and one token; advances *p.
void SkipToken(const char** p, const char* end) {
  const char* s = *p;
  while (s < end && (*s == ' ' || *s == '\t')) ++s;
  while (s < end && *s != ' ' && *s != '\t' && *s != '\n') ++s;
  *p = s;
}

const char* LineEnd(const char* p, const char* end) {
  const void* nl = std::memchr(p, '\n', static_cast<size_t>(end - p));
  return nl ? static_cast<const char*>(nl) : end;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Devices whose reads are not disk reads of their own: virtual block devices stacked on disks
// that already count the I/O (dm-, md), file- or memory-backed ones (loop, ram, zram), and
// optical/floppy drives.
bool SkippedDevice(std::string_view name) {
  for (std::string_view p : {"loop", "ram", "zram", "dm-", "md", "sr", "fd"}) {
    if (StartsWith(name, p)) return true;
  }
  return false;
}

// Reads a small file (a /proc/<pid>/ file) into buf; returns its length or -1.
ssize_t ReadSmall(const char* path, char* buf, size_t cap) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = ::read(fd, buf, cap - 1);
  ::close(fd);
  if (n >= 0) buf[n] = '\0';
  return n;
}

}  // namespace

HostSampler::HostSampler(int64_t root_pid, std::string proc_root)
    : root_pid_(root_pid), proc_root_(std::move(proc_root)) {
  long t = sysconf(_SC_CLK_TCK);
  if (t > 0) clk_tck_ = t;
  long p = sysconf(_SC_PAGESIZE);
  if (p > 0) page_size_ = p;
  buf_.reserve(kInitialBuffer);
  path_.reserve(proc_root_.size() + 64);
}

void HostSampler::CopyTreePids(std::vector<int64_t>* out) const {
  std::lock_guard<std::mutex> lock(tree_mu_);
  out->assign(shared_tree_pids_.begin(), shared_tree_pids_.end());
}

std::vector<std::string> HostSampler::TakeNotes() {
  std::lock_guard<std::mutex> lock(notes_mu_);
  return std::exchange(notes_, {});
}

void HostSampler::NoteFailure(Source source, const char* path) noexcept {
  if (noted_[source]) return;
  noted_[source] = true;
  try {
    std::string note = std::string("host: cannot read ") + path + ": " + std::strerror(errno);
    std::lock_guard<std::mutex> lock(notes_mu_);
    notes_.push_back(std::move(note));
  } catch (...) {
  }
}

bool HostSampler::ReadFile(const char* path, std::string* buf) noexcept {
  try {
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    if (buf->capacity() < kInitialBuffer) buf->reserve(kInitialBuffer);
    buf->resize(buf->capacity());
    size_t len = 0;
    for (;;) {
      if (len == buf->size()) buf->resize(buf->size() * 2);
      ssize_t n = ::read(fd, buf->data() + len, buf->size() - len);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        if (n < 0) return false;
        break;
      }
      len += static_cast<size_t>(n);
    }
    buf->resize(len);
    return true;
  } catch (...) {
    return false;
  }
}

void HostSampler::SampleCpu(double dt_s, store::HostSampleRow* host) noexcept {
  path_.assign(proc_root_).append("/stat");
  if (!ReadFile(path_.c_str(), &buf_)) return NoteFailure(kStat, path_.c_str());
  read_anything_ = true;
  cur_cpu_.clear();
  const char* p = buf_.data();
  const char* end = p + buf_.size();
  int64_t ncores = 0;
  while (p < end) {
    const char* eol = LineEnd(p, end);
    if (eol - p < 3 || std::memcmp(p, "cpu", 3) != 0) break;  // cpu lines come first
    const char* s = p + 3;
    size_t slot = 0;  // 0 = aggregate
    if (s < eol && *s >= '0' && *s <= '9') {
      uint64_t id = 0;
      NextU64(&s, eol, &id);
      slot = static_cast<size_t>(id) + 1;
      ++ncores;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    uint64_t v[8] = {};
    int got = 0;
    while (got < 8 && NextU64(&s, eol, &v[got])) ++got;
    if (got >= 4) {
      if (cur_cpu_.size() <= slot) cur_cpu_.resize(slot + 1);
      const uint64_t idle = v[3] + v[4];
      const uint64_t busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
      cur_cpu_[slot] = {busy, busy + idle, true};
    }
    p = eol + 1;
  }
  if (ncores > 0) host->ncores = ncores;

  if (dt_s > 0 && !prev_cpu_.empty()) {
    auto pct = [](const CpuTimes& now, const CpuTimes& before) -> std::optional<double> {
      if (!now.valid || !before.valid || now.total <= before.total || now.busy < before.busy) {
        return std::nullopt;
      }
      return 100.0 * static_cast<double>(now.busy - before.busy) /
             static_cast<double>(now.total - before.total);
    };
    if (!cur_cpu_.empty()) host->cpu_pct = pct(cur_cpu_[0], prev_cpu_[0]);
    // Per core, only when exactly the same cores are online in both ticks.
    bool same = cur_cpu_.size() == prev_cpu_.size();
    for (size_t i = 1; same && i < cur_cpu_.size(); ++i) {
      same = cur_cpu_[i].valid == prev_cpu_[i].valid;
    }
    if (same) {
      host->cpu_per_core.reserve(static_cast<size_t>(ncores));
      for (size_t i = 1; i < cur_cpu_.size(); ++i) {
        if (!cur_cpu_[i].valid) continue;
        std::optional<double> v = pct(cur_cpu_[i], prev_cpu_[i]);
        if (!v) {
          host->cpu_per_core.clear();
          break;
        }
        host->cpu_per_core.push_back(*v);
      }
    }
  }
  std::swap(prev_cpu_, cur_cpu_);
}

void HostSampler::SampleMemory(store::HostSampleRow* host) noexcept {
  path_.assign(proc_root_).append("/meminfo");
  if (!ReadFile(path_.c_str(), &buf_)) return NoteFailure(kMeminfo, path_.c_str());
  read_anything_ = true;
  std::optional<uint64_t> total, available, free_kb, cached, buffers;
  const char* p = buf_.data();
  const char* end = p + buf_.size();
  while (p < end) {
    const char* eol = LineEnd(p, end);
    const char* colon = static_cast<const char*>(std::memchr(p, ':', static_cast<size_t>(eol - p)));
    if (colon != nullptr) {
      std::string_view key(p, static_cast<size_t>(colon - p));
      std::optional<uint64_t>* slot = key == "MemTotal"       ? &total
                                      : key == "MemAvailable" ? &available
                                      : key == "MemFree"      ? &free_kb
                                      : key == "Cached"       ? &cached
                                      : key == "Buffers"      ? &buffers
                                                              : nullptr;
      uint64_t v = 0;
      const char* s = colon + 1;
      if (slot != nullptr && NextU64(&s, eol, &v)) *slot = v * 1024;  // values are in kB
    }
    p = eol + 1;
  }
  if (total) host->mem_total_bytes = static_cast<int64_t>(*total);
  // Kernels before 3.14 lack MemAvailable: approximate it by free + reclaimable cache.
  if (!available && free_kb && cached && buffers) available = *free_kb + *cached + *buffers;
  if (total && available && *available <= *total) {
    host->mem_used_bytes = static_cast<int64_t>(*total - *available);
  }
  if (cached && buffers) host->page_cache_bytes = static_cast<int64_t>(*cached + *buffers);
}

void HostSampler::SampleSwap(double dt_s, store::HostSampleRow* host) noexcept {
  path_.assign(proc_root_).append("/vmstat");
  if (!ReadFile(path_.c_str(), &buf_)) return NoteFailure(kVmstat, path_.c_str());
  read_anything_ = true;
  std::optional<uint64_t> pswpin;
  const char* p = buf_.data();
  const char* end = p + buf_.size();
  while (p < end) {
    const char* eol = LineEnd(p, end);
    if (eol - p > 7 && std::memcmp(p, "pswpin ", 7) == 0) {
      const char* s = p + 7;
      uint64_t v = 0;
      if (NextU64(&s, eol, &v)) pswpin = v;
      break;
    }
    p = eol + 1;
  }
  if (pswpin && prev_swap_in_pages_ && dt_s > 0 && *pswpin >= *prev_swap_in_pages_) {
    host->swap_in_bps = static_cast<double>(*pswpin - *prev_swap_in_pages_) *
                        static_cast<double>(page_size_) / dt_s;
  }
  prev_swap_in_pages_ = pswpin;
}

void HostSampler::SampleDisk(double dt_s, store::HostSampleRow* host) noexcept {
  path_.assign(proc_root_).append("/diskstats");
  if (!ReadFile(path_.c_str(), &buf_)) return NoteFailure(kDiskstats, path_.c_str());
  read_anything_ = true;
  size_t n = 0;
  const char* p = buf_.data();
  const char* end = p + buf_.size();
  // major minor name reads_completed reads_merged sectors_read ...
  try {
    while (p < end) {
      const char* eol = LineEnd(p, end);
      const char* s = p;
      SkipToken(&s, eol);
      SkipToken(&s, eol);
      while (s < eol && (*s == ' ' || *s == '\t')) ++s;
      const char* name = s;
      SkipToken(&s, eol);
      std::string_view nm(name, static_cast<size_t>(s - name));
      uint64_t reads = 0, merged = 0, sectors = 0;
      if (!nm.empty() && NextU64(&s, eol, &reads) && NextU64(&s, eol, &merged) &&
          NextU64(&s, eol, &sectors)) {
        if (disks_.size() <= n) disks_.resize(n + 1);
        disks_[n].name.assign(nm);
        disks_[n].reads = reads;
        disks_[n].sectors = sectors;
        ++n;
      }
      p = eol + 1;
    }
  } catch (...) {
    return;
  }
  auto listed = [&](std::string_view name) {
    for (size_t i = 0; i < n; ++i) {
      if (disks_[i].name == name) return true;
    }
    return false;
  };
  uint64_t sectors = 0, ios = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string_view name = disks_[i].name;
    if (SkippedDevice(name)) continue;
    // A partition is a listed device's name followed by digits (sda1), or by 'p' and digits
    // (nvme0n1p1, mmcblk0p1).
    size_t cut = name.size();
    while (cut > 0 && name[cut - 1] >= '0' && name[cut - 1] <= '9') --cut;
    if (cut < name.size() && cut > 0) {
      if (listed(name.substr(0, cut))) continue;
      if (name[cut - 1] == 'p' && cut > 1 && listed(name.substr(0, cut - 1))) continue;
    }
    sectors += disks_[i].sectors;
    ios += disks_[i].reads;
  }
  if (dt_s > 0 && prev_disk_sectors_ && prev_disk_ios_ && sectors >= *prev_disk_sectors_ &&
      ios >= *prev_disk_ios_) {
    host->disk_read_bps =
        static_cast<double>((sectors - *prev_disk_sectors_) * kSectorBytes) / dt_s;
    host->disk_read_iops = static_cast<double>(ios - *prev_disk_ios_) / dt_s;
  }
  prev_disk_sectors_ = sectors;
  prev_disk_ios_ = ios;
}

bool HostSampler::ReadProcStat(int64_t pid, ProcEntry* e) noexcept {
  // <proc_root>/<pid>/stat: pid (comm) state ppid pgrp session tty_nr tpgid flags minflt
  // cminflt majflt cmajflt utime stime cutime cstime priority nice num_threads itrealvalue
  // starttime ...  comm may hold blanks and parentheses: fields start after the last ')'.
  char path[512];
  char text[1024];
  std::snprintf(path, sizeof path, "%s/%lld/stat", proc_root_.c_str(), static_cast<long long>(pid));
  ssize_t len = ReadSmall(path, text, sizeof text);
  if (len <= 0) return false;  // exited
  const char* end = text + len;
  const char* s = static_cast<const char*>(memrchr(text, ')', static_cast<size_t>(len)));
  if (s == nullptr) return false;
  ++s;
  SkipToken(&s, end);  // state
  int64_t f[19] = {};  // fields 4 (ppid) .. 22 (starttime)
  int got = 0;
  while (got < 19 && NextI64(&s, end, &f[got])) ++got;
  if (got < 12) return false;  // not a stat line we understand (utime/stime missing)
  e->pid = pid;
  e->ppid = f[0];
  e->ticks = static_cast<uint64_t>(f[10]) + static_cast<uint64_t>(f[11]);
  e->starttime = got >= 19 ? static_cast<uint64_t>(f[18]) : 0;
  return true;
}

bool HostSampler::ScanTree() noexcept {
  entries_.clear();
  DIR* dir = ::opendir(proc_root_.c_str());
  if (dir == nullptr) {
    NoteFailure(kProcScan, proc_root_.c_str());
    return false;
  }
  try {
    // 1. Every process's parent, from <proc_root>/*/stat.
    while (dirent* de = ::readdir(dir)) {
      const char* d = de->d_name;
      if (*d < '1' || *d > '9') continue;
      int64_t pid = 0;
      while (*d >= '0' && *d <= '9') pid = pid * 10 + (*d++ - '0');
      if (*d != '\0') continue;
      ProcEntry e;
      if (ReadProcStat(pid, &e)) entries_.push_back(e);
    }
    ::closedir(dir);
    dir = nullptr;
    // 2. The tree: breadth-first from the root over a ppid-sorted copy.
    std::sort(entries_.begin(), entries_.end(), [](const ProcEntry& a, const ProcEntry& b) {
      return a.ppid != b.ppid ? a.ppid < b.ppid : a.pid < b.pid;
    });
    job_pids_.clear();
    const ProcEntry* root = nullptr;
    for (const ProcEntry& e : entries_) {
      if (e.pid == root_pid_) root = &e;
    }
    if (root == nullptr) return true;
    tree_pids_.push_back(root_pid_);
    cur_proc_.push_back({root->pid, root->starttime, root->ticks, false});
    // The job's other ranks are not this process's tree even when it started them (Lightning's
    // ddp strategy: rank 0 starts the others as its children).
    const std::vector<int64_t>* not_mine = job_roots_ ? &*job_roots_ : nullptr;
    CollectDescendants(&tree_pids_, root_pid_, false, not_mine);
    // 3. The job's other ranks: the pids the ranks told each other, or else the launcher's
    // other children; and their descendants.
    if (job_roots_) {
      std::vector<int64_t> roots;
      for (int64_t pid : *job_roots_) {
        if (pid == root_pid_) continue;
        auto it = std::find_if(entries_.begin(), entries_.end(),
                               [pid](const ProcEntry& e) { return e.pid == pid; });
        if (it == entries_.end()) continue;  // exited (or not in this pid namespace)
        roots.push_back(pid);
        cur_proc_.push_back({it->pid, it->starttime, it->ticks, true});
      }
      // A rank may have started others (Lightning's rank 0): they are roots already.
      CollectDescendants(&roots, root_pid_, true, not_mine);
      job_pids_.assign(roots.begin(), roots.end());
    } else if (job_parent_ && *job_parent_ > 1 && *job_parent_ != root_pid_) {
      std::vector<int64_t> launcher{*job_parent_};
      CollectDescendants(&launcher, root_pid_, true);
      job_pids_.assign(launcher.begin() + 1, launcher.end());
      // CollectDescendants added cur_proc_ entries for them already.
    }
    return true;
  } catch (...) {
    if (dir != nullptr) ::closedir(dir);
    return false;
  }
}

void HostSampler::CollectDescendants(std::vector<int64_t>* pids, int64_t skip, bool job,
                                     const std::vector<int64_t>* skip_too) {
  for (size_t i = 0; i < pids->size(); ++i) {
    const int64_t parent = (*pids)[i];
    auto lo = std::lower_bound(entries_.begin(), entries_.end(), parent,
                               [](const ProcEntry& e, int64_t v) { return e.ppid < v; });
    for (auto it = lo; it != entries_.end() && it->ppid == parent; ++it) {
      if (it->pid == skip) continue;  // the root (a cycle cannot exist, but never loop)
      if (skip_too && std::find(skip_too->begin(), skip_too->end(), it->pid) != skip_too->end()) {
        continue;
      }
      pids->push_back(it->pid);
      cur_proc_.push_back({it->pid, it->starttime, it->ticks, job});
    }
  }
}

bool HostSampler::RereadTree() noexcept {
  // The pids of the last scan, minus those that exited or were reused (a reused pid forces a
  // full scan next tick, as its place in the tree is unknown).
  try {
    const auto reread = [this](std::vector<int64_t>* pids, bool job) {
      scratch_pids_.assign(pids->begin(), pids->end());
      pids->clear();
      for (int64_t pid : scratch_pids_) {
        ProcEntry e;
        if (!ReadProcStat(pid, &e)) continue;
        auto it = std::lower_bound(prev_proc_.begin(), prev_proc_.end(), pid,
                                   [](const ProcPrev& p, int64_t v) { return p.pid < v; });
        if (it != prev_proc_.end() && it->pid == pid && it->starttime != e.starttime) {
          force_scan_ = true;
          continue;
        }
        pids->push_back(pid);
        cur_proc_.push_back({pid, e.starttime, e.ticks, job});
      }
    };
    reread(&tree_pids_, false);
    reread(&job_pids_, true);
    return true;
  } catch (...) {
    return false;
  }
}

void HostSampler::SampleTree(double dt_s, int64_t now_rel_ns, store::HostSampleRow* host,
                             std::vector<store::WorkerSampleRow>* workers) noexcept {
  cur_proc_.clear();
  const bool full = force_scan_ || !last_scan_ns_ || tree_rescan_interval_ns_ <= 0 ||
                    now_rel_ns - *last_scan_ns_ >= tree_rescan_interval_ns_ ||
                    now_rel_ns < *last_scan_ns_;
  bool ok;
  if (full) {
    tree_pids_.clear();
    force_scan_ = false;
    ok = ScanTree();
    if (ok) last_scan_ns_ = now_rel_ns;
  } else {
    ok = RereadTree();
  }
  if (!ok) {
    tree_pids_.clear();
    job_pids_.clear();
    prev_proc_.clear();
    return;
  }
  read_anything_ = true;
  try {
    // 3. Per pid: cpu% against the previous tick, RSS from statm.
    char path[512];
    char text[256];
    double cpu_sum = 0;
    double job_sum = 0;
    size_t job_count = 0, job_rates = 0;
    bool root_has_rate = false;
    int64_t rss_sum = 0;
    bool any_rss = false;
    for (size_t i = 0; i < cur_proc_.size(); ++i) {
      const ProcPrev& cur = cur_proc_[i];
      const auto prev = std::lower_bound(prev_proc_.begin(), prev_proc_.end(), cur.pid,
                                         [](const ProcPrev& p, int64_t v) { return p.pid < v; });
      const bool has_rate = dt_s > 0 && prev != prev_proc_.end() && prev->pid == cur.pid &&
                            prev->starttime == cur.starttime && cur.ticks >= prev->ticks;
      const double pct = has_rate ? 100.0 * static_cast<double>(cur.ticks - prev->ticks) /
                                        static_cast<double>(clk_tck_) / dt_s
                                  : 0.0;
      if (cur.job) {  // the job's other ranks: their CPU only
        job_sum += pct;
        ++job_count;
        if (has_rate) ++job_rates;
        continue;
      }
      store::WorkerSampleRow w;
      w.ts_ns = now_rel_ns;
      w.pid = cur.pid;
      w.role = cur.pid == root_pid_ ? "main" : "child";
      if (has_rate) {
        w.cpu_pct = pct;
        cpu_sum += pct;
        if (cur.pid == root_pid_) root_has_rate = true;
      }
      std::snprintf(path, sizeof path, "%s/%lld/statm", proc_root_.c_str(),
                    static_cast<long long>(cur.pid));
      ssize_t len = ReadSmall(path, text, sizeof text);
      if (len > 0) {
        // size resident shared text lib data dt (pages)
        const char* s = text;
        uint64_t size = 0, resident = 0;
        if (NextU64(&s, text + len, &size) && NextU64(&s, text + len, &resident)) {
          w.rss_bytes = static_cast<int64_t>(resident) * page_size_;
          rss_sum += *w.rss_bytes;
          any_rss = true;
        }
      }
      workers->push_back(std::move(w));
    }
    if (root_has_rate) host->proc_cpu_pct = cpu_sum;
    // Known when the ranks were found before this tick (a tick that just found them all has no
    // rate for any yet), or when none is left.
    if (root_has_rate && (job_parent_ || job_roots_) && (job_count == 0 || job_rates > 0)) {
      host->job_cpu_pct = job_sum;
    }
    if (any_rss) host->proc_rss_bytes = rss_sum;
    std::sort(cur_proc_.begin(), cur_proc_.end(),
              [](const ProcPrev& a, const ProcPrev& b) { return a.pid < b.pid; });
    std::swap(prev_proc_, cur_proc_);
  } catch (...) {
  }
}

void HostSampler::SetJobRoots(std::vector<int64_t> pids) {
  std::lock_guard<std::mutex> lock(job_roots_mu_);
  pending_job_roots_ = std::move(pids);
}

bool HostSampler::Sample(int64_t now_rel_ns, store::HostSampleRow* host,
                         std::vector<store::WorkerSampleRow>* workers) noexcept {
  try {
    std::lock_guard<std::mutex> lock(job_roots_mu_);
    if (pending_job_roots_) {
      job_roots_ = std::move(pending_job_roots_);
      pending_job_roots_.reset();
      force_scan_ = true;  // find their trees now
    }
  } catch (...) {
  }
  *host = store::HostSampleRow();
  host->ts_ns = now_rel_ns;
  workers->clear();
  read_anything_ = false;
  const double dt_s = prev_ts_ns_ ? static_cast<double>(now_rel_ns - *prev_ts_ns_) / 1e9 : 0.0;
  SampleCpu(dt_s, host);
  SampleMemory(host);
  SampleSwap(dt_s, host);
  SampleDisk(dt_s, host);
  SampleTree(dt_s, now_rel_ns, host, workers);
  try {
    std::lock_guard<std::mutex> lock(tree_mu_);
    shared_tree_pids_.assign(tree_pids_.begin(), tree_pids_.end());
  } catch (...) {
  }
  prev_ts_ns_ = now_rel_ns;
  return read_anything_;
}

}  // namespace gpuprof::telemetry
