#include "server/ingest_api.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <sstream>

#include <nlohmann/json.hpp>

#include "store/row_json.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;

HttpResponse Json(int status, const json& doc) {
  HttpResponse r;
  r.status = status;
  r.body = doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return r;
}

HttpResponse Error(int status, const std::string& message) {
  return Json(status, json{{"error", message}});
}

// A client's run UUID or batch id: 1 to `max` characters of [A-Za-z0-9._:-].
bool ValidId(const std::string& id, size_t max) {
  return !id.empty() && id.size() <= max && std::all_of(id.begin(), id.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':';
  });
}

std::string Header(const HttpRequest& r, const std::string& name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : it->second;
}

// "/api/v1/runs/abc/batches?x=1" -> segments {"api","v1","runs","abc","batches"}.
std::vector<std::string> Segments(const std::string& target) {
  const std::string path = target.substr(0, target.find('?'));
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(path);
  while (std::getline(in, cur, '/')) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

constexpr const char* kEndpoints =
    "GET /healthz, GET /metrics, PUT /api/v1/runs/{uuid}, POST /api/v1/runs/{uuid}/batches";

}  // namespace

bool SecretEquals(const std::string& a, const std::string& b) {
  // Compare over the longer length so the time says nothing about where they differ.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

Expected<std::string> Gunzip(const std::string& data, size_t limit, bool* too_large) {
  *too_large = false;
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return Status::Error("gzip: cannot start");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[64 * 1024];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&zs);
      return Status::Error("the body is not valid gzip (Content-Encoding: gzip)");
    }
    out.append(buf, sizeof buf - zs.avail_out);
    if (out.size() > limit) {
      inflateEnd(&zs);
      *too_large = true;
      return Status::Error("the body inflates to more than " + std::to_string(limit) +
                           " bytes (the server's limit)");
    }
    if (rc == Z_OK && zs.avail_in == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      return Status::Error("the gzip body is truncated");
    }
  }
  inflateEnd(&zs);
  return out;
}

Expected<std::unique_ptr<IngestApi>> IngestApi::Open(const std::string& storage_path,
                                                     ApiOptions options) {
  auto db = store::SqliteStore::Open(storage_path, store::SqliteStore::Mode::kReadWrite);
  if (!db) return db.status();
  return std::unique_ptr<IngestApi>(
      new IngestApi(std::move(db.value()), storage_path, std::move(options)));
}

IngestApi::IngestApi(std::unique_ptr<store::SqliteStore> db, std::string path,
                     ApiOptions options)
    : db_(std::move(db)), storage_path_(std::move(path)), options_(std::move(options)) {}

HttpResponse IngestApi::Count(HttpResponse response) {
  std::lock_guard lock(counters_mu_);
  ++responses_[response.status];
  return response;
}

std::optional<HttpResponse> IngestApi::CheckWriteKey(const HttpRequest& request) {
  auto it = request.headers.find("x-api-key");
  if (it == request.headers.end() || it->second.empty()) {
    return Error(401, "missing X-API-Key header: ingest needs one of the server's write keys");
  }
  bool match = false;
  for (const std::string& key : options_.api_keys) match |= SecretEquals(it->second, key);
  if (!match) return Error(403, "the X-API-Key is not a write key of this server");
  return std::nullopt;
}

Expected<std::string> IngestApi::Body(const HttpRequest& request, HttpResponse* rejection) {
  const std::string type = Header(request, "content-type");
  if (type.rfind("application/json", 0) != 0) {
    *rejection = Error(415, "Content-Type must be application/json (got '" + type + "')");
    return Status::Error("type");
  }
  if (request.body.size() > options_.max_body_bytes) {
    *rejection = Error(413, "the body is " + std::to_string(request.body.size()) +
                                " bytes; the server takes at most " +
                                std::to_string(options_.max_body_bytes));
    return Status::Error("size");
  }
  const std::string encoding = Header(request, "content-encoding");
  if (encoding.empty() || encoding == "identity") return request.body;
  if (encoding != "gzip") {
    *rejection = Error(415, "Content-Encoding '" + encoding + "' is not supported (gzip is)");
    return Status::Error("encoding");
  }
  bool too_large = false;
  auto plain = Gunzip(request.body, options_.max_body_bytes, &too_large);
  if (!plain) *rejection = Error(too_large ? 413 : 400, plain.error());
  return plain;
}

