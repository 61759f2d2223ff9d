#include "server/live_bus.h"

#include <algorithm>

namespace gpuprof::server {

void MergeLiveEvent(nlohmann::json& into, const nlohmann::json& event) {
  if (into.value("type", "") != "batch" || event.value("type", "") != "batch") {
    into = event;
    return;
  }
  nlohmann::json& rows = into["rows"];
  if (!rows.is_object()) rows = nlohmann::json::object();
  const nlohmann::json added = event.value("rows", nlohmann::json::object());
  for (const auto& [table, n] : added.items()) {
    if (n.is_number_integer()) rows[table] = rows.value(table, int64_t{0}) + n.get<int64_t>();
  }
  into["stored"] = into.value("stored", int64_t{0}) + event.value("stored", int64_t{0});
  for (const char* key : {"last_step", "last_ts_ns"}) {
    if (event.contains(key) && event[key].is_number_integer()) {
      if (!into.contains(key) || !into[key].is_number_integer() ||
          into[key].get<int64_t>() < event[key].get<int64_t>()) {
        into[key] = event[key];
      }
    }
  }
  into["insights"] = into.value("insights", false) || event.value("insights", false);
  into["coalesced"] = into.value("coalesced", int64_t{1}) + event.value("coalesced", int64_t{1});
}

bool LiveBus::Subscriber::Offer(int64_t run_id, const std::string& kind,
                                const nlohmann::json& event) {
  if (run_filter_ && *run_filter_ != run_id) return false;
  bool merged = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) return false;
    const auto key = std::make_pair(run_id, kind);
    auto it = std::find_if(pending_.begin(), pending_.end(),
                           [&](const auto& p) { return p.first == key; });
    if (it != pending_.end()) {
      MergeLiveEvent(it->second, event);
      merged = true;
    } else {
      pending_.emplace_back(key, event);
    }
  }
  cv_.notify_one();
  return merged;
}

std::vector<nlohmann::json> LiveBus::Subscriber::Take(std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, wait, [&] { return closed_ || !pending_.empty(); });
  std::vector<nlohmann::json> out;
  if (closed_) return out;
  out.reserve(pending_.size());
  for (auto& p : pending_) out.push_back(std::move(p.second));
  pending_.clear();
  return out;
}

void LiveBus::Subscriber::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    pending_.clear();
  }
  cv_.notify_all();
}

bool LiveBus::Subscriber::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

std::shared_ptr<LiveBus::Subscriber> LiveBus::Subscribe(std::optional<int64_t> run_filter) {
  auto s = std::make_shared<Subscriber>(run_filter);
  std::lock_guard lock(mu_);
  subscribers_.push_back(s);
  return s;
}

void LiveBus::Unsubscribe(const std::shared_ptr<Subscriber>& s) {
  s->Close();
  std::lock_guard lock(mu_);
  subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), s), subscribers_.end());
}

size_t LiveBus::viewers() const {
  std::lock_guard lock(mu_);
  return subscribers_.size();
}

void LiveBus::PublishRun(int64_t run_id, nlohmann::json event) {
  event["type"] = "run";
  event["run_id"] = run_id;
  Publish(run_id, "run", std::move(event));
}

void LiveBus::PublishBatch(int64_t run_id, nlohmann::json event) {
  event["type"] = "batch";
  event["run_id"] = run_id;
  Publish(run_id, "batch", std::move(event));
}

void LiveBus::Publish(int64_t run_id, const std::string& kind, nlohmann::json event) {
  std::vector<std::shared_ptr<Subscriber>> targets;
  {
    std::lock_guard lock(mu_);
    targets = subscribers_;
  }
  for (const auto& s : targets) {
    if (s->Offer(run_id, kind, event)) coalesced_.fetch_add(1);
  }
}

}  // namespace gpuprof::server
