#include "analysis/group.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "analysis/format.h"
#include "analysis/rules/registry.h"
#include "analysis/rules/rules.h"

namespace gpuprof::analysis {
namespace {

using nlohmann::json;

constexpr const char* kNoAlignment = "not aligned: no clock alignment recorded";

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

// An integer of a JSON object: an integer, or a finite number rounded; nullopt otherwise.
std::optional<int64_t> IntKey(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (std::isfinite(v) && std::fabs(v) < 9e18) return static_cast<int64_t>(std::llround(v));
  }
  return std::nullopt;
}

// "+1.2 µs", "-340 ns", "0 ns".
std::string SignedDuration(int64_t ns) {
  return (ns > 0 ? "+" : "") + FormatDuration(static_cast<double>(ns));
}

// ranks[i]'s clock; read from its run when the view was assembled by hand without clocks.
RankClock ClockOf(const GroupView& g, size_t i) {
  return i < g.clocks.size() ? g.clocks[i] : ReadRankClock(g.ranks[i].run());
}

// The clock column of one rank: its offset and uncertainty, "reference", or "—".
std::string ClockCell(const RunView& v, const RankClock& c) {
  if (!c.aligned()) return "—";
  if (v.run().rank && c.reference_rank == v.run().rank && *c.offset_ns == 0) return "reference";
  std::string out = SignedDuration(*c.offset_ns);
  if (c.uncertainty_ns) out += " ±" + FormatDuration(static_cast<double>(*c.uncertainty_ns));
  return out;
}

}  // namespace

RankClock ReadRankClock(const store::RunInfo& run) {
  RankClock c;
  json dist;
  if (run.config_json) {
    const json config = json::parse(*run.config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_object()) {
      if (auto it = config.find("distributed"); it != config.end() && it->is_object()) dist = *it;
    }
  }
  std::string reason;
  if (dist.is_object()) {
    c.offset_ns = IntKey(dist, "clock_offset_ns");
    c.uncertainty_ns = IntKey(dist, "clock_uncertainty_ns");
    c.reference_rank = IntKey(dist, "clock_reference_rank");
    c.rounds = IntKey(dist, "clock_rounds");
    if (auto it = dist.find("clock_method"); it != dist.end() && it->is_string()) {
      c.method = it->get<std::string>();
    }
    if (auto it = dist.find("clock_unaligned_reason"); it != dist.end() && it->is_string()) {
      reason = it->get<std::string>();
    }
  }
  if (!c.offset_ns) {
    c.uncertainty_ns.reset();
    c.unaligned_reason = reason.empty() ? std::string(kNoAlignment) : "not aligned: " + reason;
  }
  return c;
}

int64_t GroupView::AlignedNs(size_t i, int64_t rel_ns) const {
  const int64_t offset = i < clocks.size() ? clocks[i].offset_ns.value_or(0) : 0;
  return ranks[i].run().start_unix_ns + rel_ns - offset;
}

size_t GroupView::AlignedRanks() const {
  return static_cast<size_t>(
      std::count_if(clocks.begin(), clocks.end(), [](const RankClock& c) { return c.aligned(); }));
}

std::string GroupView::AlignmentBasis() const {
  const size_t n = ranks.size(), aligned = AlignedRanks();
  if (aligned == 0) {
    return "clocks not aligned: wall clocks compared as they are (each run's start time; as "
           "close as the hosts' clock sync)";
  }
  std::optional<int64_t> reference, worst;
  std::string method;
  for (const RankClock& c : clocks) {
    if (!c.aligned()) continue;
    if (!reference && c.reference_rank) reference = c.reference_rank;
    if (c.uncertainty_ns) worst = std::max(worst.value_or(0), *c.uncertainty_ns);
    if (method.empty()) method = c.method;
  }
  std::string how;
  if (worst) how = "±" + FormatDuration(static_cast<double>(*worst));
  if (!method.empty()) how += (how.empty() ? "" : "; ") + method;
  std::string out = "clocks aligned to " +
                    (reference ? "rank " + std::to_string(*reference) : "the reference rank");
  if (aligned < n) out += StrFormat(" on %zu of %zu ranks", aligned, n);
  if (!how.empty()) out += " (" + how + ")";
  if (aligned < n) out += "; the others' wall clocks compared as they are";
  return out;
}

