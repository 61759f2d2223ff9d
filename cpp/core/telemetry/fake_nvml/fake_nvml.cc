// fake_nvml: a stand-in for the NVIDIA management library (libnvidia-ml.so.1) that speaks the
// same C ABI (telemetry/nvml_abi.h) and answers from a scenario file, so that the tests load
// NvmlCollector's real dlopen/dlsym path without a GPU. Built twice:
//   fake_nvml/libnvidia-ml.so.1         today's symbol set (_v2/_v3 names, clocks-event reasons)
//   fake_nvml_legacy/libnvidia-ml.so.1  (-DGPUPROF_FAKE_NVML_LEGACY) only the old names: no
//       nvmlInit_v2 / nvmlInitWithFlags / _v2 count+handle, no _v2/_v3 process lists (only the
//       unversioned one with the two-field record), clocks *throttle* reasons, no
//       nvmlDeviceGetPcieThroughput, no nvmlDeviceGetProcessUtilization.
//
// SCENARIO FORMAT. $GPUPROF_FAKE_NVML_SCENARIO names a text file, read by each first nvmlInit
// (init after a full shutdown re-reads it). Unset or unreadable: nvmlInit returns 9 (Driver Not
// Loaded). A malformed file: nvmlInit returns 999 and nvmlErrorString(999) says which line and why.
// One directive per line, tokens separated by blanks, '#' starts a comment:
//
//   devices <n>                 number of GPUs, 0..64 (default 1)
//   init_error <code>           nvmlInit returns <code> (an nvmlReturn_t number, e.g. 9)
//   count_error <code>          nvmlDeviceGetCount returns <code>
//   gpu <sel> <key> <args...>   a per-device setting; <sel> is a device index or '*' for all
//                               devices (lines apply in order, so later ones override)
//
// Per-device keys (defaults in brackets):
//   name <text to end of line>  ["NVIDIA Fake GPU"]
//   uuid <text>                 [GPU-fa4e0000-0000-4000-8000-<index as 12 digits>]
//   mem_total <bytes>           [85899345920 = 80 GiB]
//   mem_used <curve>   bytes    [0]       util <curve>      percent [0]
//   mem_util <curve>   percent  [0]       power <curve>     milliwatts [100000]
//   temp <curve>       deg C    [40]      sm_clock <curve>  MHz [1980]
//   sm_clock_max <n>   MHz      [1980]    clock_reasons <curve>  bitmask, 0x.. allowed [0]
//   pcie_rx <curve>    KB/s     [0]       pcie_tx <curve>   KB/s [0]
//   process <pid|self|parent> <bytes|na>
//                               one compute process on this device; "self" is the process that
//                               loaded the library, "parent" its parent; "na" reports
//                               NVML_VALUE_NOT_AVAILABLE as its memory
//   process_fill <n> <bytes>    n more processes with pids 4000000.. (to overflow the caller's
//                               buffer and exercise NVML_ERROR_INSUFFICIENT_SIZE)
//   not_supported <field>       the field's entry point returns 3 (Not Supported) on every call
//   fail <field> after <n> [code]
//                               the field's calls with index >= n return <code> [999]
//   lost after <n>              every per-tick call with index >= n returns 15 (GPU is lost)
//   process_util <pid|self|parent> <curve>
//                               per-process SM utilization (percent) of one process, answered by
//                               nvmlDeviceGetProcessUtilization: one sample per such process whose
//                               curve is > 0 at that call (as the driver lists only busy
//                               processes), smUtil = the curve, other utilizations 0
//   process_util_period <ms>    the driver's per-process sample period [0]. 0: every call makes
//                               a fresh sample stamped with the current wall time (us; always
//                               newer than lastSeenTimeStamp). P > 0: a call's sample is stamped
//                               with the start of the current P-period, so the calls after the
//                               first within one period find nothing new (only the latest period
//                               is returned, never a backlog)
//   accounting <on|off>         the accounting mode [off]. When on, nvmlDeviceGetAccountingStats
//                               answers for the listed processes: gpuUtilization = the util
//                               curve, maxMemoryUsage = the process's bytes; other pids get 6
//                               (Not Found). When off it returns 3 (Not Supported), as NVML does
//
// Curves: "V" is a constant; "A..B" or "A..B/S" ramps linearly: the call with index k returns
// A + (B - A) * min(k, S) / S rounded to the nearest integer (S defaults to 10).
//
// Fields (for not_supported / fail): util (also mem_util), memory (mem_used and mem_total),
// proc_mem (process list), power, temp, sm_clock, clock_reasons, pcie (RX and TX), name, uuid,
// sm_clock_max, accounting (the mode query), proc_util (nvmlDeviceGetProcessUtilization).
// nvmlDeviceGetAccountingStats counts as a util call.
//
// nvmlDeviceGetProcessUtilization answers NVML_ERROR_NOT_FOUND when no process is busy at that
// call index or the sample would not be newer than lastSeenTimeStamp, and a size query (null
// buffer) or too small a buffer with NVML_ERROR_INSUFFICIENT_SIZE and the count needed.
//
// Call index: each (device, field) pair counts its own calls from 0, so with gpuprof's collector,
// which reads every field once per Sample(), index k is the (k+1)-th Sample(). Two exceptions keep
// that true: the collector's start-up read of the memory total shares index 0 with the first
// Sample(), and a process-list call answered with Insufficient Size does not count. PCIe RX and TX
// count separately (one call each per Sample()). proc_util counts like the process list: a size
// query or too small a buffer answered with Insufficient Size does not count; a NOT_FOUND does.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "telemetry/nvml_abi.h"

