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

struct Mfu {
  double value = 0;            // achieved / peak, 0..1 (may exceed 1 on bad inputs)
  double achieved_tflops = 0;  // flops_per_step / steady mean step time
  double peak_tflops = 0;
  Dtype dtype = Dtype::kBf16;
  std::string gpu_label;
  double flops_per_step = 0;
  double step_ns = 0;          // steady-state mean step time
};

// Either an MFU value or the reason it is unknown ("MFU unknown: CPU run").
struct MfuResult {
  std::optional<Mfu> mfu;
  std::string reason;
};

// MFU = flops_per_step / steady-state mean step time / peak of ONE GPU of the run's model
// for the declared dtype. flops_per_step is this process's work per optimizer step; with one
// process per GPU (plain or DDP/torchrun training) this is the usual per-GPU MFU. The mean
// (not the median) step time is used because MFU is a throughput.
MfuResult ComputeMfu(const RunView& view);

}  // namespace gpuprof::analysis
