// Bad input on the ingest endpoints (issue 17): malformed, truncated, oversized and gzip-bomb
// bodies, too many rows, wrong types and a bad last row are each a 4xx whose {"error": ...}
// names the problem, and leave the store as it was: no row of the batch and not its id (so a
// corrected retry under the same id is stored). The store is read back with sqlite3 directly.
// ingest_fuzz.cc checks the same contract on generated inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "server/gzip_test_util.h"
#include "server/ingest_api.h"
#include "store/row_json.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr size_t kMaxBody = 64 * 1024;
constexpr size_t kMaxRows = 100;

class IngestBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpuprof_bad_input_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ApiOptions o;
    o.api_keys = {"key"};
    o.max_body_bytes = kMaxBody;
    o.max_rows_per_batch = kMaxRows;
    o.secret = std::string(32, 's');
    auto api = ServerApi::Open(db_path(), o);
    ASSERT_TRUE(api.ok()) << api.error();
    api_ = std::move(api.value());
    store::RunInfo info;
    info.run_name = "exp";
    info.hostname = "node-1";
    info.pid = 42;
    info.start_unix_ns = 1;
    run_ = json{{"run", store::RunInfoToJson(info)}};
    ASSERT_EQ(Send("PUT", "/api/v1/runs/r1", run_.dump()).status, 201);
  }
  void TearDown() override {
    api_.reset();
    fs::remove_all(dir_);
  }
  std::string db_path() const { return (dir_ / "server.db").string(); }

  HttpResponse Send(const std::string& method, const std::string& target, std::string body,
                    bool gzip = false) {
    HttpRequest r;
    r.method = method;
    r.target = target;
    r.headers = {{"x-api-key", "key"}, {"content-type", "application/json"}};
    if (gzip) r.headers["content-encoding"] = "gzip";
    r.body = std::move(body);
    return api_->Handle(r);
  }
  HttpResponse Post(std::string body, bool gzip = false) {
    return Send("POST", "/api/v1/runs/r1/batches", std::move(body), gzip);
  }
  // A valid batch: `steps` steps, two GPU samples, one diagnostic and one insight.
  static json Batch(const std::string& id, int steps = 3) {
    std::vector<store::Row> rows;
    for (int64_t s = 0; s < steps; ++s) {
      rows.emplace_back(store::StepRow{s, s * 100, s * 100 + 90, 5, "gap", 1, 1, 1});
    }
    for (int64_t t = 0; t < 2; ++t) {
      store::GpuSampleRow g;
      g.ts_ns = t * 1000;
      g.gpu_index = 0;
      g.util_pct = 50.0;
      rows.emplace_back(g);
    }
    store::DiagnosticRow d;
    d.ts_ns = 7;
    d.level = "info";
    d.source = "test";
    d.message = "hello";
    rows.emplace_back(d);
    store::InsightRow insight{
        0, "data.loader_bound", "data", "high", "slow loader", "more workers", std::nullopt};
    return json{{"batch_id", id},
                {"rows", store::RowsToJson(rows)},
                {"insights", store::InsightsToJson({insight})}};
  }
  static std::string ErrorOf(const HttpResponse& r) {
    json doc = json::parse(r.body, nullptr, false);
    if (!doc.is_object() || !doc.contains("error") || !doc["error"].is_string()) {
      return "(no JSON error in: " + r.body + ")";
    }
    return doc["error"].get<std::string>();
  }

  // sqlite3 on the server's file: the rows of every table a batch writes, and its batches.
  int64_t Scalar(const std::string& sql) {
    sqlite3* db = nullptr;
    int64_t v = -1;
    if (sqlite3_open_v2(db_path().c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_stmt* st = nullptr;
      if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
          sqlite3_step(st) == SQLITE_ROW) {
        v = sqlite3_column_int64(st, 0);
      }
      sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return v;
  }
  int64_t StoredRows() {
    int64_t n = 0;
    for (const char* t :
         {"steps", "phases", "gpus", "gpu_samples", "gpu_samples_1s", "host_samples",
          "host_core_samples", "worker_samples", "worker_samples_10s", "kernels", "comm_buckets",
          "host_stalls", "cpu_waits", "telemetry_status", "insights", "diagnostics"}) {
      n += Scalar(std::string("SELECT count(*) FROM ") + t);
    }
    return n;
  }
  int64_t Batches() { return Scalar("SELECT count(*) FROM ingest_batches"); }

  // The response is `status` with an error naming `what`, and nothing was stored.
  void ExpectRefused(const HttpResponse& r, int status, const std::string& what) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_THAT(ErrorOf(r), HasSubstr(what));
    EXPECT_EQ(StoredRows(), 0);
    EXPECT_EQ(Batches(), 0);
  }

  fs::path dir_;
  std::unique_ptr<ServerApi> api_;
  json run_;
};

