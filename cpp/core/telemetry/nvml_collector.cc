#include "telemetry/nvml_collector.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <utility>

namespace gpuprof::telemetry {

namespace {

// How many times a process-list read is retried after NVML_ERROR_INSUFFICIENT_SIZE (the list can
// grow between the size query and the read).
constexpr int kProcessListRetries = 4;
// Initial capacity of the per-device process-list buffer; grows on demand, never shrinks.
constexpr size_t kInitialProcessCapacity = 32;

template <typename Fn>
Fn Resolve(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

// Resolves the first of `names` the library exports; `*chosen` receives its name (or stays null).
template <typename Fn, size_t N>
Fn ResolveFirst(void* handle, const std::array<const char*, N>& names, const char** chosen) {
  for (const char* name : names) {
    if (Fn fn = Resolve<Fn>(handle, name)) {
      if (chosen) *chosen = name;
      return fn;
    }
  }
  return nullptr;
}

// Most per-process utilization samples one read takes (the driver's ring is far smaller).
constexpr size_t kMaxProcessSamples = 65536;

// The clock of the driver's per-process utilization timestamps: CPU wall time in microseconds.
unsigned long long RealtimeUs() noexcept {
  timespec ts{};
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return 0;
  return static_cast<unsigned long long>(ts.tv_sec) * 1'000'000ULL +
         static_cast<unsigned long long>(ts.tv_nsec) / 1000ULL;
}

// Grows `v` to hold at least `need` entries, with room for more; false when it cannot.
template <typename T>
bool GrowFor(std::vector<T>& v, size_t need) noexcept {
  try {
    size_t want = std::max(need + need / 2 + 8, v.size() * 2);
    if (want > kMaxProcessSamples) want = kMaxProcessSamples;
    if (want <= v.size()) return false;
    v.resize(want);
    return true;
  } catch (...) {
    return false;
  }
}

bool PidWanted(const std::vector<int64_t>& pids, unsigned int pid) {
  for (int64_t p : pids) {
    if (p == static_cast<int64_t>(pid)) return true;
  }
  return false;
}

}  // namespace

std::string ResolveNvmlLibraryPath(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* env = std::getenv(kNvmlLibraryEnv);
  if (env != nullptr && *env != '\0') return env;
  return kNvmlDefaultLibrary;
}

bool InNestedPidNamespace() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return false;
  char line[512];
  bool nested = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "NSpid:", 6) != 0) continue;
    // One pid per namespace level, outermost first: more than one means we are nested.
    int numbers = 0;
    for (char* p = line + 6; *p != '\0';) {
      while (*p == ' ' || *p == '\t') ++p;
      if (*p < '0' || *p > '9') break;
      ++numbers;
      while (*p >= '0' && *p <= '9') ++p;
    }
    nested = numbers > 1;
    break;
  }
  std::fclose(f);
  return nested;
}

// The resolved entry points. Required ones are non-null after Open succeeds; optional ones may be
// null, which switches their field off for every device.
struct NvmlCollector::Api {
  nvml::InitFn init = nullptr;
  nvml::ShutdownFn shutdown = nullptr;
  nvml::ErrorStringFn error_string = nullptr;
  nvml::DeviceGetCountFn get_count = nullptr;
  nvml::DeviceGetHandleByIndexFn get_handle = nullptr;
  nvml::DeviceGetNameFn get_name = nullptr;
  nvml::DeviceGetUuidFn get_uuid = nullptr;
  nvml::DeviceGetMemoryInfoFn memory_info = nullptr;
  nvml::DeviceGetUtilizationRatesFn utilization = nullptr;
  nvml::DeviceGetPowerUsageFn power = nullptr;
  nvml::DeviceGetTemperatureFn temperature = nullptr;
  nvml::DeviceGetClockInfoFn clock_info = nullptr;
  nvml::DeviceGetClockInfoFn max_clock_info = nullptr;
  nvml::DeviceGetClocksReasonsFn clock_reasons = nullptr;
  nvml::DeviceGetPcieThroughputFn pcie = nullptr;
  // Exactly one of these is used: the _v3/_v2 entry points take the four-field record, the
  // unversioned one the two-field v1 record.
  nvml::DeviceGetProcessesV2Fn processes_v2 = nullptr;
  nvml::DeviceGetProcessesV1Fn processes_v1 = nullptr;
  nvml::DeviceGetProcessUtilizationFn process_utilization = nullptr;