namespace nv = gpuprof::telemetry::nvml;

namespace {

constexpr int kMaxDevices = 64;
constexpr const char* kScenarioEnv = "GPUPROF_FAKE_NVML_SCENARIO";
constexpr unsigned long long kFillPidBase = 4000000;

enum Field : int {
  kUtil,
  kMemory,
  kProcMem,
  kPower,
  kTemp,
  kSmClock,
  kClockReasons,
  kPcieRx,
  kPcieTx,
  kName,
  kUuid,
  kSmClockMax,
  kAccounting,
  kProcUtil,
  kFieldCount
};

// A value over the call index: A + (B - A) * min(k, S) / S.
struct Curve {
  double a = 0, b = 0;
  int steps = 0;  // 0 = constant a
  unsigned long long At(long long k) const {
    double v = a;
    if (steps > 0) v = a + (b - a) * static_cast<double>(std::min<long long>(k, steps)) / steps;
    return v <= 0 ? 0ULL : static_cast<unsigned long long>(std::llround(v));
  }
};

struct Process {
  unsigned int pid;
  unsigned long long bytes;
};

struct ProcessUtil {
  unsigned int pid;
  Curve sm;
};

struct FakeDevice {
  std::string name = "NVIDIA Fake GPU";
  std::string uuid;
  unsigned long long mem_total = 80ULL << 30;
  Curve mem_used, util, mem_util, power{100000}, temp{40}, sm_clock{1980}, clock_reasons, pcie_rx,
      pcie_tx;
  unsigned int sm_clock_max = 1980;
  bool accounting = false;
  std::vector<Process> processes;
  std::vector<ProcessUtil> process_utils;
  unsigned long long process_util_period_us = 0;
  bool not_supported[kFieldCount] = {};
  long long fail_after[kFieldCount];
  nv::Return fail_code[kFieldCount];
  long long lost_after = -1;
  long long calls[kFieldCount] = {};
  FakeDevice() {
    for (int f = 0; f < kFieldCount; ++f) {
      fail_after[f] = -1;
      fail_code[f] = nv::kErrorUnknown;
    }
  }
};

struct State {
  std::mutex mu;
  int init_count = 0;
  nv::Return init_error = nv::kSuccess;
  nv::Return count_error = nv::kSuccess;
  std::vector<FakeDevice> devices;
  std::string problem;  // why init failed (for nvmlErrorString)
  nv::Return problem_code = nv::kSuccess;
};

State& S() {
  static State state;  // destroyed when the library is unloaded, after the last call
  return state;
}

bool ParseCode(const std::string& tok, nv::Return* out) {
  char* end = nullptr;
  long v = std::strtol(tok.c_str(), &end, 0);
  if (tok.empty() || *end != '\0') return false;
  *out = static_cast<nv::Return>(v);
  return true;
}

bool ParseNumber(const std::string& tok, double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(tok.c_str(), &end);
  if (tok.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseCurve(const std::string& tok, Curve* c) {
  size_t dots = tok.find("..");
  if (dots == std::string::npos) {
    c->steps = 0;
    return ParseNumber(tok, &c->a);
  }
  std::string b = tok.substr(dots + 2);
  int steps = 10;
  size_t slash = b.find('/');
  if (slash != std::string::npos) {
    double s = 0;
    if (!ParseNumber(b.substr(slash + 1), &s) || s < 1 || s != std::floor(s)) return false;
    steps = static_cast<int>(s);
    b = b.substr(0, slash);
  }
  c->steps = steps;
  return ParseNumber(tok.substr(0, dots), &c->a) && ParseNumber(b, &c->b);
}

// Maps a scenario field name to the counters it controls (pcie -> RX and TX).
int FieldsOf(const std::string& name, Field out[2]) {
  static const struct {
    const char* name;
    Field f;
  } kNames[] = {{"util", kUtil},
                {"memory", kMemory},
                {"proc_mem", kProcMem},
                {"power", kPower},
                {"temp", kTemp},
                {"sm_clock", kSmClock},
                {"clock_reasons", kClockReasons},
                {"name", kName},
                {"uuid", kUuid},
                {"sm_clock_max", kSmClockMax},
                {"accounting", kAccounting},
                {"proc_util", kProcUtil}};
  if (name == "pcie") {
    out[0] = kPcieRx;
    out[1] = kPcieTx;
    return 2;
  }
  for (const auto& n : kNames) {
    if (name == n.name) {
      out[0] = n.f;
      return 1;
    }
  }
  return 0;
}

// A process id of a scenario: a number, "self" (the process that loaded the library) or
// "parent" (its parent).
bool ParsePid(const std::string& tok, unsigned int* pid) {
  double v = 0;
  if (tok == "self")
    *pid = static_cast<unsigned int>(getpid());
  else if (tok == "parent")
    *pid = static_cast<unsigned int>(getppid());
  else if (ParseNumber(tok, &v) && v >= 0 && v == std::floor(v))
    *pid = static_cast<unsigned int>(v);
  else
    return false;
  return true;
}

// Applies one "gpu <sel> <key> ..." setting to `d`. `rest` is the text after the key (for name).
std::string ApplyDeviceKey(FakeDevice& d, const std::vector<std::string>& t,
                           const std::string& rest) {
  const std::string& key = t[2];
  auto need = [&](size_t n) { return t.size() >= 3 + n; };
  struct CurveKey {
    const char* name;
    Curve FakeDevice::*member;
  };
  static const CurveKey kCurves[] = {{"mem_used", &FakeDevice::mem_used},
                                     {"util", &FakeDevice::util},
                                     {"mem_util", &FakeDevice::mem_util},
                                     {"power", &FakeDevice::power},
                                     {"temp", &FakeDevice::temp},
                                     {"sm_clock", &FakeDevice::sm_clock},
                                     {"clock_reasons", &FakeDevice::clock_reasons},
                                     {"pcie_rx", &FakeDevice::pcie_rx},
                                     {"pcie_tx", &FakeDevice::pcie_tx}};
  for (const CurveKey& ck : kCurves) {
    if (key != ck.name) continue;
    if (!need(1) || !ParseCurve(t[3], &(d.*ck.member))) return key + " needs a value or A..B[/S]";
    return "";
  }
  double v = 0;
  if (key == "name") {
    if (rest.empty()) return "name needs text";
    d.name = rest;
  } else if (key == "uuid") {
    if (!need(1)) return "uuid needs text";
    d.uuid = t[3];
  } else if (key == "mem_total") {
    if (!need(1) || !ParseNumber(t[3], &v) || v < 0) return "mem_total needs bytes";
    d.mem_total = static_cast<unsigned long long>(v);
  } else if (key == "sm_clock_max") {
    if (!need(1) || !ParseNumber(t[3], &v) || v < 0) return "sm_clock_max needs MHz";
    d.sm_clock_max = static_cast<unsigned int>(v);
  } else if (key == "process") {
    if (!need(2)) return "process needs <pid|self|parent> <bytes|na>";
    Process p{};
    if (!ParsePid(t[3], &p.pid)) return "process pid must be a number, self or parent";
    if (t[4] == "na")
      p.bytes = nv::kValueNotAvailable;
    else if (ParseNumber(t[4], &v) && v >= 0)
      p.bytes = static_cast<unsigned long long>(v);
    else
      return "process bytes must be a number or na";
    d.processes.push_back(p);
  } else if (key == "process_util") {
    ProcessUtil pu{};
    if (!need(2) || !ParsePid(t[3], &pu.pid) || !ParseCurve(t[4], &pu.sm)) {
      return "process_util needs <pid|self|parent> <percent or A..B[/S]>";
    }
    d.process_utils.push_back(pu);
  } else if (key == "process_util_period") {
    if (!need(1) || !ParseNumber(t[3], &v) || v < 0) return "process_util_period needs ms";
    d.process_util_period_us = static_cast<unsigned long long>(std::llround(v * 1000.0));
  } else if (key == "process_fill") {
    double n = 0;
    if (!need(2) || !ParseNumber(t[3], &n) || n < 0 || n > 100000 || !ParseNumber(t[4], &v)) {
      return "process_fill needs <n> <bytes>";
    }
    for (int i = 0; i < static_cast<int>(n); ++i) {
      d.processes.push_back(
          {static_cast<unsigned int>(kFillPidBase + i), static_cast<unsigned long long>(v)});
    }
  } else if (key == "not_supported") {
    Field fs[2];
    int n = need(1) ? FieldsOf(t[3], fs) : 0;
    if (n == 0) return "not_supported needs a field name";
    for (int i = 0; i < n; ++i) d.not_supported[fs[i]] = true;
  } else if (key == "fail") {
    Field fs[2];
    int n = need(3) ? FieldsOf(t[3], fs) : 0;
    nv::Return code = nv::kErrorUnknown;
    if (n == 0 || t[4] != "after" || !ParseNumber(t[5], &v) || v < 0 ||
        (t.size() > 6 && !ParseCode(t[6], &code))) {
      return "fail needs <field> after <n> [code]";
    }
    for (int i = 0; i < n; ++i) {
      d.fail_after[fs[i]] = static_cast<long long>(v);
      d.fail_code[fs[i]] = code;
    }
  } else if (key == "accounting") {
    if (!need(1) || (t[3] != "on" && t[3] != "off")) return "accounting needs on or off";
    d.accounting = t[3] == "on";
  } else if (key == "lost") {
    if (!need(2) || t[3] != "after" || !ParseNumber(t[4], &v) || v < 0) {
      return "lost needs after <n>";
    }
    d.lost_after = static_cast<long long>(v);
  } else {
    return "unknown device key '" + key + "'";
  }
  return "";
}

// Reads the scenario into `s`. Returns the init result; on failure s.problem says why.
nv::Return LoadScenario(State& s) {
  s.devices.assign(1, FakeDevice());
  s.init_error = nv::kSuccess;
  s.count_error = nv::kSuccess;
  s.problem.clear();
  s.problem_code = nv::kSuccess;
  const char* path = std::getenv(kScenarioEnv);
  if (path == nullptr || *path == '\0') {
    s.problem = std::string("fake_nvml: ") + kScenarioEnv + " is not set";
    return s.problem_code = nv::kErrorDriverNotLoaded;
  }
  std::ifstream in(path);
  if (!in) {
    s.problem = std::string("fake_nvml: cannot read scenario ") + path;
    return s.problem_code = nv::kErrorDriverNotLoaded;
  }
  // Device-scoped lines are kept until the device count is known.
  std::vector<std::pair<int, std::string>> device_lines;
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) {
    s.problem = std::string("fake_nvml: ") + path + ":" + std::to_string(lineno) + ": " + why;
    return s.problem_code = nv::kErrorUnknown;
  };
  int devices = 1;
  while (std::getline(in, line)) {
    ++lineno;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ts(line);
    std::vector<std::string> t;
    for (std::string tok; ts >> tok;) t.push_back(tok);
    if (t.empty()) continue;
    double v = 0;
    if (t[0] == "devices") {
      if (t.size() != 2 || !ParseNumber(t[1], &v) || v < 0 || v > kMaxDevices) {
        return bad("devices needs a count in 0..64");
      }
      devices = static_cast<int>(v);
    } else if (t[0] == "init_error") {
      if (t.size() != 2 || !ParseCode(t[1], &s.init_error)) return bad("init_error needs a code");
    } else if (t[0] == "count_error") {
      if (t.size() != 2 || !ParseCode(t[1], &s.count_error)) return bad("count_error needs a code");
    } else if (t[0] == "gpu") {
      if (t.size() < 3) return bad("gpu needs <index|*> <key> ...");
      device_lines.emplace_back(lineno, line);
    } else {
      return bad("unknown directive '" + t[0] + "'");
    }
  }
  s.devices.assign(devices, FakeDevice());
  for (int i = 0; i < devices; ++i) {
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-fa4e0000-0000-4000-8000-%012d", i);
    s.devices[i].uuid = uuid;
  }
  for (const auto& [no, text] : device_lines) {
    lineno = no;
    std::istringstream ts(text);
    std::vector<std::string> t;
    for (std::string tok; ts >> tok;) t.push_back(tok);
    // The text after "gpu <sel> <key>", for keys that take the rest of the line.
    std::string rest;
    {
      std::istringstream rs(text);
      std::string skip;
      rs >> skip >> skip >> skip;
      std::getline(rs, rest);
      size_t b = rest.find_first_not_of(" \t");
      size_t e = rest.find_last_not_of(" \t\r");
      rest = b == std::string::npos ? "" : rest.substr(b, e - b + 1);
    }
    int first = 0;
    int last = devices - 1;
    if (t[1] != "*") {
      double idx = 0;
      if (!ParseNumber(t[1], &idx) || idx < 0 || idx >= devices || idx != std::floor(idx)) {
        return bad("gpu index '" + t[1] + "' is not a device (devices " + std::to_string(devices) +
                   ")");
      }
      first = last = static_cast<int>(idx);
    }
    for (int i = first; i <= last; ++i) {
      std::string why = ApplyDeviceKey(s.devices[i], t, rest);
      if (!why.empty()) return bad(why);
    }
  }
  if (s.init_error != nv::kSuccess) {
    s.problem_code = s.init_error;
    s.problem = std::string("fake_nvml: init_error in ") + path;
    return s.init_error;
  }
  return nv::kSuccess;
}

// Looks up a handle; null when it is not one of ours or NVML is not initialised.
FakeDevice* Dev(State& s, nv::Device h) {
  if (s.init_count == 0 || s.devices.empty()) return nullptr;
  auto* d = reinterpret_cast<FakeDevice*>(h);
  if (d < s.devices.data() || d >= s.devices.data() + s.devices.size()) return nullptr;
  return d;
}

// The scripted outcome of a call of `f` on `d` with call index k: success, or the code the
// scenario makes it fail with. `per_tick`: subject to "lost after".
nv::Return Judge(const FakeDevice& d, Field f, long long k, bool per_tick) {
  if (d.not_supported[f]) return nv::kErrorNotSupported;
  if (per_tick && d.lost_after >= 0 && k >= d.lost_after) return nv::kErrorGpuIsLost;
  if (d.fail_after[f] >= 0 && k >= d.fail_after[f]) return d.fail_code[f];
  return nv::kSuccess;
}

// Counts one call of `f` on `d`: its index in *k and its scripted outcome.
nv::Return Step(FakeDevice& d, Field f, long long* k, bool per_tick = true) {
  *k = d.calls[f]++;
  return Judge(d, f, *k, per_tick);
}

nv::Return CopyString(const std::string& v, char* buf, unsigned int len) {
  if (buf == nullptr) return nv::kErrorInvalidArgument;
  if (v.size() + 1 > len) return nv::kErrorInsufficientSize;
  std::memcpy(buf, v.c_str(), v.size() + 1);
  return nv::kSuccess;
}

nv::Return Init() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count > 0) {
    ++s.init_count;
    return nv::kSuccess;
  }
  nv::Return r = LoadScenario(s);
  if (r == nv::kSuccess) s.init_count = 1;
  return r;
}