GroupView BuildGroupView(std::string group_id, std::vector<store::RunData> runs) {
  GroupView g;
  g.group_id = std::move(group_id);
  std::sort(runs.begin(), runs.end(), [](const store::RunData& a, const store::RunData& b) {
    return RankOrder(a.run, b.run);
  });
  // Within one rank the newest run wins; the older ones are listed as superseded.
  std::vector<store::RunData> kept;
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool newer_follows =
        i + 1 < runs.size() && runs[i].run.rank && runs[i + 1].run.rank == runs[i].run.rank;
    if (newer_follows) {
      g.superseded.push_back(runs[i].run);
    } else {
      kept.push_back(std::move(runs[i]));
    }
  }
  for (store::RunData& d : kept) g.ranks.push_back(BuildRunView(std::move(d)));
  for (const RunView& v : g.ranks) g.clocks.push_back(ReadRankClock(v.run()));
  // The rank the others were aligned to is at offset 0 by definition, unless it says otherwise.
  std::optional<int64_t> reference;
  for (const RankClock& c : g.clocks) {
    if (c.aligned() && c.reference_rank) reference = c.reference_rank;
  }
  for (size_t i = 0; reference && i < g.ranks.size(); ++i) {
    RankClock& c = g.clocks[i];
    if (c.aligned() || g.ranks[i].run().rank != reference) continue;
    if (c.unaligned_reason != kNoAlignment) continue;  // it recorded why it is not aligned
    c.offset_ns = 0;
    c.uncertainty_ns = 0;
    c.reference_rank = reference;
    c.unaligned_reason.clear();
  }
  return g;
}

namespace {

// [start, end] of a run on the wall clock; an unfinished run (no end_ns) reaches to the end of
// time.
std::pair<int64_t, int64_t> WallSpan(const store::RunInfo& run) {
  constexpr int64_t kOpen = std::numeric_limits<int64_t>::max();
  const int64_t end = run.end_ns && *run.end_ns >= 0 && *run.end_ns < kOpen - run.start_unix_ns
                          ? run.start_unix_ns + *run.end_ns
                          : kOpen;
  return {run.start_unix_ns, end};
}

}  // namespace

PeerWaits MeasurePeerWaits(const store::RunData& self, std::vector<store::RunData> runs) {
  PeerWaits out;
  out.group_id = self.run.group_id.value_or("");
  if (!self.run.rank) {
    out.reason = "the run has no rank, so its peers cannot be told apart from it";
    return out;
  }
  // Per other rank, the newest run that ran at the same time as this one (a restarted job
  // leaves older attempts of every rank in the store).
  const auto [self_begin, self_end] = WallSpan(self.run);
  std::map<int64_t, size_t> newest;  // rank -> index into runs
  for (size_t i = 0; i < runs.size(); ++i) {
    const store::RunInfo& r = runs[i].run;
    if (r.run_id == self.run.run_id || !r.rank || *r.rank == *self.run.rank) continue;
    if (r.group_id != self.run.group_id) continue;
    const auto [begin, end] = WallSpan(r);
    if (begin > self_end || self_begin > end) continue;
    auto [it, added] = newest.try_emplace(*r.rank, i);
    if (!added && runs[it->second].run.run_id < r.run_id) it->second = i;
  }
  if (newest.empty()) {
    out.reason = StrFormat(
        "no other rank of job '%s' that ran at the same time is in this store (a rank that "
        "writes its own file is compared by gpuprof insights --group on a file holding them "
        "all)",
        out.group_id.c_str());
    return out;
  }
  std::vector<store::RunData> members;
  store::RunData me;
  me.run = self.run;
  me.comm_buckets = self.comm_buckets;
  members.push_back(std::move(me));
  for (const auto& [rank, i] : newest) {
    store::RunData d;
    d.run = std::move(runs[i].run);
    d.comm_buckets = std::move(runs[i].comm_buckets);
    d.insights = std::move(runs[i].insights);
    members.push_back(std::move(d));
  }
  const GroupView g = BuildGroupView(out.group_id, std::move(members));
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    if (g.ranks[r].run().run_id != self.run.run_id) continue;
    PeerWaits mine = std::move(PeerWaitsOfEveryRank(g)[r]);
    for (const RunView& other : g.ranks) {
      const store::InsightRow* lead = rules::LeadingFinding(other.data.insights);
      if (lead && &other != &g.ranks[r]) mine.peer_leads[rules::RankLabel(other.run())] = *lead;
    }
    return mine;
  }
  return out;  // unreachable: self is the only run of its rank in the view
}

