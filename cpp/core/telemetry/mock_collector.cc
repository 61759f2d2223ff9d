#include "telemetry/mock_collector.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

#include "telemetry/nvml_abi.h"

namespace gpuprof::telemetry {

namespace {

constexpr double kPi = 3.14159265358979323846;

constexpr std::array<const char*, 8> kMockFields = {"util", "memory",   "proc_mem",      "power",
                                                    "temp", "sm_clock", "clock_reasons", "pcie"};

std::string Trim(std::string_view s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return std::string(s.substr(b, e - b));
}

// Parses a whole string as a finite double; nullopt otherwise.
std::optional<double> ToDouble(const std::string& s) {
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

int FieldBit(std::string_view name) {
  for (size_t i = 0; i < kMockFields.size(); ++i) {
    if (name == kMockFields[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

int64_t MockScenario::ThrottleReasonBits() const {
  if (throttle_reason == "power") return static_cast<int64_t>(nvml::kClocksEventSwPowerCap);
  if (throttle_reason == "hw") return static_cast<int64_t>(nvml::kClocksEventHwSlowdown);
  return static_cast<int64_t>(nvml::kClocksEventSwThermalSlowdown |
                              nvml::kClocksEventHwThermalSlowdown);
}

Expected<MockScenario> MockScenario::Parse(const std::string& spec) {
  MockScenario s;
  struct NumKey {
    const char* name;
    double* target;
    double lo, hi;
  };
  const NumKey num_keys[] = {
      {"mem_total_gib", &s.mem_total_gib, 0.001, 1e6},
      {"util", &s.util, 0, 100},
      {"util_amp", &s.util_amp, 0, 100},
      {"period_s", &s.period_s, 1e-3, 1e9},
      {"mem_util_ratio", &s.mem_util_ratio, 0, 1},
      {"mem_frac", &s.mem_frac, 0, 1},
      {"mem_start_frac", &s.mem_start_frac, 0, 1},
      {"mem_ramp_s", &s.mem_ramp_s, 0, 1e9},
      {"power_w", &s.power_w, 0, 1e5},
      {"idle_power_w", &s.idle_power_w, 0, 1e5},
      {"temp", &s.temp, -50, 200},
      {"idle_temp", &s.idle_temp, -50, 200},
      {"temp_tau_s", &s.temp_tau_s, 0, 1e9},
      {"throttle_after_s", &s.throttle_after_s, 0, 1e12},
      {"throttle_temp_c", &s.throttle_temp_c, -100, 200},
      {"pcie_rx_gbps", &s.pcie_rx_gbps, 0, 1e4},
      {"pcie_tx_gbps", &s.pcie_tx_gbps, 0, 1e4},
  };
  const char* const other_keys[] = {
      "model", "sm_clock_max_mhz", "throttle", "throttle_clock_mhz", "throttle_reason", "missing"};
  auto valid_keys = [&] {
    std::string all;
    for (const char* k : other_keys) all += (all.empty() ? "" : ", ") + std::string(k);
    for (const NumKey& k : num_keys) all += ", " + std::string(k.name);
    return all;
  };

  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string item = Trim(std::string_view(spec).substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return Status::Error("mock scenario item '" + item + "' is not key=value");
    }
    std::string key = Trim(std::string_view(item).substr(0, eq));
    std::string value = Trim(std::string_view(item).substr(eq + 1));
    auto bad_value = [&](const std::string& expect) {
      return Status::Error("mock scenario key '" + key + "' expects " + expect + ", got '" + value +
                           "'");
    };

    bool handled = false;
    for (const NumKey& k : num_keys) {
      if (key != k.name) continue;
      std::optional<double> v = ToDouble(value);
      if (!v || *v < k.lo || *v > k.hi) {
        return bad_value("a number in [" + FormatNumber(k.lo) + ", " + FormatNumber(k.hi) + "]");
      }
      *k.target = *v;
      handled = true;
      break;
    }
    if (handled) continue;

    if (key == "model") {
      if (value.empty()) return bad_value("a GPU model name");
      s.model = value;
    } else if (key == "sm_clock_max_mhz" || key == "throttle_clock_mhz") {
      std::optional<double> v = ToDouble(value);
      if (!v || *v < 1 || *v > 100000 || *v != std::floor(*v)) {
        return bad_value("a whole number of MHz");
      }
      (key == "sm_clock_max_mhz" ? s.sm_clock_max_mhz : s.throttle_clock_mhz) =
          static_cast<int64_t>(*v);
    } else if (key == "throttle") {
      if (value == "1" || value == "true")
        s.throttle = true;
      else if (value == "0" || value == "false")
        s.throttle = false;
      else
        return bad_value("0 or 1");
    } else if (key == "throttle_reason") {
      if (value != "thermal" && value != "power" && value != "hw") {
        return bad_value("thermal, power or hw");
      }
      s.throttle_reason = value;
    } else if (key == "missing") {
      s.missing.clear();
      size_t p = 0;
      while (p <= value.size()) {
        size_t plus = value.find('+', p);
        if (plus == std::string::npos) plus = value.size();
        std::string field = Trim(std::string_view(value).substr(p, plus - p));
        p = plus + 1;
        if (field.empty()) continue;
        if (FieldBit(field) < 0) {
          return Status::Error(
              "mock scenario key 'missing': unknown field '" + field +
              "' (valid: util, memory, proc_mem, power, temp, sm_clock, clock_reasons, pcie)");
        }
        s.missing.push_back(field);
      }
    } else {
      return Status::Error("unknown mock scenario key '" + key + "' (valid keys: " + valid_keys() +
                           ")");
    }
  }
  return s;
}

MockCollector::MockCollector(int gpu_count, MockScenario scenario)
    : scenario_(std::move(scenario)) {
  mem_total_bytes_ =
      static_cast<int64_t>(std::llround(scenario_.mem_total_gib * 1024.0 * 1024.0 * 1024.0));
  for (const std::string& f : scenario_.missing) {
    int bit = FieldBit(f);
    if (bit >= 0) missing_mask_ |= 1u << bit;
  }
  for (int i = 0; i < std::max(gpu_count, 0); ++i) {
    GpuDevice d;
    d.index = i;
    d.name = scenario_.model;
    // Stable, obviously fake UUIDs: GPU-00000000-0000-4000-8000-0000000000NN.
    char uuid[64];
    std::snprintf(uuid, sizeof uuid, "GPU-00000000-0000-4000-8000-%012d", i);
    d.uuid = std::string(uuid);
    d.memory_total_bytes = mem_total_bytes_;
    d.sm_clock_max_mhz = scenario_.sm_clock_max_mhz;
    devices_.push_back(std::move(d));
  }
}

bool MockCollector::Missing(const char* field) const {
  int bit = FieldBit(field);
  return bit >= 0 && (missing_mask_ & (1u << bit)) != 0;
}

bool MockCollector::Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
                           std::vector<store::GpuSampleRow>* out) noexcept {
  try {
    out->clear();
    const MockScenario& s = scenario_;
    const double t = static_cast<double>(now_rel_ns) / 1e9;
    const bool throttling = s.throttle && t >= s.throttle_after_s;
    for (const GpuDevice& d : devices_) {
      store::GpuSampleRow row;
      row.ts_ns = now_rel_ns;
      row.gpu_index = d.index;
      const double phase = static_cast<double>(d.index);
      const double util = std::clamp(
          s.util + s.util_amp * std::sin(2.0 * kPi * t / s.period_s + phase), 0.0, 100.0);
      if (!Missing("util")) {
        row.util_pct = util;
        row.mem_util_pct = util * s.mem_util_ratio;
      }
      const double ramp = s.mem_ramp_s > 0 ? std::min(std::max(t, 0.0) / s.mem_ramp_s, 1.0) : 1.0;
      const int64_t mem_used = static_cast<int64_t>(
          std::llround(static_cast<double>(mem_total_bytes_) *
                       (s.mem_start_frac + (s.mem_frac - s.mem_start_frac) * ramp)));
      if (!Missing("memory")) {
        row.mem_used_bytes = mem_used;
        row.mem_total_bytes = mem_total_bytes_;
      }
      if (!Missing("proc_mem") && !pids.empty()) row.proc_mem_bytes = mem_used;
      if (!Missing("power")) {
        row.power_mw = static_cast<int64_t>(
            std::llround((s.idle_power_w + (s.power_w - s.idle_power_w) * util / 100.0) * 1000.0));
      }
      if (!Missing("temp")) {
        double temp = s.temp_tau_s > 0 ? s.temp - (s.temp - s.idle_temp) *
                                                      std::exp(-std::max(t, 0.0) / s.temp_tau_s)
                                       : s.temp;
        if (throttling) temp += s.throttle_temp_c;
        row.temp_c = temp;
      }
      if (!Missing("sm_clock")) {
        row.sm_clock_mhz = throttling ? s.throttle_clock_mhz : s.sm_clock_max_mhz;
      }
      if (!Missing("clock_reasons")) row.clock_reasons = throttling ? s.ThrottleReasonBits() : 0;
      if (!Missing("pcie")) {
        row.pcie_rx_bps = s.pcie_rx_gbps * 1e9 * util / 100.0;
        row.pcie_tx_bps = s.pcie_tx_gbps * 1e9 * util / 100.0;
      }
      out->push_back(row);
    }
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace gpuprof::telemetry
