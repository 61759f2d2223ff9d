// Live updates from a team server to its viewers (GET /api/v1/live, a WebSocket): every run
// created or updated and every batch stored becomes an event, fanned out to the subscribed
// viewers. Publishing never waits on a viewer: each viewer has a mailbox that holds at most one
// pending event per (run, kind); an event for a key that is still pending is merged into it
// (a "batch" event adds its row counts and keeps the newest step / timestamp, and counts what
// it merged in "coalesced"), so a slow viewer gets fewer, fuller messages, and its mailbox stays
// bounded by the number of runs. A viewer whose socket does not take a message within the send
// timeout is dropped (http_server.cc). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpuprof::server {

class LiveBus {
 public:
  // One viewer's mailbox. Take() is for that viewer's thread only.
  class Subscriber {
   public:
    // Events of this run only, or of every run.
    explicit Subscriber(std::optional<int64_t> run_filter) : run_filter_(run_filter) {}
    // The pending events, oldest key first (waits up to `wait` for one); empty after Close().
    std::vector<nlohmann::json> Take(std::chrono::milliseconds wait);
    void Close();
    bool closed() const;

   private:
    friend class LiveBus;
    // Returns whether the event merged into a pending one.
    bool Offer(int64_t run_id, const std::string& kind, const nlohmann::json& event);

    const std::optional<int64_t> run_filter_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    // Pending events by (run, kind), in first-arrival order of their keys.
    std::vector<std::pair<std::pair<int64_t, std::string>, nlohmann::json>> pending_;
    bool closed_ = false;
  };

  std::shared_ptr<Subscriber> Subscribe(std::optional<int64_t> run_filter);
  void Unsubscribe(const std::shared_ptr<Subscriber>& s);

  // {"type": "run", "run_id", "run_uuid", "run_name", "status", ...}: a run created or updated.
  void PublishRun(int64_t run_id, nlohmann::json event);
  // {"type": "batch", "run_id", "rows": {"<table>": n, ...}, "stored": n, "last_step",
  //  "last_ts_ns", "insights": bool}: a batch stored.
  void PublishBatch(int64_t run_id, nlohmann::json event);

  size_t viewers() const;
  uint64_t coalesced() const { return coalesced_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  void CountDropped() { dropped_.fetch_add(1); }

 private:
  void Publish(int64_t run_id, const std::string& kind, nlohmann::json event);

  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Subscriber>> subscribers_;
  std::atomic<uint64_t> coalesced_{0}, dropped_{0};
};

// `into` += `event` for two events of one (run, kind) key: a "batch" sums rows and stored, keeps
// the largest last_step / last_ts_ns, ors insights and counts the merge in "coalesced"; any
// other kind is replaced by the newer event.
void MergeLiveEvent(nlohmann::json& into, const nlohmann::json& event);

}  // namespace gpuprof::server
