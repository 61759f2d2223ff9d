// Writes a synthetic long run into a gpuprof store through the real write path, as fast as the
// writer takes it, with simulated timestamps:
//   - GPU telemetry: `gpus` devices at `hz`, rolled up with store::GpuRollup and pushed raw +
//     rollup exactly as Recorder::GpuTick does (the raw rows are pruned by the StoreWriter's
//     default retention, as in a real run);
//   - host telemetry at `host_hz` with per-core CPU of `cores` cores, and `workers` dataloader
//     worker processes plus the main process (store::WorkerRollup, as Recorder::HostTick);
//   - one training step per `step_s` seconds with forward/backward/optimizer phases.
// The scenario is meant to make a few rules fire on a long run: the loader waits ~20% of each
// step (dataloader_stall), GPU `gpus - 1` throttles thermally for 8% of the run
// (thermal_throttling), and everything else stays healthy.
//
// Usage: long_run_gen --db PATH [--hours 24] [--gpus 8] [--hz 100] [--host-hz 5]
//                     [--cores 64] [--workers 8] [--step-s 1]
// Prints one line of key=value figures (rows, seconds, dropped) for bench/long_run/run.sh.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "store/rollup.h"
#include "store/sqlite_store.h"

namespace {

using gpuprof::store::Row;
namespace store = gpuprof::store;

constexpr int64_t kSec = 1'000'000'000;
constexpr double kPi = 3.14159265358979323846;

struct Args {
  std::string db;
  double hours = 24;
  int gpus = 8;
  double hz = 100;
  double host_hz = 5;
  int cores = 64;
  int workers = 8;
  double step_s = 1.0;
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "long_run_gen: %s\nusage: long_run_gen --db PATH [--hours 24] [--gpus 8] "
               "[--hz 100] [--host-hz 5] [--cores 64] [--workers 8] [--step-s 1]\n",
               why);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) Usage(("missing value for " + k).c_str());
    const char* v = argv[++i];
    if (k == "--db") a.db = v;
    else if (k == "--hours") a.hours = std::atof(v);
    else if (k == "--gpus") a.gpus = std::atoi(v);
    else if (k == "--hz") a.hz = std::atof(v);
    else if (k == "--host-hz") a.host_hz = std::atof(v);
    else if (k == "--cores") a.cores = std::atoi(v);
    else if (k == "--workers") a.workers = std::atoi(v);
    else if (k == "--step-s") a.step_s = std::atof(v);
    else Usage(("unknown option " + k).c_str());
  }
  if (a.db.empty()) Usage("--db is required");
  if (a.hours <= 0 || a.gpus <= 0 || a.hz <= 0 || a.host_hz <= 0 || a.step_s <= 0 ||
      a.cores <= 0 || a.workers < 0) {
    Usage("every number must be positive");
  }
  return a;
}

