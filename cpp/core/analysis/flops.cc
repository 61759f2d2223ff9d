#include "analysis/flops.h"

#include <array>
#include <cctype>
#include <cstdint>
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
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kTf32:
      return "tf32";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kFp8:
      return "fp8";
  }
  return "?";
}

double PeakTflopsEntry::For(Dtype dtype) const {
  switch (dtype) {
    case Dtype::kFp32:
      return fp32;
    case Dtype::kTf32:
      return tf32;
    case Dtype::kBf16:
      return bf16;
    case Dtype::kFp16:
      return fp16;
    case Dtype::kFp8:
      return fp8;
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

Status ValidateTransformerShape(const TransformerShape& s) {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v <= 0)
      return Status::Error(StrFormat("%s must be > 0, got %lld", name, static_cast<long long>(v)));
    return Status::Ok();
  };
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"layers", s.layers},
                                {"hidden", s.hidden},
                                {"heads", s.heads},
                                {"seq_len", s.seq_len},
                                {"vocab", s.vocab}}) {
    if (Status st = positive(name, v); !st.ok()) return st;
  }
  if (s.kv_heads) {
    if (Status st = positive("kv_heads", *s.kv_heads); !st.ok()) return st;
  }
  if (s.ffn_hidden) {
    if (Status st = positive("ffn_hidden", *s.ffn_hidden); !st.ok()) return st;
  }
  if (Status st = positive("moe_experts", s.moe_experts); !st.ok()) return st;
  if (Status st = positive("moe_top_k", s.moe_top_k); !st.ok()) return st;
  if (s.lora_rank && *s.lora_rank <= 0) {
    return Status::Error(StrFormat("lora_rank must be > 0 (None for a full fine-tune), got %lld",
                                   static_cast<long long>(*s.lora_rank)));
  }
  if (s.hidden % s.heads != 0) {
    return Status::Error(StrFormat("heads (%lld) must divide hidden (%lld)",
                                   static_cast<long long>(s.heads),
                                   static_cast<long long>(s.hidden)));
  }
  const int64_t kv_heads = s.kv_heads.value_or(s.heads);
  if (kv_heads > s.heads || s.heads % kv_heads != 0) {
    return Status::Error(StrFormat("kv_heads (%lld) must divide heads (%lld)",
                                   static_cast<long long>(kv_heads),
                                   static_cast<long long>(s.heads)));
  }
  if (s.moe_top_k > s.moe_experts) {
    return Status::Error(StrFormat("moe_top_k (%lld) must be <= moe_experts (%lld)",
                                   static_cast<long long>(s.moe_top_k),
                                   static_cast<long long>(s.moe_experts)));
  }
  return Status::Ok();
}

Expected<TransformerFlops> TransformerFlopsPerToken(const TransformerShape& s) {
  if (Status st = ValidateTransformerShape(s); !st.ok()) return st;
  const double L = static_cast<double>(s.layers);
  const double h = static_cast<double>(s.hidden);
  const double d = h / static_cast<double>(s.heads);
  const double kv = static_cast<double>(s.kv_heads.value_or(s.heads)) * d;
  const double f = static_cast<double>(s.ffn_hidden.value_or(4 * s.hidden));
  const double m = s.gated_mlp ? 3 : 2;  // MLP weight matrices
  const double experts = static_cast<double>(s.moe_experts);
  const double top_k = static_cast<double>(s.moe_top_k);
  const double seq = static_cast<double>(s.seq_len);
  const bool lora = s.lora_rank.has_value();
  const double r = static_cast<double>(s.lora_rank.value_or(0));

  // Forward FLOPs of one layer, per token.
  const double proj = 2 * h * h + 2 * 2 * h * kv + 2 * h * h;  // Q, K+V, O
  const double scores = 2 * 2 * seq * h;                       // QKᵀ, A·V (full, see flops.h)
  const double router = s.moe_experts > 1 ? 2 * h * experts : 0;
  const double mlp = top_k * m * 2 * h * f + router;
  // LoRA adapters on Q (h→h), K and V (h→kv), O (h→h) and the active experts' MLP matrices
  // (h↔f): 2·r·(d_in + d_out) each.
  const double adapters =
      lora ? 2 * r * ((h + h) + 2 * (h + kv) + (h + h)) + top_k * m * 2 * r * (h + f) : 0;

  TransformerFlops out;
  out.attention_proj = L * proj;
  out.attention_scores = L * scores;
  out.mlp = L * mlp;
  out.lm_head = 2 * h * static_cast<double>(s.vocab);
  out.lora_adapters = L * adapters;
  out.forward =
      out.attention_proj + out.attention_scores + out.mlp + out.lm_head + out.lora_adapters;
  if (lora) {
    // Frozen base weights: forward + input gradient only. Scores and adapters: the full 3×.
    out.model = 2 * (out.attention_proj + out.mlp + out.lm_head) +
                3 * (out.attention_scores + out.lora_adapters);
  } else {
    out.model = 3 * out.forward;
  }
  const double layers_forward = out.forward - out.lm_head;
  out.hardware = out.model + (s.grad_checkpoint ? layers_forward : 0);
  return out;
}