  const char* init_name = "nvmlInit_v2";
};

// Sampling state of one device. Owned by the sampler thread.
struct NvmlCollector::DeviceState {
  nvml::Device handle = nullptr;
  int64_t index = 0;
  std::string label;  // "gpu0"
  std::array<bool, kFieldCount> active{};
  std::array<bool, kFieldCount> error_noted{};
  bool lost = false;
  bool read_failed_noted = false;
  bool proc_unmatched_noted = false;
  std::optional<int64_t> last_pcie_ns;  // when PCIe was last read (it is decimated)
  std::vector<nvml::ProcessInfoV2> procs;
  std::vector<nvml::ProcessInfoV1> procs_v1;
  // Per-process utilization (opt-in). Sampler thread only.
  std::vector<nvml::ProcessUtilizationSample> util_samples;  // grows on demand, never shrinks
  bool util_started = false;
  unsigned long long util_cursor_us = 0;  // newest driver timestamp taken
  std::optional<double> proc_util;        // the current value for our pids
  int64_t proc_util_told_ns = 0;          // when the driver last told us something about ours
  int64_t util_started_ns = 0;            // the first per-process read
  bool proc_util_told = false;            // the driver told us something since then
  bool proc_util_pid_matched = false;     // one of our pids appeared in a sample
  bool proc_util_unknown_noted = false;
  bool proc_util_unmatched_noted = false;
};

const char* NvmlCollector::FieldName(Field field) {
  switch (field) {
    case kUtil:
      return "util";
    case kMemory:
      return "memory";
    case kProcMem:
      return "proc_mem";
    case kPower:
      return "power";
    case kTemp:
      return "temp";
    case kSmClock:
      return "sm_clock";
    case kClockReasons:
      return "clock_reasons";
    case kPcie:
      return "pcie";
    case kProcUtil:
      return "proc_util";
    default:
      return "?";
  }
}

NvmlCollector::NvmlCollector() : api_(std::make_unique<Api>()) {}

