#include "server/ingest_api.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <charconv>
#include <chrono>
#include <fstream>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "analysis/analysis.h"
#include "analysis/group.h"
#include "analysis/run_view.h"
#include "analysis/report.h"
#include "server/lttb.h"
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
  return ErrorResponse(status, message);
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

// A Prometheus label value: backslash, double quote and newline escaped.
std::string PromLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// The live event of a run created or updated (LiveBus::PublishRun).
json RunEvent(const store::RunInfo& info, bool created) {
  json e = {{"run_name", info.run_name}, {"status", info.status}, {"created", created},
            {"hostname", info.hostname}, {"start_unix_ns", info.start_unix_ns}};
  e["group_id"] = info.group_id ? json(*info.group_id) : json(nullptr);
  e["end_ns"] = info.end_ns ? json(*info.end_ns) : json(nullptr);
  return e;
}

// The live event of a batch stored (LiveBus::PublishBatch): rows per table, the newest step
// and the newest telemetry timestamp in it.
json BatchEvent(const std::vector<store::Row>& rows, bool insights) {
  json counts = json::object();
  std::optional<int64_t> last_step, last_ts;
  for (const store::Row& row : rows) {
    const std::string table = store::RowJsonTable(row);
    counts[table] = counts.value(table, int64_t{0}) + 1;
    if (const auto* s = std::get_if<store::StepRow>(&row)) {
      last_step = std::max(last_step.value_or(s->step), s->step);
    }
    std::visit(
        [&](const auto& r) {
          if constexpr (requires { r.ts_ns; }) {
            if constexpr (std::is_same_v<std::decay_t<decltype(r.ts_ns)>, int64_t>) {
              last_ts = std::max(last_ts.value_or(r.ts_ns), r.ts_ns);
            }
          }
        },
        row);
  }
  json e = {{"rows", counts}, {"stored", rows.size()}, {"insights", insights}};
  if (last_step) e["last_step"] = *last_step;
  if (last_ts) e["last_ts_ns"] = *last_ts;
  return e;
}

constexpr const char* kEndpoints =
    "GET /healthz, GET /metrics, PUT /api/v1/runs/{uuid}, POST /api/v1/runs/{uuid}/batches, "
    "POST /api/v1/login, POST /api/v1/logout, GET /api/v1/runs, GET /api/v1/runs/{id}, "
    "GET /api/v1/runs/{id}/series, GET /api/v1/runs/{id}/steps, GET /api/v1/runs/{id}/kernels, "
    "GET /api/v1/compare, GET /api/v1/groups/{name}, GET /api/v1/live (WebSocket)";

constexpr const char* kSessionCookie = "gpuprof_session";
constexpr const char* kCsrfCookie = "gpuprof_csrf";

std::string Hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += d[p[i] >> 4];
    out += d[p[i] & 15];
  }
  return out;
}

// name -> value of the Cookie header.
std::map<std::string, std::string> Cookies(const HttpRequest& r) {
  std::map<std::string, std::string> out;
  auto it = r.headers.find("cookie");
  if (it == r.headers.end()) return out;
  std::istringstream in(it->second);
  std::string part;
  while (std::getline(in, part, ';')) {
    const size_t b = part.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    const size_t eq = part.find('=', b);
    if (eq == std::string::npos) continue;
    out[part.substr(b, eq - b)] = part.substr(eq + 1);
  }
  return out;
}

