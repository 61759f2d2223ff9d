#include "server/ingest_api.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/group.h"
#include "analysis/report.h"
#include "analysis/run_view.h"
#include "server/lttb.h"
#include "server/series_cache.h"
#include "server/web_assets.h"
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
    "GET /api/v1/compare, GET /api/v1/groups/{name}, GET /api/v1/live (WebSocket), "
    "GET /api/v1/session, GET /login?token=, GET / (the web app)";

#ifndef GPUPROF_VERSION
#define GPUPROF_VERSION "unknown"
#endif
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

json RunEvent(const store::RunInfo& info, bool created) {
  json e = {{"run_name", info.run_name},
            {"status", info.status},
            {"created", created},
            {"hostname", info.hostname},
            {"start_unix_ns", info.start_unix_ns}};
  e["group_id"] = info.group_id ? json(*info.group_id) : json(nullptr);
  e["end_ns"] = info.end_ns ? json(*info.end_ns) : json(nullptr);
  return e;
}

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
  // 64 MiB of cache, a checkpoint every 10,000 pages (40 MiB): 1.10 -> 1.50 M rows/s of ingest
  // (docs/benchmarks.md, "Team server").
  if (Status st = (*db)->TuneForServer(64, 10'000); !st.ok()) return st;
  return std::unique_ptr<ServerApi>(
      new ServerApi(std::move(db.value()), storage_path, std::move(options)));
}

std::unique_ptr<ServerApi> ServerApi::Create(std::unique_ptr<store::RunStore> db,
                                             std::string storage, ApiOptions options) {
  return std::unique_ptr<ServerApi>(
      new ServerApi(std::move(db), std::move(storage), std::move(options)));
}

ServerApi::ServerApi(std::unique_ptr<store::RunStore> db, std::string path, ApiOptions options)
    : db_(std::move(db)),
      storage_path_(std::move(path)),
      options_(std::move(options)),
      session_cookie_(std::string(kSessionCookie) + options_.cookie_suffix),
      csrf_cookie_(std::string(kCsrfCookie) + options_.cookie_suffix) {
  // SQLite: reads get read-only connections of their own (WAL readers run beside the writer
  // and beside each other), so a long analysis never holds up a chart's series or ingest.
  if (!db_->thread_safe() && dynamic_cast<store::SqliteStore*>(db_.get()) != nullptr) {
    reader_path_ = db_->location();
  }
}

std::optional<HttpResponse> ServerApi::NoSuchRun(store::RunStore& db, int64_t run_id) {
  auto exists = db.RunExists(run_id);
  if (!exists) return Error(500, "store: " + exists.error());
  if (!*exists) return Error(404, "no run " + std::to_string(run_id) + " on this server");
  return std::nullopt;
}

ServerApi::ReadLease ServerApi::Read() {
  ReadLease lease;
  lease.api_ = this;
  if (reader_path_) {
    std::unique_lock lock(readers_mu_);
    readers_cv_.wait(lock, [&] { return !idle_readers_.empty() || readers_open_ < kReaders; });
    if (!idle_readers_.empty()) {
      lease.own_ = std::move(idle_readers_.back());
      idle_readers_.pop_back();
    } else {
      ++readers_open_;
      lock.unlock();
      auto opened = store::SqliteStore::Open(*reader_path_, store::SqliteStore::Mode::kReadOnly);
      if (opened) {
        lease.own_ = std::move(opened.value());
      } else {
        lock.lock();
        --readers_open_;
        readers_cv_.notify_one();
      }
    }
    if (lease.own_) {
      lease.db_ = lease.own_.get();
      return lease;
    }
  }
  // No pool (PostgreSQL's own, or a reader that could not be opened): the store itself.
  lease.lock_ = LockStore();
  lease.db_ = db_.get();
  return lease;
}

ServerApi::ReadLease::~ReadLease() {
  if (!own_) return;
  std::lock_guard lock(api_->readers_mu_);
  api_->idle_readers_.push_back(std::move(own_));
  api_->readers_cv_.notify_one();
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
    HttpResponse r =
        Error(405, m + " is not allowed on " + request.target + " (allowed: " + allow + ")");
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
  // The web app: its files need no session (they hold no data; the API behind them does).
  if (seg.empty() || (seg.size() == 1 && seg[0] == "index.html") ||
      (seg.size() >= 2 && (seg[0] == "app" || seg[0] == "lib" || seg[0] == "vendor"))) {
    if (m != "GET" && m != "HEAD") return Count(not_allowed("GET"));
    return Count(StaticFile(request, request.target.substr(0, request.target.find('?'))));
  }
  if (seg.size() == 1 && seg[0] == "favicon.ico") {  // browsers ask; there is none
    if (m != "GET" && m != "HEAD") return Count(not_allowed("GET"));
    HttpResponse r;
    r.status = 204;
    r.content_type = "image/x-icon";
    return Count(r);
  }
  if (seg.size() == 1 && seg[0] == "login") {
    if (m != "GET") return Count(not_allowed("GET"));
    return Count(TokenLogin(request));
  }
  const bool v1 = seg.size() >= 3 && seg[0] == "api" && seg[1] == "v1";
  if (v1 && seg.size() == 3 && seg[2] == "session") {
    if (m != "GET") return Count(not_allowed("GET"));
    return Count(Session(request));
  }
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
      return Count(Error(400,
                         "the run id in the path must be 1-128 characters of "
                         "[A-Za-z0-9._:-]"));
    }
    return Count(batches ? PostBatch(uuid, request) : PutRun(uuid, request));
  }
  if (v1 && seg.size() == 3 && seg[2] == "live") {
    // A WebSocket upgrade never reaches Handle (the socket layer takes it to AuthorizeLive).
    if (m != "GET") return Count(not_allowed("GET"));
    if (auto denied = CheckViewer(request, false)) return Count(*denied);
    HttpResponse r = Error(426,
                           "GET /api/v1/live is a WebSocket: connect with an Upgrade: "
                           "websocket request");
    r.headers.emplace_back("Upgrade", "websocket");
    return Count(r);
  }
  if (seg.size() >= 2 && seg[0] == "api" && seg[1] != "v1") {
    return Count(Error(404, "API version '" + seg[1] + "' is not served; this server speaks v1"));
  }
  return Count(Error(
      404, "no such endpoint: " + m + " " + request.target + " (endpoints: " + kEndpoints + ")"));
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
      return Count(
          Error(403, "the WebSocket's Origin (" + origin->second + ") is not this server"));
    }
  }
  const auto params = Query(request.target);
  const auto run = params.find("run");
  if (run != params.end()) {
    const std::string& query = run->second;
    const auto id = ParseInt(query);
    if (!id || *id <= 0) return Count(Error(400, "run must be a run id (a positive integer)"));
    auto db = Read();
    if (auto missing = NoSuchRun(*db, *id)) return Count(*missing);
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
  // Decoded straight from the text into rows (no document: the ingest hot path), whole before
  // anything is stored.
  JsonReader reader(*body);
  auto not_json = [&] { return Error(400, "the body is " + reader.error()); };
  JsonReader::Type type{};
  if (!reader.Peek(&type)) return not_json();
  if (type != JsonReader::Type::kObject) {
    if (!reader.Skip() || !reader.End()) return not_json();
    return Error(400, "the body must be a JSON object");
  }
  reader.EnterObject();
  std::optional<std::string> batch_id;  // when given as a string
  std::vector<store::Row> rows;
  std::optional<std::string_view> insights_text;
  std::set<std::string> fields;
  for (std::string key; reader.NextKey(&key);) {
    if (key != "batch_id" && key != "rows" && key != "insights") {
      return Error(400, "unknown field '" + key + "' (expected: batch_id, rows, insights)");
    }
    if (!fields.insert(key).second) return Error(400, "field '" + key + "' is given twice");
    if (key == "batch_id") {
      if (!reader.Peek(&type)) return not_json();
      if (type == JsonReader::Type::kString) {
        batch_id.emplace();
        reader.String(&*batch_id);
      } else {
        reader.Skip();
      }
    } else if (key == "rows") {
      bool too_many = false;
      Status st = store::ReadRows(reader, options_.max_rows_per_batch, &rows, &too_many);
      if (!reader.ok()) return not_json();
      // Too many rows is a size limit, a 413 like a body over the limit (docs/server.md).
      if (!st.ok()) return Error(too_many ? 413 : 400, st.message());
    } else {
      std::string_view raw;
      if (reader.Skip(&raw)) insights_text = raw;
    }
  }
  if (!reader.ok() || !reader.End()) return not_json();
  if (!batch_id || !ValidId(*batch_id, 128)) {
    return Error(400,
                 "batch_id must be a string of 1-128 characters of [A-Za-z0-9._:-]: the "
                 "client's id for this batch, the same on every retry");
  }
  std::optional<std::vector<store::InsightRow>> insights;
  if (insights_text) {
    auto parsed = store::InsightsFromJsonText(*insights_text);
    if (!parsed) return Error(400, parsed.error());
    insights = std::move(parsed.value());
  }
  const std::string& id = *batch_id;
  auto lock = LockStore();
  auto run_id = db_->IngestRunId(uuid);
  if (!run_id) return Error(500, "store: " + run_id.error());
  if (!*run_id) {
    return Error(404, "no run '" + uuid + "' on this server: PUT /api/v1/runs/" + uuid + " first");
  }
  bool duplicate = false;
  Status st = db_->WriteBatchOnce(**run_id, id, rows, insights ? &*insights : nullptr, &duplicate);
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
  if (!duplicate) {
    // Series rows older than a minute summary covers (a spool drained late) make it stale.
    std::optional<int64_t> oldest;
    for (const store::Row& row : rows) {
      if (const auto* g = std::get_if<store::GpuRollupRow>(&row)) {
        oldest = std::min(oldest.value_or(g->ts_ns), g->ts_ns);
      } else if (const auto* h = std::get_if<store::HostSampleRow>(&row)) {
        oldest = std::min(oldest.value_or(h->ts_ns), h->ts_ns);
      }
    }
    if (oldest) series_cache_.Invalidate(**run_id, *oldest);
    {
      std::lock_guard lock(reports_mu_);
      ++run_writes_[**run_id];
    }
    bus_.PublishBatch(**run_id, BatchEvent(rows, insights.has_value()));
  }
  return Json(200, json{{"run_id", **run_id},
                        {"batch_id", id},
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
    if (options_.login_token) {
      return Error(403,
                   "this dashboard has no password: open the URL the training process "
                   "printed (its token logs the browser in once)");
    }
    return Error(403,
                 "viewing is off on this server: start it with --viewer-password or "
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
                                      std::to_string(options_.logins_per_minute) + " a minute");
      r.headers.emplace_back("Retry-After",
                             std::to_string(std::max<int64_t>(1, seen.front() + 60 - now)));
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
  HttpResponse r;
  std::string csrf;
  if (Status st = IssueSession(request, &r, &csrf); !st.ok()) return Error(500, st.message());
  HttpResponse ok =
      Json(200, json{{"csrf", csrf}, {"expires_unix", Now() + options_.session_ttl_s}});
  ok.headers = std::move(r.headers);
  return ok;
}

Status ServerApi::IssueSession(const HttpRequest& request, HttpResponse* r, std::string* csrf) {
  const int64_t now = Now();
  unsigned char nonce_bytes[16];
  if (RAND_bytes(nonce_bytes, sizeof nonce_bytes) != 1) return Status::Error("no randomness");
  const std::string nonce = Hex(nonce_bytes, sizeof nonce_bytes);
  const std::string payload = "v1." + std::to_string(now + options_.session_ttl_s) + "." + nonce;
  const std::string session = payload + "." + Sign(payload);
  const std::string token = Sign("csrf." + nonce);
  const bool tls = [&] {
    auto it = request.headers.find("x-forwarded-proto");
    return it != request.headers.end() && it->second == "https";
  }();
  const std::string attrs =
      "; Path=/; SameSite=Strict; Max-Age=" + std::to_string(options_.session_ttl_s) +
      (tls ? "; Secure" : "");
  r->headers.emplace_back("Set-Cookie", session_cookie_ + "=" + session + attrs + "; HttpOnly");
  r->headers.emplace_back("Set-Cookie", csrf_cookie_ + "=" + token + attrs);
  *csrf = token;
  return Status::Ok();
}

std::optional<HttpResponse> ServerApi::CheckViewer(const HttpRequest& request,
                                                   bool state_changing) {
  if (!viewing_on()) {
    return Error(403,
                 "viewing is off on this server: start it with --viewer-password or "
                 "--viewer-password-file");
  }
  const auto cookies = Cookies(request);
  auto it = cookies.find(session_cookie_);
  if (it == cookies.end()) {
    if (request.headers.count("x-api-key")) {
      return Error(401, "a write key cannot read: log in as a viewer (POST /api/v1/login)");
    }
    return Error(401, options_.login_token
                          ? "not logged in: open the URL the training process printed"
                          : "not logged in: POST /api/v1/login with the viewer password");
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
    auto cookie = cookies.find(csrf_cookie_);
    if (header == request.headers.end() || cookie == cookies.end() ||
        !SecretEquals(header->second, cookie->second) || !SecretEquals(header->second, expected)) {
      return Error(403,
                   "missing or wrong X-CSRF-Token header (the gpuprof_csrf cookie's "
                   "value, as given at login)");
    }
  }
  return std::nullopt;
}

HttpResponse ServerApi::Logout(const HttpRequest& request) {
  if (auto denied = CheckViewer(request, true)) return *denied;
  HttpResponse r = Json(200, json{{"logged_out", true}});
  r.headers.emplace_back("Set-Cookie",
                         session_cookie_ + "=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
  r.headers.emplace_back("Set-Cookie", csrf_cookie_ + "=; Path=/; Max-Age=0; SameSite=Strict");
  return r;
}

HttpResponse ServerApi::ListRuns(const HttpRequest& request) {
  const auto q = Query(request.target);
  for (const auto& [k, v] : q) {
    if (k != "name" && k != "group" && k != "status" && k != "id") {
      return Error(400, "unknown filter '" + k + "' (filters: id, name, group, status)");
    }
  }
  std::optional<int64_t> only;
  if (q.count("id")) {
    only = ParseInt(q.at("id"));
    if (!only) return Error(400, "id must be a run id (an integer), got '" + q.at("id") + "'");
  }
  auto db = Read();
  auto runs = db->ListRuns();
  if (!runs) return Error(500, "store: " + runs.error());
  json list = json::array();
  for (const auto& r : *runs) {
    if (only && r.run_id != *only) continue;
    if (q.count("name") && r.run_name != q.at("name")) continue;
    if (q.count("group") && r.group_id.value_or("") != q.at("group")) continue;
    if (q.count("status") && r.status != q.at("status")) continue;
    json j = store::RunInfoToJson(r);
    j["run_id"] = r.run_id;
    auto progress = db->LoadRunProgress(r.run_id);
    if (!progress) return Error(500, "store: " + progress.error());
    j["steps"] = progress->steps;
    // Ended: its end; live (or killed): the newest step or sample so far; null before any.
    std::optional<int64_t> duration = r.end_ns;
    if (!duration) {
      const auto& a = progress->last_step_end_ns;
      const auto& b = progress->last_sample_ns;
      duration = a && b ? std::max(*a, *b) : a ? a : b;
    }
    j["duration_ns"] = duration ? json(*duration) : json();
    if (progress->headline) {
      const auto& h = *progress->headline;
      j["headline"] = {{"rule_id", h.rule_id},
                       {"severity", h.severity},
                       {"message", h.message},
                       {"fix", h.fix ? json(*h.fix) : json()}};
    } else {
      j["headline"] = nullptr;
    }
    list.push_back(std::move(j));
  }
  return Json(200, json{{"runs", list}});
}

HttpResponse ServerApi::RunReport(const std::string& id) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  auto db = Read();
  if (auto missing = NoSuchRun(*db, *run_id)) return *missing;
  auto report = Report(*db, *run_id);
  if (!report) return Error(500, report.error());
  return Json(200, *report);
}

Expected<json> ServerApi::Report(store::RunStore& db, int64_t run_id) {
  // What the report is computed from, as far as a cheap look tells: the run's fields, its steps
  // and newest times, its insights. Unchanged -> the report computed last time.
  auto runs = db.ListRuns();
  if (!runs) return Status::Error("store: " + runs.error());
  auto progress = db.LoadRunProgress(run_id);
  if (!progress) return Status::Error("store: " + progress.error());
  json key = json::array();
  std::optional<std::string> group;
  for (const store::RunInfo& r : *runs) {
    if (r.run_id != run_id) continue;
    key.push_back(store::RunInfoToJson(r));
    if (r.world_size && *r.world_size > 1) group = r.group_id;
  }
  // A rank's report also reads the other ranks' bucket timings (peer_wait): their fields and
  // the batches stored for them are part of what it is computed from.
  std::vector<int64_t> peers;
  if (group) {
    for (const store::RunInfo& r : *runs) {
      if (r.run_id == run_id || r.group_id != group) continue;
      key.push_back(store::RunInfoToJson(r));
      peers.push_back(r.run_id);
    }
  }
  key.push_back({progress->steps, progress->last_step ? *progress->last_step : -1,
                 progress->last_step_end_ns ? *progress->last_step_end_ns : -1,
                 progress->last_sample_ns ? *progress->last_sample_ns : -1,
                 progress->headline ? progress->headline->rule_id + progress->headline->message
                                    : std::string()});
  {
    std::lock_guard lock(reports_mu_);
    key.push_back(run_writes_[run_id]);  // batches stored since start (rows of any table)
    for (int64_t peer : peers) key.push_back(run_writes_[peer]);
  }
  const std::string fingerprint = key.dump();
  {
    std::lock_guard lock(reports_mu_);
    auto it = reports_.find(run_id);
    if (it != reports_.end() && it->second.first == fingerprint) return it->second.second;
  }
  auto report = analysis::AnalyzeRun(db, run_id, analysis::AnalysisOptions{});
  if (!report) return Status::Error("analysis: " + report.error());
  json doc = analysis::ReportJson(*report);
  std::lock_guard lock(reports_mu_);
  if (reports_.size() >= 256 && !reports_.count(run_id)) reports_.erase(reports_.begin());
  reports_[run_id] = {fingerprint, doc};
  return doc;
}

namespace {

// What every page of the app is sent with: scripts and connections only from this server, no
// framing, no referrer (a dashboard URL's token never leaves in a Referer).
void AddPageHeaders(HttpResponse* r) {
  r->headers.emplace_back("Content-Security-Policy",
                          "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
                          "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'");
  r->headers.emplace_back("X-Content-Type-Options", "nosniff");
  r->headers.emplace_back("X-Frame-Options", "DENY");
  r->headers.emplace_back("Referrer-Policy", "no-referrer");
  r->headers.emplace_back("Cache-Control", "no-cache");
}

HttpResponse Page(int status, const std::string& title, const std::string& text) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/html; charset=utf-8";
  r.body = "<!doctype html><meta charset=\"utf-8\"><title>gpuprof: " + title +
           "</title><link rel=\"icon\" href=\"data:,\"><body style=\"font-family:sans-serif;"
           "max-width:40em;margin:4em auto\"><h1>" +
           title + "</h1><p>" + text + "</p></body>\n";
  AddPageHeaders(&r);
  return r;
}

}  // namespace

HttpResponse ServerApi::StaticFile(const HttpRequest& request, const std::string& path) {
  (void)request;
  auto asset = FindWebAsset(path, options_.web_dir);
  if (!asset) {
    return Error(404, "no such file: " + path +
                          (path == "/" || path == "/index.html"
                               ? " (this gpuprof was built without the web app)"
                               : ""));
  }
  HttpResponse r;
  r.content_type = asset->content_type;
  r.body = std::move(asset->body);
  AddPageHeaders(&r);
  return r;
}

HttpResponse ServerApi::Session(const HttpRequest& request) {
  const bool logged_in = viewing_on() && !CheckViewer(request, false).has_value();
  json doc = {{"mode", options_.login_token ? "dashboard" : "serve"},
              {"viewing", viewing_on()},
              {"logged_in", logged_in},
              {"run_id", options_.dashboard_run_id ? json(*options_.dashboard_run_id) : json()},
              {"version", GPUPROF_VERSION}};
  if (logged_in) {
    // The session's CSRF token (also in the csrf cookie): a page of this origin reads it here.
    const auto cookies = Cookies(request);
    const std::string& cookie = cookies.at(session_cookie_);
    const size_t last = cookie.rfind('.');
    const size_t nonce = cookie.rfind('.', last - 1);
    doc["csrf"] = Sign("csrf." + cookie.substr(nonce + 1, last - nonce - 1));
  }
  return Json(200, doc);
}

HttpResponse ServerApi::TokenLogin(const HttpRequest& request) {
  const std::string app =
      options_.dashboard_run_id ? "/#/runs/" + std::to_string(*options_.dashboard_run_id) : "/";
  auto redirect = [&](HttpResponse r) {
    r.status = 303;
    r.content_type = "text/plain; charset=utf-8";
    r.body = "see " + app + "\n";
    r.headers.emplace_back("Location", app);
    AddPageHeaders(&r);
    return r;
  };
  // Already logged in (the link opened again, a reload): on to the app.
  if (viewing_on() && !CheckViewer(request, false)) return redirect(HttpResponse{});
  if (!options_.login_token) {
    return Page(404, "No login link here",
                "This server has no login link: log in with the viewer password at <a "
                "href=\"/\">the start page</a>.");
  }
  const auto q = Query(request.target);
  auto it = q.find("token");
  if (it == q.end() || !SecretEquals(it->second, *options_.login_token)) {
    return Page(403, "Wrong login link",
                "This link's token is not this dashboard's. Open the URL the training process "
                "printed, whole.");
  }
  if (token_used_.exchange(true)) {
    return Page(403, "Login link already used",
                "This dashboard's login link works once, and a browser has used it. Open the "
                "dashboard in that browser, or restart the training to get a new link.");
  }
  HttpResponse r;
  std::string csrf;
  if (Status st = IssueSession(request, &r, &csrf); !st.ok()) {
    token_used_ = false;
    return Error(500, st.message());
  }
  return redirect(std::move(r));
}

namespace {

// A series value as a chart shows it: 3 decimals below 1000 (percent, degrees, watts), whole
// numbers above (bytes, milliwatts), so an answer of 32 series x 1000 points stays small.
double Display(double v) {
  if (std::fabs(v) >= 1000) return std::round(v);
  return std::round(v * 1000) / 1000;
}

}  // namespace

HttpResponse ServerApi::Series(const std::string& id, const HttpRequest& request) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  const auto q = Query(request.target);
  auto param = [&](const char* name, int64_t fallback) -> std::optional<int64_t> {
    auto it = q.find(name);
    return it == q.end() ? std::optional<int64_t>(fallback) : ParseInt(it->second);
  };
  std::vector<std::string> metrics;
  {
    std::istringstream in(q.count("metric") ? q.at("metric") : "");
    for (std::string m; std::getline(in, m, ',');) metrics.push_back(m);
  }
  if (metrics.empty()) metrics.push_back("");
  const bool all_gpus = q.count("gpu") && q.at("gpu") == "all";
  const auto gpu = all_gpus ? std::optional<int64_t>(0) : param("gpu", 0);
  const auto points = param("points", 2000);
  const auto from = param("from_ns", 0);
  const auto to = param("to_ns", INT64_MAX);
  if (!gpu || !points || !from || !to) {
    return Error(400, "gpu (an integer or 'all'), points, from_ns and to_ns must be integers");
  }
  if (*points < 3 || *points > 100000) return Error(400, "points must be in 3..100000");
  if (metrics.size() > 16) return Error(400, "at most 16 metrics at once");
  auto db = Read();
  if (auto missing = NoSuchRun(*db, *run_id)) return *missing;
  if (metrics.size() == 1 && !all_gpus) {
    const std::string& metric = metrics[0];
    auto series = db->LoadSeries(*run_id, metric, *gpu, *from, *to);
    if (!series) return Error(400, series.error());
    const auto kept = Lttb(*series, static_cast<size_t>(*points));
    json pts = json::array();
    for (const auto& [t, v] : kept) pts.push_back({t, Display(v)});
    const auto column = store::SeriesMetric(metric);
    return Json(200, json{{"metric", metric},
                          {"gpu", column && column->per_gpu ? json(*gpu) : json()},
                          {"source_points", series->size()},
                          {"points", pts}});
  }
  // Several metrics and/or every GPU: one scan per table, straight into the series asked for
  // (no row is held beyond its values), then LTTB per (metric, GPU).
  using Points = std::vector<std::pair<int64_t, double>>;
  static const char* kGpuColumns[] = {"gpu_util", "gpu_mem", "gpu_power", "gpu_temp"};
  static const char* kHostColumns[] = {"host_cpu", "host_mem", "host_disk_read",
                                       "proc_cpu", "proc_rss", "job_cpu"};
  static_assert(std::size(kHostColumns) == store::kHostSeriesColumns);
  auto column_of = [](const std::string& m, const char* const* names, int n) {
    for (int i = 0; i < n; ++i) {
      if (m == names[i]) return i;
    }
    return -1;
  };
  uint32_t gpu_mask = 0, host_mask = 0;
  for (const auto& m : metrics) {
    if (!store::SeriesMetric(m)) {
      return Error(400, "no metric '" + m + "' (metrics: " + store::MetricNames() + ")");
    }
    if (int c = column_of(m, kGpuColumns, store::kGpuSeriesColumns); c >= 0) gpu_mask |= 1u << c;
    if (int c = column_of(m, kHostColumns, store::kHostSeriesColumns); c >= 0) {
      host_mask |= 1u << c;
    }
  }
  std::map<int64_t, std::array<Points, store::kGpuSeriesColumns>> by_gpu;
  std::array<Points, store::kHostSeriesColumns> host;
  // A window much wider than the points asked for is drawn from the minute buckets' extremes
  // (series_cache.h); the run's newest sample bounds an open-ended window.
  int64_t span_end = *to;
  if (*to == INT64_MAX) {
    auto progress = db->LoadRunProgress(*run_id);
    if (!progress) return Error(500, "store: " + progress.error());
    span_end = progress->last_sample_ns.value_or(0);
  }
  const bool wide = SeriesCache::Wide(span_end - *from, *points);
  if (wide && gpu_mask) {
    std::map<int64_t, std::vector<SeriesCache::Points>> cached;
    Status st = series_cache_.GpuSeries(*db, *run_id, all_gpus ? std::nullopt : gpu, gpu_mask,
                                        *from, *to, &cached);
    if (!st.ok()) return Error(500, "store: " + st.message());
    for (auto& [index, columns] : cached) {
      for (int c = 0; c < store::kGpuSeriesColumns; ++c) by_gpu[index][c] = std::move(columns[c]);
    }
  } else if (gpu_mask) {
    Status st = db->ScanGpuSeries(*run_id, all_gpus ? std::nullopt : gpu, *from, *to,
                                  [&](const store::SeriesRow& r) {
                                    auto& series = by_gpu[r.gpu_index];
                                    for (int c = 0; c < store::kGpuSeriesColumns; ++c) {
                                      if ((gpu_mask & r.known) & (1u << c))
                                        series[c].emplace_back(r.ts_ns, r.v[c]);
                                    }
                                  });
    if (!st.ok()) return Error(500, "store: " + st.message());
  }
  if (wide && host_mask) {
    std::vector<SeriesCache::Points> cached;
    Status st = series_cache_.HostSeries(*db, *run_id, host_mask, *from, *to, &cached);
    if (!st.ok()) return Error(500, "store: " + st.message());
    for (int c = 0; c < store::kHostSeriesColumns; ++c) host[c] = std::move(cached[c]);
  } else if (host_mask) {
    Status st = db->ScanHostSeries(*run_id, *from, *to, [&](const store::SeriesRow& r) {
      for (int c = 0; c < store::kHostSeriesColumns; ++c) {
        if ((host_mask & r.known) & (1u << c)) host[c].emplace_back(r.ts_ns, r.v[c]);
      }
    });
    if (!st.ok()) return Error(500, "store: " + st.message());
  }
  json out = json::array();
  auto emit = [&](const std::string& metric, json gpu_label, const Points& source) {
    if (source.empty()) return;
    json pts = json::array();
    for (const auto& [t, v] : Lttb(source, static_cast<size_t>(*points))) {
      pts.push_back({t, Display(v)});
    }
    out.push_back(json{{"metric", metric},
                       {"gpu", std::move(gpu_label)},
                       {"source_points", source.size()},
                       {"points", std::move(pts)}});
  };
  for (const auto& m : metrics) {
    if (int c = column_of(m, kGpuColumns, store::kGpuSeriesColumns); c >= 0) {
      for (const auto& [index, series] : by_gpu) emit(m, json(index), series[c]);
    } else {
      emit(m, json(), host[column_of(m, kHostColumns, store::kHostSeriesColumns)]);
    }
  }
  return Json(200, json{{"from_ns", *from},
                        {"to_ns", *to},
                        {"resolution", wide ? "minute extremes" : "1 s"},
                        {"series", std::move(out)}});
}

