#include "server/push.h"

#include <nlohmann/json.hpp>

#include "server/http_server.h"
#include "store/row_json.h"
#include "store/sqlite_store.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;

}  // namespace

std::string ServerRunId(const store::RunInfo& r) {
  std::string host;
  for (char c : r.hostname) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.';
    host += ok ? c : '_';
  }
  if (host.size() > 64) host.resize(64);
  return host + ":" + std::to_string(r.pid) + ":" + std::to_string(r.start_unix_ns) + ":" +
         std::to_string(r.run_id);
}

Expected<json> CallServer(const std::string& url, const std::string& key, const std::string& method,
                          const std::string& path, const json& body) {
  auto res = HttpCall(url, method, path, {{"Content-Type", "application/json"}, {"X-API-Key", key}},
                      body.dump(-1, ' ', false, json::error_handler_t::replace));
  if (!res) return res.status();
  json doc = json::parse(res->body, nullptr, false);
  if (res->status >= 300) {
    std::string message = doc.is_object() && doc.contains("error") && doc["error"].is_string()
                              ? doc["error"].get<std::string>()
                              : res->body.substr(0, 200);
    return Status::Error(url + " answered " + std::to_string(res->status) + " to " + method + " " +
                         path + ": " + message);
  }
  if (doc.is_discarded()) {
    return Status::Error(url + " answered " + std::to_string(res->status) +
                         " with a body that is not JSON");
  }
  return doc;
}

Expected<PushResult> PushRun(const std::string& db_path, int64_t run_id,
                             const PushOptions& options) {
  auto db = store::SqliteStore::Open(db_path, store::SqliteStore::Mode::kReadOnly);
  if (!db) return db.status();
  auto all = (*db)->LoadRunRows(run_id);
  if (!all) return all.status();
  const store::RunData* data = &all->data;
  const std::vector<store::Row>& rows = all->rows;

  PushResult out;
  out.run_uuid = ServerRunId(data->run);
  const std::string base = "/api/v1/runs/" + out.run_uuid;
  auto put = CallServer(options.server_url, options.api_key, "PUT", base,
                        json{{"run", store::RunInfoToJson(data->run)}});
  if (!put) return put.status();
  out.server_run_id = (*put)["run_id"].get<int64_t>();

  const size_t per = std::max<size_t>(1, options.batch_rows);
  for (size_t i = 0, n = 0; i < rows.size(); i += per, ++n) {
    const std::vector<store::Row> chunk(
        rows.begin() + static_cast<std::ptrdiff_t>(i),
        rows.begin() + static_cast<std::ptrdiff_t>(std::min(rows.size(), i + per)));
    // The id says which rows: the same on every push of the same run and batch size.
    const std::string id = "rows-" + std::to_string(per) + "-" + std::to_string(n);
    auto res = CallServer(
        options.server_url, options.api_key, "POST", base + "/batches",
        json{{"batch_id", id}, {"rows", store::RowsToJson(chunk, store::RowLayout::kColumns)}});
    if (!res) return res.status();
    ++out.batches;
    if ((*res)["duplicate"].get<bool>()) {
      ++out.duplicate_batches;
    } else {
      out.rows += chunk.size();
    }
  }
  if (!data->insights.empty()) {
    auto res = CallServer(
        options.server_url, options.api_key, "POST", base + "/batches",
        json{{"batch_id", "insights"}, {"insights", store::InsightsToJson(data->insights)}});
    if (!res) return res.status();
    ++out.batches;
    if ((*res)["duplicate"].get<bool>()) ++out.duplicate_batches;
  }
  return out;
}

}  // namespace gpuprof::server