// %XX and '+' decoded (a malformed escape is kept as it is).
std::string PercentDecode(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%' && i + 2 < in.size() &&
               std::isxdigit(static_cast<unsigned char>(in[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
      out += static_cast<char>(std::stoi(in.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

// The query parameters of a target, percent-decoded.
std::map<std::string, std::string> Query(const std::string& target) {
  std::map<std::string, std::string> out;
  const size_t q = target.find('?');
  if (q == std::string::npos) return out;
  std::istringstream in(target.substr(q + 1));
  std::string part;
  while (std::getline(in, part, '&')) {
    const size_t eq = part.find('=');
    out[PercentDecode(part.substr(0, eq))] =
        PercentDecode(eq == std::string::npos ? "" : part.substr(eq + 1));
  }
  return out;
}

std::optional<int64_t> ParseInt(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

}  // namespace

HttpResponse ErrorResponse(int status, const std::string& message) {
  return Json(status, json{{"error", message}});
}

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

Expected<std::unique_ptr<ServerApi>> ServerApi::Open(const std::string& storage_path,
                                                     ApiOptions options) {
  auto db = store::SqliteStore::Open(storage_path, store::SqliteStore::Mode::kReadWrite);
  if (!db) return db.status();
  return std::unique_ptr<ServerApi>(
      new ServerApi(std::move(db.value()), storage_path, std::move(options)));
}

std::unique_ptr<ServerApi> ServerApi::Create(std::unique_ptr<store::RunStore> db,
                                             std::string storage, ApiOptions options) {
  return std::unique_ptr<ServerApi>(
      new ServerApi(std::move(db), std::move(storage), std::move(options)));
}

ServerApi::ServerApi(std::unique_ptr<store::RunStore> db, std::string path, ApiOptions options)
    : db_(std::move(db)), storage_path_(std::move(path)), options_(std::move(options)) {}

std::optional<HttpResponse> ServerApi::NoSuchRun(int64_t run_id) {
  auto exists = db_->RunExists(run_id);
  if (!exists) return Error(500, "store: " + exists.error());
  if (!*exists) return Error(404, "no run " + std::to_string(run_id) + " on this server");
  return std::nullopt;
}

std::unique_lock<std::mutex> ServerApi::LockStore() {
  if (db_->thread_safe()) return std::unique_lock<std::mutex>();
  return std::unique_lock<std::mutex>(mu_);
}

HttpResponse ServerApi::Count(HttpResponse response) {
  std::lock_guard lock(counters_mu_);
  ++responses_[response.status];
  return response;
}

std::optional<HttpResponse> ServerApi::CheckWriteKey(const HttpRequest& request) {
  auto it = request.headers.find("x-api-key");
  if (it == request.headers.end() || it->second.empty()) {
    return Error(401, "missing X-API-Key header: ingest needs one of the server's write keys");
  }
  bool match = false;
  for (const std::string& key : options_.api_keys) match |= SecretEquals(it->second, key);
  if (!match) return Error(403, "the X-API-Key is not a write key of this server");
  return std::nullopt;
}

Expected<std::string> ServerApi::Body(const HttpRequest& request, HttpResponse* rejection) {
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

HttpResponse ServerApi::Handle(const HttpRequest& request) {
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
  const bool v1 = seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1";
  if (v1 && seg.size() == 3 && (seg[2] == "login" || seg[2] == "logout")) {
    if (m != "POST") return Count(not_allowed("POST"));
    return Count(seg[2] == "login" ? Login(request) : Logout(request));
  }
  if (v1 && seg.size() == 3 && seg[2] == "runs") {
    if (m != "GET") return Count(not_allowed("GET"));
    if (auto denied = CheckViewer(request, false)) return Count(*denied);
    return Count(ListRuns(request));
  }
  if (v1 && seg[2] == "runs" && m == "GET" &&
      (seg.size() == 4 ||
       (seg.size() == 5 && (seg[4] == "series" || seg[4] == "steps" || seg[4] == "kernels")))) {
    if (auto denied = CheckViewer(request, false)) return Count(*denied);
    if (seg.size() == 4) return Count(RunReport(seg[3]));
    if (seg[4] == "kernels") return Count(Kernels(seg[3], request));
    return Count(seg[4] == "series" ? Series(seg[3], request) : Steps(seg[3], request));
  }
  if (v1 && ((seg.size() == 3 && seg[2] == "compare") || (seg.size() == 4 && seg[2] == "groups"))) {
    if (m != "GET") return Count(not_allowed("GET"));
    if (auto denied = CheckViewer(request, false)) return Count(*denied);
    return Count(seg[2] == "compare" ? Compare(request) : Group(PercentDecode(seg[3])));
  }
  if (v1 && seg[2] == "runs" && (seg.size() == 4 || (seg.size() == 5 && seg[4] == "batches"))) {
    const std::string& uuid = seg[3];
    const bool batches = seg.size() == 5;
    if (batches && m != "POST") return Count(not_allowed("POST"));
    if (!batches && m != "PUT") return Count(not_allowed("GET, PUT"));
    if (auto denied = CheckWriteKey(request)) return Count(*denied);
    if (!ValidId(uuid, 128)) {
      return Count(Error(400, "the run id in the path must be 1-128 characters of "
                              "[A-Za-z0-9._:-]"));
    }
    return Count(batches ? PostBatch(uuid, request) : PutRun(uuid, request));
  }
  if (v1 && seg.size() == 3 && seg[2] == "live") {
    // A WebSocket upgrade never reaches Handle (the socket layer takes it to AuthorizeLive).
    if (m != "GET") return Count(not_allowed("GET"));
    if (auto denied = CheckViewer(request, false)) return Count(*denied);
    HttpResponse r = Error(426, "GET /api/v1/live is a WebSocket: connect with an Upgrade: "
                                "websocket request");
    r.headers.emplace_back("Upgrade", "websocket");
    return Count(r);
  }
  if (seg.size() >= 2 && seg[0] == "api" && seg[1] != "v1") {
    return Count(Error(404, "API version '" + seg[1] + "' is not served; this server speaks v1"));
  }
  return Count(Error(404, "no such endpoint: " + m + " " + request.target + " (endpoints: " +
                              kEndpoints + ")"));
}

bool ServerApi::IsLiveTarget(const std::string& target) {
  const std::vector<std::string> seg = Segments(target);
  return seg.size() == 3 && seg[0] == "api" && seg[1] == "v1" && seg[2] == "live";
}

std::optional<HttpResponse> ServerApi::AuthorizeLive(const HttpRequest& request,
                                                     std::optional<int64_t>* run_filter) {
  run_filter->reset();
  if (request.method != "GET") return Count(Error(405, "the live endpoint takes GET"));
  if (!IsLiveTarget(request.target)) return Count(Error(404, "not the live endpoint"));
  if (auto denied = CheckViewer(request, false)) return Count(*denied);
  // A page of another site may open a WebSocket with the viewer's cookie (browsers send it on
  // the upgrade): only this server's own pages may.
  auto origin = request.headers.find("origin");
  auto host = request.headers.find("host");
  if (origin != request.headers.end()) {
    const std::string h = host == request.headers.end() ? "" : host->second;
    if (origin->second != "http://" + h && origin->second != "https://" + h) {
      return Count(Error(403, "the WebSocket's Origin (" + origin->second +
                                  ") is not this server"));
    }
  }
  const auto params = Query(request.target);
  const auto run = params.find("run");
  if (run != params.end()) {
    const std::string& query = run->second;
    const auto id = ParseInt(query);
    if (!id || *id <= 0) return Count(Error(400, "run must be a run id (a positive integer)"));
    auto lock = LockStore();
    if (auto missing = NoSuchRun(*id)) return Count(*missing);
    *run_filter = *id;
  }
  Count(Json(101, json::object()));
  return std::nullopt;
}

HttpResponse ServerApi::PutRun(const std::string& uuid, const HttpRequest& request) {
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
  auto lock = LockStore();
  auto existing = db_->IngestRunId(uuid);
  if (!existing) return Error(500, "store: " + existing.error());
  if (*existing) {
    info->run_id = **existing;
    Status st = db_->UpdateRunFields(*info);
    if (st.ok() && info->status != "running") {
      st = db_->FinishRun(info->run_id, info->status, info->end_ns, info->error);
    }
    if (!st.ok()) return Error(500, "store: " + st.message());
    lock = {};
    bus_.PublishRun(info->run_id, RunEvent(*info, false));
    return Json(200, json{{"run_id", info->run_id}, {"created", false}});
  }
  auto id = db_->BeginIngestRun(uuid, *info);
  if (!id) return Error(500, "store: " + id.error());
  lock = {};
  {
    std::lock_guard c(counters_mu_);
    ++runs_created_;
  }
  info->run_id = *id;
  bus_.PublishRun(*id, RunEvent(*info, true));
  return Json(201, json{{"run_id", *id}, {"created", true}});
}

HttpResponse ServerApi::PostBatch(const std::string& uuid, const HttpRequest& request) {
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
    // Too many rows is a size limit, a 413 like a body over the limit (docs/server.md).
    size_t count = 0;
    if (doc["rows"].is_object()) {
      for (const auto& [table, list] : doc["rows"].items()) {
        if (list.is_array()) count += list.size();
      }
    }
    if (count > options_.max_rows_per_batch) {
      return Error(413, "rows: more than " + std::to_string(options_.max_rows_per_batch) +
                            " rows in one batch; send smaller batches");
    }
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
  auto lock = LockStore();
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
  lock = {};
  {
    std::lock_guard c(counters_mu_);
    ++batches_;
    if (duplicate) {
      ++duplicate_batches_;
    } else {
      rows_ += rows.size();
    }
  }
  if (!duplicate) bus_.PublishBatch(**run_id, BatchEvent(rows, insights.has_value()));
  return Json(200, json{{"run_id", **run_id},
                        {"batch_id", batch_id},
                        {"stored", duplicate ? 0 : rows.size()},
                        {"duplicate", duplicate}});
}

int64_t ServerApi::Now() const {
  if (options_.now_s) return options_.now_s();
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string ServerApi::Sign(const std::string& payload) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), options_.secret.data(), static_cast<int>(options_.secret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), mac, &len);
  return Hex(mac, len);
}

HttpResponse ServerApi::Login(const HttpRequest& request) {
  if (!options_.viewer_password) {
    return Error(403, "viewing is off on this server: start it with --viewer-password or "
                      "--viewer-password-file");
  }
  // At most logins_per_minute attempts per client address in any minute.
  const int64_t now = Now();
  {
    std::lock_guard lock(logins_mu_);
    auto& seen = logins_[request.peer];
    while (!seen.empty() && seen.front() <= now - 60) seen.pop_front();
    if (seen.size() >= options_.logins_per_minute) {
      HttpResponse r = Error(429, "too many login attempts from this address: at most " +
                                      std::to_string(options_.logins_per_minute) +
                                      " a minute");
      r.headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(
                                                1, seen.front() + 60 - now)));
      return r;
    }
    seen.push_back(now);
  }
  HttpResponse rejection;
  auto body = Body(request, &rejection);
  if (!body) return rejection;
  json doc = json::parse(*body, nullptr, false);
  if (!doc.is_object() || !doc.contains("password") || !doc["password"].is_string()) {
    return Error(400, "the body must be {\"password\": \"...\"}");
  }
  if (!SecretEquals(doc["password"].get<std::string>(), *options_.viewer_password)) {
    return Error(401, "wrong password");
  }
  unsigned char nonce_bytes[16];
  if (RAND_bytes(nonce_bytes, sizeof nonce_bytes) != 1) return Error(500, "no randomness");
  const std::string nonce = Hex(nonce_bytes, sizeof nonce_bytes);
  const std::string payload = "v1." + std::to_string(now + options_.session_ttl_s) + "." + nonce;
  const std::string session = payload + "." + Sign(payload);
  const std::string csrf = Sign("csrf." + nonce);
  const bool tls = [&] {
    auto it = request.headers.find("x-forwarded-proto");
    return it != request.headers.end() && it->second == "https";
  }();
  const std::string attrs = "; Path=/; SameSite=Strict; Max-Age=" +
                            std::to_string(options_.session_ttl_s) + (tls ? "; Secure" : "");
  HttpResponse r = Json(200, json{{"csrf", csrf}, {"expires_unix", now + options_.session_ttl_s}});
  r.headers.emplace_back("Set-Cookie", std::string(kSessionCookie) + "=" + session + attrs +
                                           "; HttpOnly");
  r.headers.emplace_back("Set-Cookie", std::string(kCsrfCookie) + "=" + csrf + attrs);
  return r;
}

std::optional<HttpResponse> ServerApi::CheckViewer(const HttpRequest& request,
                                                   bool state_changing) {
  if (!options_.viewer_password) {
    return Error(403, "viewing is off on this server: start it with --viewer-password or "
                      "--viewer-password-file");
  }
  const auto cookies = Cookies(request);
  auto it = cookies.find(kSessionCookie);
  if (it == cookies.end()) {
    if (request.headers.count("x-api-key")) {
      return Error(401, "a write key cannot read: log in as a viewer (POST /api/v1/login)");
    }
    return Error(401, "not logged in: POST /api/v1/login with the viewer password");
  }
  // "v1.<expiry>.<nonce>.<mac>"
  const std::string& token = it->second;
  const size_t last = token.rfind('.');
  const std::string payload = last == std::string::npos ? "" : token.substr(0, last);
  if (last == std::string::npos || !SecretEquals(token.substr(last + 1), Sign(payload))) {
    return Error(401, "the session cookie is not valid: log in again");
  }
  const size_t a = payload.find('.'), b = payload.find('.', a + 1);
  const auto expiry = a == std::string::npos || b == std::string::npos
                          ? std::nullopt
                          : ParseInt(payload.substr(a + 1, b - a - 1));
  if (!expiry || *expiry <= Now()) return Error(401, "the session has expired: log in again");
  if (state_changing) {
    // Double submit: the header must carry the CSRF cookie, and both the session's token.
    const std::string expected = Sign("csrf." + payload.substr(b + 1));
    auto header = request.headers.find("x-csrf-token");
    auto cookie = cookies.find(kCsrfCookie);
    if (header == request.headers.end() || cookie == cookies.end() ||
        !SecretEquals(header->second, cookie->second) ||
        !SecretEquals(header->second, expected)) {
      return Error(403, "missing or wrong X-CSRF-Token header (the gpuprof_csrf cookie's "
                        "value, as given at login)");
    }
  }
  return std::nullopt;
}

HttpResponse ServerApi::Logout(const HttpRequest& request) {
  if (auto denied = CheckViewer(request, true)) return *denied;
  HttpResponse r = Json(200, json{{"logged_out", true}});
  r.headers.emplace_back("Set-Cookie", std::string(kSessionCookie) +
                                           "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
  r.headers.emplace_back("Set-Cookie",
                         std::string(kCsrfCookie) + "=; Path=/; Max-Age=0; SameSite=Strict");
  return r;
}

HttpResponse ServerApi::ListRuns(const HttpRequest& request) {
  const auto q = Query(request.target);
  for (const auto& [k, v] : q) {
    if (k != "name" && k != "group" && k != "status") {
      return Error(400, "unknown filter '" + k + "' (filters: name, group, status)");
    }
  }
  auto lock = LockStore();
  auto runs = db_->ListRuns();
  if (!runs) return Error(500, "store: " + runs.error());
  json list = json::array();
  for (const auto& r : *runs) {
    if (q.count("name") && r.run_name != q.at("name")) continue;
    if (q.count("group") && r.group_id.value_or("") != q.at("group")) continue;
    if (q.count("status") && r.status != q.at("status")) continue;
    json j = store::RunInfoToJson(r);
    j["run_id"] = r.run_id;
    list.push_back(std::move(j));
  }
  return Json(200, json{{"runs", list}});
}

HttpResponse ServerApi::RunReport(const std::string& id) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  auto lock = LockStore();
  if (auto missing = NoSuchRun(*run_id)) return *missing;
  auto report = analysis::AnalyzeRun(*db_, *run_id, analysis::AnalysisOptions{});
  if (!report) return Error(500, "analysis: " + report.error());
  return Json(200, analysis::ReportJson(*report));
}

HttpResponse ServerApi::Series(const std::string& id, const HttpRequest& request) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  const auto q = Query(request.target);
  auto param = [&](const char* name, int64_t fallback) -> std::optional<int64_t> {
    auto it = q.find(name);
    return it == q.end() ? std::optional<int64_t>(fallback) : ParseInt(it->second);
  };
  const std::string metric = q.count("metric") ? q.at("metric") : "";
  const auto gpu = param("gpu", 0);
  const auto points = param("points", 2000);
  const auto from = param("from_ns", 0);
  const auto to = param("to_ns", INT64_MAX);
  if (!gpu || !points || !from || !to) {
    return Error(400, "gpu, points, from_ns and to_ns must be integers");
  }
  if (*points < 3 || *points > 100000) return Error(400, "points must be in 3..100000");
  auto lock = LockStore();
  if (auto missing = NoSuchRun(*run_id)) return *missing;
  auto series = db_->LoadSeries(*run_id, metric, *gpu, *from, *to);
  if (!series) return Error(400, series.error());
  const auto kept = Lttb(*series, static_cast<size_t>(*points));
  json pts = json::array();
  for (const auto& [t, v] : kept) pts.push_back({t, v});
  return Json(200, json{{"metric", metric},
                        {"gpu", metric == "host_cpu" ? json() : json(*gpu)},
                        {"source_points", series->size()},
                        {"points", pts}});
}

HttpResponse ServerApi::Kernels(const std::string& id, const HttpRequest& request) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  const auto q = Query(request.target);
  const auto top = q.count("top") ? ParseInt(q.at("top")) : std::optional<int64_t>(50);
  if (!top || *top < 1 || *top > 10000) return Error(400, "top must be an integer in 1..10000");
  const auto from = q.count("from_ns") ? ParseInt(q.at("from_ns"))
                                       : std::optional<int64_t>(INT64_MIN);
  const auto to = q.count("to_ns") ? ParseInt(q.at("to_ns")) : std::optional<int64_t>(INT64_MAX);
  if (!from || !to || *from > *to) {
    return Error(400, "from_ns and to_ns must be integers (run-relative ns), from_ns <= to_ns");
  }
  auto lock = LockStore();
  if (auto missing = NoSuchRun(*run_id)) return *missing;
  auto rows = db_->LoadKernels(*run_id);
  if (!rows) return Error(500, "store: " + rows.error());
  lock = {};
  // Per (name, source) over the windows that start in [from_ns, to_ns].
  struct Acc {
    int64_t calls = 0, gpu_ns = 0, windows = 0;
  };
  std::map<std::pair<std::string, std::string>, Acc> by_kernel;
  std::set<int64_t> windows;
  std::set<std::string> sources;
  int64_t total = 0;
  for (const store::KernelRow& k : *rows) {
    if (k.window_start_ns < *from || k.window_start_ns > *to) continue;
    Acc& a = by_kernel[{k.name, k.source}];
    a.calls += k.calls;
    a.gpu_ns += k.gpu_ns;
    ++a.windows;
    total += k.gpu_ns;
    windows.insert(k.window_start_ns);
    sources.insert(k.source);
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Acc>> sorted(by_kernel.begin(),
                                                                          by_kernel.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.gpu_ns != b.second.gpu_ns ? a.second.gpu_ns > b.second.gpu_ns
                                              : a.first < b.first;
  });
  json list = json::array();
  for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(*top); ++i) {
    const auto& [key, a] = sorted[i];
    list.push_back({{"name", key.first},
                    {"source", key.second},
                    {"calls", a.calls},
                    {"gpu_ns", a.gpu_ns},
                    {"mean_ns", a.calls > 0 ? json(static_cast<double>(a.gpu_ns) / a.calls)
                                            : json(nullptr)},
                    {"share_pct", total > 0 ? json(100.0 * a.gpu_ns / total) : json(nullptr)},
                    {"windows", a.windows}});
  }
  json out = {{"run_id", *run_id},
              {"recorded", !rows->empty()},
              {"kernels_total", sorted.size()},
              {"windows", windows.size()},
              {"total_gpu_ns", total},
              {"sources", json(std::vector<std::string>(sources.begin(), sources.end()))},
              {"kernels", list}};
  out["reason"] = rows->empty() ? json("no kernel trace was recorded for this run")
                                : json(nullptr);
  return Json(200, out);
}

