#include "server/live_push.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "server/push.h"
#include "store/row_json.h"

namespace gpuprof::server {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string DefaultSpoolDir() {
  if (const char* dir = std::getenv("GPUPROF_BUFFER_DIR"); dir && *dir) return dir;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.gpuprof/buffer";
}

LivePush::LivePush(LivePushOptions options) : options_(std::move(options)) {}

LivePush::~LivePush() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LivePush::Add(const store::Row& row) noexcept {
  try {
    std::lock_guard lock(queue_mu_);
    queued_.push_back(row);
  } catch (...) {
  }
}

std::string LivePush::spool_path() const {
  return (fs::path(options_.spool_dir) / ("run-" + uuid_ + ".jsonl")).string();
}

void LivePush::Start(const store::RunInfo& info) {
  std::lock_guard lock(mu_);
  if (started_) return;
  started_ = true;
  uuid_ = ServerRunId(info) + ":live";  // not the id `gpuprof push` uses
  run_json_ = store::RunInfoToJson(info);
  thread_ = std::thread([this] { Loop(); });
}

void LivePush::UpdateRun(const store::RunInfo& info) noexcept {
  try {
    json run = store::RunInfoToJson(info);
    std::lock_guard lock(queue_mu_);
    run_update_ = std::move(run);
  } catch (...) {
  }
}

void LivePush::TakeQueued() {
  std::vector<store::Row> rows;
  std::optional<json> update;
  {
    std::lock_guard lock(queue_mu_);
    rows.swap(queued_);
    update.swap(run_update_);
  }
  if (update) {
    // Sent again before the next batch; a spool carries it too (drain sends the newest).
    run_json_ = std::move(*update);
    run_put_ = false;
    if (spool_open_) Spool(json{{"run", run_json_}});
  }
  if (rows.empty()) return;
  Batch b;
  b.id = "live-" + std::to_string(next_batch_++);
  b.rows = rows.size();
  b.body = json{{"batch_id", b.id}, {"rows", store::RowsToJson(rows, store::RowLayout::kColumns)}};
  pending_rows_ += b.rows;
  pending_.push_back(std::move(b));
  // Past the memory bound, the oldest batches live in the spool only (gpuprof drain sends them).
  while (pending_rows_ > options_.max_pending_rows && pending_.size() > 1) {
    Batch& old = pending_.front();
    if (!old.spooled) Spool(old.body);
    pending_rows_ -= old.rows;
    pending_.pop_front();
  }
}

void LivePush::Spool(const json& line) {
  try {
    if (!spool_open_) {
      fs::create_directories(options_.spool_dir);
      std::ofstream out(spool_path(), std::ios::app);
      out << Dump(json{{"v", 1},
                       {"server", options_.server_url},
                       {"run_uuid", uuid_},
                       {"run", run_json_}})
          << "\n";
      if (!out) return;
      spool_open_ = true;
    }
    std::ofstream out(spool_path(), std::ios::app);
    out << Dump(line) << "\n";
  } catch (...) {
    spool_open_ = false;
  }
}

void LivePush::SpoolUnspooled() {
  for (Batch& b : pending_) {
    if (!b.spooled) {
      Spool(b.body);
      b.spooled = spool_open_;
    }
  }
}

bool LivePush::PutRun(const json& run) {
  auto res = CallServer(options_.server_url, options_.api_key, "PUT", "/api/v1/runs/" + uuid_,
                        json{{"run", run}});
  if (!res) {
    if (!first_error_) first_error_ = res.error();
    return false;
  }
  if (res->is_object() && res->contains("run_id") && (*res)["run_id"].is_number_integer()) {
    server_run_id_ = (*res)["run_id"].get<int64_t>();
  }
  return true;
}

bool LivePush::SendPending(std::chrono::steady_clock::time_point deadline) {
  if (!run_put_) {
    if (!PutRun(run_json_)) return false;
    run_put_ = true;
  }
  while (!pending_.empty()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    Batch& b = pending_.front();
    auto res = CallServer(options_.server_url, options_.api_key, "POST",
                          "/api/v1/runs/" + uuid_ + "/batches", b.body);
    if (!res) {
      if (!first_error_) first_error_ = res.error();
      return false;
    }
    pending_rows_ -= b.rows;
    pending_.pop_front();
  }
  return true;
}

void LivePush::Loop() {
  pthread_setname_np(pthread_self(), "gpuprof-push");
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, options_.period, [this] { return stop_; });
    if (stop_) break;
    TakeQueued();
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_at_) continue;
    // Sending happens under mu_: Finish() waits for an attempt in flight.
    if (SendPending(now + std::chrono::seconds(30))) {
      backoff_ = std::chrono::milliseconds(0);
    } else {
      SpoolUnspooled();
      backoff_ = std::min<std::chrono::milliseconds>(
          std::chrono::seconds(30),
          backoff_.count() == 0 ? std::chrono::milliseconds(1000) : backoff_ * 2);
      retry_at_ = std::chrono::steady_clock::now() + backoff_;
    }
  }
}

