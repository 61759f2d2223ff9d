// The live push of a profiled run to a team server (profile(server=...) or $GPUPROF_SERVER):
// every row the run's store writer takes is also handed to Add() (StoreWriter::Options::tee),
// and a native thread ("gpuprof-push") sends what came in once a period (1 s) as one batch,
// never on the training thread. The local SQLite file is written as always.
//
// When the server cannot be reached or refuses the key, the batches not acknowledged are
// appended to a spool file, <spool_dir>/run-<uuid>.jsonl, and the thread retries with backoff
// (1 s doubling to 30 s), sending the oldest first. Finish() (after the session stopped) sends
// the run's final fields, the rest of the rows and the insights, waiting at most `exit_wait`;
// what is still not acknowledged then stays in the spool for `gpuprof drain`, and the file is
// deleted once everything was acknowledged. Batch ids ("live-<n>") make every retry, and a
// drain of batches the server already has, safe: the server stores each batch once.
//
// Spool format (JSON Lines): a header {"v": 1, "server": URL, "run_uuid": U, "run": RUN}, then
// {"batch_id": ID, "rows": ROWS} / {"batch_id": ID, "insights": [...]} lines and
// {"run": RUN} lines with the run's later fields (docs/server.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::server {

struct LivePushOptions {
  std::string server_url;  // http://host:port
  std::string api_key;
  std::string spool_dir;  // created when first needed
  std::chrono::milliseconds period{1000};
  std::chrono::milliseconds exit_wait{5000};
  size_t max_pending_rows = 2'000'000;  // held in memory for retry; beyond, in the spool only
};

class LivePush {
 public:
  explicit LivePush(LivePushOptions options);
  ~LivePush();
  LivePush(const LivePush&) = delete;
  LivePush& operator=(const LivePush&) = delete;

  // Any thread; cheap (a copy under a lock). Rows added before Start() wait for it.
  void Add(const store::Row& row) noexcept;
  // The run is known (its id and start): registers it on the server and starts the thread.
  void Start(const store::RunInfo& info);
  // The run's fields changed while it runs (a group id or clock offsets agreed after the start):
  // the push thread sends them again (a PUT) before its next batch. Any thread; cheap.
  void UpdateRun(const store::RunInfo& info) noexcept;
  // The run ended: sends its final fields, what is left and the insights (at most exit_wait),
  // stops the thread. nullopt when the server acknowledged everything; else why not and where
  // the rest is ("... 12 batches left in /root/.gpuprof/buffer/run-U.jsonl: gpuprof drain ...").
  std::optional<std::string> Finish(const store::RunInfo& final_info,
                                    const std::vector<store::InsightRow>& insights);

  std::string spool_path() const;
  // The run's id on the server once it acknowledged the run (for a link to its dashboard).
  std::optional<int64_t> server_run_id() const {
    const int64_t id = server_run_id_.load();
    return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
  }
  const std::string& server_url() const { return options_.server_url; }

 private:
  struct Batch {
    std::string id;
    nlohmann::json body;  // {"batch_id", "rows" | "insights"}
    size_t rows = 0;
    bool spooled = false;
  };
  void Loop();
  void TakeQueued();  // queued rows -> one pending batch
  bool SendPending(std::chrono::steady_clock::time_point deadline);  // true: all acked
  bool PutRun(const nlohmann::json& run);
  void Spool(const nlohmann::json& line);  // appends one line (creates the file with a header)
  void SpoolUnspooled();

  LivePushOptions options_;
  std::string uuid_;
  nlohmann::json run_json_;
  bool run_put_ = false;

  std::mutex queue_mu_;  // guards queued_ and run_update_
  std::vector<store::Row> queued_;
  std::optional<nlohmann::json> run_update_;  // newer run fields, for the next PUT

  std::mutex mu_;  // guards the rest, used by the thread and Finish()
  std::condition_variable cv_;
  bool stop_ = false;
  bool started_ = false;
  std::deque<Batch> pending_;
  size_t pending_rows_ = 0;
  uint64_t next_batch_ = 0;
  bool spool_open_ = false;
  std::optional<std::string> first_error_;
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point retry_at_{};
  std::atomic<int64_t> server_run_id_{-1};
  std::thread thread_;
};

// The spool directory: $GPUPROF_BUFFER_DIR, else ~/.gpuprof/buffer.
std::string DefaultSpoolDir();

// Sends every spool file in `dir` to `server_url` (`gpuprof drain`); deletes each only after the
// server acknowledged all of it. Returns one line per file.
struct DrainResult {
  std::vector<std::string> lines;  // what happened to each file
  size_t files_done = 0;
  size_t files_failed = 0;
};
DrainResult DrainSpool(const std::string& dir, const std::string& server_url,
                       const std::string& api_key);

}  // namespace gpuprof::server