HttpResponse ServerApi::Steps(const std::string& id, const HttpRequest& request) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  const auto q = Query(request.target);
  const auto points = q.count("points") ? ParseInt(q.at("points")) : std::optional<int64_t>(2000);
  if (!points || *points < 1 || *points > 100000) {
    return Error(400, "points must be an integer in 1..100000");
  }
  auto lock = LockStore();
  if (auto missing = NoSuchRun(*run_id)) return *missing;
  auto data = db_->LoadRun(*run_id);
  if (!data) return Error(500, "store: " + data.error());
  const analysis::RunView view = analysis::BuildRunView(std::move(data.value()));
  // Per step: its time in loader wait, each phase (wall), and the rest; GPU time apart.
  static const char* kPhases[] = {"forward", "backward", "optimizer", "comm"};
  struct Acc {
    int64_t first = 0, last = 0, n = 0;
    double duration = 0, wait = 0, other = 0;
    double phase[4] = {0, 0, 0, 0};
    double gpu = 0;
    int64_t gpu_known = 0;
  };
  const size_t total = view.steps.size();
  const size_t per = std::max<size_t>(1, (total + static_cast<size_t>(*points) - 1) /
                                             static_cast<size_t>(*points));
  json rows = json::array();
  for (size_t i = 0; i < total; i += per) {
    Acc a;
    a.first = view.steps[i].step;
    for (size_t j = i; j < std::min(total, i + per); ++j) {
      const analysis::StepView& st = view.steps[j];
      a.last = st.step;
      ++a.n;
      a.duration += static_cast<double>(st.duration_ns);
      const double wait = static_cast<double>(st.wait_ns.value_or(0));
      a.wait += wait;
      double named = 0;
      bool any_gpu = false;
      double gpu = 0;
      for (const auto& ph : st.phases) {
        for (int k = 0; k < 4; ++k) {
          if (ph.name == kPhases[k]) {
            a.phase[k] += static_cast<double>(ph.wall_ns);
            named += static_cast<double>(ph.wall_ns);
          }
        }
        if (ph.gpu_ns) {
          any_gpu = true;
          gpu += static_cast<double>(*ph.gpu_ns);
        }
      }
      a.other += std::max(0.0, static_cast<double>(st.duration_ns) - wait - named);
      if (any_gpu) {
        a.gpu += gpu;
        ++a.gpu_known;
      }
    }
    const double n = static_cast<double>(a.n);
    json r = {{"first_step", a.first},      {"last_step", a.last},
              {"steps", a.n},               {"duration_ns", a.duration / n},
              {"wait_ns", a.wait / n},      {"forward_ns", a.phase[0] / n},
              {"backward_ns", a.phase[1] / n}, {"optimizer_ns", a.phase[2] / n},
              {"comm_ns", a.phase[3] / n},  {"other_ns", a.other / n},
              {"gpu_ns", a.gpu_known ? json(a.gpu / static_cast<double>(a.gpu_known))
                                     : json(nullptr)}};
    rows.push_back(std::move(r));
  }
  return Json(200, json{{"run_id", *run_id},
                        {"steps_total", total},
                        {"steps_per_row", per},
                        {"rows", rows}});
}

