#include "server/live_push.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "server/http_server.h"
#include "server/ingest_api.h"

namespace gpuprof::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

store::RunInfo Info() {
  store::RunInfo info;
  info.run_id = 7;
  info.run_name = "live";
  info.hostname = "node 1";  // the space becomes '_' in the run id
  info.pid = 42;
  info.start_unix_ns = 1000;
  return info;
}

// A team server on 127.0.0.1 (any free port, write key "k") over `db`, serving until destroyed.
struct TestServer {
  explicit TestServer(const fs::path& db) {
    ApiOptions api_options;
    api_options.api_keys = {"k"};
    auto opened = ServerApi::Open(db.string(), api_options);
    if (!opened.ok()) {
      ADD_FAILURE() << opened.error();
      return;
    }
    api = std::move(opened.value());
    ServerOptions so;
    so.port = 0;
    auto listening = HttpServer::Listen(so, api.get());
    if (!listening.ok()) {
      ADD_FAILURE() << listening.error();
      return;
    }
    http = std::move(listening.value());
    serving = std::thread([this] { http->Serve(); });
    url = "http://127.0.0.1:" + std::to_string(http->port());
  }
  ~TestServer() {
    if (!http) return;
    http->Stop();
    serving.join();
  }
  std::unique_ptr<ServerApi> api;
  std::unique_ptr<HttpServer> http;
  std::thread serving;
  std::string url;
};

TEST(LivePushTest, AnUnreachableServerLeavesASpoolThatDrainDeliversOnceUp) {
  const fs::path dir = fs::temp_directory_path() / ("gpuprof_live_" + std::to_string(getpid()));
  fs::remove_all(dir);
  // GIVEN a live push to a port nothing listens on
  LivePushOptions o;
  o.server_url = "http://127.0.0.1:9";
  o.api_key = "k";
  o.spool_dir = (dir / "spool").string();
  o.period = std::chrono::milliseconds(20);
  o.exit_wait = std::chrono::milliseconds(500);
  LivePush push(o);
  for (int i = 0; i < 5; ++i) push.Add(store::StepRow{i, i * 10, i * 10 + 9, 1, "gap", 1, 1, 1});
  push.Start(Info());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int i = 5; i < 8; ++i) push.Add(store::StepRow{i, i * 10, i * 10 + 9, 1, "gap", 1, 1, 1});
  store::RunInfo done = Info();
  done.status = "ok";
  done.end_ns = 100;
  // WHEN the run ends
  const auto why = push.Finish(done, {});
  // THEN it says why and where the rows are, and they are in the spool
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("could not push run node_1:42:1000:7:live to http://127.0.0.1:9"));
  EXPECT_THAT(*why, HasSubstr(push.spool_path()));
  ASSERT_TRUE(fs::exists(push.spool_path()));
  // AND a line cut short by a crash is skipped, the rest delivered once the server is up
  std::ofstream(push.spool_path(), std::ios::app) << "{\"batch_id\": \"live-9\", \"ro";
  auto server = std::make_unique<TestServer>(dir / "server.db");
  ASSERT_TRUE(server->http);
  const std::string url = server->url;
  const DrainResult r = DrainSpool(o.spool_dir, url, "k");
  ASSERT_EQ(r.files_done, 1u) << r.lines[0];
  EXPECT_THAT(r.lines[0], HasSubstr("1 damaged lines skipped"));
  EXPECT_FALSE(fs::exists(push.spool_path()));
  // AND the server holds the 8 steps once, and the run as finished
  auto db =
      store::SqliteStore::Open((dir / "server.db").string(), store::SqliteStore::Mode::kReadOnly);
  ASSERT_TRUE(db.ok());
  EXPECT_EQ((*db)->LoadSteps(1)->size(), 8u);
  EXPECT_EQ((*db)->ListRuns()->at(0).status, "ok");
  // AND a second drain has nothing to send
  const DrainResult none = DrainSpool(o.spool_dir, url, "k");
  EXPECT_THAT(none.lines[0], HasSubstr("nothing to send"));
  server.reset();
  fs::remove_all(dir);
}

TEST(LivePushTest, FieldsUpdatedWhileTheRunGoesOnReachTheServerBeforeItEnds) {
  const fs::path dir =
      fs::temp_directory_path() / ("gpuprof_live_update_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // GIVEN a server and a run pushed live to it, without a group at its start
  auto server = std::make_unique<TestServer>(dir / "server.db");
  ASSERT_TRUE(server->http);
  LivePushOptions o;
  o.server_url = server->url;
  o.api_key = "k";
  o.spool_dir = (dir / "spool").string();
  o.period = std::chrono::milliseconds(20);
  LivePush push(o);
  push.Start(Info());
  auto server_run = [&]() -> std::optional<store::RunInfo> {
    auto db =
        store::SqliteStore::Open((dir / "server.db").string(), store::SqliteStore::Mode::kReadOnly);
    if (!db.ok()) return std::nullopt;
    auto runs = (*db)->ListRuns();
    if (!runs.ok() || runs->empty()) return std::nullopt;
    return runs->at(0);
  };
  auto wait_for = [&](auto&& done) {
    for (int i = 0; i < 250; ++i) {  // at most 5 s
      if (auto r = server_run(); r && done(*r)) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return server_run();
  };
  auto first = wait_for([](const store::RunInfo&) { return true; });
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->group_id.has_value());
  // WHEN the ranks agree a group id and clock offsets while it runs
  store::RunInfo agreed = Info();
  agreed.group_id = "job-7";
  agreed.config_json = R"({"distributed": {"clock_offset_ns": 1234}})";
  push.UpdateRun(agreed);
  push.Add(store::StepRow{0, 0, 9, 1, "gap", 1, 1, 1});
  // THEN the server has them while the run is still running
  auto live = wait_for([](const store::RunInfo& r) { return r.group_id.has_value(); });
  ASSERT_TRUE(live.has_value());
  EXPECT_EQ(live->group_id, "job-7");
  EXPECT_EQ(live->status, "running");
  ASSERT_TRUE(live->config_json.has_value());
  EXPECT_THAT(*live->config_json, HasSubstr("clock_offset_ns"));
  // AND the run's end still lands as before
  store::RunInfo done = agreed;
  done.status = "ok";
  done.end_ns = 100;
  EXPECT_FALSE(push.Finish(done, {}).has_value());
  EXPECT_EQ(server_run()->status, "ok");
  EXPECT_EQ(server_run()->group_id, "job-7");
  server.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpuprof::server