HttpResponse IngestApi::Handle(const HttpRequest& request) {
  const std::vector<std::string> seg = Segments(request.target);
  const std::string& m = request.method;
  auto not_allowed = [&](const char* allow) {
    HttpResponse r = Error(405, m + " is not allowed on " + request.target + " (allowed: " +
                                    allow + ")");
    r.headers.emplace_back("Allow", allow);
    return r;
  };
  if (seg.size() == 1 && seg[0] == "healthz") {
    if (m != "GET" && m != "HEAD") return Count(not_allowed("GET"));
    return Count(Json(200, json{{"status", "ok"}, {"schema", store::kSchemaVersion}}));
  }
  if (seg.size() == 1 && seg[0] == "metrics") {
    if (m != "GET" && m != "HEAD") return Count(not_allowed("GET"));
    return Metrics();
  }
  if (seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "runs" &&
      (seg.size() == 4 || (seg.size() == 5 && seg[4] == "batches"))) {
    const std::string& uuid = seg[3];
    const bool batches = seg.size() == 5;
    if (batches && m != "POST") return Count(not_allowed("POST"));
    if (!batches && m != "PUT") return Count(not_allowed("PUT"));
    if (auto denied = CheckWriteKey(request)) return Count(*denied);
    if (!ValidId(uuid, 128)) {
      return Count(Error(400, "the run id in the path must be 1-128 characters of "
                              "[A-Za-z0-9._:-]"));
    }
    return Count(batches ? PostBatch(uuid, request) : PutRun(uuid, request));
  }
  if (seg.size() >= 2 && seg[0] == "api" && seg[1] != "v1") {
    return Count(Error(404, "API version '" + seg[1] + "' is not served; this server speaks v1"));
  }
  return Count(Error(404, "no such endpoint: " + m + " " + request.target + " (endpoints: " +
                              kEndpoints + ")"));
}

HttpResponse IngestApi::PutRun(const std::string& uuid, const HttpRequest& request) {
  HttpResponse rejection;
  auto body = Body(request, &rejection);
  if (!body) return rejection;
  json doc = json::parse(*body, nullptr, false);
  if (doc.is_discarded()) return Error(400, "the body is not valid JSON");
  if (!doc.is_object() || !doc.contains("run")) {
    return Error(400, "the body must be an object with a 'run' object");
  }
  for (const auto& [key, value] : doc.items()) {
    if (key != "run") return Error(400, "unknown field '" + key + "' (expected: run)");
  }
  auto info = store::RunInfoFromJson(doc["run"]);
  if (!info) return Error(400, info.error());
  std::lock_guard lock(mu_);
  auto existing = db_->IngestRunId(uuid);
  if (!existing) return Error(500, "store: " + existing.error());
  if (*existing) {
    info->run_id = **existing;
    Status st = db_->UpdateRunFields(*info);
    if (st.ok() && info->status != "running") {
      st = db_->FinishRun(info->run_id, info->status, info->end_ns, info->error);
    }
    if (!st.ok()) return Error(500, "store: " + st.message());
    return Json(200, json{{"run_id", info->run_id}, {"created", false}});
  }
  auto id = db_->BeginIngestRun(uuid, *info);
  if (!id) return Error(500, "store: " + id.error());
  {
    std::lock_guard c(counters_mu_);
    ++runs_created_;
  }
  return Json(201, json{{"run_id", *id}, {"created", true}});
}