HttpResponse ServerApi::Compare(const HttpRequest& request) {
  const auto q = Query(request.target);
  if (!q.count("runs")) return Error(400, "compare needs ?runs=ID,ID[,ID,ID] (2 to 4 runs)");
  std::vector<int64_t> ids;
  std::istringstream in(q.at("runs"));
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto id = ParseInt(part);
    if (!id) return Error(400, "runs: '" + part + "' is not a run id");
    ids.push_back(*id);
  }
  if (ids.size() < 2 || ids.size() > 4) {
    return Error(400, "compare takes 2 to 4 runs, got " + std::to_string(ids.size()));
  }
  json out = json::array();
  auto lock = LockStore();
  for (int64_t id : ids) {
    if (auto missing = NoSuchRun(id)) return *missing;
    auto report = analysis::AnalyzeRun(*db_, id, analysis::AnalysisOptions{});
    if (!report) return Error(500, "analysis: " + report.error());
    json doc = analysis::ReportJson(*report);
    out.push_back(json{{"run", doc["run"]},
                       {"steps", doc["steps"]},
                       {"mfu", doc["mfu"]},
                       {"insights", doc["insights"]}});
  }
  return Json(200, json{{"runs", out}});
}

HttpResponse ServerApi::Group(const std::string& name) {
  auto lock = LockStore();
  auto runs = db_->ListRuns();
  if (!runs) return Error(500, "store: " + runs.error());
  const bool known = std::any_of(runs->begin(), runs->end(), [&](const store::RunInfo& r) {
    return r.group_id && *r.group_id == name;
  });
  if (!known) return Error(404, "no group '" + name + "' on this server");
  auto report = analysis::AnalyzeStoredGroup(*db_, name, analysis::AnalysisOptions{});
  if (!report) return Error(500, "analysis: " + report.error());
  return Json(200, analysis::GroupReportJson(*report));
}