TEST_F(IngestBadInputTest, MalformedJsonIsA400) {
  for (const std::string body :
       {std::string(""), std::string("{"), std::string("{\"batch_id\": "),
        std::string("{\"batch_id\": \"b\", \"rows\": {\"steps\": [{\"step\": 0,]}}"),
        std::string("{\"batch_id\": \"b\"} trailing"), std::string("\xff\xfe{}"),
        std::string("{\"batch_id\": \"b\xc3\x28\"}"), std::string("{\"batch_id\": \"b\0\"}", 18),
        std::string("{\"batch_id\": \"b\", \"rows\": {\"steps\": [{\"step\": 1e999}]}}"),
        std::string(20000, '[') /* deep nesting, not closed */}) {
    SCOPED_TRACE(body.substr(0, 60));
    ExpectRefused(Post(body), 400, "not valid JSON");
  }
  // Valid JSON of the wrong shape
  ExpectRefused(Post("[]"), 400, "must be a JSON object");
  ExpectRefused(Post("null"), 400, "must be a JSON object");
  ExpectRefused(Post(std::string(20000, '[') + std::string(20000, ']')), 400,
                "must be a JSON object");
  ExpectRefused(Send("PUT", "/api/v1/runs/r2", "{\"run\": "), 400, "not valid JSON");
}

TEST_F(IngestBadInputTest, ATruncatedBodyIsA400AtEveryCut) {
  const std::string full = Batch("b").dump();
  for (size_t cut = 0; cut < full.size(); cut += 7) {
    SCOPED_TRACE(cut);
    ExpectRefused(Post(full.substr(0, cut)), 400, "not valid JSON");
  }
  EXPECT_EQ(Post(full).status, 200);
}