HttpResponse ServerApi::Kernels(const std::string& id, const HttpRequest& request) {
  const auto run_id = ParseInt(id);
  if (!run_id) return Error(400, "the run id must be an integer, got '" + id + "'");
  const auto q = Query(request.target);
  const auto top = q.count("top") ? ParseInt(q.at("top")) : std::optional<int64_t>(50);
  if (!top || *top < 1 || *top > 10000) return Error(400, "top must be an integer in 1..10000");
  const auto from =
      q.count("from_ns") ? ParseInt(q.at("from_ns")) : std::optional<int64_t>(INT64_MIN);
  const auto to = q.count("to_ns") ? ParseInt(q.at("to_ns")) : std::optional<int64_t>(INT64_MAX);
  if (!from || !to || *from > *to) {
    return Error(400, "from_ns and to_ns must be integers (run-relative ns), from_ns <= to_ns");
  }
  auto db = Read();
  if (auto missing = NoSuchRun(*db, *run_id)) return *missing;
  // The traced time per name: GPU time of the kernels table, or, on a run without kernels
  // (a CPU run), the self CPU time of its traced steps' operators (cpu_ops). Never mixed.
  struct Timed {
    int64_t window_start_ns;
    const std::string* name;
    const std::string* source;
    int64_t calls, ns;
  };
  std::vector<Timed> timed;
  auto kernels = db->LoadKernels(*run_id);
  if (!kernels) return Error(500, "store: " + kernels.error());
  for (const store::KernelRow& k : *kernels) {
    timed.push_back({k.window_start_ns, &k.name, &k.source, k.calls, k.gpu_ns});
  }
  const bool cpu = kernels->empty();
  Expected<std::vector<store::CpuOpRow>> ops = std::vector<store::CpuOpRow>{};
  if (cpu) {
    ops = db->LoadCpuOps(*run_id);
    if (!ops) return Error(500, "store: " + ops.error());
    for (const store::CpuOpRow& o : *ops) {
      timed.push_back({o.window_start_ns, &o.name, &o.source, o.calls, o.self_cpu_ns});
    }
  }
  const char* time_key = cpu ? "self_cpu_ns" : "gpu_ns";
  // Per (name, source) over the windows that start in [from_ns, to_ns].
  struct Acc {
    int64_t calls = 0, ns = 0, windows = 0;
  };
  std::map<std::pair<std::string, std::string>, Acc> by_name;
  std::set<int64_t> windows;
  std::set<std::string> sources;
  int64_t total = 0;
  for (const Timed& t : timed) {
    if (t.window_start_ns < *from || t.window_start_ns > *to) continue;
    Acc& a = by_name[{*t.name, *t.source}];
    a.calls += t.calls;
    a.ns += t.ns;
    ++a.windows;
    total += t.ns;
    windows.insert(t.window_start_ns);
    sources.insert(*t.source);
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Acc>> sorted(by_name.begin(),
                                                                          by_name.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.ns != b.second.ns ? a.second.ns > b.second.ns : a.first < b.first;
  });
  json list = json::array();
  for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(*top); ++i) {
    const auto& [key, a] = sorted[i];
    list.push_back(
        {{"name", key.first},
         {"source", key.second},
         {"calls", a.calls},
         {time_key, a.ns},
         {"mean_ns", a.calls > 0 ? json(static_cast<double>(a.ns) / a.calls) : json(nullptr)},
         {"share_pct", total > 0 ? json(100.0 * a.ns / total) : json(nullptr)},
         {"windows", a.windows}});
  }
  const bool recorded = !timed.empty();
  json out = {{"run_id", *run_id},
              {"recorded", recorded},
              {"kind", !recorded ? json(nullptr) : json(cpu ? "cpu_operators" : "kernels")},
              {"kernels_total", sorted.size()},
              {"windows", windows.size()},
              {cpu ? "total_self_cpu_ns" : "total_gpu_ns", total},
              {"sources", json(std::vector<std::string>(sources.begin(), sources.end()))},
              {"kernels", list}};
  out["reason"] = recorded ? json(nullptr)
                           : json(
                                 "no kernel trace was recorded for this run (profile("
                                 "trace_every_n_steps=N), trace_range=(a, b) or "
                                 "continuous_traces_hz=f records one; `gpuprof insights` "
                                 "says why this run has none)");
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
  auto db = Read();
  if (auto missing = NoSuchRun(*db, *run_id)) return *missing;
  // The answer of the same question last time, while the run's steps did not change.
  auto progress = db->LoadRunProgress(*run_id);
  if (!progress) return Error(500, "store: " + progress.error());
  std::string fingerprint;
  {
    std::lock_guard lock(reports_mu_);
    // A live run's newest sample moves every second: only a finished run's answer is reused
    // (GPU times resolved late for old steps never go unseen).
    fingerprint = json::array({*points, progress->steps, progress->last_step.value_or(-1),
                               progress->last_step_end_ns.value_or(-1),
                               progress->last_sample_ns.value_or(-1), run_writes_[*run_id]})
                      .dump();
    // In a dashboard the recorder writes the file, not this API: no reuse there.
    auto it = options_.login_token ? steps_answers_.end() : steps_answers_.find(*run_id);
    if (it != steps_answers_.end() && it->second.first == fingerprint) {
      return Json(200, it->second.second);
    }
  }
  // Only the steps and their phases' sums (a 24 h run's telemetry is not read for this).
  std::vector<store::StepBreakdownRow> steps;
  bool comm_measured = false;  // comm is null unless some step has a comm phase
  Status st = db->ScanStepBreakdown(*run_id, [&](const store::StepBreakdownRow& r) {
    comm_measured = comm_measured || r.comm;
    steps.push_back(r);
  });
  if (!st.ok()) return Error(500, "store: " + st.message());
  // Per step (or bucket of consecutive steps, means): loader wait, each phase (wall), the rest;
  // GPU time apart.
  const size_t total = steps.size();
  const size_t per = std::max<size_t>(
      1, (total + static_cast<size_t>(*points) - 1) / static_cast<size_t>(*points));
  json rows = json::array();
  for (size_t i = 0; i < total; i += per) {
    int64_t first = steps[i].step, last = first, n = 0, gpu_known = 0;
    double duration = 0, wait = 0, other = 0, gpu = 0;
    double phase[4] = {0, 0, 0, 0};
    for (size_t j = i; j < std::min(total, i + per); ++j) {
      const store::StepBreakdownRow& r = steps[j];
      last = r.step;
      ++n;
      duration += static_cast<double>(r.duration_ns);
      const double w = static_cast<double>(r.wait_ns.value_or(0));
      wait += w;
      double named = 0;  // custom-named phases stay in "other"
      for (int k = 0; k < 4; ++k) {
        phase[k] += static_cast<double>(r.phase_ns[k]);
        named += static_cast<double>(r.phase_ns[k]);
      }
      other += std::max(0.0, static_cast<double>(r.duration_ns) - w - named);
      if (r.gpu_known) {
        gpu += static_cast<double>(r.gpu_ns);
        ++gpu_known;
      }
    }
    const double d = static_cast<double>(n);
    rows.push_back(
        json{{"first_step", first},
             {"last_step", last},
             {"steps", n},
             {"duration_ns", std::llround(duration / d)},
             {"wait_ns", std::llround(wait / d)},
             {"forward_ns", std::llround(phase[0] / d)},
             {"backward_ns", std::llround(phase[1] / d)},
             {"optimizer_ns", std::llround(phase[2] / d)},
             {"comm_ns", comm_measured ? json(std::llround(phase[3] / d)) : json(nullptr)},
             {"other_ns", std::llround(other / d)},
             {"gpu_ns", gpu_known ? json(std::llround(gpu / static_cast<double>(gpu_known)))
                                  : json(nullptr)}});
  }
  json doc = {{"run_id", *run_id},
              {"steps_total", total},
              {"steps_per_row", per},
              {"rows", std::move(rows)}};
  std::lock_guard lock(reports_mu_);
  if (steps_answers_.size() >= 64 && !steps_answers_.count(*run_id)) {
    steps_answers_.erase(steps_answers_.begin());
  }
  steps_answers_[*run_id] = {fingerprint, doc};
  return Json(200, doc);
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
  auto db = Read();
  for (int64_t id : ids) {
    if (auto missing = NoSuchRun(*db, id)) return *missing;
    auto report = Report(*db, id);
    if (!report) return Error(500, report.error());
    const json& doc = *report;
    out.push_back(json{{"run", doc["run"]},
                       {"steps", doc["steps"]},
                       {"mfu", doc["mfu"]},
                       {"insights", doc["insights"]}});
  }
  return Json(200, json{{"runs", out}});
}

HttpResponse ServerApi::Group(const std::string& name) {
  auto db = Read();
  auto runs = db->ListRuns();
  if (!runs) return Error(500, "store: " + runs.error());
  const bool known = std::any_of(runs->begin(), runs->end(), [&](const store::RunInfo& r) {
    return r.group_id && *r.group_id == name;
  });
  if (!known) return Error(404, "no group '" + name + "' on this server");
  auto report = analysis::AnalyzeStoredGroup(*db, name, analysis::AnalysisOptions{});
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
    auto db = Read();
    if (auto runs = db->ListRuns()) {
      for (const auto& r : *runs) {
        if (r.status != "running") continue;
        ++live;
        auto latest = db->LatestGpuSecond(r.run_id);
        if (!latest) continue;
        for (const auto& g : *latest) {
          const std::string labels = "{run_id=\"" + std::to_string(r.run_id) + "\",run_name=\"" +
                                     PromLabel(r.run_name) + "\",gpu=\"" +
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
    out << "# HELP " << kGpu[i][0] << " " << kGpu[i][1] << "\n# TYPE " << kGpu[i][0] << " gauge\n"
        << samples;
  }
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = out.str();
  return r;
}

}  // namespace gpuprof::server