std::vector<PeerWaits> PeerWaitsOfEveryRank(const GroupView& g) {
  const size_t n = g.ranks.size();
  std::vector<PeerWaits> out(n);
  for (size_t r = 0; r < n; ++r) {
    out[r].group_id = g.group_id;
    for (size_t o = 0; o < n; ++o) {
      if (o != r) out[r].peers.push_back(rules::RankLabel(g.ranks[o].run()));
    }
    if (n < 2) out[r].reason = "the group has no other rank";
  }
  // Each rank's earliest start of each (step, bucket), on the common clock.
  using Key = std::pair<int64_t, int64_t>;  // (step, bucket)
  std::vector<std::map<Key, int64_t>> starts(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& b : g.ranks[r].data.comm_buckets) {
      const int64_t at = g.AlignedNs(r, b.start_ns);
      auto [it, added] = starts[r].try_emplace({b.step, b.bucket}, at);
      if (!added) it->second = std::min(it->second, at);
    }
  }
  // Per key, the two latest starts and whose they are: every rank's latest other rank is one of
  // them, so one pass serves all ranks.
  struct Latest {
    int64_t at[2] = {0, 0};
    size_t rank[2] = {0, 0};
    size_t count = 0;
  };
  std::map<Key, Latest> latest;
  for (size_t r = 0; r < n; ++r) {
    for (const auto& [key, at] : starts[r]) {
      Latest& l = latest[key];
      if (l.count == 0 || at > l.at[0]) {
        l.at[1] = l.at[0];
        l.rank[1] = l.rank[0];
        l.at[0] = at;
        l.rank[0] = r;
      } else if (l.count == 1 || at > l.at[1]) {
        l.at[1] = at;
        l.rank[1] = r;
      }
      ++l.count;
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const auto& [key, at] : starts[r]) {
      const Latest& l = latest[key];
      if (l.count < 2) continue;  // only this rank timed it
      const int i = l.rank[0] == r ? 1 : 0;
      const size_t other = l.rank[i];
      PeerWaits::Step& step = out[r].steps[key.first];
      const int64_t wait = l.at[i] - at;
      if (wait > step.wait_ns) {
        step = PeerWaits::Step{wait, static_cast<int>(other < r ? other : other - 1)};
      }
    }
  }
  return out;
}

RankStats ComputeRankStats(const RunView& rank, const PeerWaits* peers) {
  RankStats s;
  s.wait_fraction = rank.breakdown.wait_fraction;
  if (auto comm = rules::MeasureCommShare(rank)) s.comm_fraction = comm->fraction();
  if (peers) {
    if (auto wait = rules::MeasurePeerWait(rank, *peers)) s.peer_wait_fraction = wait->fraction();
  }
  return s;
}

