#include "server/ingest_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "server/gzip_test_util.h"
#include "store/row_json.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class ServerApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpuprof_ingest_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ApiOptions o;
    o.api_keys = {"old-key", "new-key"};
    o.max_body_bytes = 64 * 1024;
    o.max_rows_per_batch = 100;
    o.viewer_password = "view-pass";
    o.secret = std::string(32, 's');
    o.now_s = [this] { return now_; };
    auto api = ServerApi::Open((dir_ / "server.db").string(), o);
    ASSERT_TRUE(api.ok()) << api.error();
    api_ = std::move(api.value());
  }
  void TearDown() override {
    api_.reset();
    fs::remove_all(dir_);
  }

  HttpResponse Call(const std::string& method, const std::string& target, const json& body,
                    const std::string& key = "new-key",
                    const std::string& type = "application/json") {
    HttpRequest r;
    r.method = method;
    r.target = target;
    if (!key.empty()) r.headers["x-api-key"] = key;
    r.headers["content-type"] = type;
    r.body = body.is_null() ? "" : body.dump();
    return api_->Handle(r);
  }
  static json Run() {
    store::RunInfo info;
    info.run_name = "exp";
    info.hostname = "node-1";
    info.pid = 42;
    info.start_unix_ns = 1;
    return json{{"run", store::RunInfoToJson(info)}};
  }
  static json Batch(const std::string& id, int64_t first_step, int n) {
    std::vector<store::Row> rows;
    for (int i = 0; i < n; ++i) {
      const int64_t s = first_step + i;
      rows.emplace_back(store::StepRow{s, s * 100, s * 100 + 90, 5, "gap", 1, 1, 1});
    }
    return json{{"batch_id", id}, {"rows", store::RowsToJson(rows)}};
  }
  size_t StoredSteps(int64_t run_id) {
    auto db = store::SqliteStore::Open((dir_ / "server.db").string(),
                                       store::SqliteStore::Mode::kReadOnly);
    auto steps = (*db)->LoadSteps(run_id);
    return steps->size();
  }

  // Logs in; the Cookie header value and the CSRF token.
  std::pair<std::string, std::string> Login(const std::string& peer = "10.0.0.1") {
    HttpRequest r;
    r.method = "POST";
    r.target = "/api/v1/login";
    r.headers["content-type"] = "application/json";
    r.body = json{{"password", "view-pass"}}.dump();
    r.peer = peer;
    HttpResponse res = api_->Handle(r);
    EXPECT_EQ(res.status, 200) << res.body;
    std::string cookie;
    for (const auto& [k, v] : res.headers) {
      if (k == "Set-Cookie") {
        if (!cookie.empty()) cookie += "; ";
        cookie += v.substr(0, v.find(';'));
        EXPECT_THAT(v, HasSubstr("SameSite=Strict"));
        if (v.rfind("gpuprof_session=", 0) == 0) {
          EXPECT_THAT(v, HasSubstr("HttpOnly"));
        }
      }
    }
    return {cookie, json::parse(res.body)["csrf"].get<std::string>()};
  }
  HttpResponse Viewer(const std::string& method, const std::string& target,
                      const std::string& cookie, const std::string& csrf = "",
                      const std::string& key = "") {
    HttpRequest r;
    r.method = method;
    r.target = target;
    r.headers["content-type"] = "application/json";
    if (!cookie.empty()) r.headers["cookie"] = cookie;
    if (!csrf.empty()) r.headers["x-csrf-token"] = csrf;
    if (!key.empty()) r.headers["x-api-key"] = key;
    return api_->Handle(r);
  }

  fs::path dir_;
  int64_t now_ = 1'700'000'000;
  std::unique_ptr<ServerApi> api_;
};

TEST_F(ServerApiTest, TheTwoAuthAxesAreIndependentAndEveryBadCredentialIsRefused) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches", Batch("b", 0, 12)).status, 200);
  const auto [cookie, csrf] = Login();
  // A viewer reads
  EXPECT_EQ(Viewer("GET", "/api/v1/runs", cookie).status, 200);
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/1", cookie).status, 200);
  // ...but cannot write: ingest needs a write key whatever the cookie
  HttpRequest w;
  w.method = "PUT";
  w.target = "/api/v1/runs/r2";
  w.headers = {{"content-type", "application/json"}, {"cookie", cookie}};
  w.body = Run().dump();
  EXPECT_EQ(api_->Handle(w).status, 401);
  // A write key cannot read
  HttpResponse keyed = Viewer("GET", "/api/v1/runs", "", "", "new-key");
  EXPECT_EQ(keyed.status, 401);
  EXPECT_THAT(keyed.body, HasSubstr("a write key cannot read"));
  // No cookie, a tampered cookie, an expired one
  EXPECT_EQ(Viewer("GET", "/api/v1/runs", "").status, 401);
  std::string tampered = cookie;
  tampered[tampered.find("v1.") + 3] = tampered[tampered.find("v1.") + 3] == '9' ? '8' : '9';
  EXPECT_THAT(Viewer("GET", "/api/v1/runs", tampered).body, HasSubstr("not valid"));
  now_ += 12 * 3600 + 1;
  EXPECT_THAT(Viewer("GET", "/api/v1/runs", cookie).body, HasSubstr("expired"));
  now_ -= 12 * 3600 + 1;
  // State-changing viewer requests need the CSRF token, matching the cookie and the session
  EXPECT_EQ(Viewer("POST", "/api/v1/logout", cookie).status, 403);
  EXPECT_EQ(Viewer("POST", "/api/v1/logout", cookie, "0123").status, 403);
  const auto [other_cookie, other_csrf] = Login();
  EXPECT_EQ(Viewer("POST", "/api/v1/logout", cookie, other_csrf).status, 403);
  EXPECT_EQ(Viewer("POST", "/api/v1/logout", cookie, csrf).status, 200);
}

