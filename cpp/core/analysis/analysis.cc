#include "analysis/analysis.h"

#include <set>

#include "analysis/format.h"
#include "analysis/run_loader.h"

namespace gpuprof::analysis {

Expected<Report> AnalyzeRun(store::RunStore& store, int64_t run_id,
                            const AnalysisOptions& options) {
  Expected<bool> exists = store.RunExists(run_id);
  if (!exists) return exists.status();
  if (!*exists) {
    return Status::Error(
        StrFormat("no run %lld in %s", static_cast<long long>(run_id), store.location().c_str()));
  }
  Expected<store::RunData> data = store.LoadRun(run_id);
  if (!data) return data.status();
  for (const store::DiagnosticRow& d : options.unstored_diagnostics) {
    data->diagnostics.push_back(d);
  }
  RuleContext context = MakeRuleContextFromEnv(options);
  ApplyStoredRate(data->run, options, &context);
  Expected<std::vector<PriorRun>> prior = LoadPriorRuns(store, data->run);
  if (!prior) return prior.status();
  context.previous_runs = std::move(prior).value();
  context.peer_waits = LoadPeerWaits(store, *data);
  return Analyze(std::move(data).value(), context);
}

Expected<GroupReport> AnalyzeStoredGroup(store::RunStore& store, const std::string& group_id,
                                         const AnalysisOptions& options) {
  Expected<std::vector<store::RunData>> runs = LoadGroupRuns(store, group_id);
  if (!runs) return runs.status();
  if (runs->empty()) {
    Expected<std::vector<std::string>> groups = ListGroupIds(store);
    if (!groups) return groups.status();
    std::string known;
    for (size_t i = 0; i < groups->size(); ++i) known += (i ? ", " : "") + (*groups)[i];
    return Status::Error(StrFormat(
        "no runs with group_id '%s' in %s (%s)", group_id.c_str(), store.location().c_str(),
        groups->empty() ? "no run in it has a group_id" : ("groups: " + known).c_str()));
  }
  return AnalyzeGroup(group_id, std::move(runs).value(), MakeRuleContextFromEnv(options));
}

Expected<GroupName> ResolveGroupName(store::RunStore& store, const std::string& name) {
  auto runs = store.ListRuns();
  if (!runs) return runs.status();
  std::set<std::string> groups, of_name;
  const store::RunInfo* newest = nullptr;
  for (const store::RunInfo& r : *runs) {
    if (!r.group_id) continue;
    if (*r.group_id == name) return GroupName{name, std::nullopt};
    groups.insert(*r.group_id);
    if (r.run_name != name) continue;
    of_name.insert(*r.group_id);
    if (!newest || r.run_id > newest->run_id) newest = &r;
  }
  if (newest) return GroupName{*newest->group_id, of_name.size()};
  std::string known;
  for (const std::string& g : groups) known += (known.empty() ? "" : ", ") + g;
  return Status::Error(StrFormat(
      "no runs with group_id '%s' in %s, nor runs of that name with a group_id (%s; --group "
      "takes a group id or the run name of the group's runs)",
      name.c_str(), store.location().c_str(),
      groups.empty() ? "no run in it has a group_id" : ("groups: " + known).c_str()));
}

Expected<std::string> SummaryText(store::RunStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options) {
  Expected<Report> report = AnalyzeRun(store, run_id, options);
  if (!report) return report.status();
  return FormatSummary(*report, db_path);
}

Expected<std::string> FinalizeRun(store::RunStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options,
                                  std::optional<std::string>* not_stored) {
  Expected<Report> report = AnalyzeRun(store, run_id, options);
  if (!report) return report.status();
  Status written = store.ReplaceInsights(run_id, ToInsightRows(*report));
  if (written.ok()) written = StoreCostRate(store, *report);
  if (!written.ok()) {
    // The store refused (locked, full): the summary is still printed, and says so.
    if (not_stored) *not_stored = written.message();
    report->view.data.diagnostics.push_back(store::DiagnosticRow{
        std::nullopt, "warning", "store",
        "this summary's insights were not stored with the run: " + written.message()});
  }
  return FormatSummary(*report, db_path);
}

Status StoreCostRate(store::RunStore& store, const Report& report) {
  if (!report.cost_rate_usd_per_hour) return Status::Ok();
  store::RunInfo info = report.view.run();
  nlohmann::json config = nlohmann::json::object();
  if (info.config_json) {
    config = nlohmann::json::parse(*info.config_json, nullptr, /*allow_exceptions=*/false);
    // A config that is not a JSON object is left alone rather than replaced.
    if (!config.is_object()) return Status::Ok();
  }
  auto same = config.find(kStoredRateKey);
  if (same != config.end() && same->is_number() &&
      same->get<double>() == *report.cost_rate_usd_per_hour) {
    return Status::Ok();  // already stored (a report of a stored run prices it the same way)
  }
  config[kStoredRateKey] = *report.cost_rate_usd_per_hour;
  config[kStoredRateSourceKey] = report.cost_rate_source;
  info.config_json = config.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return store.UpdateRunFields(info);
}

}  // namespace gpuprof::analysis
