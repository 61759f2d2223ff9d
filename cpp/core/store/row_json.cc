#include "store/row_json.h"

#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "store/tables.h"

namespace gpuprof::store {
namespace {

using nlohmann::json;

// The JSON table key per Row alternative, in variant order: the table's name, or the
// kJsonName of a row type that shares its table (PhaseGpuRow: "phase_gpu_times").
template <typename T>
constexpr const char* JsonTable() {
  if constexpr (requires { Table<T>::kJsonName; }) {
    return Table<T>::kJsonName;
  } else {
    return Table<T>::kName;
  }
}
constexpr auto kTables = []<size_t... I>(std::index_sequence<I...>) {
  return std::array<const char*, sizeof...(I)>{JsonTable<std::variant_alternative_t<I, Row>>()...};
}
(std::make_index_sequence<std::variant_size_v<Row>>{});

template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

void Put(json& j, const char* name, int64_t v) { j[name] = v; }
void Put(json& j, const char* name, double v) {
  j[name] = std::isfinite(v) ? json(v) : json(nullptr);
}
void Put(json& j, const char* name, bool v) { j[name] = v; }
void Put(json& j, const char* name, const std::string& v) { j[name] = v; }
void Put(json& j, const char* name, const std::vector<double>& v) {
  if (!v.empty()) j[name] = v;
}
template <typename T>
void Put(json& j, const char* name, const std::optional<T>& v) {
  if (v) {
    Put(j, name, *v);
  } else {
    j[name] = nullptr;
  }
}

// Reads one value; an error message (without the location) when it has the wrong type.
std::optional<std::string> Get(const json& v, int64_t& out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return "integer out of range";
    }
    out = v.get<int64_t>();
    return std::nullopt;
  }
  return "expected an integer, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, double& out) {
  if (v.is_number()) {
    out = v.get<double>();
    return std::nullopt;
  }
  return "expected a number, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, bool& out) {
  if (v.is_boolean()) {
    out = v.get<bool>();
    return std::nullopt;
  }
  return "expected true or false, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, std::string& out) {
  if (v.is_string()) {
    out = v.get<std::string>();
    if (out.find('\0') != std::string::npos) return "a string holding a NUL character";
    return std::nullopt;
  }
  return "expected a string, got " + std::string(v.type_name());
}
std::optional<std::string> Get(const json& v, std::vector<double>& out) {
  if (!v.is_array()) return "expected an array of numbers, got " + std::string(v.type_name());
  out.clear();
  for (const json& x : v) {
    if (!x.is_number()) return "expected an array of numbers";
    out.push_back(x.get<double>());
  }
  return std::nullopt;
}
template <typename T>
std::optional<std::string> Get(const json& v, std::optional<T>& out) {
  if (v.is_null()) {
    out.reset();
    return std::nullopt;
  }
  T value{};
  if (auto why = Get(v, value)) return why;
  out = std::move(value);
  return std::nullopt;
}

template <typename T>
json Encode(const T& row) {
  json j = json::object();
  ForEachField(row, [&](const char* name, const auto& member) { Put(j, name, member); });
  return j;
}

// Decodes one object into `row`; where() is "table[i]" for messages (built only for one).
// The hot path of a team server's ingest: no allocation beyond the row's own strings.
template <typename T, typename Where>
Status DecodeWith(const json& j, const Where& where, T& row) {
  if (!j.is_object()) return Status::Error(where() + ": expected an object, got " + j.type_name());
  Status st;
  size_t found = 0;
  ForEachField(row, [&](const char* name, auto& member) {
    if (!st.ok()) return;
    using M = std::decay_t<decltype(member)>;
    auto it = j.find(name);
    if (it == j.end()) {
      // Optional columns and a host sample's per-core list may be left out.
      if constexpr (!IsOptional<M>::value && !std::is_same_v<M, std::vector<double>>) {
        st = Status::Error(where() + "." + name + ": missing (required)");
      }
      return;
    }
    ++found;
    if (auto why = Get(*it, member)) st = Status::Error(where() + "." + name + ": " + *why);
  });
  if (!st.ok()) return st;
  if (found < j.size()) {  // a key that is no column: name it
    std::set<std::string> known;
    T probe{};
    ForEachField(probe, [&](const char* name, auto&) { known.insert(name); });
    for (const auto& [key, value] : j.items()) {
      if (!known.count(key)) return Status::Error(where() + ": unknown column '" + key + "'");
    }
  }
  return Status::Ok();
}
template <typename T>
Status Decode(const json& j, const std::string& where, T& row) {
  return DecodeWith(
      j, [&] { return where; }, row);
}