// Every endpoint under every credential: the status each must give.
TEST_F(ServerApiTest, TheAuthMatrixOfEveryEndpointAndEveryCredential) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  json grouped = Run();
  grouped["run"]["group_id"] = "g";
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r2", grouped).status, 201);
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches", Batch("b", 0, 12)).status, 200);
  const auto [cookie, csrf] = Login();
  std::string tampered = cookie;
  tampered[tampered.find("v1.") + 3] = tampered[tampered.find("v1.") + 3] == '9' ? '8' : '9';
  const auto [old_cookie, old_csrf] = Login();

  struct Endpoint {
    const char* method;
    const char* target;
    enum { kWrite, kRead, kViewerAction } axis;
    int ok;  // the status with the right credential
  };
  int batch = 0;
  const std::vector<Endpoint> endpoints = {
      {"PUT", "/api/v1/runs/r1", Endpoint::kWrite, 200},
      {"POST", "/api/v1/runs/r1/batches", Endpoint::kWrite, 200},
      {"GET", "/api/v1/runs", Endpoint::kRead, 200},
      {"GET", "/api/v1/runs/1", Endpoint::kRead, 200},
      {"GET", "/api/v1/runs/1/series?metric=host_cpu", Endpoint::kRead, 200},
      {"GET", "/api/v1/runs/1/steps", Endpoint::kRead, 200},
      {"GET", "/api/v1/runs/1/kernels", Endpoint::kRead, 200},
      {"GET", "/api/v1/compare?runs=1,2", Endpoint::kRead, 200},
      {"GET", "/api/v1/groups/g", Endpoint::kRead, 200},
      {"GET", "/api/v1/live", Endpoint::kRead, 426},  // authorized, but not an upgrade
      {"POST", "/api/v1/logout", Endpoint::kViewerAction, 200},
  };
  // key, cookie, csrf
  struct Credential {
    const char* name;
    std::string key, cookie, csrf;
    int write, read, action;  // expected status per axis (0: the endpoint's own ok)
  };
  const std::vector<Credential> credentials = {
      {"nothing", "", "", "", 401, 401, 401},
      {"a wrong key", "guess", "", "", 403, 401, 401},
      {"a rotated-out key", "gone-key", "", "", 403, 401, 401},
      {"a write key", "new-key", "", "", 0, 401, 401},
      {"a viewer cookie", "", cookie, "", 401, 0, 403},
      {"a tampered cookie", "", tampered, csrf, 401, 401, 401},
      {"an expired cookie", "", "EXPIRED", csrf, 401, 401, 401},
      {"a wrong CSRF token", "", cookie, old_csrf, 401, 0, 403},
      {"the viewer's cookie and CSRF token", "", old_cookie, old_csrf, 401, 0, 0},
  };
  for (const Credential& c : credentials) {
    for (const Endpoint& e : endpoints) {
      HttpRequest r;
      r.method = e.method;
      r.target = e.target;
      r.headers["content-type"] = "application/json";
      if (!c.key.empty()) r.headers["x-api-key"] = c.key;
      const bool expired = c.cookie == "EXPIRED";
      if (!c.cookie.empty()) r.headers["cookie"] = expired ? cookie : c.cookie;
      if (!c.csrf.empty()) r.headers["x-csrf-token"] = c.csrf;
      if (e.axis == Endpoint::kWrite) {
        r.body = std::string(e.target).find("batches") != std::string::npos
                     ? Batch("m" + std::to_string(batch++), 100, 1).dump()
                     : Run().dump();
      } else if (e.axis == Endpoint::kViewerAction) {
        r.body = "{}";
      }
      if (expired) now_ += 12 * 3600 + 1;
      const int got = api_->Handle(r).status;
      if (expired) now_ -= 12 * 3600 + 1;
      const int want = e.axis == Endpoint::kWrite  ? c.write
                       : e.axis == Endpoint::kRead ? c.read
                                                   : c.action;
      EXPECT_EQ(got, want == 0 ? e.ok : want) << e.method << " " << e.target << " with " << c.name;
    }
  }
}

