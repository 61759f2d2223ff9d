// Test-only helpers shared by the rule tests: evaluate one rule of the registry on a built run,
// and compact step shapes.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "analysis/group.h"
#include "analysis/rules/registry.h"
#include "analysis/test_runs.h"

namespace gpuprof::analysis::testing {

inline RuleResult Eval(const std::string& id, const RunBuilder& b, const RuleContext& ctx = {}) {
  const RuleSpec* spec = FindRule(id);
  EXPECT_NE(spec, nullptr) << id;
  if (!spec) return RuleResult::Skip("no such rule");
  return EvaluateRule(*spec, BuildRunView(b.Build()), ctx);
}

// Evaluates a group rule on the runs built by `ranks`.
inline RuleResult EvalGroup(const std::string& id, const std::vector<RunBuilder>& ranks,
                            const RuleContext& ctx = {}) {
  const RuleSpec* spec = FindRule(id);
  EXPECT_NE(spec, nullptr) << id;
  if (!spec) return RuleResult::Skip("no such rule");
  std::vector<store::RunData> runs;
  for (const RunBuilder& b : ranks) runs.push_back(b.Build());
  return EvaluateGroupRule(*spec, BuildGroupView("g", std::move(runs)), ctx);
}

inline StepShape Shape(int64_t duration_ms, std::optional<int64_t> wait_ms,
                       std::vector<std::pair<std::string, int64_t>> phases_ms) {
  StepShape s;
  s.duration_ns = duration_ms * kMs;
  s.wait_ns = wait_ms ? std::optional<int64_t>(*wait_ms * kMs) : std::nullopt;
  s.phases.clear();
  for (auto& [name, ms] : phases_ms) s.phases.push_back({name, ms * kMs, std::nullopt});
  return s;
}

// forward/backward/optimizer summing to `phase_ms`, split 3:5:2 (rounded to ms).
inline StepShape Split(int64_t duration_ms, std::optional<int64_t> wait_ms, int64_t phase_ms) {
  const int64_t f = phase_ms * 3 / 10, o = phase_ms * 2 / 10;
  return Shape(duration_ms, wait_ms,
               {{"forward", f}, {"backward", phase_ms - f - o}, {"optimizer", o}});
}

// Whether the report lists a finding of rule `id` (folded findings are not listed).
inline bool HasInsight(const Report& report, std::string_view id) {
  for (const Insight& in : report.insights) {
    if (in.rule_id == id) return true;
  }
  return false;
}

// Whether `id`'s finding was folded under `by`'s (Report::explained).
inline bool FoldedUnder(const Report& report, std::string_view id, std::string_view by) {
  for (const auto& e : report.explained) {
    if (e.insight.rule_id == id && e.by == by) return true;
  }
  return false;
}

}  // namespace gpuprof::analysis::testing