Expected<TransformerStepFlops> TransformerFlopsPerStep(const TransformerShape& shape,
                                                       int64_t tokens_per_step) {
  if (tokens_per_step <= 0) {
    return Status::Error(StrFormat("tokens_per_step must be > 0, got %lld",
                                   static_cast<long long>(tokens_per_step)));
  }
  Expected<TransformerFlops> per_token = TransformerFlopsPerToken(shape);
  if (!per_token) return per_token.status();
  TransformerStepFlops out;
  out.per_token = *per_token;
  out.tokens_per_step = tokens_per_step;
  out.model_per_step = per_token->model * static_cast<double>(tokens_per_step);
  out.hardware_per_step = per_token->hardware * static_cast<double>(tokens_per_step);
  return out;
}

std::string FlopsMethodLabel(std::string_view method) {
  if (method == "arch") return "TransformerArch";
  if (method == "declared") return "declared flops_per_step";
  if (method == "counted") return "counted (FlopCounterMode, one step)";
  return std::string(method);
}

MfuResult ComputeMfu(const RunView& view) {
  const store::RunInfo& run = view.run();
  auto unknown = [](std::string why) { return MfuResult{std::nullopt, "MFU unknown: " + why}; };
  if (view.IsCpuRun()) {
    return unknown(
        "CPU run (MFU compares with a GPU's peak; `gpuprof rules --reference` lists "
        "the GPUs)");
  }
  if (run.gpu_backend && *run.gpu_backend == "mock") {
    return unknown("the GPU is simulated (gpu=\"mock\"), so it has no real peak");
  }
  if (!run.flops_per_step || *run.flops_per_step <= 0) {
    // The Python layer records why the automatic count produced nothing.
    for (const store::DiagnosticRow& d : view.data.diagnostics) {
      if (d.source == kFlopsDiagnosticSource) return unknown(d.message);
    }
    return unknown(
        "flops_per_step not declared (pass arch=gpuprof.TransformerArch(...) with "
        "tokens_per_step=, or flops_per_step=, to profile(); with neither, auto mode counts one "
        "step)");
  }
  if (!run.gpu_model) {
    const auto* gpu = view.Telemetry("gpu");
    if (gpu && !gpu->available && gpu->reason) {
      return unknown("GPU model unknown (GPU telemetry unavailable: " + *gpu->reason + ")");
    }
    return unknown(
        "GPU model unknown (the GPU collector did not name the GPU; the cost line "
        "and MFU need it)");
  }
  if (!run.dtype) return unknown("compute dtype not declared (pass dtype= to profile())");
  const std::optional<Dtype> dtype = ParseDtype(*run.dtype);
  if (!dtype) return unknown("unrecognized dtype '" + *run.dtype + "'");
  const PeakTflopsEntry* entry = FindPeakEntry(*run.gpu_model);
  if (!entry) {
    return unknown("no peak TFLOPs listed for '" + *run.gpu_model +
                   "' (`gpuprof rules --reference` lists the GPUs with a peak)");
  }
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
  m.flops_method = run.flops_method;
  m.achieved_tflops = m.flops_per_step / (m.step_ns * 1e-9) / 1e12;
  m.value = m.achieved_tflops / m.peak_tflops;
  if (m.value > 1.0) {
    return unknown(
        StrFormat("computes to %s of one %s's peak, so flops_per_step likely counts more than this "
                  "process's GPU work",
                  FormatPercent(m.value, 1).c_str(), m.gpu_label.c_str()));
  }
  return MfuResult{m, ""};
}

}  // namespace gpuprof::analysis