TEST_F(ServerApiTest, TheEleventhLoginInAMinuteIsRefusedWithRetryAfter) {
  HttpRequest r;
  r.method = "POST";
  r.target = "/api/v1/login";
  r.headers["content-type"] = "application/json";
  r.body = json{{"password", "wrong"}}.dump();
  r.peer = "10.0.0.9";
  for (int i = 0; i < 10; ++i) EXPECT_EQ(api_->Handle(r).status, 401);
  HttpResponse limited = api_->Handle(r);
  EXPECT_EQ(limited.status, 429);
  bool retry_after = false;
  for (const auto& [k, v] : limited.headers) retry_after |= k == "Retry-After";
  EXPECT_TRUE(retry_after);
  // ...the right password too, from that address; another address is not affected
  r.body = json{{"password", "view-pass"}}.dump();
  EXPECT_EQ(api_->Handle(r).status, 429);
  r.peer = "10.0.0.10";
  EXPECT_EQ(api_->Handle(r).status, 200);
  // AND a minute later the first address may try again
  now_ += 61;
  r.peer = "10.0.0.9";
  EXPECT_EQ(api_->Handle(r).status, 200);
}

TEST_F(ServerApiTest, ViewersGetRunsTheEnginesReportAndDownsampledSeries) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  // 5,000 seconds of GPU utilization, in batches of 50 rows (the test's limits)
  for (int64_t first = 0; first < 5000; first += 50) {
    std::vector<store::Row> rows;
    for (int64_t t = first; t < first + 50; ++t) {
      store::GpuRollupRow g;
      g.ts_ns = t * 1'000'000'000;
      g.samples = 10;
      g.util_samples = 10;
      g.util_mean_pct = t == 2500 ? 100.0 : 50.0;
      rows.emplace_back(g);
    }
    json batch{{"batch_id", "g" + std::to_string(first)}, {"rows", store::RowsToJson(rows)}};
    HttpResponse stored = Call("POST", "/api/v1/runs/r1/batches", batch);
    ASSERT_EQ(stored.status, 200) << stored.body;
  }
  const auto [cookie, csrf] = Login();
  // The runs, filtered
  json runs = json::parse(Viewer("GET", "/api/v1/runs?name=exp", cookie).body);
  ASSERT_EQ(runs["runs"].size(), 1u);
  EXPECT_EQ(runs["runs"][0]["run_id"], 1);
  EXPECT_TRUE(json::parse(Viewer("GET", "/api/v1/runs?name=other", cookie).body)["runs"].empty());
  EXPECT_EQ(Viewer("GET", "/api/v1/runs?color=red", cookie).status, 400);
  // The report is the engine's (the same document as gpuprof insights --json)
  json report = json::parse(Viewer("GET", "/api/v1/runs/1", cookie).body);
  EXPECT_EQ(report["format"], "gpuprof.insights/1");
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/99", cookie).status, 404);
  // The series, downsampled to 200 points, keeps the spike and both ends
  json s = json::parse(
      Viewer("GET", "/api/v1/runs/1/series?metric=gpu_util&gpu=0&points=200", cookie).body);
  EXPECT_EQ(s["source_points"], 5000);
  ASSERT_EQ(s["points"].size(), 200u);
  double peak = 0;
  for (const auto& p : s["points"]) peak = std::max(peak, p[1].get<double>());
  EXPECT_EQ(peak, 100.0);
  EXPECT_EQ(s["points"][0][0], 0);
  EXPECT_EQ(s["points"][199][0], 4999LL * 1'000'000'000);
  // A window
  json w = json::parse(Viewer("GET",
                              "/api/v1/runs/1/series?metric=gpu_util&from_ns=0&to_ns=" +
                                  std::to_string(9LL * 1'000'000'000),
                              cookie)
                           .body);
  EXPECT_EQ(w["source_points"], 10);
  EXPECT_THAT(Viewer("GET", "/api/v1/runs/1/series?metric=fan", cookie).body,
              HasSubstr("no metric 'fan'"));
}

TEST_F(ServerApiTest, ARanksReportIsRecomputedWhenTheOtherRanksStoreMore) {
  // GIVEN two ranks of job "g": 20 steps of 100 ms each, buckets ready at 20 ms on rank 0 and at
  // 85 ms on rank 1, every collective done at 95 ms
  auto rank = [](int64_t r) {
    json run = Run();
    run["run"]["pid"] = 42 + r;
    run["run"]["rank"] = r;
    run["run"]["world_size"] = 2;
    run["run"]["group_id"] = "g";
    return run;
  };
  auto rows = [](int64_t ready_ms, bool steps, bool buckets) {
    std::vector<store::Row> out;
    for (int64_t s = 0; s < 20; ++s) {
      const int64_t t = s * 100'000'000;
      if (steps) out.emplace_back(store::StepRow{s, t, t + 100'000'000, 5, "gap", 1, 1, 1});
      if (buckets) {
        out.emplace_back(store::CommBucketRow{s, 0, t + ready_ms * 1'000'000, t + 95'000'000, 1});
      }
    }
    return out;
  };
  auto post = [&](const char* run, const std::string& id, const std::vector<store::Row>& r) {
    return Call("POST", std::string("/api/v1/runs/") + run + "/batches",
                json{{"batch_id", id}, {"rows", store::RowsToJson(r)}})
        .status;
  };
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r0", rank(0)).status, 201);
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", rank(1)).status, 201);
  ASSERT_EQ(post("r0", "a", rows(20, true, true)), 200);
  ASSERT_EQ(post("r1", "a", rows(85, true, false)), 200);
  const auto [cookie, csrf] = Login();
  auto peer_wait = [&, &cookie = cookie] {
    const json report = json::parse(Viewer("GET", "/api/v1/runs/1", cookie).body);
    for (const auto& i : report["insights"]) {
      if (i["rule_id"] == "peer_wait") return i["message"].get<std::string>();
    }
    for (const auto& n : report["not_evaluated"]) {
      if (n["rule_id"] == "peer_wait") return "not evaluated: " + n["reason"].get<std::string>();
    }
    return std::string("passed");
  };
  // WHEN rank 1 has stored only its steps, rank 0's report cannot compare
  EXPECT_THAT(peer_wait(), HasSubstr("not evaluated: no steady-state step whose buckets"));
  // AND once rank 1's buckets arrive (rank 0 unchanged) the report is computed again
  ASSERT_EQ(post("r1", "b", rows(85, false, true)), 200);
  EXPECT_THAT(peer_wait(), HasSubstr("This rank waited 65% of step time"));
}

TEST_F(ServerApiTest, MetricsShowALiveRunsNewestGpuSecondWithItsNameEscaped) {
  json run = Run();
  run["run"]["run_name"] = "a\"b\\c\nd";
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", run).status, 201);
  std::vector<store::Row> rows;
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t gpu = 0; gpu < 2; ++gpu) {
      store::GpuRollupRow g;
      g.ts_ns = t * 1'000'000'000;
      g.gpu_index = gpu;
      g.util_mean_pct = 10.0 * (t + 1) + gpu;
      g.power_mean_mw = 250'000;
      if (gpu == 0) g.temp_max_c = 60.5;  // GPU 1's temperature was not measured
      rows.emplace_back(g);
    }
  }
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches",
                 json{{"batch_id", "g"}, {"rows", store::RowsToJson(rows)}})
                .status,
            200);
  const std::string text = Call("GET", "/metrics", nullptr, "").body;
  const std::string labels = "{run_id=\"1\",run_name=\"a\\\"b\\\\c\\nd\",gpu=\"";
  // The newest second only, per GPU; power in watts; an unmeasured reading has no sample
  EXPECT_THAT(text, HasSubstr("gpuprof_gpu_utilization_percent" + labels + "0\"} 20\n"));
  EXPECT_THAT(text, HasSubstr("gpuprof_gpu_utilization_percent" + labels + "1\"} 21\n"));
  EXPECT_THAT(text, HasSubstr("gpuprof_gpu_power_watts" + labels + "1\"} 250\n"));
  EXPECT_THAT(text, HasSubstr("gpuprof_gpu_temperature_celsius" + labels + "0\"} 60.5\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("gpuprof_gpu_temperature_celsius" + labels + "1")));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("gpuprof_gpu_memory_used_bytes")));
  // A finished run has no gauges
  run["run"]["status"] = "ok";
  run["run"]["end_ns"] = 2'000'000'000;
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", run).status, 200);
  EXPECT_THAT(Call("GET", "/metrics", nullptr, "").body,
              ::testing::Not(HasSubstr("gpuprof_gpu_utilization_percent")));
}

TEST_F(ServerApiTest, ViewersGetTheTopKernelsOrNotRecordedWithTheReason) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  const auto [cookie, csrf] = Login();
  // Before any trace: nothing, said so (not zeros)
  json none = json::parse(Viewer("GET", "/api/v1/runs/1/kernels", cookie).body);
  EXPECT_EQ(none["recorded"], false);
  EXPECT_THAT(none["reason"].get<std::string>(), HasSubstr("no kernel trace"));
  EXPECT_TRUE(none["kernels"].empty());
  // Two traced windows: gemm 3 + 5 ms, softmax 1 ms, a CPU operator of another source
  std::vector<store::Row> rows = {
      store::Row(store::KernelRow{0, 100, "gemm", 10, 3'000'000, "cupti"}),
      store::Row(store::KernelRow{0, 100, "softmax", 4, 1'000'000, "cupti"}),
      store::Row(store::KernelRow{1000, 1100, "gemm", 10, 5'000'000, "cupti"}),
      store::Row(store::KernelRow{1000, 1100, "aten::mm", 2, 1'000'000, "torch_profiler"})};
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches",
                 json{{"batch_id", "k"}, {"rows", store::RowsToJson(rows)}})
                .status,
            200);
  json k = json::parse(Viewer("GET", "/api/v1/runs/1/kernels?top=2", cookie).body);
  EXPECT_EQ(k["recorded"], true);
  EXPECT_TRUE(k["reason"].is_null());
  EXPECT_EQ(k["kernels_total"], 3);
  EXPECT_EQ(k["windows"], 2);
  EXPECT_EQ(k["total_gpu_ns"], 10'000'000);
  ASSERT_EQ(k["kernels"].size(), 2u);
  EXPECT_EQ(k["kernels"][0]["name"], "gemm");
  EXPECT_EQ(k["kernels"][0]["calls"], 20);
  EXPECT_EQ(k["kernels"][0]["gpu_ns"], 8'000'000);
  EXPECT_DOUBLE_EQ(k["kernels"][0]["share_pct"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(k["kernels"][0]["mean_ns"].get<double>(), 400'000.0);
  EXPECT_EQ(k["kernels"][0]["windows"], 2);
  EXPECT_EQ(k["sources"], json({"cupti", "torch_profiler"}));
  // A window of the run
  json w = json::parse(Viewer("GET", "/api/v1/runs/1/kernels?from_ns=500", cookie).body);
  EXPECT_EQ(w["total_gpu_ns"], 6'000'000);
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/1/kernels?top=0", cookie).status, 400);
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/1/kernels?from_ns=9&to_ns=1", cookie).status, 400);
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/7/kernels", cookie).status, 404);
  EXPECT_EQ(Viewer("GET", "/api/v1/runs/1/kernels", "").status, 401);
}

TEST_F(ServerApiTest, ACpuRunsTopKernelsAreItsTracedOperatorsByCpuTime) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  const auto [cookie, csrf] = Login();
  // A CPU run: no kernels, the operators of two traced steps (pushed like any other rows)
  std::vector<store::Row> rows = {
      store::Row(
          store::CpuOpRow{0, 100, 0, "aten::bmm", 6, 4'000'000, 4'500'000, "torch_profiler"}),
      store::Row(store::CpuOpRow{0, 100, 0, "aten::_softmax", 2, 1'000'000, std::nullopt,
                                 "torch_profiler"}),
      store::Row(
          store::CpuOpRow{1000, 1100, 10, "aten::bmm", 6, 4'000'000, 4'400'000, "torch_profiler"})};
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches",
                 json{{"batch_id", "ops"}, {"rows", store::RowsToJson(rows)}})
                .status,
            200);
  json k = json::parse(Viewer("GET", "/api/v1/runs/1/kernels", cookie).body);
  EXPECT_EQ(k["recorded"], true);
  EXPECT_EQ(k["kind"], "cpu_operators");
  // Host time under its own keys: never reported as GPU time
  EXPECT_FALSE(k.contains("total_gpu_ns"));
  EXPECT_EQ(k["total_self_cpu_ns"], 9'000'000);
  ASSERT_EQ(k["kernels"].size(), 2u);
  EXPECT_EQ(k["kernels"][0]["name"], "aten::bmm");
  EXPECT_EQ(k["kernels"][0]["self_cpu_ns"], 8'000'000);
  EXPECT_FALSE(k["kernels"][0].contains("gpu_ns"));
  EXPECT_EQ(k["kernels"][0]["windows"], 2);
  EXPECT_EQ(k["windows"], 2);
  // Once a kernel exists (an nsys import), the kernels are what is shown
  ASSERT_EQ(Call("POST", "/api/v1/runs/r1/batches",
                 json{{"batch_id", "k"},
                      {"rows", store::RowsToJson(
                                   {store::Row(store::KernelRow{0, 100, "gemm", 1, 5, "nsys"})})}})
                .status,
            200);
  json g = json::parse(Viewer("GET", "/api/v1/runs/1/kernels", cookie).body);
  EXPECT_EQ(g["kind"], "kernels");
  EXPECT_EQ(g["total_gpu_ns"], 5);
  EXPECT_EQ(g["kernels"].size(), 1u);
}