HttpResponse IngestApi::PostBatch(const std::string& uuid, const HttpRequest& request) {
  HttpResponse rejection;
  auto body = Body(request, &rejection);
  if (!body) return rejection;
  json doc = json::parse(*body, nullptr, false);
  if (doc.is_discarded()) return Error(400, "the body is not valid JSON");
  if (!doc.is_object()) return Error(400, "the body must be a JSON object");
  for (const auto& [key, value] : doc.items()) {
    if (key != "batch_id" && key != "rows" && key != "insights") {
      return Error(400, "unknown field '" + key + "' (expected: batch_id, rows, insights)");
    }
  }
  if (!doc.contains("batch_id") || !doc["batch_id"].is_string() ||
      !ValidId(doc["batch_id"].get<std::string>(), 128)) {
    return Error(400, "batch_id must be a string of 1-128 characters of [A-Za-z0-9._:-]: the "
                      "client's id for this batch, the same on every retry");
  }
  const std::string batch_id = doc["batch_id"].get<std::string>();
  std::vector<store::Row> rows;
  if (doc.contains("rows")) {
    auto parsed = store::RowsFromJson(doc["rows"], options_.max_rows_per_batch);
    if (!parsed) return Error(400, parsed.error());
    rows = std::move(parsed.value());
  }
  std::optional<std::vector<store::InsightRow>> insights;
  if (doc.contains("insights")) {
    auto parsed = store::InsightsFromJson(doc["insights"]);
    if (!parsed) return Error(400, parsed.error());
    insights = std::move(parsed.value());
  }
  std::lock_guard lock(mu_);
  auto run_id = db_->IngestRunId(uuid);
  if (!run_id) return Error(500, "store: " + run_id.error());
  if (!*run_id) {
    return Error(404, "no run '" + uuid + "' on this server: PUT /api/v1/runs/" + uuid +
                          " first");
  }
  bool duplicate = false;
  Status st = db_->WriteBatchOnce(**run_id, batch_id, rows, insights ? &*insights : nullptr,
                                  &duplicate);
  if (!st.ok()) return Error(500, "store: " + st.message());
  {
    std::lock_guard c(counters_mu_);
    ++batches_;
    if (duplicate) {
      ++duplicate_batches_;
    } else {
      rows_ += rows.size();
    }
  }
  return Json(200, json{{"run_id", **run_id},
                        {"batch_id", batch_id},
                        {"stored", duplicate ? 0 : rows.size()},
                        {"duplicate", duplicate}});
}

HttpResponse IngestApi::Metrics() {
  std::ostringstream out;
  int64_t live = 0;
  {
    std::lock_guard lock(mu_);
    if (auto runs = db_->ListRuns()) {
      for (const auto& r : *runs) live += r.status == "running";
    }
  }
  std::lock_guard c(counters_mu_);
  ++responses_[200];
  out << "# HELP gpuprof_http_responses_total HTTP responses by status code.\n"
      << "# TYPE gpuprof_http_responses_total counter\n";
  for (const auto& [status, n] : responses_) {
    out << "gpuprof_http_responses_total{code=\"" << status << "\"} " << n << "\n";
  }
  out << "# HELP gpuprof_ingest_batches_total Batches received (duplicates included).\n"
      << "# TYPE gpuprof_ingest_batches_total counter\n"
      << "gpuprof_ingest_batches_total " << batches_ << "\n"
      << "# HELP gpuprof_ingest_duplicate_batches_total Batches received again (not stored).\n"
      << "# TYPE gpuprof_ingest_duplicate_batches_total counter\n"
      << "gpuprof_ingest_duplicate_batches_total " << duplicate_batches_ << "\n"
      << "# HELP gpuprof_ingest_rows_total Rows stored.\n"
      << "# TYPE gpuprof_ingest_rows_total counter\n"
      << "gpuprof_ingest_rows_total " << rows_ << "\n"
      << "# HELP gpuprof_ingest_runs_created_total Runs created by clients.\n"
      << "# TYPE gpuprof_ingest_runs_created_total counter\n"
      << "gpuprof_ingest_runs_created_total " << runs_created_ << "\n"
      << "# HELP gpuprof_runs_live Runs whose status is running.\n"
      << "# TYPE gpuprof_runs_live gauge\n"
      << "gpuprof_runs_live " << live << "\n";
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = out.str();
  return r;
}

}  // namespace gpuprof::server