TEST_F(IngestBadInputTest, ATruncatedGzipStreamIsA400AtEveryCut) {
  const std::string gz = Gzip(Batch("b").dump());
  for (size_t cut = 0; cut < gz.size(); ++cut) {  // the trailer's CRC and size included
    SCOPED_TRACE(cut);
    HttpResponse r = Post(gz.substr(0, cut), /*gzip=*/true);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(ErrorOf(r), testing::AnyOf(HasSubstr("truncated"), HasSubstr("not valid gzip")));
  }
  EXPECT_EQ(StoredRows(), 0);
  EXPECT_EQ(Batches(), 0);
  // A damaged CRC is refused too
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0x01;
  ExpectRefused(Post(bad_crc, true), 400, "not valid gzip");
  HttpResponse ok = Post(gz, true);
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(IngestBadInputTest, AGzipBombIsA413QuicklyAndInflatesNoFurtherThanTheLimit) {
  // 48 MiB of zeros compress to about 48 KiB: under the body limit, 768 times it inflated.
  const std::string bomb = Gzip(std::string(48u << 20, '\0'));
  ASSERT_LT(bomb.size(), kMaxBody);
  for (const auto& [method, target] :
       {std::pair{"POST", "/api/v1/runs/r1/batches"}, std::pair{"PUT", "/api/v1/runs/r1"}}) {
    SCOPED_TRACE(target);
    const auto t0 = std::chrono::steady_clock::now();
    HttpResponse r = Send(method, target, bomb, true);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    ExpectRefused(r, 413, "inflates to more than 65536 bytes");
    EXPECT_LT(ms, 500) << "inflation must stop at the limit, not run to the end";
  }
}

TEST_F(IngestBadInputTest, AnOversizedPlainBodyIsA413NamingTheLimit) {
  json big = Batch("big");
  big["rows"]["diagnostics"][0]["message"] = std::string(kMaxBody, 'a');
  ExpectRefused(Post(big.dump()), 413, "the server takes at most 65536");
  // Exactly at the limit is not refused for its size
  std::string at_limit = Batch("b").dump();
  at_limit += std::string(kMaxBody - at_limit.size(), ' ');
  EXPECT_EQ(Post(at_limit).status, 200);
}

TEST_F(IngestBadInputTest, TooManyRowsIsA413AndStoresNone) {
  // 100 steps + 2 GPU samples + 1 diagnostic: over max_rows_per_batch across tables
  ExpectRefused(Post(Batch("many", kMaxRows).dump()), 413, "more than 100 rows in one batch");
  EXPECT_EQ(Post(Batch("many", kMaxRows - 3).dump()).status, 200);
}

TEST_F(IngestBadInputTest, WrongTypesAreA400NamingTableIndexAndColumn) {
  struct Case {
    std::string path;  // JSON pointer into the batch
    json value;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"/rows/steps/1/step", "1", "steps[1].step: expected an integer, got string"},
      {"/rows/steps/1/step", 1.5, "steps[1].step: expected an integer, got number"},
      {"/rows/steps/2/end_ns", true, "steps[2].end_ns: expected an integer, got boolean"},
      {"/rows/steps/0/start_ns", json(uint64_t{1} << 63),
       "steps[0].start_ns: integer out of range"},
      {"/rows/steps/0/wait_source", 3, "steps[0].wait_source: expected a string, got number"},
      {"/rows/gpu_samples/1/util_pct", "50", "gpu_samples[1].util_pct: expected a number"},
      {"/rows/steps/0/extra", 1, "steps[0]: unknown column 'extra'"},
      {"/rows/steps/1", json::array(), "steps[1]: expected an object, got array"},
      {"/rows/stepz", json::array(), "rows: unknown table 'stepz'"},
      {"/rows/steps", json::object(), "rows.steps: 'columns' missing"},
      {"/rows/steps", "x",
       "rows.steps: expected an array of rows or {\"columns\": ..., \"rows\": ...}, got string"},
      {"/rows/host_samples", json::array({{{"ts_ns", 1}, {"cpu_per_core", {1, "x"}}}}),
       "host_samples[0].cpu_per_core: expected an array of numbers"},
      {"/rows/diagnostics/0/message", std::string("a\0b", 3),
       "diagnostics[0].message: a string holding a NUL"},
      {"/insights/0/ordinal", "0", "insights[0].ordinal: expected an integer, got string"},
      {"/insights", json::object(), "insights: expected an array, got object"},
      {"/batch_id", 7, "batch_id must be a string"},
      {"/batch_id", "has space", "batch_id must be a string"},
      {"/batch_id", std::string(129, 'b'), "batch_id must be a string"},
      {"/rows", json::array(), "rows: expected an object of tables, got array"},
      {"/extra", 1, "unknown field 'extra'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    json batch = Batch("b");
    batch[json::json_pointer(c.path)] = c.value;
    ExpectRefused(Post(batch.dump()), 400, c.error);
  }
  // The run's fields too
  json run = run_;
  run["run"]["pid"] = "42";
  ExpectRefused(Send("PUT", "/api/v1/runs/r2", run.dump()), 400, "run.pid: expected an integer");
  run = run_;
  run["run"]["status"] = "done";
  ExpectRefused(Send("PUT", "/api/v1/runs/r2", run.dump()), 400, "run.status: 'done'");
  run = run_;
  run["run"].erase("hostname");
  ExpectRefused(Send("PUT", "/api/v1/runs/r2", run.dump()), 400, "run.hostname: missing");
  EXPECT_EQ(Scalar("SELECT count(*) FROM runs"), 1);
}

TEST_F(IngestBadInputTest, ABadLastRowRefusesTheWholeBatchAndItsIdAndARetryStores) {
  json batch = Batch("b7");
  // The last row of the last table, after valid steps, GPU samples and the insight
  batch["rows"]["diagnostics"][0].erase("level");
  ExpectRefused(Post(batch.dump()), 400, "diagnostics[0].level: missing (required)");
  EXPECT_EQ(Scalar("SELECT count(*) FROM ingest_batches WHERE batch_id = 'b7'"), 0);
  // The same id, corrected: stored whole, once
  HttpResponse ok = Post(Batch("b7").dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["stored"], 6);
  EXPECT_EQ(StoredRows(), 7);  // 6 rows and the insight
  EXPECT_EQ(Batches(), 1);
  HttpResponse again = Post(Batch("b7").dump());
  EXPECT_EQ(json::parse(again.body)["duplicate"], true);
  EXPECT_EQ(StoredRows(), 7);
}

TEST_F(IngestBadInputTest, RowsTheStoreWouldRefuseAreA400NotA500) {
  // Two insights with one ordinal: the insights table's key. Before this was checked the store's
  // insert failed and the client got a 500 (and retried the batch for ever).
  json batch = Batch("dup");
  batch["insights"].push_back(batch["insights"][0]);
  ExpectRefused(Post(batch.dump()), 400, "insights[1].ordinal: 0 is given twice");
  batch["insights"][1]["ordinal"] = 1;
  EXPECT_EQ(Post(batch.dump()).status, 200);
}

}  // namespace
}  // namespace gpuprof::server
