// Test-only: writes an in-memory run into a real SqliteStore file, the way the recorder does
// (BeginRun, WriteRows, FinishRun), so tests can compare analysis before and after the store.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "store/sqlite_store.h"

namespace gpuprof::analysis::testing {

// A fresh DB path under the test temp dir; the files are removed on destruction.
class TempDb {
 public:
  TempDb() {
    static std::atomic<int> counter{0};
    path_ = (std::filesystem::path(::testing::TempDir()) /
             ("gpuprof_analysis_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
              ".db"))
                .string();
    Remove();
  }
  ~TempDb() { Remove(); }
  TempDb(const TempDb&) = delete;
  TempDb& operator=(const TempDb&) = delete;
  const std::string& path() const { return path_; }

 private:
  void Remove() {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path_ + suffix, ec);
  }
  std::string path_;
};

// Writes `data` as a new run; returns its run_id (0 after a test failure).
inline int64_t WriteRun(store::SqliteStore& db, const store::RunData& data) {
  auto id = db.BeginRun(data.run);
  EXPECT_TRUE(id.ok()) << id.error();
  if (!id.ok()) return 0;
  std::vector<store::Row> rows;
  for (const auto& r : data.steps) rows.emplace_back(r);
  for (const auto& r : data.phases) rows.emplace_back(r);
  for (const auto& r : data.gpus) rows.emplace_back(r);
  for (const auto& r : data.gpu_samples_1s) rows.emplace_back(r);
  for (const auto& r : data.host_samples) rows.emplace_back(r);
  for (const auto& r : data.worker_samples_10s) rows.emplace_back(r);
  for (const auto& r : data.kernels) rows.emplace_back(r);
  for (const auto& r : data.cpu_ops) rows.emplace_back(r);
  for (const auto& r : data.comm_buckets) rows.emplace_back(r);
  for (const auto& r : data.stalls) rows.emplace_back(r);
  for (const auto& r : data.cpu_waits) rows.emplace_back(r);
  for (const auto& r : data.telemetry) rows.emplace_back(r);
  for (const auto& r : data.diagnostics) rows.emplace_back(r);
  Status st = db.WriteRows(*id, rows);
  EXPECT_TRUE(st.ok()) << st.message();
  if (data.run.status != "running") {
    st = db.FinishRun(*id, data.run.status, data.run.end_ns, data.run.error);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return *id;
}

inline std::unique_ptr<store::SqliteStore> OpenDb(const std::string& path) {
  auto db = store::SqliteStore::Open(path);
  EXPECT_TRUE(db.ok()) << db.error();
  return db.ok() ? std::move(db).value() : nullptr;
}

}  // namespace gpuprof::analysis::testing
