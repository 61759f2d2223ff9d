// libFuzzer target: the strict JSON row codec (store/row_json.h) that ingest decodes with, without
// a server or a store, so it runs many times faster than ingest_fuzz.cc. Same input layout and
// seeds: byte 0 is ignored (ingest_fuzz's request kind), the rest is a JSON document, decoded
// as rows, insights and a run, and where it is an object, its "rows", "insights" and "run" too.
//
// Aborts (a finding) when what decodes does not survive a round trip: encoding the decoded
// rows (in both layouts) and decoding that again must succeed with the same rows (compared by
// their encoding); or when the pull reader the decoders read with (util/json_reader.h) and
// nlohmann-json disagree on whether the input is JSON at all.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "store/row_json.h"
#include "util/json_reader.h"

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

void RowsRoundTrip(const std::vector<store::Row>& rows, const json& origin) {
  const json encoded = store::RowsToJson(rows);
  for (const auto layout : {store::RowLayout::kObjects, store::RowLayout::kColumns}) {
    const json sent = store::RowsToJson(rows, layout);
    auto again = store::RowsFromJsonText(sent.dump(), kMaxRows);
    if (!again) Fail(("rows do not decode again: " + again.error()).c_str(), origin, sent);
    if (again->size() != rows.size() || store::RowsToJson(*again) != encoded) {
      Fail("rows change in a round trip", encoded, store::RowsToJson(*again));
    }
  }
}

void RoundTrip(const json& doc) {
  const std::string text = doc.dump();  // valid UTF-8: the document was parsed
  if (auto rows = store::RowsFromJsonText(text, kMaxRows)) RowsRoundTrip(*rows, doc);
  if (auto insights = store::InsightsFromJsonText(text)) {
    const json encoded = store::InsightsToJson(*insights);
    auto again = store::InsightsFromJsonText(encoded.dump());
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
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  // nlohmann-json ends its input at a NUL byte; JSON has none outside strings (where it is
  // escaped), and the reader refuses it anywhere. So: the same verdict on the text before the
  // first NUL, and never "JSON" for a text holding one.
  auto accepts = [](std::string_view t, std::string* why) {
    gpuprof::JsonReader reader(t);
    const bool ok = reader.Skip() && reader.End();
    *why = reader.error();
    return ok;
  };
  std::string why;
  const size_t nul = text.find('\0');
  const bool ours = accepts(text.substr(0, nul), &why);
  const json doc = json::parse(data + 1, data + size, nullptr, false);
  if (ours != !doc.is_discarded()) {
    std::fprintf(stderr, "row_json_fuzz: the reader %s what nlohmann-json %s (%s)\n",
                 ours ? "accepts" : "refuses", ours ? "refuses" : "accepts", why.c_str());
    abort();
  }
  if (nul != std::string_view::npos && accepts(text, &why)) {
    std::fprintf(stderr, "row_json_fuzz: the reader accepts a NUL byte\n");
    abort();
  }
  // The rows straight from the text, as the server decodes a batch's "rows"
  if (auto rows = store::RowsFromJsonText(text, kMaxRows)) RowsRoundTrip(*rows, doc);
  if (doc.is_discarded()) return 0;
  RoundTrip(doc);
  if (doc.is_object()) {
    for (const char* key : {"rows", "insights", "run"}) {
      if (auto it = doc.find(key); it != doc.end()) RoundTrip(*it);
    }
  }
  return 0;
}