TEST_F(ServerApiTest, ARunIsCreatedOnceAndABatchSentTwiceIsStoredOnce) {
  // GIVEN a run created by its client's id
  HttpResponse created = Call("PUT", "/api/v1/runs/node-1:42:1:1", Run());
  ASSERT_EQ(created.status, 201) << created.body;
  const int64_t run_id = json::parse(created.body)["run_id"];
  // AND resumed under the same id: the same run
  HttpResponse again = Call("PUT", "/api/v1/runs/node-1:42:1:1", Run());
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(json::parse(again.body)["run_id"], run_id);
  EXPECT_EQ(json::parse(again.body)["created"], false);
  // WHEN a batch arrives twice (a retry) and another once
  HttpResponse first = Call("POST", "/api/v1/runs/node-1:42:1:1/batches", Batch("b1", 0, 10));
  HttpResponse retry = Call("POST", "/api/v1/runs/node-1:42:1:1/batches", Batch("b1", 0, 10));
  HttpResponse second = Call("POST", "/api/v1/runs/node-1:42:1:1/batches", Batch("b2", 10, 5));
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(json::parse(first.body)["stored"], 10);
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(json::parse(retry.body)["duplicate"], true);
  EXPECT_EQ(json::parse(retry.body)["stored"], 0);
  EXPECT_EQ(second.status, 200);
  // THEN each row is stored once
  EXPECT_EQ(StoredSteps(run_id), 15u);
  // AND /metrics counts it, without any key in it
  HttpResponse metrics = Call("GET", "/metrics", nullptr, "");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.body, HasSubstr("gpuprof_ingest_batches_total 3\n"));
  EXPECT_THAT(metrics.body, HasSubstr("gpuprof_ingest_duplicate_batches_total 1\n"));
  EXPECT_THAT(metrics.body, HasSubstr("gpuprof_ingest_rows_total 15\n"));
  EXPECT_THAT(metrics.body, HasSubstr("gpuprof_runs_live 1\n"));
  EXPECT_THAT(metrics.body, ::testing::Not(HasSubstr("key")));
  // AND finishing the run updates it
  json done = Run();
  done["run"]["status"] = "ok";
  done["run"]["end_ns"] = 2000;
  EXPECT_EQ(Call("PUT", "/api/v1/runs/node-1:42:1:1", done).status, 200);
  EXPECT_THAT(Call("GET", "/metrics", nullptr, "").body, HasSubstr("gpuprof_runs_live 0\n"));
}

