#include "lines/sampler.h"

#include <fcntl.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <system_error>

#include "clock/clock.h"
#include "telemetry/nvml_collector.h"

namespace gpuprof::lines {

// ---- BoundedTimeline ---------------------------------------------------------------------

BoundedTimeline::BoundedTimeline(size_t capacity) : capacity_(std::max<size_t>(capacity, 2)) {
  if (capacity_ % 2 != 0) ++capacity_;
  points_.reserve(capacity_);
}

void BoundedTimeline::Add(int64_t t_ns, int64_t value) noexcept {
  ++raw_;
  if (open_count_ == 0 || value > open_.second) open_ = {t_ns, value};
  if (++open_count_ < stride_) return;
  if (points_.size() == capacity_) Compact();
  points_.push_back(open_);  // capacity reserved: no allocation
  open_count_ = 0;
}

void BoundedTimeline::Compact() noexcept {
  size_t out = 0;
  for (size_t i = 0; i + 1 < points_.size(); i += 2)
    points_[out++] = points_[i].second >= points_[i + 1].second ? points_[i] : points_[i + 1];
  points_.resize(out);
  stride_ *= 2;
}

std::vector<std::pair<int64_t, int64_t>> BoundedTimeline::Points() const {
  std::vector<std::pair<int64_t, int64_t>> out(points_);
  if (open_count_ > 0) out.push_back(open_);
  return out;
}

// ---- RssReader ---------------------------------------------------------------------------

RssReader::~RssReader() {
  if (fd_ >= 0) close(fd_);
}

Status RssReader::Open() {
  if (fd_ >= 0) return Status::Ok();
  fd_ = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    return Status::Error(std::string("cannot open /proc/self/statm: ") + std::strerror(errno));
  long ps = sysconf(_SC_PAGESIZE);
  if (ps > 0) page_size_ = ps;
  if (!Read()) return Status::Error("cannot parse /proc/self/statm");
  return Status::Ok();
}

std::optional<int64_t> RssReader::Read() const noexcept {
  if (fd_ < 0) return std::nullopt;
  char buf[128];
  ssize_t n = pread(fd_, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // "size resident shared text lib data dt" in pages: the second field.
  const char* p = buf;
  while (*p && *p != ' ') ++p;
  if (*p != ' ') return std::nullopt;
  ++p;
  int64_t pages = 0;
  bool any = false;
  for (; *p >= '0' && *p <= '9'; ++p) {
    pages = pages * 10 + (*p - '0');
    any = true;
  }
  if (!any) return std::nullopt;
  return pages * page_size_;
}

// ---- LineSampler -------------------------------------------------------------------------

namespace {

int64_t ThreadCpuNs() noexcept {
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

LineSampler::LineSampler(SamplerOptions options, RequestFn request, void* ctx, RequestFn remind)
    : options_(options),
      request_(request),
      ctx_(ctx),
      remind_(remind),
      timeline_(options.timeline_capacity) {
  if (options_.interval_ns < 50'000) options_.interval_ns = 50'000;  // 20 kHz at most
  if (options_.memory_interval_ns < 50'000) options_.memory_interval_ns = 50'000;
  if (options_.gpu_interval_ns < 1'000'000) options_.gpu_interval_ns = 1'000'000;
  pids_.push_back(options_.pid > 0 ? options_.pid : static_cast<int64_t>(getpid()));
  gpu_rows_.reserve(16);
}

LineSampler::~LineSampler() { Stop(); }

void LineSampler::AtomicMax(std::atomic<int64_t>& a, int64_t v) noexcept {
  int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

Status LineSampler::Start() {
  if (thread_.joinable() || paused_) return Status::Error("the sampler is already running");
  if (options_.memory) {
    Status s = rss_.Open();
    if (!s.ok()) {
      std::lock_guard lock(notes_mu_);
      notes_.push_back("host memory unavailable: " + s.message());
    } else {
      rss_ok_ = true;
    }
  }
  start_ns_ = clock::NowNs();
  last_take_ns_ = start_ns_;
  last_cpu_ns_ = ThreadCpuNs();
  gpu_since_ns_ = start_ns_;
  if (rss_ok_) {
    auto rss = rss_.Read();
    if (rss) {
      rss_start_ = rss_peak_total_ = rss_end_ = *rss;
      rss_last_.store(*rss, std::memory_order_relaxed);
      rss_peak_open_.store(*rss, std::memory_order_relaxed);
      rss_at_last_take_ = *rss;
      source_prev_rss_ = *rss;
      timeline_.Add(0, *rss);
    }
  }
  stop_ = false;
  loop_start_ns_ = start_ns_;
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void LineSampler::JoinThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void LineSampler::Pause() {
  if (!thread_.joinable()) return;
  JoinThread();
  paused_ = true;
#ifdef __linux__
  // pthread_join returns once the kernel has cleared the thread's id (when its memory is
  // released), a little before the thread leaves the thread group that /proc/self/stat
  // counts. tgkill(pid, tid, 0) fails with ESRCH from the moment it has left.
  const int64_t tid = thread_tid_.exchange(0);
  if (tid > 0) {
    const int64_t deadline = clock::NowNs() + 50'000'000;
    while (syscall(SYS_tgkill, getpid(), static_cast<pid_t>(tid), 0) == 0 &&
           clock::NowNs() < deadline) {
      const timespec nap{0, 20'000};
      nanosleep(&nap, nullptr);
    }
  }
#endif
}

Status LineSampler::Resume() {
  if (!paused_) return Status::Ok();
  paused_ = false;
  {
    std::lock_guard lock(mu_);
    stop_ = false;
  }
  loop_start_ns_ = clock::NowNs();
  try {
    thread_ = std::thread([this] { Loop(); });
  } catch (const std::system_error& e) {
    paused_ = true;  // Stop() still closes the session
    return Status::Error(std::string("cannot restart the sampler thread: ") + e.what());
  }
  return Status::Ok();
}

void LineSampler::Stop() {
  if (!thread_.joinable() && !paused_) return;
  if (thread_.joinable()) JoinThread();
  paused_ = false;
  if (rss_ok_) {
    auto rss = rss_.Read();
    if (rss) {
      int64_t now = clock::NowNs();
      timeline_.Add(now - start_ns_, *rss);
      rss_end_ = *rss;
      rss_peak_total_ = std::max(rss_peak_total_.value_or(*rss), *rss);
      if (source_ != nullptr) ChargeSourceLine(*rss);
      rss_last_.store(*rss, std::memory_order_relaxed);
      AtomicMax(rss_peak_open_, *rss);
    }
  }
}

void LineSampler::Loop() noexcept {
  using std::chrono::nanoseconds;
  using Clock = std::chrono::steady_clock;
  constexpr int64_t kNever = INT64_MAX;
  const bool gpu = options_.gpu != nullptr;
#ifdef __linux__
  // The default 50 us timer slack of a normal thread would stretch every interval (at 1 kHz,
  // ~5 % fewer samples than asked for); 1 us keeps the rate.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
#ifdef __linux__
  thread_tid_.store(static_cast<int64_t>(syscall(SYS_gettid)));
#endif
  const int64_t begin = loop_start_ns_;
  int64_t next_request = begin + options_.interval_ns;
  int64_t next_rss = rss_ok_ ? begin + options_.memory_interval_ns : kNever;
  int64_t next_gpu = gpu ? begin : kNever;  // the GPU is read at once
  // clock::NowNs is CLOCK_MONOTONIC, as is steady_clock on Linux: deadlines convert 1:1.
  const int64_t offset =
      clock::NowNs() -
      std::chrono::duration_cast<nanoseconds>(Clock::now().time_since_epoch()).count();
  std::unique_lock lock(mu_);
  while (!stop_) {
    // While a request is outstanding, sleep until it is answered (the answer wakes this
    // thread) or the next read is due; with nothing to read, only the answer or Stop wake it.
    const bool pending = pending_.load();
    const int64_t deadline =
        std::min({pending ? (remind_ ? next_request : kNever) : next_request, next_rss, next_gpu});
    if (pending) awaiting_answer_.store(true);
    auto woken = [&] { return stop_ || (pending && !pending_.load()); };
    if (deadline == kNever) {
      cv_.wait(lock, woken);
    } else if (deadline > clock::NowNs()) {
      cv_.wait_until(lock, Clock::time_point(nanoseconds(deadline - offset)), woken);
    }
    awaiting_answer_.store(false);
    if (stop_) break;
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    lock.unlock();
    const int64_t now = clock::NowNs();
    if (now >= next_rss) {
      ReadRss(now);
      next_rss = std::max(next_rss + options_.memory_interval_ns, now);
    }
    if (now >= next_gpu) {
      SampleGpu(now);
      next_gpu = std::max(next_gpu + options_.gpu_interval_ns, now);
    }
    if (now >= next_request) {
      if (!pending_.load()) {
        Request(now);
      } else if (remind_ != nullptr) {
        remind_(ctx_);
      }
      next_request = NextRequestDeadline(next_request, now, options_.interval_ns);
    }
    lock.lock();
  }
}

void LineSampler::Request(int64_t) noexcept {
  if (pending_.exchange(true)) return;
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (!request_(ctx_)) {
    failed_requests_.fetch_add(1, std::memory_order_relaxed);
    pending_.store(false);
  }
}

void LineSampler::ReadRss(int64_t now) noexcept {
  auto rss = rss_.Read();
  if (!rss) return;
  if (source_ != nullptr) ChargeSourceLine(*rss);
  rss_last_.store(*rss, std::memory_order_relaxed);
  AtomicMax(rss_peak_open_, *rss);
  timeline_.Add(now - start_ns_, *rss);
  rss_peak_total_ = std::max(rss_peak_total_.value_or(*rss), *rss);
}

void LineSampler::ChargeSourceLine(int64_t rss) noexcept {
  const uint64_t key = source_->load(std::memory_order_relaxed);
  const int64_t delta = source_prev_rss_ >= 0 ? rss - source_prev_rss_ : 0;
  source_prev_rss_ = rss;
  if (key == 0) return;
  try {
    SourceLineMemory& m = source_lines_[key];
    if (m.readings == 0) {
      m.key = key;
      m.rss_peak = rss;
    }
    m.rss_delta += delta;
    m.rss_peak = std::max(m.rss_peak, rss);
    ++m.readings;
  } catch (...) {  // out of memory: this reading is not charged
  }
}

std::vector<SourceLineMemory> LineSampler::SourceLines() const {
  std::vector<SourceLineMemory> out;
  out.reserve(source_lines_.size());
  for (const auto& [key, m] : source_lines_) out.push_back(m);
  return out;
}

void LineSampler::SampleGpu(int64_t now) noexcept {
  ++gpu_summary_.ticks;
  int64_t util_ppm = -1;
  int64_t mem = -1;
  if (options_.gpu->Sample(now - start_ns_, pids_, &gpu_rows_)) {
    // A device's per-process utilization is this process's own share of it and counts as it
    // is. Without it, the device-wide utilization of the devices this process holds memory on
    // counts; if the driver gives no per-process memory at all, every device counts.
    bool any_proc_known = false;
    for (const auto& r : gpu_rows_)
      if (r.proc_mem_bytes) any_proc_known = true;
    for (const auto& r : gpu_rows_) {
      if (r.proc_mem_bytes) {
        ++gpu_summary_.proc_mem_readings;
        mem = std::max<int64_t>(mem, 0) + *r.proc_mem_bytes;
        if (*r.proc_mem_bytes > 0) {
          gpu_summary_.used_devices_known = true;
          if (std::find(gpu_summary_.used_devices.begin(), gpu_summary_.used_devices.end(),
                        r.gpu_index) == gpu_summary_.used_devices.end() &&
              gpu_summary_.used_devices.size() < 64)
            gpu_summary_.used_devices.push_back(r.gpu_index);
        }
      }
      if (r.proc_util_pct) {
        ++gpu_summary_.util_readings;
        ++gpu_summary_.proc_util_readings;
        util_ppm =
            std::max<int64_t>(util_ppm, 0) + static_cast<int64_t>(*r.proc_util_pct * 10'000.0);
      } else if (r.util_pct) {
        ++gpu_summary_.util_readings;
        bool counts = !any_proc_known || (r.proc_mem_bytes && *r.proc_mem_bytes > 0);
        util_ppm = std::max<int64_t>(util_ppm, 0) +
                   (counts ? static_cast<int64_t>(*r.util_pct * 10'000.0) : 0);
      }
    }
  } else {
    ++gpu_summary_.failed_ticks;
  }
  {
    // The old utilization held until now; the new one holds from now on.
    std::lock_guard lock(gpu_mu_);
    if (gpu_util_ppm_ >= 0) gpu_busy_open_ += gpu_util_ppm_ * (now - gpu_since_ns_) / 1'000'000;
    gpu_util_ppm_ = util_ppm;
    gpu_since_ns_ = now;
    if (util_ppm >= 0) gpu_busy_known_ = true;
  }
  gpu_mem_last_.store(mem, std::memory_order_relaxed);
  if (mem >= 0) {
    AtomicMax(gpu_mem_peak_open_, mem);
    gpu_summary_.proc_mem_peak = std::max(gpu_summary_.proc_mem_peak.value_or(mem), mem);
  }
}

SampleInterval LineSampler::TakeInterval() noexcept {
  SampleInterval s;
  const int64_t now = clock::NowNs();
  s.wall_ns = now - last_take_ns_;
  last_take_ns_ = now;
  int64_t cpu = ThreadCpuNs();
  if (cpu >= 0 && last_cpu_ns_ >= 0) s.cpu_ns = cpu - last_cpu_ns_;
  last_cpu_ns_ = cpu;
  if (rss_ok_) {
    // A fresh read: the interval ends now, not at the sampler's last read.
    int64_t rss = rss_.Read().value_or(rss_last_.load(std::memory_order_relaxed));
    int64_t peak = rss_peak_open_.exchange(rss, std::memory_order_relaxed);
    if (rss >= 0) {
      if (rss_at_last_take_ >= 0) s.rss_delta = rss - rss_at_last_take_;
      rss_at_last_take_ = rss;
      s.rss_peak = std::max(peak, rss);
    }
  }
  if (options_.gpu != nullptr) {
    {
      std::lock_guard lock(gpu_mu_);
      int64_t busy = gpu_busy_open_;
      if (gpu_util_ppm_ >= 0) busy += gpu_util_ppm_ * (now - gpu_since_ns_) / 1'000'000;
      if (gpu_busy_known_ || gpu_util_ppm_ >= 0) s.gpu_busy_ns = busy;
      gpu_busy_open_ = 0;
      gpu_since_ns_ = now;
      gpu_busy_known_ = gpu_util_ppm_ >= 0;
    }
    int64_t mem = gpu_mem_last_.load(std::memory_order_relaxed);
    int64_t peak = gpu_mem_peak_open_.exchange(mem, std::memory_order_relaxed);
    if (mem >= 0 || peak >= 0) s.gpu_mem_peak = std::max(peak, mem);
  }
  pending_.store(false);
  // Wake the sampler thread only if it sleeps until this answer (seq_cst with its own store
  // of awaiting_answer_ and load of pending_: one of the two sides sees the other).
  if (awaiting_answer_.load()) {
    std::lock_guard lock(mu_);
    cv_.notify_one();
  }
  return s;
}

std::vector<std::string> LineSampler::TakeNotes() {
  std::vector<std::string> out;
  {
    std::lock_guard lock(notes_mu_);
    out.swap(notes_);
  }
  return out;
}

// ---- SummarizeGpuCollection ----------------------------------------------------------------

namespace {

// The failed reads as the summary names them: "gpu0: <error>" per device whose utilization or
// per-process memory read failed; per device that gave no reading at all, "gpu0 lost: <error>"
// (lost) or "gpu0: <error>" (every read failed in a tick), the lost ones first.
struct FailureCauses {
  std::vector<std::string> util;
  std::vector<std::string> memory;
  std::vector<std::string> whole;
};

FailureCauses GroupFailures(const std::vector<telemetry::GpuReadFailure>& failures) {
  using Kind = telemetry::GpuReadFailure::Kind;
  using Nvml = telemetry::NvmlCollector;
  FailureCauses c;
  std::vector<std::string> unreadable;
  for (const auto& f : failures) {
    switch (f.kind) {
      case Kind::kField:
        if (f.field == Nvml::FieldName(Nvml::kUtil))
          c.util.push_back(f.device + ": " + f.error);
        else if (f.field == Nvml::FieldName(Nvml::kProcMem))
          c.memory.push_back(f.device + ": " + f.error);
        break;
      case Kind::kDeviceLost:
        c.whole.push_back(f.device + " lost: " + f.error);
        break;
      case Kind::kDeviceRead:
        unreadable.push_back(f.device + ": " + f.error);
        break;
    }
  }
  c.whole.insert(c.whole.end(), unreadable.begin(), unreadable.end());
  return c;
}

// The parts of every list in turn, each once, joined with "; ".
std::string JoinCauses(std::initializer_list<const std::vector<std::string>*> lists) {
  std::vector<const std::string*> seen;
  std::string out;
  for (const auto* list : lists) {
    for (const auto& part : *list) {
      if (std::any_of(seen.begin(), seen.end(), [&](const std::string* p) { return *p == part; }))
        continue;
      seen.push_back(&part);
      out += (out.empty() ? "" : "; ") + part;
    }
  }
  return out;
}

}  // namespace

GpuCollectionSummary SummarizeGpuCollection(
    const std::optional<std::string>& collector_error, const std::string& backend,
    size_t device_count, const GpuSamplingSummary& g, const std::vector<std::string>& notes,
    const std::vector<telemetry::GpuReadFailure>& failures) {
  GpuCollectionSummary out;
  if (collector_error) {
    std::string why = "GPU measurements unavailable: " + *collector_error;
    out.time_reason = why;
    out.memory_reason = why;
    out.diagnostics.push_back(why + "; Python line profiling continued without GPU values");
    return out;
  }
  out.method = backend + "-sampled";
  out.utilization_scope = "device";  // "process" below when per-process utilization was used
  const std::string devices =
      std::to_string(device_count) + " GPU" + (device_count == 1 ? "" : "s");
  // When reads failed, the reasons name the driver's error rather than "no value came".
  const FailureCauses failed = GroupFailures(failures);
  if (g.ticks == 0) {
    out.time_reason = out.memory_reason =
        "no GPU reading was taken: the session ended before the first sample";
  } else if (g.failed_ticks == g.ticks) {
    const std::string causes = JoinCauses({&failed.util, &failed.memory, &failed.whole});
    out.time_reason = out.memory_reason =
        "every GPU reading failed (" + std::to_string(g.ticks) + " attempts on " + devices +
        (causes.empty() ? "); see the diagnostics" : "): " + causes);
  } else {
    out.time_available = g.util_readings > 0;
    out.memory_available = g.proc_mem_readings > 0;
    if (!out.time_available) {
      const std::string causes = JoinCauses({&failed.util, &failed.whole});
      out.time_reason =
          causes.empty()
              ? "the driver reported no GPU utilization for " + devices +
                    " (not supported or not available); GPU time cannot be estimated"
              : "every GPU utilization read failed (" + causes + "); GPU time cannot be estimated";
    }
    if (!out.memory_available) {
      const std::string causes = JoinCauses({&failed.memory, &failed.whole});
      out.memory_reason =
          (causes.empty()
               ? "the driver reported no per-process device memory (not supported or not "
                 "available, as with WDDM drivers on Windows)"
               : "every per-process device memory read failed (" + causes + ")") +
          std::string(out.time_available ? "; GPU time sampling continued" : "");
    }
  }
  if (out.time_available && backend == "neuron") {
    out.diagnostics.push_back(
        "GPU time is estimated from sampled utilization: neuron-monitor's per-NeuronCore "
        "averages (1 s) x time, on the cores where this process's runtime holds memory");
  } else if (out.time_available) {
    const int64_t device_wide = g.util_readings - g.proc_util_readings;
    const bool per_process =
        g.proc_util_readings > 0 && static_cast<double>(g.proc_util_readings) >=
                                        kProcessScopeShare * static_cast<double>(g.util_readings);
    if (per_process) {
      out.utilization_scope = "process";
      std::string d =
          "GPU time is estimated from this process's own utilization (NVML per-process "
          "accounting): its SM utilization x time on each GPU";
      if (device_wide > 0)
        d += "; " + std::to_string(device_wide) + " of " + std::to_string(g.util_readings) +
             " readings had no per-process value and used the device-wide utilization, which "
             "can include other processes";
      out.diagnostics.push_back(d);
    } else {
      // Why per-process utilization was not used: the collector's own note when it left one.
      std::string why;
      if (backend != "nvml") {
        why = "is not provided by the '" + backend + "' collector";
      } else if (g.proc_util_readings > 0) {
        why = "was available for only " + std::to_string(g.proc_util_readings) + " of " +
              std::to_string(g.util_readings) + " readings";
      } else {
        why = "unavailable: the driver gave no per-process sample for this process";
        for (const auto& n : notes) {
          if (n.find("proc_util") != std::string::npos) {
            why = "unavailable: " + n;
            break;
          }
        }
      }
      std::string scope =
          "GPU time is estimated from sampled utilization, which the driver reports per device: "
          "work of other processes on the same GPU can be included (per-process utilization " +
          why + ")";
      if (g.used_devices_known) {
        scope += "; only the GPUs where this process holds memory count (";
        for (size_t i = 0; i < g.used_devices.size(); ++i)
          scope += (i ? ", gpu" : "gpu") + std::to_string(g.used_devices[i]);
        scope += ")";
      } else if (HeldNoGpuMemory(g)) {
        scope += "; " + std::string(kNoDeviceMemoryGpuWarning);
      } else if (!out.memory_available) {
        scope += "; without per-process memory every GPU (" + devices + ") counts";
      }
      out.diagnostics.push_back(scope);
    }
  }
  for (const auto& n : notes) out.diagnostics.push_back("GPU collector: " + n);
  return out;
}

void FinishGpuCollection(GpuCollectionSummary& s, size_t device_count, const GpuSamplingSummary& g,
                         const std::vector<telemetry::GpuReadFailure>& failures, bool apple_host) {
  std::vector<std::string> said;  // failures mid-run: diagnostics that are also warnings
  if (!s.method && apple_host) s.time_reason = s.memory_reason = kMpsUnavailable;
  if (s.method) {
    const FailureCauses failed = GroupFailures(failures);
    const bool some_available = s.time_available || s.memory_available;
    // Mid-run failures: some readings came, others failed.
    if (g.failed_ticks > 0 && g.failed_ticks < g.ticks) {
      if (some_available) {
        const std::string why =
            failed.whole.empty() ? "" : " (" + JoinCauses({&failed.whole}) + ")";
        said.push_back("GPU readings failed in " + std::to_string(g.failed_ticks) + " of " +
                       std::to_string(g.ticks) + " samples" + why +
                       "; lines whose samples all failed have no GPU time or GPU peak memory");
      } else {
        s.diagnostics.push_back(std::to_string(g.failed_ticks) + " of " + std::to_string(g.ticks) +
                                " GPU readings failed; lines sampled then have no GPU time");
      }
    } else if (some_available && !failed.whole.empty()) {
      // One of several GPUs stopped answering; the others still did.
      said.push_back("GPU readings failed during the run (" + JoinCauses({&failed.whole}) +
                     "); lines sampled then have no GPU values from that GPU");
    }
    const int64_t n_dev = std::max<int64_t>(1, static_cast<int64_t>(device_count));
    const std::string unit = n_dev == 1 ? "readings" : "device readings";
    const int64_t answered = (g.ticks - g.failed_ticks) * n_dev;
    const int64_t missing_util = answered - g.util_readings;
    // (Measured GPU time, from CUPTI's kernel records, does not need utilization reads.)
    const bool sampled_time = s.method->ends_with("-sampled");
    if (s.time_available && sampled_time && !failed.util.empty() && missing_util > 0)
      said.push_back("GPU utilization reads failed in " + std::to_string(missing_util) + " of " +
                     std::to_string(answered) + " " + unit + " (" + JoinCauses({&failed.util}) +
                     "); lines whose samples all failed have no GPU time");
    if (s.memory_available && !failed.memory.empty()) {
      const std::string counted = answered > g.proc_mem_readings
                                      ? "in " + std::to_string(answered - g.proc_mem_readings) +
                                            " of " + std::to_string(answered) + " " + unit + " "
                                      : "during the run ";
      said.push_back("GPU memory reads failed " + counted + "(" + JoinCauses({&failed.memory}) +
                     "); lines whose samples all failed have no GPU peak memory");
    }
    s.diagnostics.insert(s.diagnostics.end(), said.begin(), said.end());
  }

  std::vector<std::string> w;
  if (s.method == "mock-sampled") w.push_back(kMockGpuWarning);
  if (!s.time_available && s.time_reason) {
    // Without a collector the reason is a whole sentence ("GPU measurements unavailable: ...");
    // one reason for both quantities is said once, naming both.
    const bool both = !s.memory_available && s.memory_reason == s.time_reason;
    w.push_back(!s.method && !apple_host ? *s.time_reason
                                         : (both ? "GPU time and GPU peak memory unavailable: "
                                                 : "GPU time unavailable: ") +
                                               *s.time_reason);
  }
  if (!s.memory_available && s.memory_reason && s.memory_reason != s.time_reason)
    w.push_back("GPU peak memory unavailable: " + *s.memory_reason);
  w.insert(w.end(), said.begin(), said.end());
  w.insert(w.end(), s.losses.begin(), s.losses.end());
  if (s.time_available && s.utilization_scope == "device" && s.method != "neuron-sampled")
    w.push_back(HeldNoGpuMemory(g) ? kNoDeviceMemoryGpuWarning : kDeviceWideGpuWarning);
  s.warnings.clear();
  for (auto& text : w)
    if (std::find(s.warnings.begin(), s.warnings.end(), text) == s.warnings.end())
      s.warnings.push_back(std::move(text));
}

// ---- SampleAggregator --------------------------------------------------------------------

namespace {

void AddOpt(std::optional<int64_t>& into, const std::optional<int64_t>& v) {
  if (v) into = into.value_or(0) + *v;
}
void MaxOpt(std::optional<int64_t>& into, const std::optional<int64_t>& v) {
  if (v) into = std::max(into.value_or(*v), *v);
}

}  // namespace

int32_t SampleAggregator::InternFile(std::string_view path) {
  auto it = file_ids_.find(std::string(path));
  if (it != file_ids_.end()) return it->second;
  auto id = static_cast<int32_t>(files_.size());
  files_.emplace_back(path);
  file_ids_.emplace(files_.back(), id);
  return id;
}

int32_t SampleAggregator::AddFunction(int32_t file_id, std::string qualname, int32_t first_line) {
  SampledFunction f;
  f.file_id = file_id;
  f.qualname = std::move(qualname);
  f.first_line = first_line;
  functions_.push_back(std::move(f));
  return static_cast<int32_t>(functions_.size() - 1);
}

void SampleAggregator::AddLine(int32_t file_id, int32_t line, const SampleInterval& s) {
  ++total_samples_;
  const int64_t key = (static_cast<int64_t>(file_id) << 32) | static_cast<uint32_t>(line);
  auto [it, fresh] = lines_.try_emplace(key);
  SampledLine& l = it->second;
  if (fresh) {
    l.file_id = file_id;
    l.line = line;
  }
  ++l.samples;
  l.wall_ns += s.wall_ns;
  AddOpt(l.cpu_ns, s.cpu_ns);
  AddOpt(l.rss_delta, s.rss_delta);
  MaxOpt(l.rss_peak, s.rss_peak);
  AddOpt(l.gpu_busy_ns, s.gpu_busy_ns);
  MaxOpt(l.gpu_mem_peak, s.gpu_mem_peak);
}

void SampleAggregator::AddOwn(int32_t function, const SampleInterval& s) noexcept {
  if (function < 0 || static_cast<size_t>(function) >= functions_.size()) return;
  auto& f = functions_[static_cast<size_t>(function)];
  f.own_ns += s.wall_ns;
  ++f.own_samples;
}

void SampleAggregator::AddTotal(int32_t function, const SampleInterval& s) noexcept {
  if (function < 0 || static_cast<size_t>(function) >= functions_.size()) return;
  functions_[static_cast<size_t>(function)].total_ns += s.wall_ns;
}

void SampleAggregator::AddUnattributed(const SampleInterval& s) noexcept {
  ++total_samples_;
  ++unattributed_samples_;
  unattributed_ns_ += s.wall_ns;
}

std::vector<SampledLine> SampleAggregator::Lines() const {
  std::vector<SampledLine> out;
  out.reserve(lines_.size());
  for (const auto& [key, l] : lines_) out.push_back(l);
  std::sort(out.begin(), out.end(), [](const SampledLine& a, const SampledLine& b) {
    return a.file_id != b.file_id ? a.file_id < b.file_id : a.line < b.line;
  });
  return out;
}

}  // namespace gpuprof::lines