std::optional<std::string> LivePush::Finish(const store::RunInfo& final_info,
                                            const std::vector<store::InsightRow>& insights) {
  {
    std::lock_guard lock(mu_);
    if (!started_) return std::nullopt;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  TakeQueued();
  if (!insights.empty()) {
    Batch b;
    b.id = "live-insights";
    b.body = json{{"batch_id", b.id}, {"insights", store::InsightsToJson(insights)}};
    pending_.push_back(std::move(b));
  }
  run_json_ = store::RunInfoToJson(final_info);
  const auto deadline = std::chrono::steady_clock::now() + options_.exit_wait;
  // The server may have been down a while: one more try now, whatever the backoff said.
  bool done = SendPending(deadline);
  if (done) done = PutRun(run_json_);  // the final status, end time and fields
  if (done) {
    if (spool_open_) {
      std::error_code ec;
      fs::remove(spool_path(), ec);
      spool_open_ = false;
    }
    return std::nullopt;
  }
  SpoolUnspooled();
  Spool(json{{"run", run_json_}});
  std::string why = "could not push run " + uuid_ + " to " + options_.server_url + ": " +
                    first_error_.value_or("no answer within the exit wait");
  if (spool_open_) {
    why += "; " + std::to_string(pending_.size()) + " batch" + (pending_.size() == 1 ? "" : "es") +
           " left in " + spool_path() + " (send them with: gpuprof drain --server " +
           options_.server_url + ")";
  } else {
    why += "; the spool " + spool_path() +
           " could not be written either: the rows are only in "
           "the local file (gpuprof push sends it)";
  }
  return why;
}

DrainResult DrainSpool(const std::string& dir, const std::string& server_url,
                       const std::string& api_key) {
  DrainResult out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    out.lines.push_back("no spool directory " + dir + ": nothing to send");
    return out;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("run-", 0) == 0 && e.path().extension() == ".jsonl") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file);
    std::string line;
    std::string uuid;
    std::vector<json> batches;
    std::optional<json> first_run, last_run;
    size_t skipped = 0;
    while (std::getline(in, line)) {
      json doc = json::parse(line, nullptr, false);
      if (doc.is_discarded() || !doc.is_object()) {
        ++skipped;  // a line cut short by a crash
        continue;
      }
      if (doc.contains("run_uuid") && doc["run_uuid"].is_string()) {
        uuid = doc["run_uuid"].get<std::string>();
      }
      if (doc.contains("run")) {
        if (!first_run) first_run = doc["run"];
        last_run = doc["run"];
      }
      if (doc.contains("batch_id")) batches.push_back(std::move(doc));
    }
    if (uuid.empty() || !first_run) {
      ++out.files_failed;
      out.lines.push_back(file.string() + ": not a gpuprof spool file (no header); left as is");
      continue;
    }
    std::optional<std::string> error;
    const std::string base = "/api/v1/runs/" + uuid;
    if (auto r = CallServer(server_url, api_key, "PUT", base, json{{"run", *first_run}}); !r) {
      error = r.error();
    }
    size_t sent = 0, duplicates = 0;
    for (size_t i = 0; !error && i < batches.size(); ++i) {
      auto r = CallServer(server_url, api_key, "POST", base + "/batches", batches[i]);
      if (!r) {
        error = r.error();
      } else {
        ++sent;
        if ((*r)["duplicate"].get<bool>()) ++duplicates;
      }
    }
    if (!error) {
      if (auto r = CallServer(server_url, api_key, "PUT", base, json{{"run", *last_run}}); !r) {
        error = r.error();
      }
    }
    if (error) {
      ++out.files_failed;
      out.lines.push_back(file.string() + ": kept (" + std::to_string(sent) + " of " +
                          std::to_string(batches.size()) + " batches sent): " + *error);
      continue;
    }
    fs::remove(file, ec);
    ++out.files_done;
    std::string text = file.string() + ": sent run " + uuid + ", " + std::to_string(sent) +
                       " batches (" + std::to_string(duplicates) +
                       " the server already had); file removed";
    if (skipped) text += "; " + std::to_string(skipped) + " damaged lines skipped";
    out.lines.push_back(text);
  }
  if (files.empty()) out.lines.push_back("no spool files in " + dir + ": nothing to send");
  return out;
}

}  // namespace gpuprof::server