TEST_F(ServerApiTest, BothRowLayoutsStoreTheSameRows) {
  // GIVEN two runs, and one batch of steps and GPU samples
  ASSERT_EQ(Call("PUT", "/api/v1/runs/objects", Run()).status, 201);
  ASSERT_EQ(Call("PUT", "/api/v1/runs/columns", Run()).status, 201);
  std::vector<store::Row> rows;
  for (int64_t s = 0; s < 6; ++s) {
    rows.emplace_back(store::StepRow{s, s * 100, s * 100 + 90,
                                     s % 2 ? std::optional<int64_t>(5) : std::nullopt, "gap", 1, 1,
                                     1});
    store::GpuSampleRow g;
    g.ts_ns = s * 10;
    g.gpu_index = s % 2;
    g.util_pct = 12.5 * static_cast<double>(s);
    g.mem_used_bytes = int64_t{1} << 40;
    rows.emplace_back(g);
  }
  // WHEN it is sent as objects to one and in the columns layout (the client's) to the other
  const json objects{{"batch_id", "o"}, {"rows", store::RowsToJson(rows)}};
  const json columns{{"batch_id", "c"},
                     {"rows", store::RowsToJson(rows, store::RowLayout::kColumns)}};
  ASSERT_TRUE(columns["rows"]["gpu_samples"].contains("columns"));
  HttpResponse a = Call("POST", "/api/v1/runs/objects/batches", objects);
  HttpResponse b = Call("POST", "/api/v1/runs/columns/batches", columns);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(json::parse(b.body)["stored"], 12);
  EXPECT_LT(columns.dump().size(), objects.dump().size());
  // THEN both runs hold the same rows
  auto db =
      store::SqliteStore::Open((dir_ / "server.db").string(), store::SqliteStore::Mode::kReadOnly);
  const int64_t first = json::parse(a.body)["run_id"], second = json::parse(b.body)["run_id"];
  auto raw_a = (*db)->LoadRawSamples(first), raw_b = (*db)->LoadRawSamples(second);
  ASSERT_TRUE(raw_a.ok() && raw_b.ok());
  ASSERT_EQ(raw_a->gpu_samples.size(), 6u);
  std::vector<store::Row> back_a(raw_a->gpu_samples.begin(), raw_a->gpu_samples.end());
  std::vector<store::Row> back_b(raw_b->gpu_samples.begin(), raw_b->gpu_samples.end());
  EXPECT_EQ(store::RowsToJson(back_a), store::RowsToJson(back_b));
  EXPECT_EQ(store::RowsToJson(back_b)["gpu_samples"][5]["util_pct"], 62.5);
  EXPECT_EQ(StoredSteps(first), 6u);
  EXPECT_EQ(StoredSteps(second), 6u);
  // AND a field given twice in the body is refused (a document would keep one silently)
  HttpRequest twice;
  twice.method = "POST";
  twice.target = "/api/v1/runs/columns/batches";
  twice.headers = {{"x-api-key", "new-key"}, {"content-type", "application/json"}};
  twice.body = R"({"batch_id": "t", "rows": {}, "batch_id": "u"})";
  HttpResponse refused = api_->Handle(twice);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.body, HasSubstr("field 'batch_id' is given twice"));
}