// xorshift64*: fast deterministic noise in [0, 1).
class Rng {
 public:
  double Next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return static_cast<double>((s_ * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t s_ = 0x9E3779B97F4A7C15ULL;
};

// Pushes rows without ever dropping: waits while the writer has over half its queue's capacity
// uncommitted (queued or held).
class Sink {
 public:
  explicit Sink(store::StoreWriter* w) : w_(w) {}
  void Push(Row row) {
    if (++since_check_ >= 4096) {
      since_check_ = 0;
      while (w_->uncommitted() > kHighWater) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!w_->Push(std::move(row))) ++refused_;
    ++pushed_;
  }
  uint64_t pushed() const { return pushed_; }
  uint64_t refused() const { return refused_; }

 private:
  static constexpr size_t kHighWater = 1 << 15;  // half the default capacity
  store::StoreWriter* w_;
  uint64_t pushed_ = 0, refused_ = 0;
  int since_check_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  const auto wall0 = std::chrono::steady_clock::now();

  auto db = store::SqliteStore::Open(a.db);
  if (!db.ok()) Usage(db.error().c_str());
  store::RunInfo info;
  info.run_name = "long_run";
  info.hostname = "bench-node";
  info.pid = 4242;
  info.start_unix_ns = 1'714'564'800LL * kSec;
  info.start_mono_ns = 1000 * kSec;
  info.device_kind = "cuda";
  info.gpu_backend = "mock";
  info.gpu_model = "NVIDIA H100 80GB HBM3";
  info.gpu_count = a.gpus;
  info.dtype = "bf16";
  // ~40% MFU per GPU at the steady step time (0.8 s of work + 0.2 s loader wait).
  info.flops_per_step = 0.40 * 989e12 * a.step_s;
  info.flops_method = "declared";
  info.sample_hz = a.hz;
  info.python_version = "3.11.2";
  info.torch_version = "2.13.0";
  info.config_json = R"({"bench": "long_run"})";
  auto run_id = (*db)->BeginRun(info);
  if (!run_id.ok()) Usage(run_id.error().c_str());

  auto writer = store::StoreWriter::Start(a.db, *run_id);  // default options and retention
  if (!writer.ok()) Usage(writer.error().c_str());
  Sink sink(writer->get());

  const int64_t end_ns = static_cast<int64_t>(a.hours * 3600.0 * kSec);
  const int64_t gpu_period = static_cast<int64_t>(kSec / a.hz);
  const int64_t host_period = static_cast<int64_t>(kSec / a.host_hz);
  const int64_t step_period = static_cast<int64_t>(a.step_s * kSec);
  const int64_t mem_total = int64_t{80} << 30;
  const int64_t hot_gpu = a.gpus - 1;
  const int64_t hot_from = end_ns * 42 / 100, hot_to = end_ns * 50 / 100;  // 8% of the run

  sink.Push(store::TelemetryStatusRow{"gpu", true, "mock", std::nullopt});
  sink.Push(store::TelemetryStatusRow{"host", true, "procfs", std::nullopt});
  store::GpuRollup gpu_rollup;
  store::WorkerRollup worker_rollup;
  for (int g = 0; g < a.gpus; ++g) {
    sink.Push(store::GpuInfoRow{g, info.gpu_model, "GPU-bench-" + std::to_string(g), mem_total,
                                1980});
    gpu_rollup.SetMaxClock(g, 1980);
  }

  Rng rng;
  std::vector<store::GpuRollupRow> gpu_rolled;
  std::vector<store::WorkerRollupRow> worker_rolled;
  int64_t next_gpu = 0, next_host = 0, next_step = step_period, next_pcie = 0;
  int64_t step = 0, step_start = 0;
  uint64_t raw_gpu = 0, host_rows = 0, steps = 0;
  while (true) {
    const int64_t t = std::min({next_gpu, next_host, next_step});
    if (t > end_ns) break;
    if (t == next_gpu) {
      // One GPU tick: every device, as GpuCollector::Sample + Recorder::GpuTick.
      const bool pcie = t >= next_pcie;  // NVML reads PCIe at most once a second
      if (pcie) next_pcie = t + kSec;
      const double ts = static_cast<double>(t) / kSec;
      gpu_rolled.clear();
      std::vector<store::GpuSampleRow> rows(static_cast<size_t>(a.gpus));
      for (int g = 0; g < a.gpus; ++g) {
        store::GpuSampleRow& s = rows[static_cast<size_t>(g)];
        s.ts_ns = t;
        s.gpu_index = g;
        const double util = std::clamp(85 + 10 * std::sin(2 * kPi * ts / 20 + g) +
                                           4 * (rng.Next() - 0.5), 0.0, 100.0);
        s.util_pct = std::round(util);
        s.mem_util_pct = std::round(util * 0.6);
        const double mem_frac = 0.55 + 0.05 * std::min(1.0, ts / 600);  // 10 min ramp
        s.mem_used_bytes = static_cast<int64_t>(static_cast<double>(mem_total) * mem_frac);
        s.mem_total_bytes = mem_total;
        s.proc_mem_bytes = *s.mem_used_bytes - (int64_t{1} << 30);
        s.power_mw = static_cast<int64_t>(90'000 + 6'100 * util);
        const bool hot = g == hot_gpu && t >= hot_from && t < hot_to;
        s.temp_c = std::round(hot ? 88 + 2 * rng.Next() : 68 + 4 * rng.Next());
        s.sm_clock_mhz = hot ? 1350 : 1980;
        s.clock_reasons = hot ? 0x40 : 0;
        if (pcie) {
          s.pcie_rx_bps = 4e9 * (0.5 + rng.Next());
          s.pcie_tx_bps = 1e9 * rng.Next();
        }
        gpu_rollup.Add(s, &gpu_rolled);
      }
      for (auto& r : gpu_rolled) sink.Push(std::move(r));
      for (auto& s : rows) sink.Push(std::move(s));
      raw_gpu += static_cast<uint64_t>(a.gpus);
      next_gpu += gpu_period;
    }
    if (t == next_host) {
      // One host tick, as HostSampler::Sample + Recorder::HostTick.
      store::HostSampleRow h;
      h.ts_ns = t;
      h.cpu_pct = 40 + 10 * rng.Next();
      h.cpu_per_core.resize(static_cast<size_t>(a.cores));
      for (double& c : h.cpu_per_core) c = std::round(1000 * rng.Next()) / 10;
      h.ncores = a.cores;
      h.mem_total_bytes = int64_t{1024} << 30;
      h.mem_used_bytes = int64_t{300} << 30;
      h.page_cache_bytes = int64_t{200} << 30;
      h.swap_in_bps = 0;
      h.disk_read_bps = 80e6 * (0.5 + rng.Next());
      h.disk_read_iops = 900 * (0.5 + rng.Next());
      h.proc_cpu_pct = 800 + 100 * rng.Next();
      h.proc_rss_bytes = int64_t{48} << 30;
      sink.Push(std::move(h));
      ++host_rows;
      worker_rolled.clear();
      std::vector<store::WorkerSampleRow> workers;
      workers.push_back(store::WorkerSampleRow{t, 1000, "main", 100 + 20 * rng.Next(),
                                               int64_t{40} << 30});
      for (int w = 0; w < a.workers; ++w) {
        workers.push_back(store::WorkerSampleRow{t, 2000 + w, "child", 60 + 20 * rng.Next(),
                                                 int64_t{2} << 30});
      }
      for (const auto& w : workers) worker_rollup.Add(w, &worker_rolled);
      for (auto& r : worker_rolled) sink.Push(std::move(r));
      for (auto& w : workers) sink.Push(std::move(w));
      next_host += host_period;
    }
    if (t == next_step) {
      // A step of step_s: ~20% loader wait, then forward / backward / optimizer.
      const int64_t d = t - step_start;
      store::StepRow s;
      s.step = step;
      s.start_ns = step_start;
      s.end_ns = t;
      if (step > 0) {
        s.wait_ns = static_cast<int64_t>(d * (0.18 + 0.04 * rng.Next()));
        s.wait_source = "gap";
      }
      s.forward_calls = s.backward_calls = s.optimizer_calls = 1;
      sink.Push(std::move(s));
      sink.Push(store::PhaseRow{step, "forward", d * 25 / 100, d * 24 / 100, 1});
      sink.Push(store::PhaseRow{step, "backward", d * 45 / 100, d * 48 / 100, 1});
      sink.Push(store::PhaseRow{step, "optimizer", d * 5 / 100, std::nullopt, 1});
      ++step;
      ++steps;
      step_start = t;
      next_step += step_period;
    }
  }
  // The end of the run: close the open rollups, as Recorder::Stop.
  gpu_rolled.clear();
  gpu_rollup.Flush(&gpu_rolled);
  for (auto& r : gpu_rolled) sink.Push(std::move(r));
  worker_rolled.clear();
  worker_rollup.Flush(&worker_rolled);
  for (auto& r : worker_rolled) sink.Push(std::move(r));

  (*writer)->Stop();
  const uint64_t dropped = (*writer)->dropped();
  const auto error = (*writer)->error();
  for (const auto& l : (*writer)->lost()) {  // a failed run says which tables lost rows
    std::fprintf(stderr, "long_run_gen: lost %llu rows of %s\n",
                 static_cast<unsigned long long>(l.rows), l.table.c_str());
  }
  writer->reset();
  if (auto st = (*db)->FinishRun(*run_id, "ok", step_start, std::nullopt); !st.ok()) {
    Usage(st.message().c_str());
  }
  db->reset();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  using ull = unsigned long long;
  std::printf("run_id=%lld hours=%g gpus=%d raw_gpu_samples=%llu host_samples=%llu steps=%llu "
              "rows_pushed=%llu dropped=%llu refused=%llu seconds=%.1f rows_per_s=%.0f\n",
              static_cast<long long>(*run_id), a.hours, a.gpus, static_cast<ull>(raw_gpu),
              static_cast<ull>(host_rows), static_cast<ull>(steps), static_cast<ull>(sink.pushed()),
              static_cast<ull>(dropped), static_cast<ull>(sink.refused()), secs,
              static_cast<double>(sink.pushed()) / secs);
  if (error) {
    std::fprintf(stderr, "long_run_gen: writer error: %s\n", error->c_str());
    return 1;
  }
  return dropped == 0 ? 0 : 1;
}