Expected<std::string> RandomSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return Status::Error("no randomness for the secret");
  return Hex(bytes, sizeof bytes);
}

Expected<std::string> LoadOrCreateSecret(const std::optional<std::string>& secret_file,
                                         const std::string& store_path) {
  auto read = [](const std::string& path) -> std::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  if (secret_file) {
    auto s = read(*secret_file);
    if (!s) return Status::Error("--secret-file " + *secret_file + ": cannot be read");
    if (s->size() < 32) {
      return Status::Error("--secret-file " + *secret_file +
                           ": too short (at least 32 bytes; e.g. head -c 32 /dev/urandom)");
    }
    return *s;
  }
  const std::string path = store_path + ".secret";
  if (auto s = read(path); s && s->size() >= 32) return *s;
  auto fresh = RandomSecret();
  if (!fresh) return fresh.status();
  const std::string secret = *fresh;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Error("cannot create the session secret " + path);
  const bool ok = ::write(fd, secret.data(), secret.size()) == static_cast<ssize_t>(secret.size());
  ::close(fd);
  if (!ok) return Status::Error("cannot write the session secret " + path);
  return secret;
}

HttpResponse ServerApi::Metrics() {
  std::ostringstream out;
  int64_t live = 0;
  // The newest second of every live run's GPUs (NULL readings are left out: no sample).
  std::ostringstream gpu[4];
  {
    auto lock = LockStore();
    if (auto runs = db_->ListRuns()) {
      for (const auto& r : *runs) {
        if (r.status != "running") continue;
        ++live;
        auto latest = db_->LatestGpuSecond(r.run_id);
        if (!latest) continue;
        for (const auto& g : *latest) {
          const std::string labels = "{run_id=\"" + std::to_string(r.run_id) +
                                     "\",run_name=\"" + PromLabel(r.run_name) + "\",gpu=\"" +
                                     std::to_string(g.gpu_index) + "\"} ";
          auto put = [&](int i, const char* name, auto value) {
            gpu[i] << name << labels << value << "\n";
          };
          if (g.util_mean_pct) put(0, "gpuprof_gpu_utilization_percent", *g.util_mean_pct);
          if (g.mem_used_max_bytes) put(1, "gpuprof_gpu_memory_used_bytes", *g.mem_used_max_bytes);
          if (g.power_mean_mw) put(2, "gpuprof_gpu_power_watts", *g.power_mean_mw / 1000.0);
          if (g.temp_max_c) put(3, "gpuprof_gpu_temperature_celsius", *g.temp_max_c);
        }
      }
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
      << "gpuprof_runs_live " << live << "\n"
      << "# HELP gpuprof_live_viewers WebSocket viewers connected to /api/v1/live.\n"
      << "# TYPE gpuprof_live_viewers gauge\n"
      << "gpuprof_live_viewers " << bus_.viewers() << "\n"
      << "# HELP gpuprof_live_events_coalesced_total Live events merged into one still pending "
         "for a slow viewer.\n"
      << "# TYPE gpuprof_live_events_coalesced_total counter\n"
      << "gpuprof_live_events_coalesced_total " << bus_.coalesced() << "\n"
      << "# HELP gpuprof_live_viewers_dropped_total Viewers disconnected for not taking "
         "messages.\n"
      << "# TYPE gpuprof_live_viewers_dropped_total counter\n"
      << "gpuprof_live_viewers_dropped_total " << bus_.dropped() << "\n";
  static const char* const kGpu[4][2] = {
      {"gpuprof_gpu_utilization_percent", "GPU utilization of a live run, newest second."},
      {"gpuprof_gpu_memory_used_bytes", "Device memory used by a live run's GPU, newest second."},
      {"gpuprof_gpu_power_watts", "Power draw of a live run's GPU, newest second (mean)."},
      {"gpuprof_gpu_temperature_celsius", "Temperature of a live run's GPU, newest second (max)."}};
  for (int i = 0; i < 4; ++i) {
    const std::string samples = gpu[i].str();
    if (samples.empty()) continue;
    out << "# HELP " << kGpu[i][0] << " " << kGpu[i][1] << "\n# TYPE " << kGpu[i][0]
        << " gauge\n" << samples;
  }
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = out.str();
  return r;
}

}  // namespace gpuprof::server
