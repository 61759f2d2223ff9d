#include "analysis/flops.h"

#include <array>
#include <cctype>
#include <string>
#include <vector>

#include "analysis/format.h"

namespace gpuprof::analysis {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> words;
  std::string cur;
  for (char c : s) {
    if (c == ' ' || c == '-' || c == '_' || c == '/' || c == '(' || c == ')' || c == ',') {
      if (!cur.empty()) words.push_back(Lower(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) words.push_back(Lower(cur));
  return words;
}

// Dense TFLOPs per GPU from the vendor datasheets (sparsity figures halved). Ordered most
// specific first. Columns: fp32 (non-tensor), tf32, bf16, fp16, fp8.
constexpr std::array kPeakTable = {
    PeakTflopsEntry{"B200", "B200", 75, 1125, 2250, 2250, 4500},
    PeakTflopsEntry{"GH200", "GH200", 67, 494, 989, 989, 1979},
    PeakTflopsEntry{"H200 NVL", "H200 NVL", 60, 417.5, 835, 835, 1671},
    PeakTflopsEntry{"H200", "H200", 67, 494, 989, 989, 1979},
    PeakTflopsEntry{"H100 PCIe", "H100 PCIe", 51, 378, 756, 756, 1513},
    PeakTflopsEntry{"H100 NVL", "H100 NVL", 60, 417.5, 835, 835, 1671},
    PeakTflopsEntry{"H100", "H100 SXM", 67, 494, 989, 989, 1979},
    PeakTflopsEntry{"A100", "A100", 19.5, 156, 312, 312, 0},
    PeakTflopsEntry{"L40S", "L40S", 91.6, 183, 362, 362, 733},
    PeakTflopsEntry{"L40", "L40", 90.5, 90.5, 181, 181, 362},
    PeakTflopsEntry{"L4", "L4", 30.3, 60, 121, 121, 242},
    PeakTflopsEntry{"A10G", "A10G", 31.2, 62.5, 125, 125, 0},
    PeakTflopsEntry{"A10", "A10", 31.2, 62.5, 125, 125, 0},
    PeakTflopsEntry{"RTX 4090", "RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3},
    PeakTflopsEntry{"V100S", "V100S", 16.4, 0, 0, 130, 0},
    PeakTflopsEntry{"V100 PCIe", "V100 PCIe", 14, 0, 0, 112, 0},
    PeakTflopsEntry{"V100", "V100 SXM2", 15.7, 0, 0, 125, 0},
    PeakTflopsEntry{"T4", "T4", 8.1, 0, 0, 65, 0},
};

}  // namespace

std::optional<Dtype> ParseDtype(std::string_view text) {
  std::string s = Lower(text);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "bf16" || s == "bfloat16") return Dtype::kBf16;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16") return Dtype::kFp16;
  if (s == "tf32" || s == "tensorfloat32") return Dtype::kTf32;
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return Dtype::kFp32;
  if (s == "fp8" || s.rfind("float8", 0) == 0 || s.rfind("fp8_", 0) == 0) return Dtype::kFp8;
  return std::nullopt;
}

std::string_view DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFp32: return "fp32";
    case Dtype::kTf32: return "tf32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kFp16: return "fp16";
    case Dtype::kFp8: return "fp8";
  }
  return "?";
}

double PeakTflopsEntry::For(Dtype dtype) const {
  switch (dtype) {
    case Dtype::kFp32: return fp32;
    case Dtype::kTf32: return tf32;
    case Dtype::kBf16: return bf16;
    case Dtype::kFp16: return fp16;
    case Dtype::kFp8: return fp8;
  }
  return 0;
}

std::span<const PeakTflopsEntry> PeakTflopsTable() { return kPeakTable; }

bool GpuNameMatches(std::string_view gpu_name, std::string_view match) {
  const std::vector<std::string> have = Words(gpu_name);
  const std::vector<std::string> need = Words(match);
  if (need.empty()) return false;
  for (const std::string& w : need) {
    bool found = false;
    for (const std::string& h : have) found = found || h == w;
    if (!found) return false;
  }
  return true;
}

const PeakTflopsEntry* FindPeakEntry(std::string_view gpu_name) {
  for (const PeakTflopsEntry& e : kPeakTable) {
    if (GpuNameMatches(gpu_name, e.match)) return &e;
  }
  return nullptr;
}

std::optional<double> PeakTflops(std::string_view gpu_name, Dtype dtype) {
  const PeakTflopsEntry* e = FindPeakEntry(gpu_name);
  if (!e || e->For(dtype) <= 0) return std::nullopt;
  return e->For(dtype);
}

std::string PeakTflopsMarkdown() {
  std::string out = "| GPU | Matches words | fp32 | tf32 | bf16 | fp16 | fp8 |\n";
  out += "|---|---|---|---|---|---|---|\n";
  auto cell = [](double v) { return v > 0 ? FormatCompact(v) : std::string("—"); };
  for (const PeakTflopsEntry& e : kPeakTable) {
    out += "| " + std::string(e.label) + " | `" + std::string(e.match) + "` | " + cell(e.fp32) +
           " | " + cell(e.tf32) + " | " + cell(e.bf16) + " | " + cell(e.fp16) + " | " +
           cell(e.fp8) + " |\n";
  }
  return out;
}

MfuResult ComputeMfu(const RunView& view) {
  const store::RunInfo& run = view.run();
  auto unknown = [](std::string why) { return MfuResult{std::nullopt, "MFU unknown: " + why}; };
  if (view.IsCpuRun()) return unknown("CPU run");
  if (!run.flops_per_step || *run.flops_per_step <= 0) {
    return unknown("flops_per_step not declared (pass flops_per_step= to profile())");
  }
  if (!run.gpu_model) {
    const auto* gpu = view.Telemetry("gpu");
    if (gpu && !gpu->available && gpu->reason) {
      return unknown("GPU model unknown (GPU telemetry unavailable: " + *gpu->reason + ")");
    }
    return unknown("GPU model unknown");
  }
  if (!run.dtype) return unknown("compute dtype not declared (pass dtype= to profile())");
  const std::optional<Dtype> dtype = ParseDtype(*run.dtype);
  if (!dtype) return unknown("unrecognized dtype '" + *run.dtype + "'");
  const PeakTflopsEntry* entry = FindPeakEntry(*run.gpu_model);
  if (!entry) return unknown("no peak TFLOPs listed for '" + *run.gpu_model + "'");
  if (entry->For(*dtype) <= 0) {
    return unknown(StrFormat("no %s peak listed for %s", std::string(DtypeName(*dtype)).c_str(),
                             std::string(entry->label).c_str()));
  }
  if (!view.steady || view.steady->mean_ns <= 0) {
    return unknown(view.steps.empty() ? "no steps recorded"
                                      : "too few steps for a steady-state step time");
  }
  Mfu m;
  m.dtype = *dtype;
  m.gpu_label = std::string(entry->label);
  m.peak_tflops = entry->For(*dtype);
  m.flops_per_step = *run.flops_per_step;
  m.step_ns = view.steady->mean_ns;
  m.achieved_tflops = m.flops_per_step / (m.step_ns * 1e-9) / 1e12;
  m.value = m.achieved_tflops / m.peak_tflops;
  return MfuResult{m, ""};
}

}  // namespace gpuprof::analysis