// The variant alternative at `index`, decoded from `j`.
template <size_t I = 0, typename Where>
Status DecodeAt(size_t index, const json& j, const Where& where, Row* out) {
  if constexpr (I < std::variant_size_v<Row>) {
    if (index == I) {
      std::variant_alternative_t<I, Row> row{};
      Status st = DecodeWith(j, where, row);
      if (st.ok()) *out = std::move(row);
      return st;
    }
    return DecodeAt<I + 1>(index, j, where, out);
  } else {
    return Status::Error(where() + ": no such table");
  }
}

}  // namespace

const char* RowJsonTable(const Row& row) { return kTables[row.index()]; }

json RowsToJson(const std::vector<Row>& rows) {
  json doc = json::object();
  for (const Row& row : rows) {
    std::visit([&](const auto& r) { doc[RowJsonTable(row)].push_back(Encode(r)); }, row);
  }
  return doc;
}

Expected<std::vector<Row>> RowsFromJson(const json& doc, size_t max_rows) {
  if (!doc.is_object()) {
    return Status::Error(std::string("rows: expected an object of tables, got ") + doc.type_name());
  }
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < std::size(kTables); ++i) index_of[kTables[i]] = i;
  std::vector<Row> rows;
  for (const auto& [table, list] : doc.items()) {
    auto it = index_of.find(table);
    if (it == index_of.end()) {
      std::string names;
      for (const char* t : kTables) names += std::string(names.empty() ? "" : ", ") + t;
      return Status::Error("rows: unknown table '" + table + "' (tables: " + names + ")");
    }
    if (!list.is_array()) {
      return Status::Error("rows." + table + ": expected an array, got " + list.type_name());
    }
    if (rows.size() + list.size() > max_rows) {
      return Status::Error("rows: more than " + std::to_string(max_rows) +
                           " rows in one batch; send smaller batches");
    }
    rows.reserve(rows.size() + list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      Row row;
      const std::string& name = table;  // (clang 14 cannot capture a structured binding)
      const auto where = [&] { return name + "[" + std::to_string(i) + "]"; };
      Status st = DecodeAt(it->second, list[i], where, &row);
      if (!st.ok()) return st;
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

json InsightsToJson(const std::vector<InsightRow>& insights) {
  json list = json::array();
  for (const InsightRow& r : insights) list.push_back(Encode(r));
  return list;
}

Expected<std::vector<InsightRow>> InsightsFromJson(const json& list) {
  if (!list.is_array()) {
    return Status::Error(std::string("insights: expected an array, got ") + list.type_name());
  }
  std::vector<InsightRow> out;
  std::set<int64_t> ordinals;  // the insights table's key: a repeat would fail in the store
  for (size_t i = 0; i < list.size(); ++i) {
    InsightRow r;
    Status st = Decode(list[i], "insights[" + std::to_string(i) + "]", r);
    if (!st.ok()) return st;
    if (!ordinals.insert(r.ordinal).second) {
      return Status::Error("insights[" + std::to_string(i) + "].ordinal: " +
                           std::to_string(r.ordinal) + " is given twice (ordinals are unique)");
    }
    out.push_back(std::move(r));
  }
  return out;
}

json RunInfoToJson(const RunInfo& info) { return Encode(info); }

Expected<RunInfo> RunInfoFromJson(const json& doc) {
  RunInfo info;
  Status st = Decode(doc, "run", info);
  if (!st.ok()) return st;
  if (info.status != "running" && info.status != "ok" && info.status != "failed") {
    return Status::Error("run.status: '" + info.status + "' is not running, ok or failed");
  }
  return info;
}

}  // namespace gpuprof::store
