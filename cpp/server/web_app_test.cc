// The web app's side of the server: static files (embedded and from a source tree), the
// session endpoint, the dashboard's single-use login link, the multi-series and runs-list
// reads the pages use, and the in-process Dashboard (real HTTP, live events from commits).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/dashboard.h"
#include "server/http_server.h"
#include "server/ingest_api.h"
#include "server/series_cache.h"
#include "server/web_assets.h"
#include "store/row_json.h"
#include "store/sqlite_store.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

fs::path TempDir() {
  fs::path d =
      fs::temp_directory_path() / ("gpuprof_web_" + std::to_string(getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

store::RunInfo MakeRun(const std::string& name) {
  store::RunInfo info;
  info.run_name = name;
  info.hostname = "node-1";
  info.pid = 7;
  info.start_unix_ns = 1'700'000'000'000'000'000;
  return info;
}

// A file store with one run: 5 steps, 3 seconds of rollups for 2 GPUs (GPU 1 without power),
// host samples, and two insights.
int64_t WriteRun(store::SqliteStore& db, const std::string& name, bool finish) {
  auto id = db.BeginRun(MakeRun(name));
  EXPECT_TRUE(id.ok()) << id.error();
  std::vector<store::Row> rows;
  for (int64_t s = 0; s < 5; ++s) {
    store::StepRow st;
    st.step = s;
    st.start_ns = s * 100'000'000;
    st.end_ns = st.start_ns + 90'000'000;
    rows.emplace_back(st);
  }
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t g = 0; g < 2; ++g) {
      store::GpuRollupRow r;
      r.ts_ns = t * 1'000'000'000;
      r.gpu_index = g;
      r.samples = 10;
      r.util_mean_pct = 50.0 + 10 * g + t;
      r.mem_used_max_bytes = (g + 1) * 1000;
      if (g == 0) r.power_mean_mw = 300'000.0;
      r.temp_max_c = 60.0;
      rows.emplace_back(r);
    }
    store::HostSampleRow h;
    h.ts_ns = t * 1'000'000'000 + 5;
    h.cpu_pct = 25.0;
    h.mem_used_bytes = 4096;
    h.proc_rss_bytes = 2048;
    if (t > 0) h.job_cpu_pct = 100.0 + static_cast<double>(t);  // the job's other ranks
    rows.emplace_back(h);
  }
  EXPECT_TRUE(db.WriteRows(*id, rows).ok());
  store::InsightRow top{0,
                        "input_bound",
                        "input",
                        "high",
                        "34% of step time waiting",
                        "raise "
                        "num_workers",
                        std::nullopt};
  store::InsightRow next{1, "low_util", "gpu", "med", "GPU idle", std::nullopt, std::nullopt};
  EXPECT_TRUE(db.ReplaceInsights(*id, {top, next}).ok());
  if (finish) EXPECT_TRUE(db.FinishRun(*id, "ok", 2'500'000'000, std::nullopt).ok());
  return *id;
}

class WebAppTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    {
      auto db =
          store::SqliteStore::Open((dir_ / "s.db").string(), store::SqliteStore::Mode::kReadWrite);
      ASSERT_TRUE(db.ok()) << db.error();
      run_ = WriteRun(**db, "exp", true);
      live_ = WriteRun(**db, "live", false);
    }
    Open(ApiOptions{});
  }
  void TearDown() override {
    api_.reset();
    fs::remove_all(dir_);
  }
  void Open(ApiOptions o) {
    o.api_keys = {"key"};
    if (!o.login_token) o.viewer_password = "pw";
    o.secret = std::string(32, 's');
    api_.reset();
    auto api = ServerApi::Open((dir_ / "s.db").string(), o);
    ASSERT_TRUE(api.ok()) << api.error();
    api_ = std::move(api.value());
  }
  HttpResponse Get(const std::string& target, const std::string& cookie = "") {
    HttpRequest r;
    r.method = "GET";
    r.target = target;
    if (!cookie.empty()) r.headers["cookie"] = cookie;
    return api_->Handle(r);
  }
  static std::string Header(const HttpResponse& r, const std::string& name) {
    for (const auto& [k, v] : r.headers) {
      if (k == name) return v;
    }
    return "";
  }
  // The Cookie header a browser sends after `r` (every Set-Cookie's name=value).
  static std::string CookiesOf(const HttpResponse& r) {
    std::string out;
    for (const auto& [k, v] : r.headers) {
      if (k != "Set-Cookie") continue;
      out += (out.empty() ? "" : "; ") + v.substr(0, v.find(';'));
    }
    return out;
  }
  std::string LoginCookie() {
    HttpRequest r;
    r.method = "POST";
    r.target = "/api/v1/login";
    r.headers["content-type"] = "application/json";
    r.body = R"({"password": "pw"})";
    HttpResponse res = api_->Handle(r);
    EXPECT_EQ(res.status, 200) << res.body;
    return CookiesOf(res);
  }

  fs::path dir_;
  int64_t run_ = 0, live_ = 0;
  std::unique_ptr<ServerApi> api_;
};

TEST_F(WebAppTest, ServesTheEmbeddedAppWithItsVendoredChartsAndLicence) {
  // GIVEN the embedded app WHEN its pages are fetched without a session THEN they are served
  // with a CSP that keeps scripts and connections on this server.
  HttpResponse index = Get("/");
  ASSERT_EQ(index.status, 200) << index.body;
  EXPECT_EQ(index.content_type, "text/html; charset=utf-8");
  EXPECT_THAT(index.body, HasSubstr("/vendor/dygraphs/dygraph.min.js"));
  EXPECT_THAT(Header(index, "Content-Security-Policy"), HasSubstr("default-src 'self'"));
  EXPECT_EQ(Header(index, "X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(Header(index, "Referrer-Policy"), "no-referrer");
  HttpResponse app = Get("/app/app.js?v=1");
  ASSERT_EQ(app.status, 200);
  EXPECT_EQ(app.content_type, "text/javascript; charset=utf-8");
  HttpResponse dygraphs = Get("/vendor/dygraphs/dygraph.min.js");
  ASSERT_EQ(dygraphs.status, 200);
  EXPECT_THAT(dygraphs.body, HasSubstr("Dygraph"));
  EXPECT_GT(dygraphs.body.size(), 100'000u);
  EXPECT_THAT(Get("/vendor/dygraphs/synchronizer.js").body, HasSubstr("synchronize"));
  EXPECT_THAT(Get("/vendor/dygraphs/dygraph.css").content_type, HasSubstr("text/css"));
  HttpResponse licence = Get("/vendor/dygraphs/LICENSE.txt");
  ASSERT_EQ(licence.status, 200);
  EXPECT_THAT(licence.body, HasSubstr("MIT"));
  EXPECT_EQ(Get("/lib/format.js").status, 200);
  // Everything embedded is reachable by its URL.
  for (const WebFile& f : EmbeddedWebFiles()) {
    EXPECT_EQ(Get(std::string("/") + f.path).status, 200) << f.path;
  }
}

TEST_F(WebAppTest, StaticPathsNeverLeaveTheAssetSet) {
  for (const char* bad : {"/app/../../etc/passwd", "/app/..%2f..%2fetc/passwd", "/lib/..\\x",
                          "/app/nope.js", "/vendor/dygraphs/dygraph.js", "/app//app.js"}) {
    HttpResponse r = Get(bad);
    EXPECT_EQ(r.status, 404) << bad;
    EXPECT_THAT(r.body, HasSubstr("\"error\"")) << bad;
  }
  HttpRequest post;
  post.method = "POST";
  post.target = "/app/app.js";
  EXPECT_EQ(api_->Handle(post).status, 405);
}

TEST_F(WebAppTest, ServesFromASourceTreeWhenGivenOne) {
  fs::create_directories(dir_ / "web" / "dashboard");
  fs::create_directories(dir_ / "web" / "lib");
  std::ofstream(dir_ / "web" / "dashboard" / "index.html") << "<p>from disk</p>";
  std::ofstream(dir_ / "web" / "lib" / "x.js") << "export const x = 1;";
  ApiOptions o;
  o.web_dir = (dir_ / "web").string();
  Open(o);
  EXPECT_EQ(Get("/").body, "<p>from disk</p>");
  EXPECT_EQ(Get("/lib/x.js").body, "export const x = 1;");
  // Vendored files always come from the build.
  EXPECT_THAT(Get("/vendor/dygraphs/dygraph.min.js").body, HasSubstr("Dygraph"));
}

TEST_F(WebAppTest, SessionSaysTheModeAndHandsTheCsrfTokenToALoggedInPage) {
  json anon = json::parse(Get("/api/v1/session").body);
  EXPECT_EQ(anon["mode"], "serve");
  EXPECT_EQ(anon["viewing"], true);
  EXPECT_EQ(anon["logged_in"], false);
  EXPECT_FALSE(anon.contains("csrf"));
  const std::string cookie = LoginCookie();
  json in = json::parse(Get("/api/v1/session", cookie).body);
  EXPECT_EQ(in["logged_in"], true);
  ASSERT_TRUE(in["csrf"].is_string());
  // The token works for a state-changing request (logout).
  HttpRequest out;
  out.method = "POST";
  out.target = "/api/v1/logout";
  out.headers["cookie"] = cookie;
  out.headers["x-csrf-token"] = in["csrf"].get<std::string>();
  EXPECT_EQ(api_->Handle(out).status, 200);
  // A tampered session is not logged in.
  std::string tampered = cookie;
  tampered.replace(tampered.find("gpuprof_session=v1.") + 19, 1, "9");
  EXPECT_EQ(json::parse(Get("/api/v1/session", tampered).body)["logged_in"], false);
}

TEST_F(WebAppTest, TheLoginLinkWorksOnceAndOpensTheDashboardsRun) {
  ApiOptions o;
  o.login_token = std::string(64, 'a');
  o.dashboard_run_id = live_;
  o.cookie_suffix = "_1234";
  Open(o);
  json anon = json::parse(Get("/api/v1/session").body);
  EXPECT_EQ(anon["mode"], "dashboard");
  EXPECT_EQ(anon["run_id"], live_);
  EXPECT_EQ(Get("/api/v1/runs").status, 401);
  EXPECT_EQ(Get("/login?token=" + std::string(64, 'b')).status, 403);
  EXPECT_EQ(Get("/login").status, 403);
  HttpResponse first = Get("/login?token=" + std::string(64, 'a'));
  ASSERT_EQ(first.status, 303) << first.body;
  EXPECT_EQ(Header(first, "Location"), "/#/runs/" + std::to_string(live_));
  const std::string cookie = CookiesOf(first);
  EXPECT_THAT(cookie, HasSubstr("gpuprof_session_1234="));
  EXPECT_THAT(cookie, HasSubstr("gpuprof_csrf_1234="));
  EXPECT_EQ(Get("/api/v1/runs", cookie).status, 200);
  // Used: a second browser gets a page that says so; the first one goes on to the app.
  HttpResponse second = Get("/login?token=" + std::string(64, 'a'));
  EXPECT_EQ(second.status, 403);
  EXPECT_THAT(second.body, HasSubstr("already used"));
  EXPECT_EQ(Get("/login?token=" + std::string(64, 'a'), cookie).status, 303);
  // No password login on a dashboard.
  HttpRequest login;
  login.method = "POST";
  login.target = "/api/v1/login";
  login.headers["content-type"] = "application/json";
  login.body = R"({"password": ""})";
  HttpResponse refused = api_->Handle(login);
  EXPECT_EQ(refused.status, 403);
  EXPECT_THAT(refused.body, HasSubstr("printed"));
}

TEST_F(WebAppTest, ALoginLinkOnAPasswordServerIsAPageNotAnError) {
  HttpResponse r = Get("/login?token=x");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
}

TEST_F(WebAppTest, RunsListCarriesStepsDurationAndHeadline) {
  const std::string cookie = LoginCookie();
  json runs = json::parse(Get("/api/v1/runs", cookie).body)["runs"];
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["steps"], 5);
  EXPECT_EQ(runs[0]["duration_ns"], 2'500'000'000);  // ended: its end
  EXPECT_EQ(runs[0]["headline"]["rule_id"], "input_bound");
  EXPECT_EQ(runs[0]["headline"]["severity"], "high");
  EXPECT_EQ(runs[0]["headline"]["fix"], "raise num_workers");
  // Live: the newest sample so far (host sample at 2 s + 5 ns).
  EXPECT_EQ(runs[1]["status"], "running");
  EXPECT_EQ(runs[1]["duration_ns"], 2'000'000'005);
  // One run by id (the run page's header), without reading every run's progress.
  json one = json::parse(Get("/api/v1/runs?id=" + std::to_string(live_), cookie).body)["runs"];
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["run_name"], "live");
  EXPECT_EQ(Get("/api/v1/runs?id=x", cookie).status, 400);
  EXPECT_TRUE(json::parse(Get("/api/v1/runs?id=999", cookie).body)["runs"].empty());
}

TEST_F(WebAppTest, StepsReadOnlyStepsAndLeaveUnmeasuredCommNull) {
  const std::string cookie = LoginCookie();
  json doc = json::parse(Get("/api/v1/runs/" + std::to_string(run_) + "/steps", cookie).body);
  ASSERT_EQ(doc["rows"].size(), 5u);
  EXPECT_EQ(doc["rows"][0]["duration_ns"], 90'000'000.0);
  EXPECT_TRUE(doc["rows"][0]["comm_ns"].is_null());  // no comm phase in this run
  // A run with a comm phase has it.
  {
    auto db =
        store::SqliteStore::Open((dir_ / "s.db").string(), store::SqliteStore::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    store::PhaseRow comm;
    comm.step = 1;
    comm.name = "comm";
    comm.wall_ns = 20'000'000;
    comm.calls = 1;
    ASSERT_TRUE((*db)->WriteRows(run_, {store::Row{comm}}).ok());
  }
  Open(ApiOptions{});  // written behind the server's back: a server started after it reads it
  doc = json::parse(Get("/api/v1/runs/" + std::to_string(run_) + "/steps", cookie).body);
  EXPECT_EQ(doc["rows"][0]["comm_ns"], 0.0);
  EXPECT_EQ(doc["rows"][1]["comm_ns"], 20'000'000.0);
  EXPECT_EQ(doc["rows"][1]["other_ns"], 70'000'000.0);
}

TEST_F(WebAppTest, StepsCountTheExposedCollectivesOfTheCommBucketsAsComm) {
  // GIVEN DDP bucket timings: step 2 (backward 50 ms) readied its last bucket 40 ms in and its
  // collectives were done at 52 ms; step 3 (no phases) had 8 ms between its only bucket being
  // ready and done; step 4's backward (5 ms) is shorter than its 20 ms of exposed comm
  {
    auto db =
        store::SqliteStore::Open((dir_ / "s.db").string(), store::SqliteStore::Mode::kReadWrite);
    ASSERT_TRUE(db.ok());
    constexpr int64_t kMs = 1'000'000;
    std::vector<store::Row> rows = {store::PhaseRow{2, "backward", 50 * kMs, std::nullopt, 1},
                                    store::PhaseRow{4, "backward", 5 * kMs, std::nullopt, 1},
                                    store::CommBucketRow{2, 0, 220 * kMs, 230 * kMs, std::nullopt},
                                    store::CommBucketRow{2, 1, 240 * kMs, 252 * kMs, std::nullopt},
                                    store::CommBucketRow{3, 0, 310 * kMs, 318 * kMs, std::nullopt},
                                    store::CommBucketRow{4, 0, 410 * kMs, 430 * kMs, std::nullopt}};
    ASSERT_TRUE((*db)->WriteRows(run_, rows).ok());
  }
  Open(ApiOptions{});
  const std::string cookie = LoginCookie();
  json doc = json::parse(Get("/api/v1/runs/" + std::to_string(run_) + "/steps", cookie).body);
  ASSERT_EQ(doc["rows"].size(), 5u);
  // THEN comm is the exposed time, taken out of backward where there is one
  EXPECT_EQ(doc["rows"][2]["comm_ns"], 12'000'000.0);
  EXPECT_EQ(doc["rows"][2]["backward_ns"], 38'000'000.0);
  EXPECT_EQ(doc["rows"][2]["other_ns"], 40'000'000.0);  // 90 - 38 - 12
  EXPECT_EQ(doc["rows"][3]["comm_ns"], 8'000'000.0);
  EXPECT_EQ(doc["rows"][3]["backward_ns"], 0.0);
  EXPECT_EQ(doc["rows"][4]["comm_ns"], 5'000'000.0);  // at most the backward it happens in
  EXPECT_EQ(doc["rows"][4]["backward_ns"], 0.0);
  // AND a step without buckets of a run that has them had no exposed comm
  EXPECT_EQ(doc["rows"][0]["comm_ns"], 0.0);
}

TEST_F(WebAppTest, FaviconIsNoContentAndServerPagesNeedNone) {
  EXPECT_EQ(Get("/favicon.ico").status, 204);
  EXPECT_THAT(Get("/login?token=x").body, HasSubstr("rel=\"icon\" href=\"data:,\""));
}

TEST_F(WebAppTest, SeveralMetricsOfEveryGpuInOneRequest) {
  const std::string cookie = LoginCookie();
  HttpResponse r = Get("/api/v1/runs/" + std::to_string(run_) +
                           "/series?metric=gpu_util,gpu_power,host_mem,proc_rss&gpu=all&points=3",
                       cookie);
  ASSERT_EQ(r.status, 200) << r.body;
  json doc = json::parse(r.body);
  std::vector<std::pair<std::string, json>> got;
  for (const auto& s : doc["series"]) got.emplace_back(s["metric"], s["gpu"]);
  // GPU 1 has no power reading: no series for it (never zeros).
  const std::vector<std::pair<std::string, json>> want = {{"gpu_util", 0},
                                                          {"gpu_util", 1},
                                                          {"gpu_power", 0},
                                                          {"host_mem", nullptr},
                                                          {"proc_rss", nullptr}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(doc["series"][1]["points"][2][1], 62.0);
  EXPECT_EQ(doc["series"][1]["source_points"], 3);
  // A window and one GPU.
  json one = json::parse(Get("/api/v1/runs/" + std::to_string(run_) +
                                 "/series?metric=gpu_util,gpu_mem&gpu=1&from_ns=1000000000",
                             cookie)
                             .body);
  ASSERT_EQ(one["series"].size(), 2u);
  EXPECT_EQ(one["series"][0]["points"].size(), 2u);
  EXPECT_EQ(one["from_ns"], 1'000'000'000);
  // A single new host metric keeps the one-series shape.
  json mem = json::parse(
      Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=host_mem", cookie).body);
  EXPECT_EQ(mem["metric"], "host_mem");
  EXPECT_TRUE(mem["gpu"].is_null());
  EXPECT_EQ(mem["points"].size(), 3u);
  HttpResponse bad =
      Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=gpu_util,nope&gpu=all", cookie);
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("no metric 'nope'"));
  // The job's other ranks' CPU is a host metric beside the others, with only the samples that
  // have it (never zeros for the rest); proc_cpu was never measured here: no series. The list
  // of metrics names it.
  json job = json::parse(
      Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=host_cpu,proc_cpu,job_cpu",
          cookie)
          .body);
  ASSERT_EQ(job["series"].size(), 2u) << job.dump();
  EXPECT_EQ(job["series"][0]["metric"], "host_cpu");
  EXPECT_EQ(job["series"][1]["metric"], "job_cpu");
  ASSERT_EQ(job["series"][1]["points"].size(), 2u);
  EXPECT_EQ(job["series"][1]["points"][0][1], 101.0);
  EXPECT_EQ(job["series"][1]["points"][1][1], 102.0);
  EXPECT_THAT(bad.body, HasSubstr("job_cpu"));
  EXPECT_EQ(
      Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=gpu_util&gpu=every", cookie)
          .status,
      400);
}

TEST_F(WebAppTest, ReadsDoNotWaitForIngestOnSqlite) {
  // GIVEN a big batch being stored (the store's write connection busy for a while) WHEN a page
  // reads series meanwhile THEN each read is answered on a read connection of its own, long
  // before the batch is done (before, every read queued behind the write).
  ApiOptions o;
  o.max_rows_per_batch = 1'000'000;
  o.max_body_bytes = 256u << 20;
  Open(o);
  HttpRequest put;
  put.method = "PUT";
  put.target = "/api/v1/runs/big-run";
  put.headers["x-api-key"] = "key";
  put.headers["content-type"] = "application/json";
  put.body = json{{"run", store::RunInfoToJson(MakeRun("big"))}}.dump();
  ASSERT_EQ(api_->Handle(put).status, 201);
  // Enough steps (an upsert a row) that the batch takes a good part of a second to store
  std::string body =
      R"({"batch_id": "b1", "rows": {"steps": {"columns": ["step", "start_ns", "end_ns",)"
      R"( "forward_calls", "backward_calls", "optimizer_calls"], "rows": [)";
  for (int64_t i = 0; i < 600'000; ++i) {
    body += (i ? ",[" : "[") + std::to_string(i) + "," + std::to_string(i * 10) + "," +
            std::to_string(i * 10 + 9) + ",1,1,1]";
  }
  body += "]}}}";
  HttpRequest post = put;
  post.method = "POST";
  post.target = "/api/v1/runs/big-run/batches";
  post.body = std::move(body);
  const std::string cookie = LoginCookie();
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int64_t write_ms = 0;
  std::thread writer([&] {
    HttpResponse r = api_->Handle(post);
    EXPECT_EQ(r.status, 200) << r.body;
    write_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    done = true;
  });
  int64_t worst_ms = 0;
  int reads = 0;
  while (!done) {
    const auto a = std::chrono::steady_clock::now();
    HttpResponse r =
        Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=gpu_util&gpu=all", cookie);
    EXPECT_EQ(r.status, 200) << r.body;
    worst_ms = std::max<int64_t>(worst_ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::steady_clock::now() - a)
                                               .count());
    ++reads;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  writer.join();
  if (write_ms < 400) GTEST_SKIP() << "the batch took only " << write_ms << " ms";
  EXPECT_GT(reads, 10);
  EXPECT_LT(worst_ms, write_ms / 3) << reads << " reads during a " << write_ms << " ms batch";
}

TEST(SeriesCacheTest, WideWindowsComeFromMinuteExtremesThatKeepPeaksAndFollowALiveRun) {
  const fs::path dir = TempDir();
  auto db = store::SqliteStore::Open((dir / "c.db").string(), store::SqliteStore::Mode::kReadWrite);
  ASSERT_TRUE(db.ok()) << db.error();
  auto id = (*db)->BeginRun(MakeRun("long"));
  ASSERT_TRUE(id.ok());
  // 3 h of 1 s rollups for 2 GPUs at 50 %, one 1-second spike to 100 % on GPU 1 at 5000 s.
  auto write_seconds = [&](int64_t from_s, int64_t to_s) {
    std::vector<store::Row> rows;
    for (int64_t t = from_s; t < to_s; ++t) {
      for (int64_t g = 0; g < 2; ++g) {
        store::GpuRollupRow r;
        r.ts_ns = t * 1'000'000'000;
        r.gpu_index = g;
        r.samples = 1;
        r.util_mean_pct = (g == 1 && t == 5000) ? 100.0 : 50.0;
        r.temp_max_c = 60.0 + static_cast<double>(t % 7);
        rows.emplace_back(r);
      }
    }
    ASSERT_TRUE((*db)->WriteRows(*id, rows).ok());
  };
  write_seconds(0, 3 * 3600);
  EXPECT_TRUE(SeriesCache::Wide(3 * 3600 * 1'000'000'000LL, 100));
  EXPECT_FALSE(SeriesCache::Wide(3 * 3600 * 1'000'000'000LL, 1000));  // 180 buckets < 500
  EXPECT_FALSE(SeriesCache::Wide(3600 * 1'000'000'000LL, 10));        // under 2 h: 1 s tier
  SeriesCache cache;
  std::map<int64_t, std::vector<SeriesCache::Points>> out;
  ASSERT_TRUE(cache.GpuSeries(**db, *id, std::nullopt, 0b1001, 0, INT64_MAX, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  // GPU 1's spike is a bucket maximum; GPU 0 never leaves 50 %.
  double peak1 = 0, peak0 = 0;
  for (const auto& [t, v] : out[1][0]) peak1 = std::max(peak1, v);
  for (const auto& [t, v] : out[0][0]) peak0 = std::max(peak0, v);
  EXPECT_EQ(peak1, 100.0);
  EXPECT_EQ(peak0, 50.0);
  EXPECT_LE(out[1][0].size(), 2u * 180);  // at most two readings a minute
  EXPECT_FALSE(out[1][3].empty());        // temperature asked for too
  EXPECT_TRUE(out[1][1].empty());         // memory was not
  // A window inside the run: only its readings.
  out.clear();
  ASSERT_TRUE(
      cache.GpuSeries(**db, *id, 1, 0b1, 3600'000'000'000LL, 7200'000'000'000LL, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  for (const auto& [t, v] : out[1][0]) {
    EXPECT_GE(t, 3600'000'000'000LL);
    EXPECT_LE(t, 7200'000'000'000LL);
  }
  // The run goes on: the next read includes the new minutes (a new spike at 4 h).
  write_seconds(3 * 3600, 4 * 3600);
  {
    store::GpuRollupRow r;
    r.ts_ns = 4 * 3600 * 1'000'000'000LL;
    r.gpu_index = 0;
    r.util_mean_pct = 99.0;
    ASSERT_TRUE((*db)->WriteRows(*id, {store::Row{r}}).ok());
  }
  out.clear();
  ASSERT_TRUE(cache.GpuSeries(**db, *id, 0, 0b1, 0, INT64_MAX, &out).ok());
  ASSERT_FALSE(out[0][0].empty());
  EXPECT_EQ(out[0][0].back(), std::make_pair(int64_t{4 * 3600 * 1'000'000'000LL}, 99.0));
  // A late write into covered minutes drops the summary; the next read sees it.
  {
    store::GpuRollupRow r;
    r.ts_ns = 60 * 1'000'000'000LL + 500;  // between two seconds already summarised
    r.gpu_index = 0;
    r.util_mean_pct = 1.0;
    ASSERT_TRUE((*db)->WriteRows(*id, {store::Row{r}}).ok());
  }
  cache.Invalidate(*id, 60 * 1'000'000'000LL + 500);
  out.clear();
  ASSERT_TRUE(cache.GpuSeries(**db, *id, 0, 0b1, 0, 120'000'000'000LL, &out).ok());
  double low = 100;
  for (const auto& [t, v] : out[0][0]) low = std::min(low, v);
  EXPECT_EQ(low, 1.0);
  // Host samples likewise.
  std::vector<store::Row> host;
  for (int64_t t = 0; t < 3 * 3600; t += 1) {
    store::HostSampleRow h;
    h.ts_ns = t * 1'000'000'000;
    h.cpu_pct = t == 100 ? 97.0 : 10.0;
    h.job_cpu_pct = t == 200 ? 350.0 : 100.0;  // the job's other ranks on the host
    host.emplace_back(h);
  }
  ASSERT_TRUE((*db)->WriteRows(*id, host).ok());
  std::vector<SeriesCache::Points> hs;
  ASSERT_TRUE(cache.HostSeries(**db, *id, 0b100001, 0, INT64_MAX, &hs).ok());
  ASSERT_EQ(hs.size(), static_cast<size_t>(store::kHostSeriesColumns));
  double top = 0;
  for (const auto& [t, v] : hs[0]) top = std::max(top, v);
  EXPECT_EQ(top, 97.0);
  EXPECT_TRUE(hs[1].empty());
  double job_top = 0;
  for (const auto& [t, v] : hs[5]) job_top = std::max(job_top, v);
  EXPECT_EQ(job_top, 350.0);
  db->reset();
  fs::remove_all(dir);
}

TEST_F(WebAppTest, TheReportIsComputedAgainOnlyWhenItsRunChanged) {
  // GIVEN a pushed run whose report was read WHEN a batch adds only a diagnostic THEN the next
  // read has it (the cached report was not served stale); unchanged, the same document.
  HttpRequest put;
  put.method = "PUT";
  put.target = "/api/v1/runs/r1";
  put.headers["x-api-key"] = "key";
  put.headers["content-type"] = "application/json";
  put.body = json{{"run", store::RunInfoToJson(MakeRun("pushed"))}}.dump();
  HttpResponse created = api_->Handle(put);
  ASSERT_EQ(created.status, 201) << created.body;
  const int64_t id = json::parse(created.body)["run_id"];
  const std::string cookie = LoginCookie();
  const std::string path = "/api/v1/runs/" + std::to_string(id);
  const std::string first = Get(path, cookie).body;
  EXPECT_EQ(Get(path, cookie).body, first);
  HttpRequest post = put;
  post.method = "POST";
  post.target = "/api/v1/runs/r1/batches";
  post.body = json{{"batch_id", "d1"},
                   {"rows",
                    {{"diagnostics",
                      {{{"ts_ns", 5},
                        {"level", "warning"},
                        {"source", "test"},
                        {"message", "late diagnostic"}}}}}}}
                  .dump();
  HttpResponse stored = api_->Handle(post);
  ASSERT_EQ(stored.status, 200) << stored.body;
  const std::string second = Get(path, cookie).body;
  EXPECT_NE(second, first);
  EXPECT_THAT(second, HasSubstr("late diagnostic"));
}

TEST_F(WebAppTest, AStepBreakdownIsReusedOnlyWhileItsRunIsUnchanged) {
  // GIVEN a pushed run with two steps, its breakdown read WHEN a batch adds GPU time to an old
  // step (and then a new step) THEN the next read shows it.
  HttpRequest put;
  put.method = "PUT";
  put.target = "/api/v1/runs/s1";
  put.headers["x-api-key"] = "key";
  put.headers["content-type"] = "application/json";
  put.body = json{{"run", store::RunInfoToJson(MakeRun("steps"))}}.dump();
  HttpResponse created = api_->Handle(put);
  ASSERT_EQ(created.status, 201) << created.body;
  const int64_t id = json::parse(created.body)["run_id"];
  auto batch = [&](const std::string& batch_id, const json& rows) {
    HttpRequest post = put;
    post.method = "POST";
    post.target = "/api/v1/runs/s1/batches";
    post.body = json{{"batch_id", batch_id}, {"rows", rows}}.dump();
    HttpResponse r = api_->Handle(post);
    ASSERT_EQ(r.status, 200) << r.body;
  };
  auto step = [](int64_t s) {
    return json{{"step", s},          {"start_ns", s * 100}, {"end_ns", s * 100 + 90},
                {"forward_calls", 1}, {"backward_calls", 1}, {"optimizer_calls", 1}};
  };
  batch("a", {{"steps", {step(0), step(1)}},
              {"phases", {{{"step", 0}, {"name", "forward"}, {"wall_ns", 40}, {"calls", 1}}}}});
  const std::string cookie = LoginCookie();
  const std::string path = "/api/v1/runs/" + std::to_string(id) + "/steps";
  json first = json::parse(Get(path, cookie).body);
  EXPECT_TRUE(first["rows"][0]["gpu_ns"].is_null());
  EXPECT_EQ(json::parse(Get(path, cookie).body), first);
  batch("b", {{"phase_gpu_times", {{{"step", 0}, {"name", "forward"}, {"gpu_ns", 33}}}}});
  json second = json::parse(Get(path, cookie).body);
  EXPECT_EQ(second["rows"][0]["gpu_ns"], 33);
  batch("c", {{"steps", {step(2)}}});
  EXPECT_EQ(json::parse(Get(path, cookie).body)["steps_total"], 3);
  // Another resolution is another answer.
  EXPECT_EQ(json::parse(Get(path + "?points=1", cookie).body)["rows"].size(), 1u);
}

TEST_F(WebAppTest, TheSeriesAnswerSaysWhichResolutionItCameFrom) {
  const std::string cookie = LoginCookie();
  json doc = json::parse(
      Get("/api/v1/runs/" + std::to_string(run_) + "/series?metric=gpu_util&gpu=all&points=3",
          cookie)
          .body);
  EXPECT_EQ(doc["resolution"], "1 s");  // a 2 s run is never summarised
}

TEST(DashboardTest, ServesTheRunOverHttpAndTurnsCommitsIntoLiveEvents) {
  const fs::path dir = TempDir();
  auto writer =
      store::SqliteStore::Open((dir / "run.db").string(), store::SqliteStore::Mode::kReadWrite);
  ASSERT_TRUE(writer.ok()) << writer.error();
  auto id = (*writer)->BeginRun(MakeRun("train"));
  ASSERT_TRUE(id.ok());
  DashboardOptions o;
  o.db_path = (dir / "run.db").string();
  o.run_id = *id;
  o.poll_ms = 20;
  auto board = Dashboard::Start(o);
  ASSERT_TRUE(board.ok()) << board.error();
  Dashboard& d = **board;
  EXPECT_THAT(d.url(), ::testing::StartsWith("http://127.0.0.1:" + std::to_string(d.port()) +
                                             "/login?token="));
  const std::string base = "http://127.0.0.1:" + std::to_string(d.port());
  auto page = HttpCall(base, "GET", "/", {}, "");
  ASSERT_TRUE(page.ok()) << page.error();
  EXPECT_EQ(page->status, 200);
  auto runs = HttpCall(base, "GET", "/api/v1/runs", {}, "");
  ASSERT_TRUE(runs.ok());
  EXPECT_EQ(runs->status, 401);  // the token first

  // Its threads block SIGINT (a Ctrl-C goes to the main thread); the caller's mask is kept.
  int named = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "gpuprof-dash" && name != "gpuprof-dashw") continue;
    ++named;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("SigBlk:", 0) != 0) continue;
      const uint64_t blocked = std::stoull(line.substr(7), nullptr, 16);
      EXPECT_TRUE(blocked & (1ull << (SIGINT - 1))) << name << ": " << line;
      EXPECT_TRUE(blocked & (1ull << (SIGTERM - 1))) << name << ": " << line;
    }
  }
  EXPECT_GE(named, 2);  // the server, the watcher, and the connections the server started
  sigset_t mine;
  pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  EXPECT_FALSE(sigismember(&mine, SIGINT));

  auto viewer = d.api().bus().Subscribe(*id);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the watcher's baseline
  store::StepRow st;
  st.step = 7;
  st.start_ns = 1'000;
  st.end_ns = 2'000;
  ASSERT_TRUE((*writer)->WriteRows(*id, {store::Row{st}}).ok());
  json batch;
  for (int i = 0; i < 100 && batch.is_null(); ++i) {
    for (const json& e : viewer->Take(std::chrono::milliseconds(50))) {
      if (e["type"] == "batch") batch = e;
    }
  }
  ASSERT_FALSE(batch.is_null()) << "no batch event after a commit";
  EXPECT_EQ(batch["run_id"], *id);
  EXPECT_EQ(batch["last_step"], 7);
  ASSERT_TRUE((*writer)->FinishRun(*id, "ok", 3'000, std::nullopt).ok());
  json ended;
  for (int i = 0; i < 100 && ended.is_null(); ++i) {
    for (const json& e : viewer->Take(std::chrono::milliseconds(50))) {
      if (e["type"] == "run") ended = e;
    }
  }
  ASSERT_FALSE(ended.is_null()) << "no run event after the run ended";
  EXPECT_EQ(ended["status"], "ok");
  d.api().bus().Unsubscribe(viewer);
  d.Stop();
  d.Stop();  // idempotent
  EXPECT_FALSE(HttpCall(base, "GET", "/healthz", {}, "", 2).ok()) << "still listening";
  board->reset();
  fs::remove_all(dir);
}

TEST(DashboardTest, AFileThatCannotBeReadIsAnError) {
  DashboardOptions o;
  o.db_path = "/nonexistent/dir/run.db";
  auto board = Dashboard::Start(o);
  ASSERT_FALSE(board.ok());
  EXPECT_THAT(board.error(), HasSubstr("dashboard:"));
}

}  // namespace
}  // namespace gpuprof::server
