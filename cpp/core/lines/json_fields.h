// Reading and totalling the optional numbers of linescope's JSON documents (the report payload,
// lines/report.cc, and the Spark view, lines/spark.cc): a missing or null field is unknown, and
// how unknown parts add is said by the function used, never left to a default of 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace gpuprof::lines::json_fields {

using OptInt = std::optional<int64_t>;

// obj[key], or null when obj is not an object or has no such key.
inline const nlohmann::json& Field(const nlohmann::json& obj, const char* key) {
  static const nlohmann::json kNull = nullptr;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

template <typename T>
nlohmann::json J(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// Totals over separately measured things (lines): unknown + x = x, the sum of what was
// measured; whoever shows it says how many things it covers.
inline OptInt Add(OptInt a, OptInt b) {
  if (!a) return b;
  if (!b) return a;
  return *a + *b;
}
inline OptInt Max(OptInt a, OptInt b) {
  if (!a) return b;
  if (!b) return a;
  return std::max(*a, *b);
}
// Parts of ONE quantity (a line reported twice, the stages of one action): unknown + x =
// unknown, since an unknown part is not 0 (nor is the peak of a part that was not measured
// below the others').
inline OptInt AddParts(OptInt a, OptInt b) {
  if (!a || !b) return std::nullopt;
  return *a + *b;
}
inline OptInt MaxParts(OptInt a, OptInt b) {
  if (!a || !b) return std::nullopt;
  return std::max(*a, *b);
}

}  // namespace gpuprof::lines::json_fields
