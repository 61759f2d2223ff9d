// What decoding a team-server ingest batch costs, per GPU sample row: the text of one batch of
// 10,000 rows (bench/server_bench.py's, both layouts) read by nlohmann-json into a document, by
// its SAX interface without building anything, and by store::RowsFromJsonText (util/
// json_reader.h, rows included); then what storing them costs (SqliteStore::WriteBatchOnce,
// timestamps going on from batch to batch). Built with -DGPUPROF_BUILD_BENCH=ON:
//   build/<dir>/cpp/core/store/row_json_benchmark
// items/s is rows per second.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "store/row_json.h"
#include "store/sqlite_store.h"

namespace gpuprof::store {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kRows = 10'000;

std::vector<Row> Samples(int64_t first) {
  std::vector<Row> rows;
  for (int64_t i = first; i < first + kRows; ++i) {
    GpuSampleRow r;
    r.ts_ns = (i / 8) * 10'000'000;
    r.gpu_index = i % 8;
    r.util_pct = 87.5;
    r.mem_util_pct = 40.0;
    r.mem_used_bytes = int64_t{60} << 30;
    r.mem_total_bytes = int64_t{80} << 30;
    r.power_mw = 650'000;
    r.temp_c = 71.0;
    r.sm_clock_mhz = 1980;
    r.clock_reasons = 0;
    r.pcie_rx_bps = 1.5e9;
    r.pcie_tx_bps = 2e8;
    rows.emplace_back(r);
  }
  return rows;
}

std::string Text(RowLayout layout, int64_t first = 0) {
  return RowsToJson(Samples(first), layout).dump();
}

struct Discard : json::json_sax_t {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

void BM_NlohmannDocument(benchmark::State& state) {
  const std::string text = Text(static_cast<RowLayout>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(json::parse(text));
  state.SetItemsProcessed(state.iterations() * kRows);
}
void BM_NlohmannSax(benchmark::State& state) {
  const std::string text = Text(static_cast<RowLayout>(state.range(0)));
  for (auto _ : state) {
    Discard sax;
    benchmark::DoNotOptimize(json::sax_parse(text, &sax));
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
void BM_RowsFromJsonText(benchmark::State& state) {
  const std::string text = Text(static_cast<RowLayout>(state.range(0)));
  for (auto _ : state) {
    auto rows = RowsFromJsonText(text, kRows);
    if (!rows.ok()) state.SkipWithError(rows.error().c_str());
    benchmark::DoNotOptimize(rows);
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
// Arg 0: objects layout, 1: columns layout.
BENCHMARK(BM_NlohmannDocument)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_NlohmannSax)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RowsFromJsonText)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

// One batch of 10,000 rows a transaction, as the server stores it. Arg 0: SQLite's defaults;
// 1: the server's tuning (TuneForServer); 2: tuned, but every batch with the same timestamps
// (what bench/server_bench.py sent before 2026-12-07: each batch lands inside the index).
void BM_WriteBatchOnce(benchmark::State& state) {
  std::string templ = (fs::temp_directory_path() / "gpuprof_bench_XXXXXX").string();
  const std::string dir = mkdtemp(templ.data());
  {
    auto store = SqliteStore::Open(dir + "/bench.db");
    if (state.range(0) != 0) (void)(*store)->TuneForServer(64, 10'000);
    RunInfo info;
    info.run_name = "bench";
    const int64_t run_id = *(*store)->BeginRun(info);
    int64_t batch = 0;
    for (auto _ : state) {
      state.PauseTiming();
      const std::vector<Row> rows = Samples(state.range(0) == 2 ? 0 : batch * kRows);
      state.ResumeTiming();
      bool duplicate = false;
      Status st = (*store)->WriteBatchOnce(run_id, "b" + std::to_string(batch++), rows, nullptr,
                                           &duplicate);
      if (!st.ok()) state.SkipWithError(st.message().c_str());
    }
  }
  fs::remove_all(dir);
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_WriteBatchOnce)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(100);

}  // namespace
}  // namespace gpuprof::store

BENCHMARK_MAIN();