nv::Return GetCount(unsigned int* count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count == 0) return nv::kErrorUninitialized;
  if (count == nullptr) return nv::kErrorInvalidArgument;
  if (s.count_error != nv::kSuccess) return s.count_error;
  *count = static_cast<unsigned int>(s.devices.size());
  return nv::kSuccess;
}

nv::Return GetHandle(unsigned int index, nv::Device* device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count == 0) return nv::kErrorUninitialized;
  if (device == nullptr || index >= s.devices.size()) return nv::kErrorInvalidArgument;
  *device = reinterpret_cast<nv::Device>(&s.devices[index]);
  return nv::kSuccess;
}

// Shared body of the process-list entry points, for either record layout.
template <typename Info>
nv::Return GetProcesses(nv::Device h, unsigned int* count, Info* infos) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || count == nullptr) return nv::kErrorInvalidArgument;
  const auto n = static_cast<unsigned int>(d->processes.size());
  long long k = d->calls[kProcMem];
  if (nv::Return r = Judge(*d, kProcMem, k, true); r != nv::kSuccess) {
    ++d->calls[kProcMem];
    return r;
  }
  if (*count < n || (infos == nullptr && n > 0)) {
    // A size query or too small a buffer: report the need. Not counted as a call.
    *count = n;
    return nv::kErrorInsufficientSize;
  }
  ++d->calls[kProcMem];
  for (unsigned int i = 0; i < n; ++i) {
    Info info{};
    info.pid = d->processes[i].pid;
    info.usedGpuMemory = d->processes[i].bytes;
    if constexpr (sizeof(Info) == sizeof(nv::ProcessInfoV2)) {
      info.gpuInstanceId = 0xFFFFFFFFu;
      info.computeInstanceId = 0xFFFFFFFFu;
    }
    infos[i] = info;
  }
  *count = n;
  return nv::kSuccess;
}

