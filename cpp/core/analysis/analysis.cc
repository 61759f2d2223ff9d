#include "analysis/analysis.h"

#include "analysis/format.h"

namespace gpuprof::analysis {

Expected<Report> AnalyzeRun(store::SqliteStore& store, int64_t run_id,
                            const AnalysisOptions& options) {
  Expected<bool> exists = store.RunExists(run_id);
  if (!exists) return exists.status();
  if (!*exists) {
    return Status::Error(StrFormat("no run %lld in %s", static_cast<long long>(run_id),
                                   store.path().c_str()));
  }
  Expected<store::RunData> data = store.LoadRun(run_id);
  if (!data) return data.status();
  return Analyze(std::move(data).value(), MakeRuleContextFromEnv(options));
}

Expected<std::string> SummaryText(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options) {
  Expected<Report> report = AnalyzeRun(store, run_id, options);
  if (!report) return report.status();
  return FormatSummary(*report, db_path);
}

Expected<std::string> FinalizeRun(store::SqliteStore& store, int64_t run_id,
                                  const std::string& db_path, const AnalysisOptions& options) {
  Expected<Report> report = AnalyzeRun(store, run_id, options);
  if (!report) return report.status();
  Status written = store.ReplaceInsights(run_id, ToInsightRows(*report));
  if (!written.ok()) return written;
  return FormatSummary(*report, db_path);
}

}  // namespace gpuprof::analysis
