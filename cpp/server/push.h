// Pushes a run of a local gpuprof DB to a team server (`gpuprof push`): PUT the run under a
// UUID derived from the run (host, pid, start time, local id: the same run always maps to the
// same server run), then its rows in batches whose ids are derived from their table and
// position, then its insights. Every batch id is the same on a retry, so pushing a run twice
// (or after a failure part-way) stores each row once.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "store/rows.h"
#include "util/status.h"

namespace gpuprof::server {

struct PushOptions {
  std::string server_url;  // http://host:port
  std::string api_key;
  size_t batch_rows = 5000;
};

struct PushResult {
  std::string run_uuid;
  int64_t server_run_id = 0;
  size_t batches = 0;
  size_t duplicate_batches = 0;
  size_t rows = 0;
};

// The server-side id of a local run: HOST:PID:START_UNIX_NS:LOCAL_RUN_ID (the host name's
// characters outside [A-Za-z0-9.-] as '_'), the same for the same run on every push.
std::string ServerRunId(const store::RunInfo& run);

// One JSON request to a gpuprof server with the write key: the answer, or an error naming the
// status and the server's message ("http://h:8000 answered 403 to PUT /api/v1/runs/U: ...").
Expected<nlohmann::json> CallServer(const std::string& url, const std::string& key,
                                    const std::string& method, const std::string& path,
                                    const nlohmann::json& body);

Expected<PushResult> PushRun(const std::string& db_path, int64_t run_id,
                             const PushOptions& options);

}  // namespace gpuprof::server
