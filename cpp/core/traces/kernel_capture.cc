#include "traces/kernel_capture.h"

#include <algorithm>

#include "clock/clock.h"

namespace gpuprof::traces {

namespace {

constexpr uint64_t kLow = 0xffffffffULL;

std::string Dim3(const int32_t v[3]) {
  return std::to_string(v[0]) + "," + std::to_string(v[1]) + "," + std::to_string(v[2]);
}

}  // namespace

KernelCapture::KernelCapture(KernelCaptureOptions options, int64_t anchor, RowSink sink, NowFn now)
    : options_(std::move(options)), anchor_(anchor), sink_(std::move(sink)), now_(now) {}

Expected<std::unique_ptr<KernelCapture>> KernelCapture::Open(KernelCaptureOptions options,
                                                             int64_t anchor_mono_ns, RowSink sink,
                                                             NowFn now) {
  if (!options.plan.enabled()) return Status::Error("no trace mode is on");
  std::unique_ptr<KernelCapture> c(new KernelCapture(std::move(options), anchor_mono_ns,
                                                     std::move(sink), now ? now : &clock::NowNs));
  telemetry::KernelTracerOptions topt = c->options_.tracer;
  topt.launch_detail = true;
  c->SetStep(0);
  auto tracer = telemetry::KernelTracer::Open(c->options_.cupti_library, &KernelCapture::TagFn,
                                              c.get(), topt);
  if (!tracer) return tracer.status();
  c->tracer_ = std::move(tracer.value());
  c->library_path_ = c->tracer_->library_path();
  KernelCapture* self = c.get();
  c->poll_.Start(
      c->options_.poll_period, [self] { self->Poll(false); }, {}, "gpuprof-kernels");
  return c;
}

KernelCapture::~KernelCapture() { Stop(); }

uint64_t KernelCapture::TagFn(void* ctx) noexcept {
  auto* self = static_cast<KernelCapture*>(ctx);
  const uint64_t step = self->step_tag_.load(std::memory_order_relaxed);
  uint64_t window = 0;
  if (self->options_.plan.continuous()) {
    const int64_t rel = self->now_() - self->anchor_;
    window = static_cast<uint64_t>(self->options_.plan.WindowOf(rel)) + 1;
    if (window > kLow) window = 0;
  }
  if (step == 0 && window == 0) return telemetry::kNoTag;
  return (step << 32) | window;
}

void KernelCapture::SetStep(int64_t step) noexcept {
  step_ = step;
  const bool traced =
      step >= 0 && static_cast<uint64_t>(step) < kLow - 1 && options_.plan.StepTraced(step);
  step_tag_.store(traced ? static_cast<uint64_t>(step) + 1 : 0, std::memory_order_relaxed);
}

void KernelCapture::OnEvent(StepEdge edge, int64_t value) noexcept {
  if (edge == StepEdge::kExcludeBegin) {
    if (exclude_depth_++ == 0) step_tag_.store(0, std::memory_order_relaxed);
    return;
  }
  if (edge == StepEdge::kExcludeEnd) {
    if (exclude_depth_ > 0 && --exclude_depth_ == 0 && (!manual_ || in_manual_step_)) {
      SetStep(step_);  // back in the step it interrupted (an auto step advances as before)
    }
    return;
  }
  if (exclude_depth_ > 0) return;  // an evaluation's activity moves no step
  switch (edge) {
    case StepEdge::kOptimizerEnd:
      if (!manual_) advance_pending_ = true;
      break;
    case StepEdge::kForwardBegin:
    case StepEdge::kBackwardBegin:
    case StepEdge::kWaitBegin:
      if (advance_pending_ && !manual_) {
        advance_pending_ = false;
        SetStep(step_ + 1);
      }
      break;
    case StepEdge::kStepBegin: {
      manual_ = true;
      advance_pending_ = false;
      const int64_t stored = value > last_manual_ ? value : last_manual_ + 1;
      last_manual_ = stored;
      in_manual_step_ = true;
      SetStep(stored);
      break;
    }
    case StepEdge::kStepEnd:
      if (in_manual_step_) {
        in_manual_step_ = false;
        step_tag_.store(0, std::memory_order_relaxed);
      }
      break;
    case StepEdge::kExcludeBegin:
    case StepEdge::kExcludeEnd:
      break;  // handled above
  }
}

void KernelCapture::OnStepRow(const store::StepRow& step) {
  if (!options_.plan.StepTraced(step.step)) return;
  std::lock_guard<std::mutex> lock(mu_);
  step_spans_[step.step] = {step.start_ns, step.end_ns};
}

void KernelCapture::Drain() {
  if (!tracer_) return;
  if (!tracer_->stopped()) tracer_->Flush();
  telemetry::KernelTraceTotals t = tracer_->TakeTotals();
  stats_.untraced_kernels += t.unattributed.kernel_count;
  stats_.dropped_records += t.dropped_records;
  for (const telemetry::KernelLaunchTotals& l : t.launches) {
    const uint64_t step = l.tag >> 32, window = l.tag & kLow;
    Key key{l.name,
            l.device,
            l.stream,
            {l.grid[0], l.grid[1], l.grid[2]},
            {l.block[0], l.block[1], l.block[2]}};
    auto add = [&](Pending& p) {
      Acc& a = p.kernels[key];
      a.calls += l.count;
      a.ns += l.ns;
      a.min_ns = std::min(a.min_ns, l.min_ns);
      a.max_ns = std::max(a.max_ns, l.max_ns);
    };
    if (step != 0) add(steps_[static_cast<int64_t>(step - 1)]);
    if (window != 0) add(windows_[static_cast<int64_t>(window - 1)]);
    stats_.traced_kernels += l.count;
  }
}

void KernelCapture::Emit(std::vector<store::Row>* out, const std::map<Key, Acc>& kernels,
                         int64_t start, int64_t end, std::optional<int64_t> step) {
  std::vector<std::pair<const Key*, const Acc*>> order;
  order.reserve(kernels.size());
  for (const auto& [k, a] : kernels) order.emplace_back(&k, &a);
  std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    return x.second->ns != y.second->ns ? x.second->ns > y.second->ns : *x.first < *y.first;
  });
  const size_t keep = std::min(order.size(), std::max<size_t>(options_.max_rows_per_window, 1));
  for (size_t i = 0; i < keep; ++i) {
    const Key& k = *order[i].first;
    const Acc& a = *order[i].second;
    store::KernelRow r;
    r.window_start_ns = start;
    r.window_end_ns = end;
    r.name = k.name;
    r.calls = static_cast<int64_t>(a.calls);
    r.gpu_ns = static_cast<int64_t>(a.ns);
    r.source = "cupti";
    r.step = step;
    r.device = k.device;
    r.stream = k.stream;
    r.grid = Dim3(k.grid);
    r.block = Dim3(k.block);
    r.min_ns = static_cast<int64_t>(a.min_ns);
    r.max_ns = static_cast<int64_t>(a.max_ns);
    out->push_back(std::move(r));
  }
  if (keep < order.size()) {
    store::KernelRow other;
    other.window_start_ns = start;
    other.window_end_ns = end;
    other.source = "cupti";
    other.step = step;
    uint64_t min_ns = ~uint64_t{0}, max_ns = 0;
    for (size_t i = keep; i < order.size(); ++i) {
      other.calls += static_cast<int64_t>(order[i].second->calls);
      other.gpu_ns += static_cast<int64_t>(order[i].second->ns);
      min_ns = std::min(min_ns, order[i].second->min_ns);
      max_ns = std::max(max_ns, order[i].second->max_ns);
    }
    other.name = "(" + std::to_string(order.size() - keep) + " other kernels)";
    other.min_ns = static_cast<int64_t>(min_ns);
    other.max_ns = static_cast<int64_t>(max_ns);
    out->push_back(std::move(other));
  }
}