nv::Return GetClocksReasons(nv::Device h, unsigned long long* reasons) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || reasons == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kClockReasons, &k); r != nv::kSuccess) return r;
  *reasons = d->clock_reasons.At(k);
  return nv::kSuccess;
}

}  // namespace

#define FAKE_NVML_EXPORT extern "C" __attribute__((visibility("default")))

FAKE_NVML_EXPORT nv::Return nvmlInit() { return Init(); }

FAKE_NVML_EXPORT nv::Return nvmlShutdown() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count == 0) return nv::kErrorUninitialized;
  --s.init_count;
  return nv::kSuccess;
}

FAKE_NVML_EXPORT const char* nvmlErrorString(nv::Return r) {
  // A scenario problem explains the init failure it caused; everything else gets the vendor's
  // wording. The returned pointer stays valid until the next nvmlInit.
  State& s = S();
  static thread_local std::string text;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (r != nv::kSuccess && r == s.problem_code && !s.problem.empty()) {
      text = std::string(nv::ReturnName(r)) + " [" + s.problem + "]";
      return text.c_str();
    }
  }
  return nv::ReturnName(r);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetCount(unsigned int* count) { return GetCount(count); }

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetHandleByIndex(unsigned int index, nv::Device* device) {
  return GetHandle(index, device);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetName(nv::Device h, char* name, unsigned int length) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kName, &k, false); r != nv::kSuccess) return r;
  return CopyString(d->name, name, length);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetUUID(nv::Device h, char* uuid, unsigned int length) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kUuid, &k, false); r != nv::kSuccess) return r;
  return CopyString(d->uuid, uuid, length);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetMemoryInfo(nv::Device h, nv::Memory* memory) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || memory == nullptr) return nv::kErrorInvalidArgument;
  // The collector's start-up read of the total and its first sample share index 0.
  const long long raw = d->calls[kMemory]++;
  const long long k = raw == 0 ? 0 : raw - 1;
  if (nv::Return r = Judge(*d, kMemory, k, true); r != nv::kSuccess) return r;
  unsigned long long used = std::min(d->mem_used.At(k), d->mem_total);
  memory->total = d->mem_total;
  memory->used = used;
  memory->free = d->mem_total - used;
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetUtilizationRates(nv::Device h, nv::Utilization* u) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || u == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kUtil, &k); r != nv::kSuccess) return r;
  u->gpu = static_cast<unsigned int>(d->util.At(k));
  u->memory = static_cast<unsigned int>(d->mem_util.At(k));
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetPowerUsage(nv::Device h, unsigned int* mw) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || mw == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kPower, &k); r != nv::kSuccess) return r;
  *mw = static_cast<unsigned int>(d->power.At(k));
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetTemperature(nv::Device h, int sensor, unsigned int* c) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || c == nullptr || sensor != nv::kTemperatureGpu) {
    return nv::kErrorInvalidArgument;
  }
  long long k = 0;
  if (nv::Return r = Step(*d, kTemp, &k); r != nv::kSuccess) return r;
  *c = static_cast<unsigned int>(d->temp.At(k));
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetClockInfo(nv::Device h, int type, unsigned int* mhz) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || mhz == nullptr) return nv::kErrorInvalidArgument;
  if (type != nv::kClockSm) return nv::kErrorNotSupported;  // only the SM clock is scripted
  long long k = 0;
  if (nv::Return r = Step(*d, kSmClock, &k); r != nv::kSuccess) return r;
  *mhz = static_cast<unsigned int>(d->sm_clock.At(k));
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetMaxClockInfo(nv::Device h, int type, unsigned int* mhz) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || mhz == nullptr) return nv::kErrorInvalidArgument;
  if (type != nv::kClockSm) return nv::kErrorNotSupported;
  long long k = 0;
  if (nv::Return r = Step(*d, kSmClockMax, &k, false); r != nv::kSuccess) return r;
  *mhz = d->sm_clock_max;
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetCurrentClocksThrottleReasons(nv::Device h,
                                                                      unsigned long long* r) {
  return GetClocksReasons(h, r);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetComputeRunningProcesses(nv::Device h, unsigned int* count,
                                                                 nv::ProcessInfoV1* infos) {
  return GetProcesses(h, count, infos);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetAccountingMode(nv::Device h, int* mode) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || mode == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kAccounting, &k, false); r != nv::kSuccess) return r;
  *mode = d->accounting ? nv::kFeatureEnabled : nv::kFeatureDisabled;
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetAccountingStats(nv::Device h, unsigned int pid,
                                                         nv::AccountingStats* stats) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || stats == nullptr) return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, kUtil, &k); r != nv::kSuccess) return r;
  if (!d->accounting) return nv::kErrorNotSupported;
  for (const Process& p : d->processes) {
    if (p.pid != pid) continue;
    *stats = nv::AccountingStats{};
    stats->gpuUtilization = static_cast<unsigned int>(d->util.At(k));
    stats->memoryUtilization = static_cast<unsigned int>(d->mem_util.At(k));
    stats->maxMemoryUsage = p.bytes;
    stats->isRunning = 1;
    return nv::kSuccess;
  }
  return nv::kErrorNotFound;
}