TEST_F(ServerApiTest, WriteKeysAreChecked) {
  EXPECT_EQ(Call("PUT", "/api/v1/runs/r1", Run(), "").status, 401);
  HttpResponse wrong = Call("PUT", "/api/v1/runs/r1", Run(), "guess");
  EXPECT_EQ(wrong.status, 403);
  EXPECT_THAT(wrong.body, ::testing::Not(HasSubstr("new-key")));
  // Both keys of a rotation work
  EXPECT_EQ(Call("PUT", "/api/v1/runs/r1", Run(), "old-key").status, 201);
  EXPECT_EQ(Call("POST", "/api/v1/runs/r1/batches", Batch("b", 0, 1), "new-key").status, 200);
  // A prefix of a key is not the key
  EXPECT_EQ(Call("PUT", "/api/v1/runs/r1", Run(), "new-ke").status, 403);
  EXPECT_TRUE(SecretEquals("abc", "abc"));
  EXPECT_FALSE(SecretEquals("abc", "abd"));
  EXPECT_FALSE(SecretEquals("abc", "abcd"));
}

TEST_F(ServerApiTest, BadRequestsAre4xxWithAMessageAndStoreNothing) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  auto error = [](const HttpResponse& r) {
    return json::parse(r.body)["error"].get<std::string>();
  };
  // A batch for a run never created
  HttpResponse unknown = Call("POST", "/api/v1/runs/nope/batches", Batch("b", 0, 1));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(error(unknown), HasSubstr("PUT /api/v1/runs/nope first"));
  // A bad row anywhere refuses the whole batch
  json bad = Batch("b", 0, 3);
  bad["rows"]["steps"][2].erase("end_ns");
  HttpResponse refused = Call("POST", "/api/v1/runs/r1/batches", bad);
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(error(refused), "steps[2].end_ns: missing (required)");
  EXPECT_EQ(StoredSteps(1), 0u);
  // ...and the same id sent right is then stored (a refused batch is not remembered)
  EXPECT_EQ(json::parse(Call("POST", "/api/v1/runs/r1/batches", Batch("b", 0, 3)).body)["stored"],
            3);
  // Malformed JSON, wrong type, no batch id, unknown field, bad ids
  HttpRequest raw;
  raw.method = "POST";
  raw.target = "/api/v1/runs/r1/batches";
  raw.headers = {{"x-api-key", "new-key"}, {"content-type", "application/json"}};
  raw.body = "{\"batch_id\": ";
  EXPECT_EQ(api_->Handle(raw).status, 400);
  EXPECT_EQ(
      Call("POST", "/api/v1/runs/r1/batches", Batch("b", 0, 1), "new-key", "text/plain").status,
      415);
  EXPECT_THAT(error(Call("POST", "/api/v1/runs/r1/batches", json{{"rows", json::object()}})),
              HasSubstr("batch_id must be"));
  EXPECT_THAT(error(Call("POST", "/api/v1/runs/r1/batches", json{{"batch_id", "x"}, {"r", 1}})),
              HasSubstr("unknown field 'r'"));
  EXPECT_EQ(Call("PUT", "/api/v1/runs/a%20b", Run()).status, 400);
  // Too many rows, too large a body
  EXPECT_THAT(error(Call("POST", "/api/v1/runs/r1/batches", Batch("big", 0, 101))),
              HasSubstr("more than 100 rows"));
  json huge = Batch("huge", 0, 1);
  huge["rows"]["diagnostics"] = json::array(
      {{{"ts_ns", 0}, {"level", "info"}, {"source", "x"}, {"message", std::string(70000, 'a')}}});
  EXPECT_EQ(Call("POST", "/api/v1/runs/r1/batches", huge).status, 413);
  // Routes and methods
  EXPECT_EQ(Call("GET", "/api/v1/runs/r1/batches", nullptr).status, 405);
  EXPECT_EQ(Call("DELETE", "/api/v1/runs/r1", nullptr).status, 405);
  EXPECT_THAT(error(Call("GET", "/nothing", nullptr)), HasSubstr("endpoints: GET /healthz"));
  EXPECT_THAT(error(Call("PUT", "/api/v2/runs/r1", Run())), HasSubstr("this server speaks v1"));
  EXPECT_EQ(Call("GET", "/healthz", nullptr, "").status, 200);
}