void KernelCapture::Poll(bool all) {
  std::vector<store::Row> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Drain();
    const int64_t rel_now = now_() - anchor_;
    for (auto it = steps_.begin(); it != steps_.end();) {
      auto span = step_spans_.find(it->first);
      const bool settled =
          span != step_spans_.end() && (all || rel_now - span->second.second >= options_.settle_ns);
      if (!settled || it->second.kernels.empty()) {
        ++it;
        continue;
      }
      const size_t before = out.size();
      Emit(&out, it->second.kernels, span->second.first, span->second.second, it->first);
      if (it->second.written) stats_.late_rows += out.size() - before;
      it->second.written = true;
      it->second.kernels.clear();
      ++it;
    }
    const int64_t w_ns = options_.plan.window_ns();
    for (auto it = windows_.begin(); it != windows_.end();) {
      const int64_t start = it->first * w_ns, end = start + w_ns;
      if (!all && rel_now - end < options_.settle_ns) break;  // ordered by window
      if (!it->second.kernels.empty()) {
        const size_t before = out.size();
        Emit(&out, it->second.kernels, start, end, std::nullopt);
        if (it->second.written) stats_.late_rows += out.size() - before;
      }
      it->second.written = true;
      it->second.kernels.clear();
      // Keep a written window's marker only while late records may still come.
      if (rel_now - end > 8 * options_.settle_ns) {
        it = windows_.erase(it);
      } else {
        ++it;
      }
    }
    // Written steps are forgotten once settled twice over.
    for (auto it = steps_.begin(); it != steps_.end();) {
      auto span = step_spans_.find(it->first);
      if (it->second.written && it->second.kernels.empty() && span != step_spans_.end() &&
          rel_now - span->second.second > 8 * options_.settle_ns) {
        step_spans_.erase(span);
        it = steps_.erase(it);
      } else {
        ++it;
      }
    }
    stats_.rows += out.size();
  }
  if (!out.empty()) sink_(std::move(out));
}

void KernelCapture::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  poll_.Stop();
  if (tracer_) tracer_->Stop();  // flushes: what was delivered stays for TakeTotals
  Poll(true);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [step, p] : steps_) {
    for (const auto& [k, a] : p.kernels) stats_.unplaced_kernels += a.calls;
    p.kernels.clear();
  }
}

KernelCapture::Stats KernelCapture::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<std::string> KernelCapture::TakeNotes() {
  return tracer_ ? tracer_->TakeNotes() : std::vector<std::string>{};
}

}  // namespace gpuprof::traces
