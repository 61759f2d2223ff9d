// The team server's HTTP API, independent of sockets: Handle() takes one request and returns
// the response, so every rule (auth, limits, validation, idempotency) is tested without a
// network (ingest_api_test.cc) and the socket layer (http_server.h) stays thin.
//
//   GET  /healthz                           liveness: {"status": "ok", "schema": N}
//   GET  /metrics                           Prometheus text: ingest counters, live runs
//   PUT  /api/v1/runs/{uuid}                write key: create or update the client's run
//   POST /api/v1/runs/{uuid}/batches        write key: one batch of rows, stored once per id
//   POST /api/v1/login                      password -> viewer session cookie + CSRF token
//   POST /api/v1/logout                     viewer + CSRF
//   GET  /api/v1/runs                       viewer: the runs (?name= &group= &status=)
//   GET  /api/v1/runs/{id}                  viewer: the run's insights report (the engine)
//   GET  /api/v1/runs/{id}/series           viewer: one metric, LTTB-downsampled
//   GET  /api/v1/runs/{id}/steps            viewer: per-step breakdown (bucketed past ?points=)
//   GET  /api/v1/runs/{id}/kernels          viewer: top kernels by GPU time (?top= &from_ns=
//   &to_ns=) GET  /api/v1/compare?runs=1,2[,3,4]     viewer: 2-4 runs side by side GET
//   /api/v1/groups/{name}              viewer: a multi-rank group's report GET
//   /api/v1/live[?run=ID]              viewer: WebSocket of live events (live_bus.h) GET
//   /api/v1/session                    anyone: the mode, whether viewing is on / logged in GET
//   /login?token=T                     the dashboard's single-use login link GET  /, /app/*,
//   /lib/*, /vendor/*       the web app (web_assets.h)
//
// Two independent axes: write keys (X-API-Key) only write, a viewer session (cookie) only
// reads. Every rejection is a 4xx with {"error": "..."} naming what was wrong. Secrets never
// appear in a response, a log line or /metrics. Thread-safe: requests share one store
// connection behind a mutex (SQLite), or the store's own pool (PostgreSQL).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/live_bus.h"
#include "server/series_cache.h"
#include "store/run_store.h"
#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::server {

struct ApiOptions {
  std::vector<std::string> api_keys;           // write keys (several: rotation)
  std::optional<std::string> viewer_password;  // none: the read API is off
  std::string secret;                          // signs viewer sessions (>= 32 bytes)
  int64_t session_ttl_s = 12 * 3600;
  size_t logins_per_minute = 10;      // per client address
  std::function<int64_t()> now_s;     // unix seconds; the wall clock unless a test's
  size_t max_body_bytes = 32u << 20;  // after gzip inflation too
  size_t max_rows_per_batch = 500'000;
  // The in-process dashboard (profile(dashboard=True)): viewers log in by opening
  // /login?token=TOKEN once (no password; the token is single-use), and the app opens on
  // dashboard_run_id. With neither a viewer password nor a token the read API is off.
  std::optional<std::string> login_token;
  std::optional<int64_t> dashboard_run_id;
  // Appended to the cookie names: several dashboards on one host (cookies ignore the port)
  // must not overwrite each other's session.
  std::string cookie_suffix;
  // Serve web/dashboard and web/lib from this source tree's web/ directory instead of the
  // embedded copies ($GPUPROF_WEB_DIR; development).
  std::optional<std::string> web_dir;
};

