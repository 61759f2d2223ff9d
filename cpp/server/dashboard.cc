#include "server/dashboard.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "store/sqlite_store.h"

namespace gpuprof::server {

using nlohmann::json;

Expected<std::unique_ptr<Dashboard>> Dashboard::Start(DashboardOptions options) {
  auto token = RandomSecret();
  if (!token) return token.status();
  auto secret = RandomSecret();
  if (!secret) return secret.status();
  auto cookie = RandomSecret();
  if (!cookie) return cookie.status();
  ApiOptions api;
  api.secret = *secret;
  api.login_token = *token;
  api.dashboard_run_id = options.run_id;
  api.cookie_suffix = "_" + cookie->substr(0, 8);
  api.web_dir = options.web_dir;
  auto db = store::SqliteStore::Open(options.db_path, store::SqliteStore::Mode::kReadOnly);
  if (!db) return Status::Error("dashboard: " + db.error());
  std::unique_ptr<Dashboard> d(new Dashboard());
  d->options_ = options;
  d->api_ = ServerApi::Create(std::move(*db), options.db_path, std::move(api));
  ServerOptions so;
  so.host = options.host;
  so.port = options.port;
  so.max_connections = 64;  // one person's browser
  auto http = HttpServer::Listen(so, d->api_.get());
  if (!http) return Status::Error("dashboard: " + http.error());
  d->http_ = std::move(*http);
  d->port_ = d->http_->port();
  d->url_ = "http://" + options.host + ":" + std::to_string(d->port_) + "/login?token=" + *token;
  // The threads (and the connection threads the server starts) block the asynchronous signals:
  // a Ctrl-C must reach Python's main thread, which may be asleep in a system call that only a
  // signal delivered to it interrupts (a signal taken by another thread leaves it asleep).
  sigset_t async_signals, previous;
  sigemptyset(&async_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCHLD, SIGWINCH}) {
    sigaddset(&async_signals, sig);
  }
  pthread_sigmask(SIG_BLOCK, &async_signals, &previous);
  d->serve_thread_ = std::thread([p = d.get()] {
    pthread_setname_np(pthread_self(), "gpuprof-dash");
    p->http_->Serve();
  });
  d->watch_thread_ = std::thread([p = d.get()] {
    pthread_setname_np(pthread_self(), "gpuprof-dashw");
    p->Watch();
  });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return d;
}

Dashboard::~Dashboard() { Stop(); }

void Dashboard::Stop() {
  if (!watch_thread_.joinable() && !serve_thread_.joinable()) return;  // stopped already
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (http_) http_->Stop();
  if (serve_thread_.joinable()) serve_thread_.join();
}

void Dashboard::Watch() {
  // A connection of its own (the API's serves requests): commits by the recorder's writer show
  // as a new data_version here.
  auto opened = store::SqliteStore::Open(options_.db_path, store::SqliteStore::Mode::kReadOnly);
  if (!opened) return;  // the API still answers; pages then refresh on their own
  std::unique_ptr<store::SqliteStore> db = std::move(*opened);
  std::optional<int64_t> version;
  struct Seen {
    std::string status;
    std::optional<int64_t> end_ns;
    int64_t steps = 0;
    std::optional<int64_t> last_ns;
  };
  std::map<int64_t, Seen> seen;
  bool first = true;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    auto v = db->DataVersion();
    if (v && (!version || *v != *version)) {
      version = *v;
      if (auto runs = db->ListRuns()) {
        for (const store::RunInfo& r : *runs) {
          auto it = seen.find(r.run_id);
          const bool created = it == seen.end();
          Seen& s = seen[r.run_id];
          if (!first && (created || s.status != r.status || s.end_ns != r.end_ns)) {
            api_->bus().PublishRun(r.run_id, RunEvent(r, created));
          }
          const bool was_running = s.status == "running" || created;
          s.status = r.status;
          s.end_ns = r.end_ns;
          if (!was_running && r.status != "running") continue;
          auto p = db->LoadRunProgress(r.run_id);
          if (!p) continue;
          std::optional<int64_t> last_ns = p->last_step_end_ns;
          if (p->last_sample_ns) last_ns = std::max(last_ns.value_or(0), *p->last_sample_ns);
          if (!first && (p->steps != s.steps || last_ns != s.last_ns)) {
            json e = {{"rows", {{"steps", p->steps - s.steps}}},
                      {"stored", p->steps - s.steps},
                      {"insights", false}};
            if (p->last_step) e["last_step"] = *p->last_step;
            if (last_ns) e["last_ts_ns"] = *last_ns;
            api_->bus().PublishBatch(r.run_id, std::move(e));
          }
          s.steps = p->steps;
          s.last_ns = last_ns;
        }
      }
      first = false;
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.poll_ms), [this] { return stopping_; });
  }
}

}  // namespace gpuprof::server