#ifndef GPUPROF_FAKE_NVML_LEGACY

FAKE_NVML_EXPORT nv::Return nvmlInit_v2() { return Init(); }

// Flags (NVML_INIT_FLAG_NO_GPUS, _NO_ATTACH) change nothing for the fake.
FAKE_NVML_EXPORT nv::Return nvmlInitWithFlags(unsigned int /*flags*/) { return Init(); }

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetCount_v2(unsigned int* count) { return GetCount(count); }

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetHandleByIndex_v2(unsigned int index, nv::Device* device) {
  return GetHandle(index, device);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetComputeRunningProcesses_v2(nv::Device h,
                                                                    unsigned int* count,
                                                                    nv::ProcessInfoV2* infos) {
  return GetProcesses(h, count, infos);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetComputeRunningProcesses_v3(nv::Device h,
                                                                    unsigned int* count,
                                                                    nv::ProcessInfoV2* infos) {
  return GetProcesses(h, count, infos);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetCurrentClocksEventReasons(nv::Device h,
                                                                   unsigned long long* r) {
  return GetClocksReasons(h, r);
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetProcessUtilization(nv::Device h,
                                                            nv::ProcessUtilizationSample* samples,
                                                            unsigned int* count,
                                                            unsigned long long last_seen_us) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || count == nullptr) return nv::kErrorInvalidArgument;
  const long long k = d->calls[kProcUtil];
  if (nv::Return r = Judge(*d, kProcUtil, k, true); r != nv::kSuccess) {
    ++d->calls[kProcUtil];
    return r;
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  unsigned long long ts = static_cast<unsigned long long>(now.tv_sec) * 1000000ULL +
                          static_cast<unsigned long long>(now.tv_nsec) / 1000ULL;
  if (d->process_util_period_us > 0)
    ts -= ts % d->process_util_period_us;
  else
    ts = std::max(ts, last_seen_us + 1);  // a fresh sample at every call, even within one us
  unsigned int busy = 0;
  for (const ProcessUtil& p : d->process_utils) busy += p.sm.At(k) > 0 ? 1 : 0;
  if (busy == 0 || ts <= last_seen_us) {
    ++d->calls[kProcUtil];
    return nv::kErrorNotFound;
  }
  if (samples == nullptr || *count < busy) {
    *count = busy;  // a size query or too small a buffer: not counted as a call
    return nv::kErrorInsufficientSize;
  }
  ++d->calls[kProcUtil];
  unsigned int i = 0;
  for (const ProcessUtil& p : d->process_utils) {
    const unsigned long long sm = p.sm.At(k);
    if (sm == 0) continue;
    nv::ProcessUtilizationSample out{};
    out.pid = p.pid;
    out.timeStamp = ts;
    out.smUtil = static_cast<unsigned int>(sm);
    samples[i++] = out;
  }
  *count = i;
  return nv::kSuccess;
}

FAKE_NVML_EXPORT nv::Return nvmlDeviceGetPcieThroughput(nv::Device h, int counter,
                                                        unsigned int* kb_per_s) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  FakeDevice* d = Dev(s, h);
  if (d == nullptr || kb_per_s == nullptr) return nv::kErrorInvalidArgument;
  Field f;
  if (counter == nv::kPcieUtilRxBytes)
    f = kPcieRx;
  else if (counter == nv::kPcieUtilTxBytes)
    f = kPcieTx;
  else
    return nv::kErrorInvalidArgument;
  long long k = 0;
  if (nv::Return r = Step(*d, f, &k); r != nv::kSuccess) return r;
  *kb_per_s = static_cast<unsigned int>((f == kPcieRx ? d->pcie_rx : d->pcie_tx).At(k));
  return nv::kSuccess;
}

#endif  // GPUPROF_FAKE_NVML_LEGACY
