#include "analysis/report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <set>

#include "analysis/format.h"
#include "analysis/pricing.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis {
namespace {

using nlohmann::json;

std::string Rule() {
  std::string line;
  for (int i = 0; i < kSummaryRuleWidth; ++i) line += "─";
  return line + "\n";
}

// First line of a (possibly multi-line) error, shortened for a one-line header.
std::string OneLine(const std::string& text, size_t max_chars = 120) {
  std::string line = text.substr(0, text.find('\n'));
  if (line.size() > max_chars) line = line.substr(0, max_chars - 1) + "…";
  return line;
}

std::string Tag(Severity s) { return "[" + std::string(SeverityTag(s)) + "]"; }

std::string UtcTime(int64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

template <typename T>
json J(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// "12.4% of 989 TFLOPs bf16 peak (H100 SXM; 123 TFLOPs achieved; FLOPs: TransformerArch)":
// the FLOPs source says which of the three methods produced the numerator.
std::string MfuText(const MfuResult& r) {
  if (!r.mfu) return r.reason;
  const Mfu& m = *r.mfu;
  return StrFormat("%s of %s TFLOPs %s peak (%s; %s TFLOPs achieved; FLOPs: %s)",
                   FormatPercent(m.value, 1).c_str(), FormatCompact(m.peak_tflops).c_str(),
                   std::string(DtypeName(m.dtype)).c_str(), m.gpu_label.c_str(),
                   FormatCompact(m.achieved_tflops).c_str(),
                   m.flops_method ? FlopsMethodLabel(*m.flops_method).c_str() : "method unknown");
}

std::string DeviceText(const store::RunInfo& run) {
  std::string out = run.device_kind.value_or("device unknown");
  if (run.gpu_model) {
    out += " · " + *run.gpu_model;
    if (run.gpu_count) out += StrFormat(" × %lld", static_cast<long long>(*run.gpu_count));
  } else if (run.gpu_count && *run.gpu_count > 0) {
    out += StrFormat(" · %lld GPU(s), model unknown", static_cast<long long>(*run.gpu_count));
  }
  return out;
}

std::string GpuAggText(const GpuAggregates& g) {
  std::vector<std::string> parts;
  parts.push_back(Plural(g.samples, "sample", "samples"));
  if (g.mean_util_pct) parts.push_back("mean util " + FormatPercent(*g.mean_util_pct / 100));
  if (g.peak_mem_used_bytes) {
    std::string s = "peak memory " + FormatBytes(*g.peak_mem_used_bytes);
    if (g.mem_total_bytes) s += " of " + FormatBytes(*g.mem_total_bytes);
    parts.push_back(s);
  }
  if (g.max_temp_c) parts.push_back(StrFormat("max temp %.0f °C", *g.max_temp_c));
  if (g.mean_power_w) parts.push_back(StrFormat("mean power %.0f W", *g.mean_power_w));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " · " : "") + parts[i];
  return out;
}

std::string HostAggText(const HostAggregates& h) {
  std::vector<std::string> parts;
  parts.push_back(Plural(h.samples, "sample", "samples"));
  if (h.mean_cpu_pct) {
    std::string s = "mean CPU " + FormatPercent(*h.mean_cpu_pct / 100);
    if (h.ncores) s += StrFormat(" of %.0f cores", *h.ncores);
    parts.push_back(s);
  }
  if (h.peak_mem_used_bytes) {
    std::string s = "peak memory " + FormatBytes(*h.peak_mem_used_bytes);
    if (h.mem_total_bytes) s += " of " + FormatBytes(*h.mem_total_bytes);
    parts.push_back(s);
  }
  if (h.max_disk_read_bps) {
    parts.push_back("peak disk read " + FormatBandwidth(*h.max_disk_read_bps));
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? " · " : "") + parts[i];
  return out;
}

// The whole run's stalls (host_stalls): count, total, longest.
struct StallTotals {
  size_t count = 0;
  double total_ns = 0;
  double longest_ns = 0;
};
StallTotals TotalStalls(const RunView& v) {
  StallTotals t;
  for (const store::StallRow& s : v.data.stalls) {
    ++t.count;
    t.total_ns += static_cast<double>(s.duration_ns);
    t.longest_ns = std::max(t.longest_ns, static_cast<double>(s.duration_ns));
  }
  return t;
}

// The whole run's CPU wait (cpu_waits): total (summed over threads) and the share of step time.
double TotalCpuWaitNs(const RunView& v) {
  double total = 0;
  for (const store::CpuWaitRow& w : v.data.cpu_waits) total += static_cast<double>(w.wait_ns);
  return total;
}

// One telemetry line: the status row when there is one, plus what was actually sampled.
std::string TelemetryLine(const RunView& v, const std::string& source) {
  const store::TelemetryStatusRow* row = v.Telemetry(source);
  std::string out;
  if (row) {
    out = row->available ? "available" : "unavailable";
    if (row->backend) out += " (" + *row->backend + ")";
    if (!row->available)
      out += ": " + row->reason.value_or("no reason recorded");
    else if (row->reason)
      out += " · " + *row->reason;
  } else {
    out = "no status recorded";
  }
  if (source == "gpu" && v.gpu.samples > 0) out += " · " + GpuAggText(v.gpu);
  if (source == "kernels" && !v.data.kernels.empty() && row && !row->available) {
    // Recorded otherwise than by the run's own tracer (gpuprof nsys-import).
    std::set<std::string> from;
    for (const store::KernelRow& k : v.data.kernels) from.insert(k.source);
    std::string names;
    for (const std::string& f : from) names += (names.empty() ? "" : ", ") + f;
    out += " · " + Plural(v.data.kernels.size(), "kernel row", "kernel rows") + " added later (" +
           names + ")";
  }
  if (source == "host" && v.host.samples > 0) out += " · " + HostAggText(v.host);
  if (source == "stalls" && v.stalls_watched) {
    const StallTotals t = TotalStalls(v);
    if (t.count == 0) {
      out += " · the process was never held off the CPU";
    } else {
      out += " · held off the CPU " + Plural(t.count, "time", "times") + ", " +
             FormatDuration(t.total_ns) + " in all, longest " + FormatDuration(t.longest_ns);
    }
  }
  if (source == "cpu_wait" && v.cpu_wait_watched) {
    const double total = TotalCpuWaitNs(v);
    if (total <= 0) {
      out += " · the training's threads never queued for a CPU (1 ms in 20 ms or more)";
    } else {
      double steps_ns = 0;
      for (const StepView& s : v.steps) steps_ns += static_cast<double>(s.duration_ns);
      out += " · the training's threads queued " + FormatDuration(total) + " for a CPU";
      if (steps_ns > 0) out += " (" + FormatPercent(total / steps_ns) + " of step time)";
    }
  }
  return out;
}

// "(200 steps, avg 121.3 ms)" or "(no steps recorded)".
std::string StepsHeadline(const RunView& v) {
  if (!v.all) return "(no steps recorded)";
  return StrFormat("(%s, avg %s)", Plural(v.all->count, "step", "steps").c_str(),
                   FormatDuration(v.all->mean_ns).c_str());
}

json DurationJson(const std::optional<DurationStats>& s) {
  if (!s) return nullptr;
  return json{{"count", s->count},   {"total_ns", s->total_ns}, {"mean_ns", s->mean_ns},
              {"p50_ns", s->p50_ns}, {"p99_ns", s->p99_ns},     {"min_ns", s->min_ns},
              {"max_ns", s->max_ns}};
}

}  // namespace

RuleContext MakeRuleContext(const AnalysisOptions& options, const char* env_rate) {
  RuleContext ctx;
  if (options.gpu_rate_usd_per_hour) {
    ctx.gpu_rate_usd_per_hour = options.gpu_rate_usd_per_hour;
    ctx.gpu_rate_source = "option";
    return ctx;
  }
  if (env_rate && *env_rate) {
    if (auto rate = ParseRate(env_rate)) {
      ctx.gpu_rate_usd_per_hour = rate;
      ctx.gpu_rate_source = "GPUPROF_GPU_RATE";
    } else {
      ctx.gpu_rate_error = StrFormat(
          "GPUPROF_GPU_RATE='%s' is not a non-negative number of USD per GPU-hour", env_rate);
    }
  }
  return ctx;
}

RuleContext MakeRuleContextFromEnv(const AnalysisOptions& options) {
  return MakeRuleContext(options, std::getenv("GPUPROF_GPU_RATE"));
}

void ApplyStoredRate(const store::RunInfo& run, const AnalysisOptions& options,
                     RuleContext* context) {
  if (options.gpu_rate_usd_per_hour || !run.config_json) return;
  const json config = json::parse(*run.config_json, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return;
  auto rate = config.find(kStoredRateKey);
  if (rate == config.end() || !rate->is_number() || !std::isfinite(rate->get<double>()) ||
      rate->get<double>() < 0) {
    return;
  }
  std::string source = "stored with the run";
  if (auto it = config.find(kStoredRateSourceKey); it != config.end() && it->is_string()) {
    source = it->get<std::string>() + ", stored with the run";
  }
  context->gpu_rate_usd_per_hour = rate->get<double>();
  context->gpu_rate_source = std::move(source);
  context->gpu_rate_error.reset();
}

Report Analyze(store::RunData data, const RuleContext& context) {
  Report report;
  report.view = BuildRunView(std::move(data));
  report.mfu = ComputeMfu(report.view);
  // Group rules need every rank: AnalyzeGroup (group.h).
  EvaluateRules(
      /*group=*/false,
      [&](const RuleSpec& spec) { return EvaluateRule(spec, report.view, context); },
      &report.insights, &report.not_evaluated, &report.explained);
  std::string why;
  if (auto rate = rules::ResolveCostRate(report.view, context, &why)) {
    report.cost_rate_usd_per_hour = rate->usd_per_hour;
    report.cost_rate_source = rate->source;
  }
  if (context.peer_waits) report.other_ranks_in_store = context.peer_waits->other_ranks;
  return report;
}

namespace {
nlohmann::json InsightJson(const Insight& in) {
  return {{"rule_id", in.rule_id}, {"family", in.family}, {"severity", SeverityName(in.severity)},
          {"message", in.message}, {"fix", in.fix},       {"evidence", in.evidence}};
}

// The rule ids that `rule_id`'s finding explains.
std::vector<std::string> ExplainedBy(const std::vector<Explained>& explained,
                                     const std::string& rule_id) {
  std::vector<std::string> ids;
  for (const Explained& e : explained) {
    if (e.by == rule_id) ids.push_back(e.insight.rule_id);
  }
  return ids;
}
}  // namespace

nlohmann::json InsightsJson(const std::vector<Insight>& insights,
                            const std::vector<Explained>& explained) {
  nlohmann::json out = nlohmann::json::array();
  for (const Insight& in : insights) {
    nlohmann::json j = InsightJson(in);
    j["explains"] = ExplainedBy(explained, in.rule_id);
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json ExplainedJson(const std::vector<Explained>& explained) {
  nlohmann::json out = nlohmann::json::array();
  for (const Explained& e : explained) {
    nlohmann::json j = InsightJson(e.insight);
    j["explained_by"] = e.by;
    out.push_back(std::move(j));
  }
  return out;
}

void ApplyPrecedence(std::vector<Insight>* fired, std::vector<Explained>* explained) {
  constexpr size_t kNone = static_cast<size_t>(-1);
  const size_t n = fired->size();
  std::vector<size_t> by(n, kNone);
  for (size_t i = 0; i < n; ++i) {
    const Insight& x = (*fired)[i];
    for (size_t j = 0; j < n && by[i] == kNone; ++j) {
      const RuleSpec* spec = j == i ? nullptr : FindRule((*fired)[j].rule_id);
      if (!spec) continue;
      for (const RuleExplains& e : spec->explains) {
        if (e.rule_id != x.rule_id) continue;
        if (!e.when.empty()) {
          auto it = x.evidence.find(e.when);
          if (it == x.evidence.end() || !it->is_boolean() || !it->get<bool>()) continue;
        }
        if (!e.same.empty()) {
          const nlohmann::json& other = (*fired)[j].evidence;
          auto mine = x.evidence.find(e.same);
          auto theirs = other.find(e.same);
          if (mine == x.evidence.end() || theirs == other.end() || *mine != *theirs) continue;
        }
        by[i] = j;
        break;
      }
    }
  }
  // Each finding's root: the first finding of its chain that nothing explains. The registry's
  // relation is acyclic but for pairs with exclusive conditions (tested); the bound only guards
  // against a bad edit (a cycle is kept).
  std::vector<std::string> root_id(n);
  for (size_t i = 0; i < n; ++i) {
    size_t root = i;
    for (size_t hops = 0; by[root] != kNone && hops < n; ++hops) root = by[root];
    if (root != i && by[root] == kNone) root_id[i] = (*fired)[root].rule_id;
  }
  std::vector<Insight> kept;
  for (size_t i = 0; i < n; ++i) {
    if (root_id[i].empty()) {
      kept.push_back(std::move((*fired)[i]));
    } else {
      explained->push_back({root_id[i], std::move((*fired)[i])});
    }
  }
  *fired = std::move(kept);
}

nlohmann::json NotEvaluatedJson(const std::vector<NotEvaluated>& not_evaluated) {
  nlohmann::json out = nlohmann::json::array();
  for (const NotEvaluated& n : not_evaluated) {
    out.push_back({{"rule_id", n.rule_id}, {"family", n.family}, {"reason", n.reason}});
  }
  return out;
}

void EvaluateRules(bool group, const std::function<RuleResult(const RuleSpec&)>& evaluate,
                   std::vector<Insight>* insights, std::vector<NotEvaluated>* not_evaluated,
                   std::vector<Explained>* explained) {
  std::vector<Insight> fired;
  for (const RuleSpec& spec : Rules()) {
    if (spec.group() != group) continue;
    RuleResult r = evaluate(spec);
    if (r.insight) {
      fired.push_back(std::move(*r.insight));
    } else if (r.not_evaluated) {
      not_evaluated->push_back({spec.id, spec.family, *r.not_evaluated});
    }
  }
  if (explained) ApplyPrecedence(&fired, explained);
  std::stable_sort(fired.begin(), fired.end(),
                   [](const Insight& a, const Insight& b) { return a.severity > b.severity; });
  for (Insight& insight : fired) insights->push_back(std::move(insight));
}

namespace {
// What was measured but not recorded (rows the store could not take, events the ring dropped):
// the diagnostics of source "store" and "recorder" at level warning or error. Every figure of
// the report is computed without them, so the report says so up front.
std::vector<std::string> DataLoss(const RunView& v) {
  std::vector<std::string> out;
  for (const store::DiagnosticRow& d : v.data.diagnostics) {
    if ((d.source == "store" || d.source == "recorder") &&
        (d.level == "warning" || d.level == "error")) {
      out.push_back(d.message);
    }
  }
  return out;
}

// The likeliest cause of a run without steps whose loop did run: it ran on another thread
// than the instrumented one (diagnostics of source "threads", written at stop).
std::string ThreadNotes(const RunView& v, const char* indent) {
  std::string out;
  for (const store::DiagnosticRow& d : v.data.diagnostics) {
    if (d.source == "threads") out += indent + d.message + "\n";
  }
  return out;
}
}  // namespace

std::string FormatSummary(const Report& report, const std::string& db_path) {
  const RunView& v = report.view;
  const store::RunInfo& run = v.run();
  std::string out = Rule();
  std::string header = "gpuprof · " + run.run_name + "  " + StepsHeadline(v);
  if (run.status == "failed") {
    header += " · failed: " + OneLine(run.error.value_or("no error recorded"));
  }
  out += header + "\n";
  for (const std::string& loss : DataLoss(v)) out += "  Data loss: " + loss + "\n";
  if (v.steps.empty()) {
    out +=
        "  No steps were recorded. Auto mode ends a step at each optimizer.step();\n"
        "  for loops without one, use profile(..., auto=False) and prof.step().\n";
    out += ThreadNotes(v, "  ");
  }
  if (report.insights.empty()) {
    out += "  Insights: none (nothing crossed a rule threshold)\n";
  } else {
    out += StrFormat("  Insights (%zu):\n", report.insights.size());
    const size_t shown = std::min(report.insights.size(), kSummaryMaxInsights);
    for (size_t i = 0; i < shown; ++i) {
      const Insight& in = report.insights[i];
      out += StrFormat("  %-8s%s\n", Tag(in.severity).c_str(), in.message.c_str());
      // The fix rides along for the findings that need action (HIGH/MED).
      if ((in.severity == Severity::kHigh || in.severity == Severity::kMed) && !in.fix.empty()) {
        out += "          → " + in.fix + "\n";
      }
      // Findings of the same cause, folded under this one (the registry's precedence).
      if (const auto ids = ExplainedBy(report.explained, in.rule_id); !ids.empty()) {
        std::string list;
        for (size_t k = 0; k < ids.size(); ++k) list += (k ? ", " : "") + ids[k];
        out += "          (same cause, also explains: " + list + ")\n";
      }
    }
    if (shown < report.insights.size()) {
      out += StrFormat("  … %zu more in the full report\n", report.insights.size() - shown);
    }
  }
  if (!report.not_evaluated.empty()) {
    // One line: as many rule ids as fit, then how many more.
    const std::string head = StrFormat("  Not evaluated (%zu): ", report.not_evaluated.size());
    const std::string tail = " (reasons in the full report)";
    std::string ids;
    size_t shown = 0;
    for (const NotEvaluated& n : report.not_evaluated) {
      const std::string next = (shown ? ", " : "") + n.rule_id;
      const size_t rest = report.not_evaluated.size() - shown - 1;
      const std::string more = rest ? StrFormat(", … +%zu", rest) : std::string();
      if (shown > 0 && head.size() + ids.size() + next.size() + more.size() + tail.size() >
                           kSummaryMaxLineColumns) {
        break;
      }
      ids += next;
      ++shown;
    }
    if (shown < report.not_evaluated.size()) {
      ids += StrFormat(", … +%zu", report.not_evaluated.size() - shown);
    }
    out += head + ids + tail + "\n";
  }
  out += StrFormat("  Full report: gpuprof insights %s %lld\n", ShellQuoteIfNeeded(db_path).c_str(),
                   static_cast<long long>(run.run_id));
  if (run.group_id && run.world_size && *run.world_size > 1) {
    // A rank of a distributed job: its peers are compared in the group report, which needs
    // them in one file.
    const long long world = *run.world_size;
    const std::string group = ShellQuoteIfNeeded(*run.group_id);
    const auto& others = report.other_ranks_in_store;
    if (others && static_cast<long long>(*others) + 1 < world) {
      out += StrFormat(
          "  %lld of %lld ranks are in this file; to compare them all: gpuprof merge all.db %s "
          "<the other ranks' files>, then gpuprof insights all.db --group %s\n",
          static_cast<long long>(*others) + 1, world, ShellQuoteIfNeeded(db_path).c_str(),
          group.c_str());
    } else {
      out += StrFormat("  All %lld ranks: gpuprof insights %s --group %s\n", world,
                       ShellQuoteIfNeeded(db_path).c_str(), group.c_str());
    }
  }
  out += Rule();
  return ValidUtf8(out);
}

// The traced kernels (GPU time) or, on a CPU run, CPU operators (self CPU time) of a run,
// summed per name over all traced windows.
struct TopTraced {
  bool recorded = false;
  bool cpu = false;
  std::set<std::string> sources;
  std::set<std::pair<int64_t, int64_t>> windows;
  size_t steps = 0;  // windows that are traced steps
  double total_ns = 0;
  struct Entry {
    std::string name;
    int64_t calls = 0;
    double ns = 0;
  };
  std::vector<Entry> top;  // descending ns
  size_t names = 0;
};

TopTraced ComputeTopTraced(const RunView& v, size_t n) {
  TopTraced t;
  std::map<std::string, TopTraced::Entry> by_name;
  std::set<int64_t> steps;
  auto add = [&](const std::string& name, int64_t calls, int64_t ns, int64_t a, int64_t b,
                 const std::optional<int64_t>& step, const std::string& source) {
    auto& e = by_name[name];
    e.name = name;
    e.calls += calls;
    e.ns += static_cast<double>(ns);
    t.total_ns += static_cast<double>(ns);
    t.windows.emplace(a, b);
    if (step) steps.insert(*step);
    t.sources.insert(source);
  };
  const TracedTimes traced = CollectTracedTimes(v.data);
  t.cpu = traced.cpu;
  for (const TracedRow& r : traced.rows) {
    add(*r.name, r.calls, r.ns, r.window_start_ns, r.window_end_ns, r.step, *r.source);
  }
  t.recorded = !by_name.empty();
  t.steps = steps.size();
  t.names = by_name.size();
  for (auto& [name, e] : by_name) t.top.push_back(std::move(e));
  std::sort(t.top.begin(), t.top.end(), [](const auto& a, const auto& b) {
    return a.ns != b.ns ? a.ns > b.ns : a.name < b.name;
  });
  if (t.top.size() > n) t.top.resize(n);
  return t;
}

std::string TopTracedText(const RunView& v) {
  const TopTraced t = ComputeTopTraced(v, kReportTopKernels);
  if (!t.recorded) {
    const auto* status = v.Telemetry("kernels");
    std::string why =
        status && status->reason ? *status->reason : "no kernel trace was recorded for this run";
    return "\nTop kernels: not recorded — " + why + "\n";
  }
  std::string sources;
  for (const auto& s : t.sources) sources += (sources.empty() ? "" : ", ") + s;
  std::string where = t.steps > 0 ? Plural(t.steps, "traced step", "traced steps")
                                  : Plural(t.windows.size(), "window", "windows");
  std::string out = StrFormat("\nTop %s (%s · %s · %s %s%s)\n", t.cpu ? "CPU operators" : "kernels",
                              sources.c_str(), where.c_str(), t.cpu ? "self CPU time" : "GPU time",
                              FormatDuration(t.total_ns).c_str(),
                              t.cpu ? "; host time, a CPU run has no GPU kernels" : "");
  out += StrFormat("  %7s %10s %8s %10s  %s\n", "share", t.cpu ? "self CPU" : "GPU time", "calls",
                   "per call", t.cpu ? "operator" : "kernel");
  for (const auto& e : t.top) {
    const double share = t.total_ns > 0 ? e.ns / t.total_ns : 0;
    out +=
        StrFormat("  %7s %10s %8lld %10s  %s\n", FormatPercent(share, 1).c_str(),
                  FormatDuration(e.ns).c_str(), static_cast<long long>(e.calls),
                  e.calls > 0 ? FormatDuration(e.ns / static_cast<double>(e.calls)).c_str() : "—",
                  OneLine(e.name, 90).c_str());
  }
  if (t.names > t.top.size()) {
    out += StrFormat("  … %zu more %s\n", t.names - t.top.size(), t.cpu ? "operators" : "kernels");
  }
  return out;
}

std::string FormatFullReport(const Report& report) {
  const RunView& v = report.view;
  const store::RunInfo& run = v.run();
  std::string out;
  out += StrFormat("gpuprof · %s · run %lld  %s\n", run.run_name.c_str(),
                   static_cast<long long>(run.run_id), StepsHeadline(v).c_str());
  std::string status = run.status;
  if (run.status == "failed") {
    status += ": " + OneLine(run.error.value_or("no error recorded"), 300);
  }
  if (run.status == "running") {
    status += " (no end recorded: still running, or the process was killed)";
  }
  out += "  status     " + status + "\n";
  for (const std::string& loss : DataLoss(v)) out += "  data loss  " + loss + "\n";
  out += "  started    " + UtcTime(run.start_unix_ns) + "\n";
  out += "  duration   " +
         OrDash(v.duration_ns, [](int64_t ns) { return FormatDuration(static_cast<double>(ns)); }) +
         (v.duration_from_steps ? " (to the last step's end)" : "") + "\n";
  out += "  device     " + DeviceText(run) + "\n";
  out += "  backend    " + run.gpu_backend.value_or("—") + "\n";
  if (!run.hostname.empty() || run.pid) {
    out += "  host       " + (run.hostname.empty() ? std::string("—") : run.hostname) +
           StrFormat(" · pid %lld", static_cast<long long>(run.pid)) + "\n";
  }
  if (run.rank || run.group_id) {
    out += "  group      " + run.group_id.value_or("—") + " · rank " +
           OrDash(run.rank, [](int64_t r) { return std::to_string(r); }) + " of " +
           OrDash(run.world_size, [](int64_t w) { return std::to_string(w); }) +
           (run.group_id
                ? " · all ranks: gpuprof insights DB --group " + ShellQuoteIfNeeded(*run.group_id)
                : std::string()) +
           "\n";
  }
  std::string versions = "gpuprof " + run.gpuprof_version;
  if (run.python_version) versions += " · Python " + *run.python_version;
  if (run.torch_version) versions += " · torch " + *run.torch_version;
  out += "  versions   " + versions + "\n";
  out += "  workload   dtype " + run.dtype.value_or("—") + " · FLOPs/step " +
         OrDash(run.flops_per_step, [](double f) { return StrFormat("%.3g", f); }) +
         (run.flops_method ? " (" + *run.flops_method + ")" : "") + "\n";

  out += "\n";
  if (!v.all) {
    out +=
        "Steps: none recorded. Auto mode ends a step at each optimizer.step(); for other loops "
        "use the manual API (profile(..., auto=False) and prof.step()).\n";
    out += ThreadNotes(v, "  ");
  } else {
    const DurationStats& a = *v.all;
    out += StrFormat("Steps (%zu)\n", a.count);
    out += StrFormat("  all steps    mean %s · p50 %s · p99 %s · min %s · max %s\n",
                     FormatDuration(a.mean_ns).c_str(), FormatDuration(a.p50_ns).c_str(),
                     FormatDuration(a.p99_ns).c_str(), FormatDuration(a.min_ns).c_str(),
                     FormatDuration(a.max_ns).c_str());
    if (v.steady) {
      const DurationStats& s = *v.steady;
      out +=
          StrFormat("  steady state steps %lld–%lld: mean %s · p50 %s · p99 %s\n",
                    static_cast<long long>(v.steps[v.steady_begin].step),
                    static_cast<long long>(v.steps.back().step), FormatDuration(s.mean_ns).c_str(),
                    FormatDuration(s.p50_ns).c_str(), FormatDuration(s.p99_ns).c_str());
      const Breakdown& b = v.breakdown;
      out += "  breakdown (share of steady-state step time; CPU wall clock):\n";
      auto row = [&](const std::string& name, const std::string& share, const std::string& note) {
        out += "    " + PadRight(name, 14) + " " + PadLeft(share, 8) + note + "\n";
      };
      row("loader wait", OrDash(b.wait_fraction, [](double f) { return FormatPercent(f, 1); }),
          b.wait_fraction ? StrFormat("   (%s, %zu steps)", WaitSourceLabel(b.wait_source).c_str(),
                                      b.wait_steps)
                          : std::string("   (not measured)"));
      bool any_gpu = false;
      for (const PhaseSummary& p : b.phases) {
        any_gpu = any_gpu || p.gpu_mean_ns.has_value();
        row(p.name, FormatPercent(p.wall_fraction, 1),
            "   " + FormatDuration(p.wall_total_ns / std::max<size_t>(1, p.steps)) + "/step" +
                (p.derived ? " (collectives after the last gradient bucket was ready, from "
                             "comm_buckets; taken out of backward)"
                           : ""));
      }
      if (b.phases.empty()) row("phases", "—", "   (no phase timings recorded)");
      row("other", OrDash(b.other_fraction, [](double f) { return FormatPercent(f, 1); }),
          b.other_fraction ? "   (outside wait and phases)" : "   (needs wait and phases)");
      if (any_gpu) {
        out += "  GPU time per step (CUDA events; separate from the CPU wall clock above):\n";
        for (const PhaseSummary& p : b.phases) {
          out += "    " + PadRight(p.name, 14) + " " +
                 PadLeft(OrDash(p.gpu_mean_ns, [](double ns) { return FormatDuration(ns); }), 8) +
                 (p.gpu_mean_ns ? "   (" + Plural(p.gpu_steps, "step", "steps") + " measured)"
                                : std::string("   (not measured)")) +
                 "\n";
        }
      }
    } else {
      out += "  steady state: needs at least 2 steps\n";
    }
  }
  out += "  MFU          " + MfuText(report.mfu) + "\n";

  out += "\nTelemetry\n";
  std::vector<std::string> sources = {"gpu", "host"};
  for (const auto& t : v.data.telemetry) {
    if (std::find(sources.begin(), sources.end(), t.source) == sources.end()) {
      sources.push_back(t.source);
    }
  }
  for (const std::string& s : sources) {
    out += "  " + PadRight(s, 12) + " " + TelemetryLine(v, s) + "\n";
  }
  out += TopTracedText(v);

  out += "\n";
  if (report.insights.empty()) {
    out += "Insights: none (nothing crossed a rule threshold)\n";
  } else {
    out += StrFormat("Insights (%zu)\n", report.insights.size());
    for (const Insight& in : report.insights) {
      out += StrFormat("  %-8s%s\n", Tag(in.severity).c_str(), in.message.c_str());
      out += "          fix: " + in.fix + "\n";
      out += "          rule: " + in.rule_id + " (" + in.family + ")\n";
      for (const Explained& e : report.explained) {
        if (e.by == in.rule_id) {
          out += "          explains: " + e.insight.rule_id + " — " + e.insight.message + "\n";
        }
      }
    }
  }
  if (!report.not_evaluated.empty()) {
    out += StrFormat("\nNot evaluated (%zu): an input was not measured or the run is too short\n",
                     report.not_evaluated.size());
    size_t width = 0;
    for (const auto& n : report.not_evaluated) width = std::max(width, n.rule_id.size());
    for (const auto& n : report.not_evaluated) {
      out +=
          StrFormat("  %-*s  %s\n", static_cast<int>(width), n.rule_id.c_str(), n.reason.c_str());
    }
  }
  return ValidUtf8(out);
}

json ReportJson(const Report& report) {
  const RunView& v = report.view;
  const store::RunInfo& r = v.run();
  json run = {
      {"run_id", r.run_id},
      {"run_name", r.run_name},
      {"status", r.status},
      {"error", J(r.error)},
      {"start_unix_ns", r.start_unix_ns},
      {"end_ns", J(r.end_ns)},
      {"duration_ns", J(v.duration_ns)},
      {"device_kind", J(r.device_kind)},
      {"gpu_backend", J(r.gpu_backend)},
      {"gpu_model", J(r.gpu_model)},
      {"gpu_count", J(r.gpu_count)},
      {"dtype", J(r.dtype)},
      {"flops_per_step", J(r.flops_per_step)},
      {"flops_method", J(r.flops_method)},
      {"hostname", r.hostname},
      {"pid", r.pid},
      {"group_id", J(r.group_id)},
      {"rank", J(r.rank)},
      {"world_size", J(r.world_size)},
      {"gpuprof_version", r.gpuprof_version},
      {"python_version", J(r.python_version)},
      {"torch_version", J(r.torch_version)},
  };
  const Breakdown& b = v.breakdown;
  json phases = json::array();
  for (const PhaseSummary& p : b.phases) {
    phases.push_back({{"name", p.name},
                      {"steps", p.steps},
                      {"calls", p.calls},
                      {"wall_fraction", p.wall_fraction},
                      {"wall_mean_ns", p.steps ? json(p.wall_total_ns / p.steps) : json(nullptr)},
                      {"gpu_mean_ns", J(p.gpu_mean_ns)},
                      {"gpu_steps", p.gpu_steps},
                      {"derived", p.derived}});
  }
  json steps = {
      {"count", v.steps.size()},
      {"all", DurationJson(v.all)},
      {"steady", DurationJson(v.steady)},
      {"steady_first_step", v.steady ? json(v.steps[v.steady_begin].step) : json(nullptr)},
      {"breakdown",
       {{"wait_fraction", J(b.wait_fraction)},
        {"wait_source", J(b.wait_source)},
        {"wait_steps", b.wait_steps},
        {"phases", phases},
        {"other_fraction", J(b.other_fraction)}}},
  };
  json mfu = {{"value", nullptr},       {"peak_tflops", nullptr}, {"achieved_tflops", nullptr},
              {"dtype", nullptr},       {"gpu", nullptr},         {"reason", nullptr},
              {"flops_method", nullptr}};
  if (report.mfu.mfu) {
    const Mfu& m = *report.mfu.mfu;
    mfu["value"] = m.value;
    mfu["peak_tflops"] = m.peak_tflops;
    mfu["achieved_tflops"] = m.achieved_tflops;
    mfu["dtype"] = DtypeName(m.dtype);
    mfu["gpu"] = m.gpu_label;
    mfu["flops_method"] = J(m.flops_method);
  } else {
    mfu["reason"] = report.mfu.reason;
  }
  json telemetry = json::array();
  for (const auto& t : v.data.telemetry) {
    telemetry.push_back({{"source", t.source},
                         {"available", t.available},
                         {"backend", J(t.backend)},
                         {"reason", J(t.reason)}});
  }
  const GpuAggregates& g = v.gpu;
  json gpu = {{"samples", g.samples},
              {"gpus_sampled", g.gpus_sampled},
              {"mean_util_pct", J(g.mean_util_pct)},
              {"max_util_pct", J(g.max_util_pct)},
              {"peak_mem_used_bytes", J(g.peak_mem_used_bytes)},
              {"mem_total_bytes", J(g.mem_total_bytes)},
              {"peak_mem_fraction", J(g.peak_mem_fraction)},
              {"peak_proc_mem_bytes", J(g.peak_proc_mem_bytes)},
              {"max_temp_c", J(g.max_temp_c)},
              {"mean_power_w", J(g.mean_power_w)},
              {"max_power_w", J(g.max_power_w)},
              {"min_sm_clock_mhz", J(g.min_sm_clock_mhz)},
              {"max_sm_clock_mhz", J(g.max_sm_clock_mhz)},
              {"max_pcie_rx_bps", J(g.max_pcie_rx_bps)},
              {"max_pcie_tx_bps", J(g.max_pcie_tx_bps)}};
  const HostAggregates& h = v.host;
  json host = {{"samples", h.samples},
               {"mean_cpu_pct", J(h.mean_cpu_pct)},
               {"max_cpu_pct", J(h.max_cpu_pct)},
               {"ncores", J(h.ncores)},
               {"peak_mem_used_bytes", J(h.peak_mem_used_bytes)},
               {"mem_total_bytes", J(h.mem_total_bytes)},
               {"peak_page_cache_bytes", J(h.peak_page_cache_bytes)},
               {"mean_swap_in_bps", J(h.mean_swap_in_bps)},
               {"max_swap_in_bps", J(h.max_swap_in_bps)},
               {"mean_disk_read_bps", J(h.mean_disk_read_bps)},
               {"max_disk_read_bps", J(h.max_disk_read_bps)},
               {"max_disk_read_iops", J(h.max_disk_read_iops)},
               {"mean_proc_cpu_pct", J(h.mean_proc_cpu_pct)},
               {"peak_proc_rss_bytes", J(h.peak_proc_rss_bytes)}};
  // The stall watch over the whole run; null when it did not run (unknown, not "no stalls").
  json stalls = nullptr;
  if (v.stalls_watched) {
    const StallTotals t = TotalStalls(v);
    stalls = {{"count", t.count}, {"total_ns", t.total_ns}, {"longest_ns", t.longest_ns}};
  }
  // The CPU wait over the whole run (summed over threads); null when it was not read.
  json cpu_wait = nullptr;
  if (v.cpu_wait_watched) {
    cpu_wait = {{"total_ns", TotalCpuWaitNs(v)}, {"stretches", v.data.cpu_waits.size()}};
  }
  json diagnostics = json::array();
  for (const store::DiagnosticRow& d : v.data.diagnostics) {
    diagnostics.push_back(
        {{"ts_ns", J(d.ts_ns)}, {"level", d.level}, {"source", d.source}, {"message", d.message}});
  }
  json insights = InsightsJson(report.insights, report.explained);
  json not_evaluated = NotEvaluatedJson(report.not_evaluated);
  // The traced kernels (GPU time) or, on a CPU run, operators (self CPU time), top first.
  json top_kernels;
  {
    const TopTraced t = ComputeTopTraced(v, kReportTopKernels);
    if (!t.recorded) {
      const auto* status = v.Telemetry("kernels");
      top_kernels = {{"recorded", false},
                     {"reason", status && status->reason
                                    ? *status->reason
                                    : std::string("no kernel trace was recorded for this run")}};
    } else {
      json entries = json::array();
      for (const auto& e : t.top) {
        entries.push_back({{"name", e.name},
                           {"calls", e.calls},
                           {t.cpu ? "self_cpu_ns" : "gpu_ns", e.ns},
                           {"share", t.total_ns > 0 ? json(e.ns / t.total_ns) : json(nullptr)}});
      }
      top_kernels = {{"recorded", true},
                     {"kind", t.cpu ? "cpu_operators" : "kernels"},
                     {"sources", std::vector<std::string>(t.sources.begin(), t.sources.end())},
                     {"traced_steps", t.steps},
                     {"windows", t.windows.size()},
                     {t.cpu ? "total_self_cpu_ns" : "total_gpu_ns", t.total_ns},
                     {"names", t.names},
                     {"top", entries}};
    }
  }
  return json{{"format", "gpuprof.insights/1"},
              {"run", run},
              {"steps", steps},
              {"mfu", mfu},
              {"telemetry", telemetry},
              {"gpu", gpu},
              {"host", host},
              {"stalls", stalls},
              {"cpu_wait", cpu_wait},
              {"top_kernels", top_kernels},
              {"insights", insights},
              {"explained", ExplainedJson(report.explained)},
              {"data_loss", DataLoss(v)},
              {"diagnostics", diagnostics},
              {"not_evaluated", not_evaluated}};
}

std::vector<store::InsightRow> ToInsightRows(const Report& report) {
  std::vector<store::InsightRow> rows;
  for (size_t i = 0; i < report.insights.size(); ++i) {
    const Insight& in = report.insights[i];
    store::InsightRow row;
    row.ordinal = static_cast<int64_t>(i);
    row.rule_id = in.rule_id;
    row.family = in.family;
    row.severity = std::string(SeverityName(in.severity));
    row.message = in.message;
    row.fix = in.fix;
    row.evidence_json = in.evidence.dump(-1, ' ', false, json::error_handler_t::replace);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace gpuprof::analysis