TEST_F(ServerApiTest, GzipBodiesAreInflatedWithinTheLimitAndBombsAreRefused) {
  ASSERT_EQ(Call("PUT", "/api/v1/runs/r1", Run()).status, 201);
  HttpRequest r;
  r.method = "POST";
  r.target = "/api/v1/runs/r1/batches";
  r.headers = {
      {"x-api-key", "new-key"}, {"content-type", "application/json"}, {"content-encoding", "gzip"}};
  r.body = Gzip(Batch("z", 0, 20).dump());
  HttpResponse ok = api_->Handle(r);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["stored"], 20);
  // A small body that inflates past the limit (a gzip bomb)
  r.body = Gzip(std::string(10 << 20, ' '));
  ASSERT_LT(r.body.size(), 64u * 1024);
  EXPECT_EQ(api_->Handle(r).status, 413);
  // A truncated or foreign body
  r.body = Gzip(Batch("t", 0, 20).dump()).substr(0, 40);
  EXPECT_EQ(api_->Handle(r).status, 400);
  r.body = "not gzip at all";
  EXPECT_EQ(api_->Handle(r).status, 400);
  r.headers["content-encoding"] = "br";
  EXPECT_EQ(api_->Handle(r).status, 415);
}

}  // namespace
}  // namespace gpuprof::server

