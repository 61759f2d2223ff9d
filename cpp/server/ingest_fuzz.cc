// libFuzzer target: the ingest endpoints of ServerApi (PUT /api/v1/runs/{uuid}, POST
// /api/v1/runs/{uuid}/batches) with the input as the request body, over a temporary SQLite
// store with a valid write key and a created run. Built by GPUPROF_BUILD_FUZZ (clang, ASan and
// UBSan); run by scripts/fuzz.sh (`make fuzz`, `make test-fuzz`).
//
// Input: byte 0 picks the request (seeds in fuzz_corpus/ start with the digit), the rest is
// the body:
//   '0' POST batch, plain            '3' PUT run, plain
//   '1' POST batch, gzipped here     '4' PUT run, gzipped here
//   '2' POST batch, the bytes sent as they are with Content-Encoding: gzip (damaged streams,
//       bombs)
//   '5' POST batch, gzipped here and cut short by 1 to 16 bytes (a truncated stream)
// (any other byte: its value modulo 6).
//
// Aborts (a finding) when:
//   - a response is neither 2xx nor 4xx (a 5xx: the store refused what the decoder let through);
//   - a 4xx has no {"error": "..."} body, or a 2xx body is not a JSON object;
//   - a 4xx changed the store (PRAGMA data_version of a second connection moved: any commit);
//   - a truncated gzip stream ('5') was accepted;
//   - a stored batch sent again is not a 200 duplicate that leaves the store as it was (then
//     its id is forgotten, so that the next input with that id is stored, not a duplicate).
// INGEST_FUZZ_STATS=1 prints how many inputs got which status, per kind, at exit (e.g. with
// -runs=0 over a corpus: what the corpus reaches).
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/gzip_test_util.h"
#include "server/ingest_api.h"

namespace {

using gpuprof::server::ApiOptions;
using gpuprof::server::HttpRequest;
using gpuprof::server::HttpResponse;
using gpuprof::server::ServerApi;
using nlohmann::json;

constexpr const char* kKey = "fuzz-key";

[[noreturn]] void Fail(const char* what, const HttpRequest& req, const HttpResponse& res) {
  std::fprintf(stderr, "ingest_fuzz: %s\n  %s %s (%zu body bytes)\n  -> %d %s\n", what,
               req.method.c_str(), req.target.c_str(), req.body.size(), res.status,
               res.body.substr(0, 2000).c_str());
  abort();
}

std::string Gzip(const uint8_t* data, size_t size) {
  return gpuprof::server::Gzip(std::string_view(reinterpret_cast<const char*>(data), size),
                               Z_DEFAULT_COMPRESSION);
}

// The server under test and a second connection that sees its commits. Lives for the process.
struct Harness {
  std::filesystem::path dir;
  std::unique_ptr<ServerApi> api;
  sqlite3* watch = nullptr;  // a second connection: sees the server's commits, forgets batches
  std::map<std::pair<int, int>, size_t> statuses;  // (kind, status) -> responses

