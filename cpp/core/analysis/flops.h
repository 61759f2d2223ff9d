// Peak throughput of GPU models and model FLOPs utilization (MFU).
//
// The peak table holds vendor datasheet figures for DENSE math, in TFLOPs per GPU: the
// "with sparsity" numbers NVIDIA quotes for Ampere and later are halved. fp32 is the
// non-tensor FP32 rate; tf32 / bf16 / fp16 / fp8 are tensor-core rates. A value of 0 means
// the datasheet lists no such rate (e.g. bf16 on V100): MFU for that dtype is unknown.
//
// GPU names are matched on whole words (split at spaces, '-' and '_', case-insensitive) so
// that "A10" does not match "A100" and "L4" does not match "L40S"; the table is ordered most
// specific first (H100 PCIe before H100).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "analysis/run_view.h"
#include "util/status.h"

namespace gpuprof::analysis {

enum class Dtype { kFp32, kTf32, kBf16, kFp16, kFp8 };

// Accepts bf16/bfloat16, fp16/float16/half, tf32, fp32/float32/float, fp8/float8*, with an
// optional "torch." prefix, any case. nullopt for anything else.
std::optional<Dtype> ParseDtype(std::string_view text);
std::string_view DtypeName(Dtype dtype);  // bf16 | fp16 | tf32 | fp32 | fp8

struct PeakTflopsEntry {
  std::string_view match;  // space-separated words that must all appear in the GPU name
  std::string_view label;  // display name
  double fp32 = 0, tf32 = 0, bf16 = 0, fp16 = 0, fp8 = 0;
  double For(Dtype dtype) const;
};

std::span<const PeakTflopsEntry> PeakTflopsTable();
// True when every word of `match` appears as a whole word of `gpu_name`.
bool GpuNameMatches(std::string_view gpu_name, std::string_view match);
// First table entry matching the name, or null.
const PeakTflopsEntry* FindPeakEntry(std::string_view gpu_name);
// Dense peak TFLOPs of one GPU of that model for that dtype; nullopt when unknown.
std::optional<double> PeakTflops(std::string_view gpu_name, Dtype dtype);

// The peak table as Markdown (GPU, matched words, fp32, tf32, bf16, fp16, fp8; "—" = none).
std::string PeakTflopsMarkdown();

// ---- Model FLOPs of a decoder-only transformer (profile(arch=TransformerArch(...))) --------
//
// Counting convention (README "MFU" states it for users):
//  * A multiply-add is 2 FLOPs. Only matmuls count: norms, softmax, activations, residual adds
//    and the embedding lookup (a gather) are left out — well under 1% at model scale, and not
//    tensor-core work.
//  * Forward, per token and layer, with h = hidden, d = h / heads, kv = kv_heads · d,
//    f = ffn_hidden, m = 3 weight matrices for a gated MLP (SwiGLU/GeGLU) else 2:
//      attention projections  2·h·h (Q) + 2·2·h·kv (K, V; GQA/MQA shrink kv) + 2·h·h (O)
//      attention scores       2·2·seq_len·h (QKᵀ and A·V). Every token is counted against the
//                             full seq_len: the causal mask is NOT halved, as in the PaLM /
//                             Megatron MFU formula (6·N + 12·L·h·seq per token), so the numbers
//                             compare with published MFU figures. A causal kernel that skips the
//                             masked half does less work than this counts.
//      MLP                    moe_top_k · m · 2·h·f, plus the router 2·h·moe_experts with MoE
//                             (only the top-k experts a token is routed to do work).
//    and once per token the LM head 2·h·vocab (tied or not, it is a matmul).
//  * Training = forward + backward, backward = 2 × forward (input and weight gradients).
//  * LoRA (lora_rank > 0): the base weights are frozen, so their matmuls (projections, MLP,
//    router, LM head) need the input gradient but no weight gradient: 2 × forward. Attention
//    scores have no weights and keep 3 ×. Adapters A (d_in × r) and B (r × d_out) sit on every
//    block linear — Q, K, V, O and the active experts' MLP matrices, not the router or LM
//    head — cost 2·r·(d_in + d_out) forward and 3 × that in training. (PEFT often adapts only
//    Q and V; the difference is a fraction of a percent.)
//  * Gradient checkpointing recomputes the blocks' forward during backward. MODEL FLOPs (what
//    MFU uses, PaLM's definition) exclude the recompute; HARDWARE FLOPs include it (one more
//    forward of the layers, not of the LM head). Checkpointing therefore lowers MFU: the step
//    takes longer for the same model FLOPs.
struct TransformerShape {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  std::optional<int64_t> kv_heads;  // nullopt = heads (multi-head attention)
  int64_t seq_len = 0;
  int64_t vocab = 0;
  std::optional<int64_t> ffn_hidden;  // nullopt = 4 × hidden
  bool gated_mlp = false;             // SwiGLU / GeGLU: 3 MLP matrices instead of 2
  int64_t moe_experts = 1;            // 1 = dense MLP
  int64_t moe_top_k = 1;              // experts each token is routed to
  std::optional<int64_t> lora_rank;   // nullopt = full fine-tune
  bool grad_checkpoint = false;
};

// Per-token FLOPs. The parts are forward FLOPs summed over all layers.
struct TransformerFlops {
  double attention_proj = 0;    // Q, K, V, O projections
  double attention_scores = 0;  // QKᵀ and A·V
  double mlp = 0;               // MLP (active experts) + router
  double lm_head = 0;
  double lora_adapters = 0;  // 0 without LoRA
  double forward = 0;        // sum of the parts
  double model = 0;          // training model FLOPs (forward + backward): what MFU uses
  double hardware = 0;       // model + the recomputed forward under gradient checkpointing
};

// Per-token FLOPs plus the per-step totals for tokens_per_step tokens per optimizer step.
struct TransformerStepFlops {
  TransformerFlops per_token;
  int64_t tokens_per_step = 0;
  double model_per_step = 0;  // stored as runs.flops_per_step (flops_method "arch")
  double hardware_per_step = 0;
};

// OK, or an error naming the field: "heads (5) must divide hidden (64)". Every count, and
// every optional one that is set, must be > 0.
Status ValidateTransformerShape(const TransformerShape& shape);
Expected<TransformerFlops> TransformerFlopsPerToken(const TransformerShape& shape);
// tokens_per_step: tokens one process trains on per optimizer step (batch × seq_len × micro-
// batches accumulated per step), > 0.
Expected<TransformerStepFlops> TransformerFlopsPerStep(const TransformerShape& shape,
                                                       int64_t tokens_per_step);

struct Mfu {
  double value = 0;            // achieved / peak, 0..1 (may exceed 1 on bad inputs)
  double achieved_tflops = 0;  // flops_per_step / steady mean step time
  double peak_tflops = 0;
  Dtype dtype = Dtype::kBf16;
  std::string gpu_label;
  double flops_per_step = 0;
  double step_ns = 0;                       // steady-state mean step time
  std::optional<std::string> flops_method;  // declared | arch | counted (runs.flops_method)
};

// Either an MFU value or the reason it is unknown ("MFU unknown: CPU run").
struct MfuResult {
  std::optional<Mfu> mfu;
  std::string reason;
};

// MFU = flops_per_step / steady-state mean step time / peak of ONE GPU of the run's model
// for the declared dtype. flops_per_step is this process's work per optimizer step; with one
// process per GPU (plain or DDP/torchrun training) this is the usual per-GPU MFU. The mean
// (not the median) step time is used because MFU is a throughput. When flops_per_step is
// missing and the Python layer recorded why the automatic count failed (a diagnostic with
// source kFlopsDiagnosticSource), the reason quotes it.
inline constexpr std::string_view kFlopsDiagnosticSource = "flops";
// How the report names a runs.flops_method value: "TransformerArch", "declared
// flops_per_step", "counted (FlopCounterMode, one step)"; other values verbatim.
std::string FlopsMethodLabel(std::string_view method);
MfuResult ComputeMfu(const RunView& view);

}  // namespace gpuprof::analysis