namespace gpuprof::server {
namespace {

TEST_F(ServerApiTest, ViewersGetTheStepBreakdownACompareAndAGroup) {
  // GIVEN two ranks of one job, 10 steps each: 10 ms wait, 30 ms forward, 50 ms backward
  for (int rank = 0; rank < 2; ++rank) {
    json run = Run();
    run["run"]["group_id"] = "job 1";
    run["run"]["rank"] = rank;
    run["run"]["world_size"] = 2;
    const std::string uuid = "rank" + std::to_string(rank);
    ASSERT_EQ(Call("PUT", "/api/v1/runs/" + uuid, run).status, 201);
    std::vector<store::Row> rows;
    for (int64_t s = 0; s < 10; ++s) {
      rows.emplace_back(store::StepRow{s, s * 100'000'000, s * 100'000'000 + 100'000'000,
                                       10'000'000, "gap", 1, 1, 0});
      rows.emplace_back(store::PhaseRow{s, "forward", 30'000'000, std::nullopt, 1});
      rows.emplace_back(store::PhaseRow{s, "backward", 50'000'000, std::nullopt, 1});
    }
    ASSERT_EQ(Call("POST", "/api/v1/runs/" + uuid + "/batches",
                   json{{"batch_id", "b"}, {"rows", store::RowsToJson(rows)}})
                  .status,
              200);
  }
  const auto [cookie, csrf] = Login();
  // The steps, bucketed 4 to a row for ?points=3
  HttpResponse steps = Viewer("GET", "/api/v1/runs/1/steps?points=3", cookie);
  ASSERT_EQ(steps.status, 200) << steps.body;
  json s = json::parse(steps.body);
  EXPECT_EQ(s["steps_total"], 10);
  EXPECT_EQ(s["steps_per_row"], 4);
  ASSERT_EQ(s["rows"].size(), 3u);
  EXPECT_EQ(s["rows"][0]["first_step"], 0);
  EXPECT_EQ(s["rows"][0]["last_step"], 3);
  EXPECT_DOUBLE_EQ(s["rows"][0]["forward_ns"].get<double>(), 30e6);
  EXPECT_DOUBLE_EQ(s["rows"][0]["other_ns"].get<double>(), 10e6);  // 100 - 10 - 30 - 50
  EXPECT_TRUE(s["rows"][0]["gpu_ns"].is_null());                   // unknown, not 0
  EXPECT_EQ(s["rows"][2]["steps"], 2);
  // A compare of both ranks; 1 or 5 runs, or an unknown one, are refused
  json cmp = json::parse(Viewer("GET", "/api/v1/compare?runs=1,2", cookie).body);
  ASSERT_EQ(cmp["runs"].size(), 2u);
  EXPECT_EQ(cmp["runs"][1]["run"]["rank"], 1);
  EXPECT_EQ(Viewer("GET", "/api/v1/compare?runs=1", cookie).status, 400);
  EXPECT_EQ(Viewer("GET", "/api/v1/compare?runs=1,2,1,2,1", cookie).status, 400);
  EXPECT_EQ(Viewer("GET", "/api/v1/compare?runs=1,99", cookie).status, 404);
  // The group (its name percent-encoded)
  HttpResponse group = Viewer("GET", "/api/v1/groups/job%201", cookie);
  ASSERT_EQ(group.status, 200) << group.body;
  EXPECT_EQ(json::parse(group.body)["ranks"].size(), 2u);
  EXPECT_EQ(Viewer("GET", "/api/v1/groups/nope", cookie).status, 404);
  // AND none of it without a viewer session
  for (const char* t : {"/api/v1/runs/1/steps", "/api/v1/compare?runs=1,2", "/api/v1/groups/x"}) {
    EXPECT_EQ(Viewer("GET", t, "").status, 401) << t;
    EXPECT_EQ(Viewer("GET", t, "", "", "new-key").status, 401) << t;
  }
}

}  // namespace
}  // namespace gpuprof::server

namespace gpuprof::server {
namespace {

TEST(SessionSecretTest, IsGeneratedOnceBesideTheStoreOrReadFromAFileOfAtLeast32Bytes) {
  const fs::path dir = fs::temp_directory_path() / ("gpuprof_secret_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "s.db").string();
  // Generated once, private, and the same on the next start
  auto first = LoadOrCreateSecret(std::nullopt, store);
  ASSERT_TRUE(first.ok()) << first.error();
  EXPECT_GE(first->size(), 32u);
  EXPECT_EQ(fs::status(store + ".secret").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(*LoadOrCreateSecret(std::nullopt, store), *first);
  // From a file: too short is refused naming it, long enough is used as it is
  std::ofstream(dir / "short") << "abc";
  EXPECT_THAT(LoadOrCreateSecret((dir / "short").string(), store).error(),
              HasSubstr("too short (at least 32 bytes"));
  const std::string long_secret(40, 'q');
  std::ofstream(dir / "long") << long_secret;
  EXPECT_EQ(*LoadOrCreateSecret((dir / "long").string(), store), long_secret);
  EXPECT_THAT(LoadOrCreateSecret((dir / "none").string(), store).error(),
              HasSubstr("cannot be read"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpuprof::server