struct HttpRequest {
  std::string method;
  std::string target;                          // path and query
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
  std::string peer;  // client address, for logs
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class ServerApi {
 public:
  // Opens (creating) the SQLite store at `storage_path`.
  static Expected<std::unique_ptr<ServerApi>> Open(const std::string& storage_path,
                                                   ApiOptions options);
  // Serves `db` (a SqliteStore or a PgStore); `storage` names it in /healthz and logs.
  static std::unique_ptr<ServerApi> Create(std::unique_ptr<store::RunStore> db, std::string storage,
                                           ApiOptions options);

  HttpResponse Handle(const HttpRequest& request);

  // The WebSocket endpoint's gate (the socket layer upgrades when this returns no refusal):
  // GET /api/v1/live[?run=ID] by a logged-in viewer whose Origin, when sent, is this server.
  // *run_filter is the ?run= given (a run that exists), or nullopt for every run.
  std::optional<HttpResponse> AuthorizeLive(const HttpRequest& request,
                                            std::optional<int64_t>* run_filter);
  // Whether `target` is the live endpoint (the socket layer asks before reading a WebSocket).
  static bool IsLiveTarget(const std::string& target);
  LiveBus& bus() { return bus_; }

  const std::string& storage_path() const { return storage_path_; }
  size_t max_body_bytes() const { return options_.max_body_bytes; }

 private:
  ServerApi(std::unique_ptr<store::RunStore> db, std::string path, ApiOptions options);
  // Holds mu_ unless the store is thread-safe (a pool serves concurrent requests itself).
  std::unique_lock<std::mutex> LockStore();
  // The store one read request uses, for as long as the lease lives: on SQLite one of up to
  // kReaders read-only connections of its own (reads never wait on ingest, nor on another
  // request's analysis), else the store itself (under LockStore() unless it is thread-safe).
  class ReadLease {
   public:
    ReadLease() = default;
    ReadLease(ReadLease&&) = default;
    ReadLease& operator=(ReadLease&&) = delete;
    ~ReadLease();
    store::RunStore* operator->() const { return db_; }
    store::RunStore& operator*() const { return *db_; }

   private:
    friend class ServerApi;
    ServerApi* api_ = nullptr;
    store::RunStore* db_ = nullptr;
    std::unique_ptr<store::RunStore> own_;  // a pooled reader, returned on destruction
    std::unique_lock<std::mutex> lock_;
  };
  static constexpr size_t kReaders = 4;
  ReadLease Read();
  // The 404 (no such run) or 500 (the store failed) for `run_id` in `db`, nullopt when it
  // exists.
  std::optional<HttpResponse> NoSuchRun(store::RunStore& db, int64_t run_id);
  std::optional<HttpResponse> CheckWriteKey(const HttpRequest& request);
  HttpResponse PutRun(const std::string& uuid, const HttpRequest& request);
  HttpResponse PostBatch(const std::string& uuid, const HttpRequest& request);
  HttpResponse Metrics();
  // The viewer axis.
  HttpResponse Login(const HttpRequest& request);
  HttpResponse Logout(const HttpRequest& request);
  std::optional<HttpResponse> CheckViewer(const HttpRequest& request, bool state_changing);
  HttpResponse ListRuns(const HttpRequest& request);
  HttpResponse RunReport(const std::string& id);
  HttpResponse Series(const std::string& id, const HttpRequest& request);
  HttpResponse Steps(const std::string& id, const HttpRequest& request);
  HttpResponse Kernels(const std::string& id, const HttpRequest& request);
  HttpResponse Compare(const HttpRequest& request);
  // The run's insights report (ReportJson), recomputed only when what it is computed from
  // changed (the run's row, its steps and newest times, its insights), else the last one.
  Expected<nlohmann::json> Report(store::RunStore& db, int64_t run_id);
  HttpResponse Group(const std::string& name);
  HttpResponse Session(const HttpRequest& request);
  HttpResponse TokenLogin(const HttpRequest& request);
  HttpResponse StaticFile(const HttpRequest& request, const std::string& path);
  // The session and CSRF cookies of a fresh viewer session, added to `r`.
  Status IssueSession(const HttpRequest& request, HttpResponse* r, std::string* csrf);
  bool viewing_on() const { return options_.viewer_password || options_.login_token; }
  int64_t Now() const;
  std::string Sign(const std::string& payload) const;  // hex HMAC-SHA256 with the secret
  // The request body as JSON (gzip inflated when Content-Encoding says so), or the 4xx.
  Expected<std::string> Body(const HttpRequest& request, HttpResponse* rejection);
  HttpResponse Count(HttpResponse response);

  std::mutex mu_;  // guards db_ when it is not thread-safe
  std::unique_ptr<store::RunStore> db_;
  std::optional<std::string> reader_path_;  // SQLite: the file the read pool opens
  std::mutex readers_mu_;
  std::condition_variable readers_cv_;
  std::vector<std::unique_ptr<store::RunStore>> idle_readers_;
  size_t readers_open_ = 0;
  std::string storage_path_;
  ApiOptions options_;
  std::mutex counters_mu_;
  std::map<int, uint64_t> responses_;  // by status
  uint64_t batches_ = 0, duplicate_batches_ = 0, rows_ = 0, runs_created_ = 0;
  LiveBus bus_;
  SeriesCache series_cache_;  // minute summaries for wide series windows
  std::mutex reports_mu_;
  // run -> (fingerprint, report)
  std::map<int64_t, std::pair<std::string, nlohmann::json>> reports_;
  std::map<int64_t, uint64_t> run_writes_;  // batches stored per run (part of the fingerprint)
  // run -> (fingerprint with the points asked, the /steps answer)
  std::map<int64_t, std::pair<std::string, nlohmann::json>> steps_answers_;
  std::string session_cookie_, csrf_cookie_;  // names (with options_.cookie_suffix)
  std::atomic<bool> token_used_{false};
  std::mutex logins_mu_;
  std::map<std::string, std::deque<int64_t>> logins_;  // per address: attempts in the last minute
};

// The live event of a run created (`created`) or updated, as LiveBus::PublishRun takes it: the
// ingest API's and the in-process dashboard's watcher's.
nlohmann::json RunEvent(const store::RunInfo& info, bool created);

// 32 random bytes as hex: a fresh session-signing secret.
Expected<std::string> RandomSecret();

// The secret that signs viewer sessions: the file's contents when given (at least 32 bytes),
// else `<store path>.secret`, created once with 32 random bytes (mode 0600) and reused.
Expected<std::string> LoadOrCreateSecret(const std::optional<std::string>& secret_file,
                                         const std::string& store_path);

// {"error": message} with `status`: every refusal of the API and of the socket layer.
HttpResponse ErrorResponse(int status, const std::string& message);

// Constant-time equality of two secrets (the time does not depend on where they differ).
bool SecretEquals(const std::string& a, const std::string& b);

// Inflates a gzip body into at most `limit` bytes; an error when it is not gzip, is damaged or
// would exceed the limit (*too_large set then).
Expected<std::string> Gunzip(const std::string& data, size_t limit, bool* too_large);

}  // namespace gpuprof::server
