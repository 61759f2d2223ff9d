// Throughput of the store: the batched writer thread and synchronous WriteRows, for
// GpuSampleRow (the most frequent row). Built with -DGPUPROF_BUILD_BENCH=ON:
//   build/<dir>/cpp/core/store/sqlite_store_benchmark
// Each iteration writes into a fresh file under $TMPDIR; items/s is committed rows per second.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "store/sqlite_store.h"

namespace gpuprof::store {
namespace {

namespace fs = std::filesystem;

GpuSampleRow Sample(int64_t i) {
  GpuSampleRow r;
  r.ts_ns = i * 1'000'000;
  r.gpu_index = i % 8;
  r.util_pct = 97.5;
  r.mem_util_pct = 40.0;
  r.mem_used_bytes = int64_t{70} << 30;
  r.mem_total_bytes = int64_t{80} << 30;
  r.proc_mem_bytes = int64_t{60} << 30;
  r.power_mw = 650'000;
  r.temp_c = 71.0;
  r.sm_clock_mhz = 1980;
  r.clock_reasons = 0;
  r.pcie_rx_bps = 1.5e9;
  r.pcie_tx_bps = 2.5e8;
  return r;
}

// A fresh directory with a DB holding one run; removed on destruction.
struct TempRun {
  TempRun() {
    std::string templ = (fs::temp_directory_path() / "gpuprof_bench_XXXXXX").string();
    dir = mkdtemp(templ.data());
    path = dir + "/bench.db";
    auto store = SqliteStore::Open(path);
    RunInfo info;
    info.run_name = "bench";
    run_id = *(*store)->BeginRun(info);
  }
  ~TempRun() { fs::remove_all(dir); }
  std::string dir, path;
  int64_t run_id = 0;
};

// Push N rows from one producer, then Stop (drain + commit). Producer waits when full, so
// every row is committed and the time is the writer's.
void BM_WriterGpuSamples(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    state.PauseTiming();
    TempRun run;
    StoreWriter::Options opt;
    opt.capacity = static_cast<size_t>(n);
    auto w = StoreWriter::Start(run.path, run.run_id, opt);
    state.ResumeTiming();
    for (int64_t i = 0; i < n; ++i) (*w)->Push(Sample(i));
    (*w)->Stop();
    state.PauseTiming();
    if ((*w)->written() != static_cast<uint64_t>(n)) state.SkipWithError("rows were dropped");
    w->reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_WriterGpuSamples)->Arg(100'000)->Unit(benchmark::kMillisecond)->UseRealTime();

// Synchronous WriteRows of one batch of N rows (one transaction); timestamps keep increasing
// across iterations, as in a real run.
void BM_WriteRowsGpuSamples(benchmark::State& state) {
  const int64_t n = state.range(0);
  TempRun run;
  auto store = SqliteStore::Open(run.path);
  std::vector<Row> rows(static_cast<size_t>(n));
  int64_t next = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (auto& row : rows) row = Sample(next++);
    state.ResumeTiming();
    Status st = (*store)->WriteRows(run.run_id, rows);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_WriteRowsGpuSamples)->Arg(1)->Arg(100)->Arg(8192)->Unit(benchmark::kMicrosecond);

// Producer-side cost of an accepted Push (the writer drains between rounds of 1000).
void BM_Push(benchmark::State& state) {
  TempRun run;
  auto w = StoreWriter::Start(run.path, run.run_id);
  const GpuSampleRow sample = Sample(0);
  for (auto _ : state) {
    for (int i = 0; i < 1000; ++i) benchmark::DoNotOptimize((*w)->Push(sample));
    state.PauseTiming();
    (*w)->Flush();
    state.ResumeTiming();
  }
  (*w)->Stop();
  state.SetItemsProcessed(state.iterations() * 1000);
  state.counters["dropped"] = static_cast<double>((*w)->dropped());
}
BENCHMARK(BM_Push)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpuprof::store

BENCHMARK_MAIN();
