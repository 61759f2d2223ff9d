#include "analysis/group.h"

#include <algorithm>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis {
namespace {

using nlohmann::json;

std::string Tag(Severity s) { return "[" + std::string(SeverityTag(s)) + "]"; }

template <typename T>
json J(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

// Ranks first (ascending), runs without a rank after them; then run_id.
bool RankOrder(const store::RunInfo& a, const store::RunInfo& b) {
  if (a.rank.has_value() != b.rank.has_value()) return a.rank.has_value();
  if (a.rank && *a.rank != *b.rank) return *a.rank < *b.rank;
  return a.run_id < b.run_id;
}

std::string Pct1(const std::optional<double>& f) {
  return OrDash(f, [](double v) { return FormatPercent(v, 1); });
}

}  // namespace

GroupView BuildGroupView(std::string group_id, std::vector<store::RunData> runs) {
  GroupView g;
  g.group_id = std::move(group_id);
  std::sort(runs.begin(), runs.end(), [](const store::RunData& a, const store::RunData& b) {
    return RankOrder(a.run, b.run);
  });
  // Within one rank the newest run wins; the older ones are listed as superseded.
  std::vector<store::RunData> kept;
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool newer_follows = i + 1 < runs.size() && runs[i].run.rank &&
                               runs[i + 1].run.rank == runs[i].run.rank;
    if (newer_follows) {
      g.superseded.push_back(runs[i].run);
    } else {
      kept.push_back(std::move(runs[i]));
    }
  }
  for (store::RunData& d : kept) g.ranks.push_back(BuildRunView(std::move(d)));
  return g;
}

RankStats ComputeRankStats(const RunView& rank) {
  RankStats s;
  s.wait_fraction = rank.breakdown.wait_fraction;
  if (auto comm = rules::MeasureCommShare(rank)) s.comm_fraction = comm->fraction();
  return s;
}

GroupReport AnalyzeGroup(std::string group_id, std::vector<store::RunData> runs,
                         const RuleContext& context) {
  GroupReport report;
  report.view = BuildGroupView(std::move(group_id), std::move(runs));
  EvaluateRules(
      /*group=*/true,
      [&](const RuleSpec& spec) { return EvaluateGroupRule(spec, report.view, context); },
      &report.insights, &report.not_evaluated);
  return report;
}

std::string FormatGroupReport(const GroupReport& report, const std::string& db_path) {
  const GroupView& g = report.view;
  std::string ids;
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    ids += (i ? ", " : "") + std::to_string(g.ranks[i].run().run_id);
  }
  std::string out = StrFormat("gpuprof · group %s · %s (run%s %s)\n", g.group_id.c_str(),
                              Plural(g.ranks.size(), "rank", "ranks").c_str(),
                              g.ranks.size() == 1 ? "" : "s", ids.c_str());
  std::vector<std::vector<std::string>> rows = {
      {"rank", "run", "host", "status", "steps", "median", "mean", "p99", "loader wait",
       "comm"}};
  for (const RunView& v : g.ranks) {
    const store::RunInfo& r = v.run();
    const RankStats st = ComputeRankStats(v);
    auto dur = [&](double DurationStats::*field) {
      return v.steady ? FormatDuration((*v.steady).*field) : std::string("—");
    };
    rows.push_back({OrDash(r.rank, [](int64_t x) { return std::to_string(x); }),
                    std::to_string(r.run_id), r.hostname.empty() ? "—" : r.hostname, r.status,
                    std::to_string(v.steps.size()), dur(&DurationStats::p50_ns),
                    dur(&DurationStats::mean_ns), dur(&DurationStats::p99_ns),
                    Pct1(st.wait_fraction), Pct1(st.comm_fraction)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], DisplayColumns(row[c]));
  }
  out += "\nRanks (steady-state step times; loader wait and comm as shares of step time)\n";
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t c = 0; c < row.size(); ++c) {
      // Text columns left-aligned, numbers right-aligned.
      const bool left = c == 2 || c == 3;
      line += " " + (left ? PadRight(row[c], width[c]) : PadLeft(row[c], width[c]));
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (!g.superseded.empty()) {
    std::string old;
    for (size_t i = 0; i < g.superseded.size(); ++i) {
      const store::RunInfo& r = g.superseded[i];
      old += (i ? ", " : "") + StrFormat("run %lld (%s)", static_cast<long long>(r.run_id),
                                         rules::RankLabel(r).c_str());
    }
    out += "  left out (a newer run of the same rank is used): " + old + "\n";
  }
  out += "\n";
  if (report.insights.empty()) {
    out += "Group insights: none (nothing crossed a rule threshold)\n";
  } else {
    out += StrFormat("Group insights (%zu)\n", report.insights.size());
    for (const Insight& in : report.insights) {
      out += StrFormat("  %-8s%s\n", Tag(in.severity).c_str(), in.message.c_str());
      out += "          fix: " + in.fix + "\n";
      out += "          rule: " + in.rule_id + " (" + in.family + ")\n";
    }
  }
  if (!report.not_evaluated.empty()) {
    out += StrFormat("\nNot evaluated (%zu)\n", report.not_evaluated.size());
    size_t w = 0;
    for (const auto& n : report.not_evaluated) w = std::max(w, n.rule_id.size());
    for (const auto& n : report.not_evaluated) {
      out += StrFormat("  %-*s  %s\n", static_cast<int>(w), n.rule_id.c_str(), n.reason.c_str());
    }
  }
  if (!g.ranks.empty()) {
    out += StrFormat("\nPer-rank reports: gpuprof insights %s RUN (e.g. %lld)\n",
                     ShellQuoteIfNeeded(db_path).c_str(),
                     static_cast<long long>(g.ranks.front().run().run_id));
  }
  return ValidUtf8(out);
}

json GroupReportJson(const GroupReport& report) {
  const GroupView& g = report.view;
  auto duration = [](const std::optional<DurationStats>& s) -> json {
    if (!s) return nullptr;
    return json{{"count", s->count},   {"mean_ns", s->mean_ns}, {"p50_ns", s->p50_ns},
                {"p99_ns", s->p99_ns}, {"min_ns", s->min_ns},   {"max_ns", s->max_ns}};
  };
  json ranks = json::array();
  for (const RunView& v : g.ranks) {
    const store::RunInfo& r = v.run();
    const RankStats st = ComputeRankStats(v);
    ranks.push_back({{"rank", J(r.rank)},
                     {"world_size", J(r.world_size)},
                     {"run_id", r.run_id},
                     {"run_name", r.run_name},
                     {"hostname", r.hostname},
                     {"status", r.status},
                     {"start_unix_ns", r.start_unix_ns},
                     {"steps", v.steps.size()},
                     {"steady", duration(v.steady)},
                     {"wait_fraction", J(st.wait_fraction)},
                     {"comm_fraction", J(st.comm_fraction)}});
  }
  json superseded = json::array();
  for (const auto& r : g.superseded) {
    superseded.push_back({{"run_id", r.run_id}, {"rank", J(r.rank)}});
  }
  json insights = InsightsJson(report.insights);
  json not_evaluated = NotEvaluatedJson(report.not_evaluated);
  return json{{"format", "gpuprof.group_insights/1"},
              {"group_id", g.group_id},
              {"ranks", ranks},
              {"superseded_runs", superseded},
              {"insights", insights},
              {"not_evaluated", not_evaluated}};
}

}  // namespace gpuprof::analysis