NvmlCollector::~NvmlCollector() {
  if (initialized_ && api_->shutdown != nullptr) api_->shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

std::string NvmlCollector::ErrorText(nvml::Return r) const {
  const char* text = nullptr;
  if (api_ && api_->error_string != nullptr) text = api_->error_string(r);
  if (text == nullptr || *text == '\0') text = nvml::ReturnName(r);
  return std::string(text) + " (NVML error " + std::to_string(r) + ")";
}

Expected<std::unique_ptr<NvmlCollector>> NvmlCollector::Open(const std::string& library_path) {
  std::unique_ptr<NvmlCollector> c(new NvmlCollector());
  c->library_path_ = library_path;
  dlerror();
  c->handle_ = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (c->handle_ == nullptr) {
    const char* why = dlerror();
    return Status::Error("cannot load " + library_path + ": " + (why ? why : "dlopen failed"));
  }
  void* h = c->handle_;
  Api& api = *c->api_;

  // Required entry points: prefer the versioned symbols, fall back to the original names that
  // pre-R450 drivers export.
  api.init = ResolveFirst<nvml::InitFn>(h, std::array{"nvmlInit_v2", "nvmlInit"}, &api.init_name);
  api.shutdown = Resolve<nvml::ShutdownFn>(h, "nvmlShutdown");
  api.get_count = ResolveFirst<nvml::DeviceGetCountFn>(
      h, std::array{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}, nullptr);
  api.get_handle = ResolveFirst<nvml::DeviceGetHandleByIndexFn>(
      h, std::array{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}, nullptr);
  const char* missing = api.init == nullptr         ? "nvmlInit_v2"
                        : api.shutdown == nullptr   ? "nvmlShutdown"
                        : api.get_count == nullptr  ? "nvmlDeviceGetCount_v2"
                        : api.get_handle == nullptr ? "nvmlDeviceGetHandleByIndex_v2"
                                                    : nullptr;
  if (missing != nullptr) {
    return Status::Error(library_path + " is not a usable NVML library: it lacks " + missing);
  }

  // Optional entry points, each on its own.
  api.error_string = Resolve<nvml::ErrorStringFn>(h, "nvmlErrorString");
  api.get_name = Resolve<nvml::DeviceGetNameFn>(h, "nvmlDeviceGetName");
  api.get_uuid = Resolve<nvml::DeviceGetUuidFn>(h, "nvmlDeviceGetUUID");
  api.memory_info = Resolve<nvml::DeviceGetMemoryInfoFn>(h, "nvmlDeviceGetMemoryInfo");
  api.utilization = Resolve<nvml::DeviceGetUtilizationRatesFn>(h, "nvmlDeviceGetUtilizationRates");
  api.power = Resolve<nvml::DeviceGetPowerUsageFn>(h, "nvmlDeviceGetPowerUsage");
  api.temperature = Resolve<nvml::DeviceGetTemperatureFn>(h, "nvmlDeviceGetTemperature");
  api.clock_info = Resolve<nvml::DeviceGetClockInfoFn>(h, "nvmlDeviceGetClockInfo");
  api.max_clock_info = Resolve<nvml::DeviceGetClockInfoFn>(h, "nvmlDeviceGetMaxClockInfo");
  api.clock_reasons = ResolveFirst<nvml::DeviceGetClocksReasonsFn>(
      h,
      std::array{"nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"},
      nullptr);
  api.pcie = Resolve<nvml::DeviceGetPcieThroughputFn>(h, "nvmlDeviceGetPcieThroughput");
  api.processes_v2 = ResolveFirst<nvml::DeviceGetProcessesV2Fn>(
      h,
      std::array{"nvmlDeviceGetComputeRunningProcesses_v3",
                 "nvmlDeviceGetComputeRunningProcesses_v2"},
      nullptr);
  if (api.processes_v2 == nullptr) {
    api.processes_v1 =
        Resolve<nvml::DeviceGetProcessesV1Fn>(h, "nvmlDeviceGetComputeRunningProcesses");
  }
  api.process_utilization =
      Resolve<nvml::DeviceGetProcessUtilizationFn>(h, "nvmlDeviceGetProcessUtilization");

  nvml::Return r = api.init();
  if (r != nvml::kSuccess) {
    return Status::Error(std::string(api.init_name) + " failed: " + c->ErrorText(r));
  }
  c->initialized_ = true;

  unsigned int count = 0;
  r = api.get_count(&count);
  if (r != nvml::kSuccess) {
    return Status::Error("nvmlDeviceGetCount failed: " + c->ErrorText(r));
  }

  std::array<bool, kFieldCount> available{};
  available[kUtil] = api.utilization != nullptr;
  available[kMemory] = api.memory_info != nullptr;
  available[kProcMem] = api.processes_v2 != nullptr || api.processes_v1 != nullptr;
  available[kPower] = api.power != nullptr;
  available[kTemp] = api.temperature != nullptr;
  available[kSmClock] = api.clock_info != nullptr;
  available[kClockReasons] = api.clock_reasons != nullptr;
  available[kPcie] = api.pcie != nullptr;
  available[kProcUtil] = false;  // opt-in: set_process_utilization
  static constexpr std::array<const char*, kFieldCount> kSymbolOf = {
      "nvmlDeviceGetUtilizationRates",
      "nvmlDeviceGetMemoryInfo",
      "nvmlDeviceGetComputeRunningProcesses_v3",
      "nvmlDeviceGetPowerUsage",
      "nvmlDeviceGetTemperature",
      "nvmlDeviceGetClockInfo",
      "nvmlDeviceGetCurrentClocksEventReasons",
      "nvmlDeviceGetPcieThroughput",
      "nvmlDeviceGetProcessUtilization"};
  for (int f = 0; f < kFieldCount; ++f) {
    if (!available[f] && f != kProcUtil) {
      c->AddNote(std::string("NVML library lacks ") + kSymbolOf[f] + ": " +
                 FieldName(static_cast<Field>(f)) + " unavailable on every GPU");
    }
  }
  c->pid_namespace_nested_ = InNestedPidNamespace();

  for (unsigned int i = 0; i < count; ++i) {
    DeviceState st;
    st.index = i;
    st.label = "gpu" + std::to_string(i);
    r = api.get_handle(i, &st.handle);
    if (r != nvml::kSuccess) {
      c->AddNote(st.label + ": skipped, no handle: " + c->ErrorText(r));
      continue;
    }
    st.active = available;
    if (api.processes_v2 != nullptr) st.procs.resize(kInitialProcessCapacity);
    if (api.processes_v1 != nullptr) st.procs_v1.resize(kInitialProcessCapacity);

    GpuDevice info;
    info.index = i;
    char buf[nvml::kDeviceNameBufferSize];
    if (api.get_name != nullptr && api.get_name(st.handle, buf, sizeof buf) == nvml::kSuccess) {
      buf[sizeof buf - 1] = '\0';
      info.name = std::string(buf);
    }
    char ubuf[nvml::kDeviceUuidBufferSize];
    if (api.get_uuid != nullptr && api.get_uuid(st.handle, ubuf, sizeof ubuf) == nvml::kSuccess) {
      ubuf[sizeof ubuf - 1] = '\0';
      info.uuid = std::string(ubuf);
    }
    if (st.active[kMemory]) {
      nvml::Memory mem{};
      r = api.memory_info(st.handle, &mem);
      if (r == nvml::kSuccess) {
        info.memory_total_bytes = static_cast<int64_t>(mem.total);
      } else if (c->OnFieldError(st, kMemory, r)) {
        // Lost during start-up: keep it listed (it exists) but never sample it.
      }
    }
    unsigned int mhz = 0;
    if (api.max_clock_info != nullptr &&
        api.max_clock_info(st.handle, nvml::kClockSm, &mhz) == nvml::kSuccess) {
      info.sm_clock_max_mhz = mhz;
    }
    c->devices_.push_back(std::move(info));
    c->states_.push_back(std::move(st));
  }
  return c;
}

void NvmlCollector::set_process_utilization(bool on) {
  process_utilization_ = on;
  const bool can = api_->process_utilization != nullptr;
  if (on && !can) {
    AddNote("NVML library lacks nvmlDeviceGetProcessUtilization: " +
            std::string(FieldName(kProcUtil)) + " unavailable on every GPU");
  }
  for (DeviceState& st : states_) st.active[kProcUtil] = on && can;
}

void NvmlCollector::AddNote(std::string note) noexcept {
  try {
    std::lock_guard<std::mutex> lock(notes_mu_);
    notes_.push_back(std::move(note));
  } catch (...) {
    // Out of memory while noting: the note is lost, sampling goes on.
  }
}

void NvmlCollector::AddFailure(std::string note, GpuReadFailure failure) noexcept {
  try {
    std::lock_guard<std::mutex> lock(notes_mu_);
    notes_.push_back(std::move(note));
    failures_.push_back(std::move(failure));
  } catch (...) {
    // Out of memory while noting: the note (or the record) is lost, sampling goes on.
  }
}

std::vector<std::string> NvmlCollector::TakeNotes() {
  std::lock_guard<std::mutex> lock(notes_mu_);
  return std::exchange(notes_, {});
}

std::vector<GpuReadFailure> NvmlCollector::TakeFailures() {
  std::lock_guard<std::mutex> lock(notes_mu_);
  return std::exchange(failures_, {});
}

bool NvmlCollector::FieldActive(size_t device_pos, Field field) const {
  if (device_pos >= states_.size() || field < 0 || field >= kFieldCount) return false;
  const DeviceState& st = states_[device_pos];
  return !st.lost && st.active[field];
}

bool NvmlCollector::OnFieldError(DeviceState& dev, Field field, nvml::Return r) noexcept {
  try {
    if (r == nvml::kErrorGpuIsLost) {
      dev.lost = true;
      AddFailure(dev.label + ": device lost (" + ErrorText(r) + "); no further samples from it",
                 {GpuReadFailure::Kind::kDeviceLost, dev.index, dev.label, "", ErrorText(r)});
      return true;
    }
    if (r == nvml::kErrorNotSupported || r == nvml::kErrorFunctionNotFound) {
      dev.active[field] = false;
      AddNote(dev.label + ": " + FieldName(field) +
              (r == nvml::kErrorNotSupported
                   ? " not supported by this device"
                   : " not supported by this driver (" + ErrorText(r) + ")"));
      return false;
    }
    if (!dev.error_noted[field]) {
      dev.error_noted[field] = true;
      AddFailure(
          dev.label + ": " + FieldName(field) + " read failed: " + ErrorText(r) +
              "; left empty while it fails",
          {GpuReadFailure::Kind::kField, dev.index, dev.label, FieldName(field), ErrorText(r)});
    }
  } catch (...) {
  }
  return false;
}

nvml::Return NvmlCollector::ReadProcessUtilization(DeviceState& dev, int64_t now_rel_ns,
                                                   const std::vector<int64_t>& pids,
                                                   store::GpuSampleRow* row) noexcept {
  const Api& api = *api_;
  if (!dev.util_started) {
    // Only the last hold's samples describe the process now; and nothing is known yet, as if
    // the driver had last spoken a hold ago.
    dev.util_started = true;
    dev.util_started_ns = now_rel_ns;
    const auto hold_us = static_cast<unsigned long long>(kProcessUtilizationHoldNs / 1000);
    const unsigned long long now_us = RealtimeUs();
    dev.util_cursor_us = now_us > hold_us ? now_us - hold_us : 0;
    dev.proc_util_told_ns = now_rel_ns - kProcessUtilizationHoldNs;
  }
  std::vector<nvml::ProcessUtilizationSample>& buf = dev.util_samples;
  unsigned int count = 0;
  nvml::Return r = nvml::kErrorInsufficientSize;
  if (buf.empty()) {
    // The documented size query, once: afterwards the buffer is reused and grown on demand.
    r = api.process_utilization(dev.handle, nullptr, &count, dev.util_cursor_us);
    if (r == nvml::kSuccess) r = nvml::kErrorNotFound;  // needs no room: no samples
    if (r == nvml::kErrorInsufficientSize && !GrowFor(buf, count)) r = nvml::kErrorMemory;
  }
  for (int attempt = 0; r == nvml::kErrorInsufficientSize && attempt < kProcessListRetries;
       ++attempt) {
    if (attempt > 0 && !GrowFor(buf, count)) {
      r = nvml::kErrorMemory;
      break;
    }
    count = static_cast<unsigned int>(buf.size());
    r = api.process_utilization(dev.handle, buf.data(), &count, dev.util_cursor_us);
  }
  if (r != nvml::kSuccess && r != nvml::kErrorNotFound) {
    dev.proc_util.reset();  // what was held can no longer be vouched for
    return r;
  }
  const size_t n = r == nvml::kSuccess ? std::min<size_t>(count, buf.size()) : 0;
  auto valid = [&](const nvml::ProcessUtilizationSample& s) {
    return s.timeStamp > dev.util_cursor_us && s.smUtil <= 100;
  };
  bool moved_on = false;  // the driver recorded a new period (for anyone)
  unsigned long long newest = dev.util_cursor_us;
  for (size_t i = 0; i < n; ++i) {
    if (!valid(buf[i])) continue;
    moved_on = true;
    newest = std::max(newest, buf[i].timeStamp);
  }
  bool ours = false;
  double sum = 0;
  for (int64_t pid : pids) {
    const nvml::ProcessUtilizationSample* latest = nullptr;
    for (size_t i = 0; i < n; ++i) {
      if (!valid(buf[i]) || static_cast<int64_t>(buf[i].pid) != pid) continue;
      if (latest == nullptr || buf[i].timeStamp > latest->timeStamp) latest = &buf[i];
    }
    if (latest != nullptr) {
      ours = true;
      sum += latest->smUtil;
    }
  }
  dev.util_cursor_us = newest;
  if (ours) {
    dev.proc_util = sum;
    dev.proc_util_told_ns = now_rel_ns;
    dev.proc_util_told = true;
    dev.proc_util_pid_matched = true;
  } else if (moved_on) {
    dev.proc_util_told_ns = now_rel_ns;
    dev.proc_util_told = true;
    if (dev.proc_util_pid_matched || !pid_namespace_nested_) {
      dev.proc_util = 0.0;  // others were sampled in the new period, ours was idle in it
    } else {
      dev.proc_util.reset();
      if (!dev.proc_util_unmatched_noted) {
        dev.proc_util_unmatched_noted = true;
        AddNote(dev.label +
                ": proc_util unknown: running in a nested pid namespace (container) and no "
                "per-process utilization sample matches ours yet");
      }
    }
  } else if (row->util_pct && *row->util_pct == 0.0) {
    dev.proc_util = 0.0;  // the whole device was idle, so was this process
    dev.proc_util_told_ns = now_rel_ns;
    dev.proc_util_told = true;
  } else if (now_rel_ns - dev.proc_util_told_ns > kProcessUtilizationHoldNs) {
    // A busy (or unreadable) device and no per-process sample for that long: the driver does
    // not report ours, which is not the same as idle. (Before the driver's first word the
    // hold counts as spent: nothing is known yet.)
    dev.proc_util.reset();
    if (!dev.proc_util_unknown_noted) {
      dev.proc_util_unknown_noted = true;
      AddNote(dev.label + ": proc_util unknown: the driver gave no per-process utilization " +
              (dev.proc_util_told
                   ? std::string("sample for over 1 s")
                   : "sample since collection began " +
                         std::to_string((now_rel_ns - dev.util_started_ns) / 1'000'000) +
                         " ms earlier") +
              " while the device was busy (or its utilization unknown); left empty until it "
              "does");
    }
  }
  // else: within the hold, the last value stands.
  row->proc_util_pct = dev.proc_util;
  return nvml::kSuccess;
}

bool NvmlCollector::SampleDevice(DeviceState& dev, int64_t now_rel_ns,
                                 const std::vector<int64_t>& pids,
                                 store::GpuSampleRow* row) noexcept {
  const Api& api = *api_;
  const nvml::Device h = dev.handle;
  row->ts_ns = now_rel_ns;
  row->gpu_index = dev.index;
  int attempted = 0;
  int failed = 0;
  nvml::Return last_error = nvml::kSuccess;
  // Records a failed read; returns true when the device is gone (stop reading it).
  // A field found unsupported is not a failed read: it just leaves the set of fields.
  auto fail = [&](Field f, nvml::Return r) {
    if (r == nvml::kErrorNotSupported || r == nvml::kErrorFunctionNotFound) {
      --attempted;
    } else {
      ++failed;
      last_error = r;
    }
    return OnFieldError(dev, f, r);
  };

  if (dev.active[kUtil]) {
    ++attempted;
    nvml::Utilization u{};
    nvml::Return r = api.utilization(h, &u);
    if (r == nvml::kSuccess) {
      row->util_pct = u.gpu;
      row->mem_util_pct = u.memory;
    } else if (fail(kUtil, r)) {
      return false;
    }
  }
  // After the device utilization: its value this tick tells an idle device from a silent driver.
  if (dev.active[kProcUtil] && !pids.empty()) {
    ++attempted;
    nvml::Return r = ReadProcessUtilization(dev, now_rel_ns, pids, row);
    if (r != nvml::kSuccess && fail(kProcUtil, r)) return false;
  }
  if (dev.active[kMemory]) {
    ++attempted;
    nvml::Memory m{};
    nvml::Return r = api.memory_info(h, &m);
    if (r == nvml::kSuccess) {
      row->mem_used_bytes = static_cast<int64_t>(m.used);
      row->mem_total_bytes = static_cast<int64_t>(m.total);
    } else if (fail(kMemory, r)) {
      return false;
    }
  }
  if (dev.active[kProcMem] && !pids.empty()) {
    ++attempted;
    unsigned int count = 0;
    nvml::Return r = nvml::kErrorInsufficientSize;
    int64_t sum = 0;
    bool matched = false;
    bool any_unknown = false;
    size_t listed = 0;
    for (int attempt = 0; attempt < kProcessListRetries && r == nvml::kErrorInsufficientSize;
         ++attempt) {
      if (attempt > 0) {
        // `count` now holds the size the driver needs; leave room for processes that start
        // before the next read.
        size_t want = static_cast<size_t>(count) + count / 2 + 8;
        try {
          if (api.processes_v2 != nullptr)
            dev.procs.resize(want);
          else
            dev.procs_v1.resize(want);
        } catch (...) {
          break;
        }
      }
      if (api.processes_v2 != nullptr) {
        count = static_cast<unsigned int>(dev.procs.size());
        r = api.processes_v2(h, &count, dev.procs.data());
      } else {
        count = static_cast<unsigned int>(dev.procs_v1.size());
        r = api.processes_v1(h, &count, dev.procs_v1.data());
      }
    }
    if (r == nvml::kSuccess) {
      listed = count;
      auto add = [&](unsigned int pid, unsigned long long used) {
        if (!PidWanted(pids, pid)) return;
        matched = true;
        if (used == nvml::kValueNotAvailable)
          any_unknown = true;
        else
          sum += static_cast<int64_t>(used);
      };
      if (api.processes_v2 != nullptr) {
        for (size_t i = 0; i < listed && i < dev.procs.size(); ++i)
          add(dev.procs[i].pid, dev.procs[i].usedGpuMemory);
      } else {
        for (size_t i = 0; i < listed && i < dev.procs_v1.size(); ++i)
          add(dev.procs_v1[i].pid, dev.procs_v1[i].usedGpuMemory);
      }
      if (any_unknown) {
        // The driver listed our process but cannot say how much it holds: unknown, not a sum.
      } else if (matched || listed == 0 || !pid_namespace_nested_) {
        // The sum of ours; 0 when none of ours is listed. But in a container a non-empty list
        // of strangers may be host pids, ours among them: that is the unknown case below.
        row->proc_mem_bytes = sum;
      } else if (!dev.proc_unmatched_noted) {
        dev.proc_unmatched_noted = true;
        AddNote(dev.label +
                ": proc_mem unknown: running in a nested pid namespace (container) and no "
                "process the driver lists matches ours");
      }
    } else if (fail(kProcMem, r)) {
      return false;
    }
  }
  if (dev.active[kPower]) {
    ++attempted;
    unsigned int mw = 0;
    nvml::Return r = api.power(h, &mw);
    if (r == nvml::kSuccess)
      row->power_mw = mw;
    else if (fail(kPower, r))
      return false;
  }
  if (dev.active[kTemp]) {
    ++attempted;
    unsigned int c = 0;
    nvml::Return r = api.temperature(h, nvml::kTemperatureGpu, &c);
    if (r == nvml::kSuccess)
      row->temp_c = c;
    else if (fail(kTemp, r))
      return false;
  }
  if (dev.active[kSmClock]) {
    ++attempted;
    unsigned int mhz = 0;
    nvml::Return r = api.clock_info(h, nvml::kClockSm, &mhz);
    if (r == nvml::kSuccess)
      row->sm_clock_mhz = mhz;
    else if (fail(kSmClock, r))
      return false;
  }
  if (dev.active[kClockReasons]) {
    ++attempted;
    unsigned long long reasons = 0;
    nvml::Return r = api.clock_reasons(h, &reasons);
    if (r == nvml::kSuccess)
      row->clock_reasons = static_cast<int64_t>(reasons);
    else if (fail(kClockReasons, r))
      return false;
  }
  // nvmlDeviceGetPcieThroughput measures over a ~20 ms window inside the call, so it is read
  // at most once per pcie_interval_ns_; the ticks in between leave PCIe unmeasured (NULL).
  const bool pcie_due = !dev.last_pcie_ns || now_rel_ns - *dev.last_pcie_ns >= pcie_interval_ns_;
  if (dev.active[kPcie] && pcie_due) {
    dev.last_pcie_ns = now_rel_ns;
    ++attempted;
    unsigned int rx = 0;
    unsigned int tx = 0;
    nvml::Return r = api.pcie(h, nvml::kPcieUtilRxBytes, &rx);
    if (r == nvml::kSuccess) {
      row->pcie_rx_bps = static_cast<double>(rx) * 1024.0;
      r = api.pcie(h, nvml::kPcieUtilTxBytes, &tx);
      if (r == nvml::kSuccess) row->pcie_tx_bps = static_cast<double>(tx) * 1024.0;
    }
    if (r != nvml::kSuccess && fail(kPcie, r)) return false;
  }

  if (attempted == 0) return false;  // nothing left to read on this device
  if (failed == attempted) {
    if (!dev.read_failed_noted) {
      dev.read_failed_noted = true;
      try {
        AddFailure(
            dev.label + ": device read failed (" + ErrorText(last_error) + "); no sample this tick",
            {GpuReadFailure::Kind::kDeviceRead, dev.index, dev.label, "", ErrorText(last_error)});
      } catch (...) {  // out of memory building the note: it is lost, sampling goes on
      }
    }
    return false;
  }
  return true;
}

bool NvmlCollector::Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
                           std::vector<store::GpuSampleRow>* out) noexcept {
  try {
    out->clear();
    bool any = false;
    for (DeviceState& dev : states_) {
      if (dev.lost) continue;
      store::GpuSampleRow row;
      if (SampleDevice(dev, now_rel_ns, pids, &row)) {
        out->push_back(row);
        any = true;
      }
    }
    return any;
  } catch (...) {
    return false;
  }
}

}  // namespace gpuprof::telemetry
