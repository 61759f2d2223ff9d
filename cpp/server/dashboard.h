// The in-process dashboard of profile(dashboard=True): the team server's API and web app
// (ServerApi + HttpServer), bound to 127.0.0.1 on a free port, serving the training process's
// own SQLite file read-only beside the recorder's writer. No password: the URL it prints
// carries a single-use token that logs one browser in. A watcher thread turns the writer's
// commits into the live events a page follows (PRAGMA data_version, polled): a "batch" event
// when a running run gained steps or samples, a "run" event when a run appeared or ended.
// Nothing here touches Python or the training thread; Stop() (idempotent, also the
// destructor's) joins both threads.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "server/http_server.h"
#include "server/ingest_api.h"
#include "util/status.h"

namespace gpuprof::server {

struct DashboardOptions {
  std::string db_path;
  int64_t run_id = 0;  // the app opens on this run
  std::string host = "127.0.0.1";
  uint16_t port = 0;                   // 0: a free port
  std::optional<std::string> web_dir;  // ApiOptions::web_dir
  int64_t poll_ms = 250;               // how often the watcher looks for commits
};

class Dashboard {
 public:
  static Expected<std::unique_ptr<Dashboard>> Start(DashboardOptions options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // http://HOST:PORT/login?token=TOKEN: the link that logs a browser in (once).
  const std::string& url() const { return url_; }
  uint16_t port() const { return port_; }
  ServerApi& api() { return *api_; }  // its events and requests, for tests
  void Stop();

 private:
  Dashboard() = default;
  void Watch();

  DashboardOptions options_;
  std::string url_;
  uint16_t port_ = 0;
  std::unique_ptr<ServerApi> api_;
  std::unique_ptr<HttpServer> http_;
  std::thread serve_thread_, watch_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
};

}  // namespace gpuprof::server