  Harness() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/gpuprof_ingest_fuzz_XXXXXX";
    if (const char* d = mkdtemp(tmpl.data())) dir = d;
    if (dir.empty()) {
      std::perror("ingest_fuzz: mkdtemp");
      abort();
    }
    ApiOptions o;
    o.api_keys = {kKey};
    o.secret = std::string(32, 's');
    // Limits that inputs of a few hundred bytes reach: a gzip bomb, a batch of too many rows.
    o.max_body_bytes = 256 << 10;
    o.max_rows_per_batch = 100;
    auto opened = ServerApi::Open((dir / "fuzz.db").string(), o);
    if (!opened) {
      std::fprintf(stderr, "ingest_fuzz: %s\n", opened.error().c_str());
      abort();
    }
    api = std::move(opened.value());
    HttpResponse r = api->Handle(
        Request("PUT", "/api/v1/runs/fuzz-run",
                R"({"run": {"run_name": "fuzz", "hostname": "h", "pid": 1, "start_unix_ns": 0,)"
                R"( "start_mono_ns": 0, "status": "running", "gpuprof_version": "0"}})",
                false));
    if (r.status != 201) {
      std::fprintf(stderr, "ingest_fuzz: creating the run: %d %s\n", r.status, r.body.c_str());
      abort();
    }
    if (sqlite3_open_v2((dir / "fuzz.db").c_str(), &watch, SQLITE_OPEN_READWRITE, nullptr) !=
        SQLITE_OK) {
      std::fprintf(stderr, "ingest_fuzz: cannot open the store to watch it\n");
      abort();
    }
    std::atexit([] { Get().Close(); });
  }
  void Close() {
    if (std::getenv("INGEST_FUZZ_STATS")) {  // which answers the inputs got, per request kind
      for (const auto& [key, n] : statuses) {
        std::fprintf(stderr, "ingest_fuzz: kind %d -> %d: %zu\n", key.first, key.second, n);
      }
    }
    sqlite3_close(watch);
    watch = nullptr;
    api.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  static Harness& Get() {
    static Harness* h = new Harness();  // never destroyed: atexit closes it
    return *h;
  }

  static HttpRequest Request(const char* method, const char* target, std::string body, bool gzip) {
    HttpRequest r;
    r.method = method;
    r.target = target;
    r.headers = {{"x-api-key", kKey}, {"content-type", "application/json"}};
    if (gzip) r.headers["content-encoding"] = "gzip";
    r.body = std::move(body);
    r.peer = "fuzz";
    return r;
  }

  // Changes whenever another connection committed since the last call.
  int64_t DataVersion() {
    sqlite3_stmt* st = nullptr;
    int64_t v = -1;
    if (sqlite3_prepare_v2(watch, "PRAGMA data_version", -1, &st, nullptr) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
      v = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return v;
  }

  // Forgets the stored batch ids, so that a mutant of a stored batch (same batch_id) is decoded
  // and written again instead of answered as a duplicate.
  void ForgetBatches() {
    if (sqlite3_exec(watch, "DELETE FROM ingest_batches", nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "ingest_fuzz: %s\n", sqlite3_errmsg(watch));
      abort();
    }
  }

  HttpResponse Check(const HttpRequest& req) {
    const int64_t before = DataVersion();
    HttpResponse res = api->Handle(req);
    const bool ok = res.status >= 200 && res.status < 300;
    const bool refused = res.status >= 400 && res.status < 500;
    if (!ok && !refused) Fail("neither 2xx nor 4xx", req, res);
    json doc = json::parse(res.body, nullptr, false);
    if (!doc.is_object()) Fail("the response body is not a JSON object", req, res);
    if (refused) {
      if (!doc.contains("error") || !doc["error"].is_string()) {
        Fail("a 4xx without {\"error\": ...}", req, res);
      }
      if (DataVersion() != before) Fail("a 4xx changed the store", req, res);
    }
    return res;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Harness& h = Harness::Get();
  const int mode = data[0] % 6;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  const bool batch = mode != 3 && mode != 4;
  const char* method = batch ? "POST" : "PUT";
  const char* target = batch ? "/api/v1/runs/fuzz-run/batches" : "/api/v1/runs/fuzz-put";
  std::string payload;
  bool gzip = true;
  switch (mode) {
    case 0:
    case 3:
      payload.assign(reinterpret_cast<const char*>(body), n);
      gzip = false;
      break;
    case 1:
    case 4:
      payload = Gzip(body, n);
      break;
    case 2:
      payload.assign(reinterpret_cast<const char*>(body), n);
      break;
    default: {  // 5: truncated
      payload = Gzip(body, n);
      const size_t cut = 1 + (n ? body[n - 1] % 16 : 0);
      payload.resize(payload.size() > cut ? payload.size() - cut : 0);
      break;
    }
  }
  const HttpRequest req = Harness::Request(method, target, std::move(payload), gzip);
  const HttpResponse res = h.Check(req);
  ++h.statuses[{mode, res.status}];
  if (mode == 5 && res.status < 300) Fail("a truncated gzip stream was accepted", req, res);
  if (batch && res.status == 200) {
    const json doc = json::parse(res.body);
    if (doc.value("duplicate", false) == false) {
      // Sent again, the same batch is a duplicate: 200, nothing stored, no commit.
      const int64_t before = h.DataVersion();
      const HttpResponse again = h.Check(req);
      const json d = json::parse(again.body, nullptr, false);
      if (again.status != 200 || !d.is_object() || d.value("duplicate", false) != true ||
          d.value("stored", -1) != 0) {
        Fail("a stored batch sent again is not a duplicate", req, again);
      }
      if (h.DataVersion() != before) Fail("a duplicate batch changed the store", req, again);
      h.ForgetBatches();
    }
  }
  return 0;
}
