#include "lines/kernel_lines.h"

#include <bit>

#include "lines/sampler.h"

namespace gpuprof::lines {

KernelLineMap::KernelLineMap(size_t ring)
    : mask_(std::bit_ceil(ring < 16 ? size_t{16} : ring) - 1), ring_(new Slot[mask_ + 1]) {}

void KernelLineMap::CloseInterval(int32_t file_id, int32_t line) noexcept {
  const uint64_t seq = next_.load(std::memory_order_relaxed);
  Slot& s = ring_[seq & mask_];
  // seq last: a reader that sees this seq sees this key.
  s.seq.store(~uint64_t{0}, std::memory_order_relaxed);
  s.key.store(file_id < 0 ? -1 : Key(file_id, line), std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_release);
  next_.store(seq + 1, std::memory_order_release);
}

void KernelLineMap::Add(LineKernelTotals& into, const telemetry::KernelTagTotals& t) {
  into.kernel_count += static_cast<int64_t>(t.kernel_count);
  into.kernel_ns += static_cast<int64_t>(t.kernel_ns);
  into.kernel_busy_ns += static_cast<int64_t>(t.kernel_busy_ns);
  into.memcpy_ns += static_cast<int64_t>(t.memcpy_ns);
  into.memset_ns += static_cast<int64_t>(t.memset_ns);
}

void KernelLineMap::Resolve(const telemetry::KernelTraceTotals& totals, bool final) {
  Add(unattributed_, totals.unattributed);
  // Earlier pending tags first (their intervals may have closed since), then the new ones.
  std::vector<telemetry::KernelTagTotals> todo;
  todo.reserve(pending_.size() + totals.tags.size());
  for (auto& [tag, t] : pending_) todo.push_back(t);
  pending_.clear();
  todo.insert(todo.end(), totals.tags.begin(), totals.tags.end());
  const uint64_t open = next_.load(std::memory_order_acquire);
  for (const auto& t : todo) {
    if (t.tag != telemetry::kNoTag && (t.tag & kLineTagBit) != 0) {
      Add(lines_[static_cast<int64_t>(t.tag & ~kLineTagBit)], t);
      continue;
    }
    if (t.tag >= open) {  // its interval is still open (or the tag is not ours)
      if (final) {
        Add(unattributed_, t);
      } else {
        auto [it, fresh] = pending_.try_emplace(t.tag, t);
        if (!fresh) {
          telemetry::KernelTagTotals& p = it->second;
          p.kernel_count += t.kernel_count;
          p.kernel_ns += t.kernel_ns;
          p.kernel_busy_ns += t.kernel_busy_ns;
          p.memcpy_count += t.memcpy_count;
          p.memcpy_ns += t.memcpy_ns;
          p.memset_count += t.memset_count;
          p.memset_ns += t.memset_ns;
        }
      }
      continue;
    }
    const Slot& s = ring_[t.tag & mask_];
    if (s.seq.load(std::memory_order_acquire) != t.tag) {
      ++late_;  // the ring moved past this interval before its records arrived
      Add(unattributed_, t);
      continue;
    }
    const int64_t key = s.key.load(std::memory_order_relaxed);
    if (s.seq.load(std::memory_order_acquire) != t.tag) {
      ++late_;
      Add(unattributed_, t);
      continue;
    }
    if (key < 0) {
      Add(unattributed_, t);
    } else {
      Add(lines_[key], t);
    }
  }
}

void ApplyKernelTracing(GpuCollectionSummary& summary, bool active,
                        const std::optional<std::string>& error, const std::string& library,
                        uint32_t cupti_version, const LineKernelTotals& unattributed,
                        int64_t late_records, const std::vector<std::string>& notes) {
  if (!active) {
    if (error && summary.method)
      summary.diagnostics.push_back("CUPTI kernel tracing unavailable (" + *error +
                                    "): GPU time is estimated from sampled utilization");
    return;
  }
  summary.method = "cupti";
  summary.time_available = true;
  summary.time_reason.reset();
  summary.utilization_scope.clear();  // GPU time does not come from utilization
  // The estimate's scope note does not apply to measured kernel time.
  std::erase_if(summary.diagnostics, [](const std::string& d) {
    return d.rfind("GPU time is estimated from ", 0) == 0;  // device-wide or per-process
  });
  std::string version = cupti_version ? " " + std::to_string(cupti_version) : "";
  summary.diagnostics.push_back(
      "GPU time is measured kernel time (CUPTI" + version + ", " + library +
      "): each kernel's device time is charged to the recorded line that launched it "
      "(exactly, for launches from the profiled thread; launches from other threads go to "
      "the line running at the next sample); overlapping kernels of one sample count once");
  if (unattributed.kernel_count > 0)
    summary.diagnostics.push_back(
        std::to_string(unattributed.kernel_count) +
        (unattributed.kernel_count == 1 ? " kernel (" : " kernels (") +
        std::to_string(unattributed.kernel_ns / 1000) +
        " us) could not be charged to a recorded line (launched outside recorded code, "
        "before the first sample or still running at the end)");
  if (late_records > 0)
    summary.diagnostics.push_back(std::to_string(late_records) +
                                  " kernel records arrived too late to be matched to a line");
  // The tracer's notes report records it lost (dropped for lack of buffer space, or too late
  // to match): GPU time is missing from the totals or from its lines, which the user must see.
  for (const auto& n : notes) {
    summary.diagnostics.push_back("CUPTI: " + n);
    summary.losses.push_back("CUPTI: " + n);
  }
}

}  // namespace gpuprof::lines
