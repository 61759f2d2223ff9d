// libFuzzer target: the strict JSON row codec (store/row_json.h) that ingest decodes with, without
// a server or a store, so it runs many times faster than ingest_fuzz.cc. Same input layout and
// seeds: byte 0 is ignored (ingest_fuzz's request kind), the rest is a JSON document, decoded
// as rows, insights and a run, and where it is an object, its "rows", "insights" and "run" too.
//
// Aborts (a finding) when what decodes does not survive a round trip: encoding the decoded
// rows and decoding that again must succeed with the same rows (compared by their encoding).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "store/row_json.h"

namespace {

using nlohmann::json;
namespace store = gpuprof::store;

constexpr size_t kMaxRows = 1000;

[[noreturn]] void Fail(const char* what, const json& first, const json& second) {
  std::fprintf(stderr, "row_json_fuzz: %s\n  first:  %s\n  second: %s\n", what,
               first.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 2000).c_str(),
               second.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 2000).c_str());
  abort();
}

void RoundTrip(const json& doc) {
  if (auto rows = store::RowsFromJson(doc, kMaxRows)) {
    const json encoded = store::RowsToJson(*rows);
    auto again = store::RowsFromJson(encoded, kMaxRows);
    if (!again) Fail(("rows do not decode again: " + again.error()).c_str(), doc, encoded);
    if (again->size() != rows->size() || store::RowsToJson(*again) != encoded) {
      Fail("rows change in a round trip", encoded, store::RowsToJson(*again));
    }
  }
  if (auto insights = store::InsightsFromJson(doc)) {
    const json encoded = store::InsightsToJson(*insights);
    auto again = store::InsightsFromJson(encoded);
    if (!again) Fail(("insights do not decode again: " + again.error()).c_str(), doc, encoded);
    if (store::InsightsToJson(*again) != encoded) {
      Fail("insights change in a round trip", encoded, store::InsightsToJson(*again));
    }
  }
  if (auto run = store::RunInfoFromJson(doc)) {
    const json encoded = store::RunInfoToJson(*run);
    auto again = store::RunInfoFromJson(encoded);
    if (!again) Fail(("a run does not decode again: " + again.error()).c_str(), doc, encoded);
    if (store::RunInfoToJson(*again) != encoded) {
      Fail("a run changes in a round trip", encoded, store::RunInfoToJson(*again));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const json doc = json::parse(data + 1, data + size, nullptr, false);
  if (doc.is_discarded()) return 0;
  RoundTrip(doc);
  if (doc.is_object()) {
    for (const char* key : {"rows", "insights", "run"}) {
      if (auto it = doc.find(key); it != doc.end()) RoundTrip(*it);
    }
  }
  return 0;
}
