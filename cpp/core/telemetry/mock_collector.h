// MockCollector: N fake GPUs whose readings are deterministic functions of the sample time, for
// demos, dashboards and tests of everything above telemetry (rules, reports) without a GPU.
// Same inputs give the same rows, on any machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/gpu_collector.h"
#include "util/status.h"

namespace gpuprof::telemetry {

// The script of a mock run. Every GPU follows the same curves, shifted in phase by its index so
// that lines do not overlap exactly. With t = seconds since the run start (now_rel_ns / 1e9):
//   util(t)   = clamp(util + util_amp * sin(2*pi*t/period_s + index), 0, 100)
//   mem_util  = util(t) * mem_util_ratio
//   mem_used  = mem_total * (mem_start_frac + (mem_frac - mem_start_frac) * min(t/mem_ramp_s, 1))
//   power     = idle_power_w + (power_w - idle_power_w) * util(t)/100      (reported in mW)
//   temp      = temp - (temp - idle_temp) * exp(-t/temp_tau_s)             (degrees C)
//   sm_clock  = sm_clock_max, or throttle_clock_mhz once throttling
//   clock_reasons = 0, or the throttle_reason bits once throttling
//   pcie rx/tx = pcie_rx_gbps / pcie_tx_gbps * 1e9 * util(t)/100          (bytes/s)
//   proc_mem  = mem_used when the caller passes any pid (the mock's process owns the GPU)
// Throttling (throttle=1) starts at t >= throttle_after_s and also adds throttle_temp_c to temp.
// Fields named in `missing` are never reported (nullopt), as on a GPU that lacks them.
struct MockScenario {
  std::string model = "NVIDIA H100 80GB HBM3";
  double mem_total_gib = 80.0;
  double util = 85.0;      // mean GPU utilization, %
  double util_amp = 10.0;  // +- wobble around it, %
  double period_s = 20.0;  // wobble period
  double mem_util_ratio = 0.6;
  double mem_frac = 0.5;  // memory used at the end of the ramp, fraction of total
  double mem_start_frac = 0.02;
  double mem_ramp_s = 10.0;
  double power_w = 700.0;  // at 100% util
  double idle_power_w = 90.0;
  double temp = 70.0;  // steady-state degrees C
  double idle_temp = 35.0;
  double temp_tau_s = 30.0;
  int64_t sm_clock_max_mhz = 1980;
  bool throttle = false;
  double throttle_after_s = 0.0;
  int64_t throttle_clock_mhz = 1200;
  std::string throttle_reason = "thermal";  // thermal | power | hw
  double throttle_temp_c = 15.0;
  double pcie_rx_gbps = 2.0;  // at 100% util, GB/s (1e9 bytes)
  double pcie_tx_gbps = 0.5;
  std::vector<std::string> missing;  // subset of: util memory proc_mem power temp sm_clock
                                     // clock_reasons pcie

  // Parses "key=value,key=value" (spaces around keys and values are ignored; an empty string
  // gives the defaults). Keys are the member names above; booleans accept 0/1/true/false;
  // `missing` takes fields joined by '+', e.g. "missing=power+pcie". Errors name the offending
  // key or value, e.g. "unknown mock scenario key 'utl' (valid keys: model, mem_total_gib, ...)".
  static Expected<MockScenario> Parse(const std::string& spec);

  // The clock_reasons bitmask that throttle_reason stands for (NVML clocks-event bits).
  int64_t ThrottleReasonBits() const;
};

class MockCollector final : public GpuCollector {
 public:
  MockCollector(int gpu_count, MockScenario scenario);

  std::string backend() const override { return "mock"; }
  const std::vector<GpuDevice>& devices() const override { return devices_; }
  // Clears *out and appends one row per GPU at time now_rel_ns. Always true.
  bool Sample(int64_t now_rel_ns, const std::vector<int64_t>& pids,
              std::vector<store::GpuSampleRow>* out) noexcept override;

  const MockScenario& scenario() const { return scenario_; }

 private:
  bool Missing(const char* field) const;

  MockScenario scenario_;
  std::vector<GpuDevice> devices_;
  int64_t mem_total_bytes_ = 0;
  uint32_t missing_mask_ = 0;
};

}  // namespace gpuprof::telemetry