GroupReport AnalyzeGroup(std::string group_id, std::vector<store::RunData> runs,
                         const RuleContext& context) {
  GroupReport report;
  report.view = BuildGroupView(std::move(group_id), std::move(runs));
  EvaluateRules(
      /*group=*/true,
      [&](const RuleSpec& spec) { return EvaluateGroupRule(spec, report.view, context); },
      &report.insights, &report.not_evaluated, &report.explained);
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
  std::vector<std::vector<std::string>> rows = {{"rank", "run", "host", "status", "steps", "median",
                                                 "mean", "p99", "loader wait", "comm", "waiting",
                                                 "clock offset"}};
  const std::vector<PeerWaits> waits = PeerWaitsOfEveryRank(g);
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    const RunView& v = g.ranks[i];
    const store::RunInfo& r = v.run();
    const RankStats st = ComputeRankStats(v, &waits[i]);
    auto dur = [&](double DurationStats::*field) {
      return v.steady ? FormatDuration((*v.steady).*field) : std::string("—");
    };
    rows.push_back({OrDash(r.rank, [](int64_t x) { return std::to_string(x); }),
                    std::to_string(r.run_id), r.hostname.empty() ? "—" : r.hostname, r.status,
                    std::to_string(v.steps.size()), dur(&DurationStats::p50_ns),
                    dur(&DurationStats::mean_ns), dur(&DurationStats::p99_ns),
                    Pct1(st.wait_fraction), Pct1(st.comm_fraction), Pct1(st.peer_wait_fraction),
                    ClockCell(v, ClockOf(g, i))});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], DisplayColumns(row[c]));
  }
  out +=
      "\nRanks (steady-state step times; loader wait, comm and waiting for the other ranks in "
      "the collectives as shares of step time)\n";
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
  out += "  " + g.AlignmentBasis() + "\n";
  // The ranks without an offset, grouped by why.
  std::vector<std::pair<std::string, std::string>> why;  // (reason, ranks)
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    const RankClock c = ClockOf(g, i);
    if (c.aligned()) continue;
    auto it = std::find_if(why.begin(), why.end(),
                           [&](const auto& w) { return w.first == c.unaligned_reason; });
    if (it == why.end()) it = why.insert(why.end(), {c.unaligned_reason, ""});
    it->second += (it->second.empty() ? "" : ", ") + rules::RankLabel(g.ranks[i].run());
  }
  for (const auto& [reason, labels] : why) out += "  " + labels + ": " + reason + "\n";
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
      for (const Explained& e : report.explained) {
        if (e.by == in.rule_id) {
          out += "          explains: " + e.insight.rule_id + " — " + e.insight.message + "\n";
        }
      }
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
  const std::vector<PeerWaits> waits = PeerWaitsOfEveryRank(g);
  for (size_t i = 0; i < g.ranks.size(); ++i) {
    const RunView& v = g.ranks[i];
    const RankClock clock = ClockOf(g, i);
    const store::RunInfo& r = v.run();
    const RankStats st = ComputeRankStats(v, &waits[i]);
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
                     {"comm_fraction", J(st.comm_fraction)},
                     {"peer_wait_fraction", J(st.peer_wait_fraction)},
                     {"clock_offset_ns", J(clock.offset_ns)},
                     {"clock_uncertainty_ns", J(clock.uncertainty_ns)},
                     {"clock_unaligned_reason",
                      clock.aligned() ? json(nullptr) : json(clock.unaligned_reason)}});
  }
  std::optional<int64_t> reference, uncertainty;
  for (const RankClock& c : g.clocks) {
    if (!c.aligned()) continue;
    if (!reference && c.reference_rank) reference = c.reference_rank;
    if (c.uncertainty_ns) uncertainty = std::max(uncertainty.value_or(0), *c.uncertainty_ns);
  }
  json alignment = {{"basis", g.AlignmentBasis()},
                    {"aligned_ranks", g.AlignedRanks()},
                    {"reference_rank", J(reference)},
                    {"uncertainty_ns", J(uncertainty)}};
  json superseded = json::array();
  for (const auto& r : g.superseded) {
    superseded.push_back({{"run_id", r.run_id}, {"rank", J(r.rank)}});
  }
  json insights = InsightsJson(report.insights, report.explained);
  json not_evaluated = NotEvaluatedJson(report.not_evaluated);
  return json{{"format", "gpuprof.group_insights/1"},
              {"group_id", g.group_id},
              {"ranks", ranks},
              {"clock_alignment", alignment},
              {"superseded_runs", superseded},
              {"insights", insights},
              {"explained", ExplainedJson(report.explained)},
              {"not_evaluated", not_evaluated}};
}

}  // namespace gpuprof::analysis
