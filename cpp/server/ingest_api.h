// The team server's HTTP API, independent of sockets: Handle() takes one request and returns
// the response, so every rule (auth, limits, validation, idempotency) is tested without a
// network (ingest_api_test.cc) and the socket layer (http_server.h) stays thin.
//
//   GET  /healthz                           liveness: {"status": "ok", "schema": N}
//   GET  /metrics                           Prometheus text: ingest counters, live runs
//   PUT  /api/v1/runs/{uuid}                write key: create or update the client's run
//   POST /api/v1/runs/{uuid}/batches        write key: one batch of rows, stored once per id
//
// Every rejection is a 4xx with {"error": "..."} naming what was wrong. Secrets never appear in
// a response, a log line or /metrics. Thread-safe: one store connection behind a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/sqlite_store.h"
#include "util/status.h"

namespace gpuprof::server {

struct ApiOptions {
  std::vector<std::string> api_keys;     // write keys (several: rotation)
  size_t max_body_bytes = 32u << 20;     // after gzip inflation too
  size_t max_rows_per_batch = 500'000;
};

struct HttpRequest {
  std::string method;
  std::string target;                    // path and query
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
  std::string peer;                      // client address, for logs
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class IngestApi {
 public:
  // Opens (creating) the SQLite store at `storage_path`.
  static Expected<std::unique_ptr<IngestApi>> Open(const std::string& storage_path,
                                                   ApiOptions options);

  HttpResponse Handle(const HttpRequest& request);

  const std::string& storage_path() const { return storage_path_; }
  size_t max_body_bytes() const { return options_.max_body_bytes; }

 private:
  IngestApi(std::unique_ptr<store::SqliteStore> db, std::string path, ApiOptions options);
  std::optional<HttpResponse> CheckWriteKey(const HttpRequest& request);
  HttpResponse PutRun(const std::string& uuid, const HttpRequest& request);
  HttpResponse PostBatch(const std::string& uuid, const HttpRequest& request);
  HttpResponse Metrics();
  // The request body as JSON (gzip inflated when Content-Encoding says so), or the 4xx.
  Expected<std::string> Body(const HttpRequest& request, HttpResponse* rejection);
  HttpResponse Count(HttpResponse response);

  std::mutex mu_;  // guards db_
  std::unique_ptr<store::SqliteStore> db_;
  std::string storage_path_;
  ApiOptions options_;
  std::mutex counters_mu_;
  std::map<int, uint64_t> responses_;  // by status
  uint64_t batches_ = 0, duplicate_batches_ = 0, rows_ = 0, runs_created_ = 0;
};

// Constant-time equality of two secrets (the time does not depend on where they differ).
bool SecretEquals(const std::string& a, const std::string& b);

// Inflates a gzip body into at most `limit` bytes; an error when it is not gzip, is damaged or
// would exceed the limit (*too_large set then).
Expected<std::string> Gunzip(const std::string& data, size_t limit, bool* too_large);

}  // namespace gpuprof::server
