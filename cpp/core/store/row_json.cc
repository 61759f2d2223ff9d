#include "store/row_json.h"

#include <array>
#include <bitset>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>

#include "store/tables.h"
#include "util/json_reader.h"

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

// ---- decoding (JsonReader) ------------------------------------------------------------------

using Type = JsonReader::Type;

std::string Got(const char* expected, Type type) {
  return std::string(expected) + ", got " + JsonReader::TypeName(type);
}

// Reads one value into `out`. nullopt: read. Else the message (without the location) of a
// value of the wrong type, which is left unread; an empty message when the reader failed (its
// error() says why: the text is not JSON).

std::optional<std::string> Read(JsonReader& r, int64_t& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t != Type::kNumber) return Got("expected an integer", t);
  JsonReader::Number n;
  if (!r.Num(&n)) return std::string();
  if (!n.integral) return Got("expected an integer", t);
  if (!n.in_range) return "integer out of range";
  out = n.integer;
  return std::nullopt;
}
std::optional<std::string> Read(JsonReader& r, double& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t != Type::kNumber) return Got("expected a number", t);
  JsonReader::Number n;
  if (!r.Num(&n)) return std::string();
  out = n.real;
  return std::nullopt;
}
std::optional<std::string> Read(JsonReader& r, bool& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t != Type::kBool) return Got("expected true or false", t);
  if (!r.Bool(&out)) return std::string();
  return std::nullopt;
}
std::optional<std::string> Read(JsonReader& r, std::string& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t != Type::kString) return Got("expected a string", t);
  if (!r.String(&out)) return std::string();
  if (out.find('\0') != std::string::npos) return "a string holding a NUL character";
  return std::nullopt;
}
std::optional<std::string> Read(JsonReader& r, std::vector<double>& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t != Type::kArray) return Got("expected an array of numbers", t);
  out.clear();
  if (!r.EnterArray()) return std::string();
  while (r.NextItem()) {
    if (!r.Peek(&t)) return std::string();
    if (t != Type::kNumber) return "expected an array of numbers";
    JsonReader::Number n;
    if (!r.Num(&n)) return std::string();
    out.push_back(n.real);
  }
  if (!r.ok()) return std::string();
  return std::nullopt;
}
template <typename T>
std::optional<std::string> Read(JsonReader& r, std::optional<T>& out) {
  Type t{};
  if (!r.Peek(&t)) return std::string();
  if (t == Type::kNull) {
    if (!r.Null()) return std::string();
    out.reset();
    return std::nullopt;
  }
  T value{};
  if (auto why = Read(r, value)) return why;
  out = std::move(value);
  return std::nullopt;
}

// The error of a value at `where` (e.g. "steps[3].step"): the reader's when the text is not
// JSON, else the type message.
Status ValueError(const JsonReader& r, const std::string& where, const std::string& why) {
  if (!r.ok()) return Status::Error(r.error());
  return Status::Error(where + ": " + why);
}
Status ReaderError(const JsonReader& r) { return Status::Error(r.error()); }

// One JSON field of row type T: its name, whether a row must give it, and its reader.
template <typename T>
struct FieldCodec {
  const char* name;
  bool required;
  std::function<std::optional<std::string>(JsonReader&, T&)> read;
};
constexpr size_t kMaxFields = 64;

// T's fields in column order (ForEachField's), made once.
template <typename T>
const std::vector<FieldCodec<T>>& Codecs() {
  static_assert(std::tuple_size_v<std::decay_t<decltype(Table<T>::kColumns)>> <= kMaxFields,
                "the decoders' bitsets of seen fields hold kMaxFields");
  static const std::vector<FieldCodec<T>> codecs = [] {
    std::vector<FieldCodec<T>> list;
    ForEachColumn<T>([&](const auto& c) {
      using C = std::decay_t<decltype(c)>;
      if constexpr (!IsFixed<C>::value) {
        if constexpr (!HasFlag<C>(kAssigned)) {
          using M = typename C::Member;
          const auto member = c.member;
          // Optional columns and a host sample's per-core list may be left out.
          list.push_back({c.name, !IsOptional<M>::value && !std::is_same_v<M, std::vector<double>>,
                          [member](JsonReader& r, T& row) { return Read(r, row.*member); }});
        }
      }
    });
    return list;
  }();
  return codecs;
}

template <typename T>
size_t FindField(const std::vector<FieldCodec<T>>& codecs, std::string_view name, size_t hint) {
  if (hint < codecs.size() && name == codecs[hint].name) return hint;
  for (size_t i = 0; i < codecs.size(); ++i) {
    if (name == codecs[i].name) return i;
  }
  return codecs.size();
}

// One row given as an object ({"column": value, ...}); where() is "table[i]" for messages
// (built only for one).
template <typename T, typename Where>
Status ReadObjectRow(JsonReader& r, const Where& where, std::string& key, T& row) {
  const auto& codecs = Codecs<T>();
  Type t{};
  if (!r.Peek(&t)) return ReaderError(r);
  if (t != Type::kObject) return Status::Error(where() + ": " + Got("expected an object", t));
  if (!r.EnterObject()) return ReaderError(r);
  std::bitset<kMaxFields> seen;
  size_t hint = 0;
  while (r.NextKey(&key)) {
    const size_t i = FindField(codecs, key, hint);
    if (i == codecs.size()) return Status::Error(where() + ": unknown column '" + key + "'");
    if (seen[i]) return Status::Error(where() + "." + key + ": given twice");
    seen[i] = true;
    hint = i + 1;
    if (auto why = codecs[i].read(r, row)) return ValueError(r, where() + "." + key, *why);
  }
  if (!r.ok()) return ReaderError(r);
  for (size_t i = 0; i < codecs.size(); ++i) {
    if (codecs[i].required && !seen[i]) {
      return Status::Error(where() + "." + codecs[i].name + ": missing (required)");
    }
  }
  return Status::Ok();
}

// Decodes one value (of the reader, or of a sub-reader over a part of its text) into `row`.
template <typename T>
Status ReadObject(JsonReader& r, const std::string& where, T& row) {
  std::string key;
  return ReadObjectRow(
      r, [&] { return where; }, key, row);
}

// Where decoding a batch's rows adds to, and its bound.
struct RowSink {
  std::vector<Row>* rows;
  size_t max_rows;
  bool* too_many;
  Status Full() {
    *too_many = true;
    return Status::Error("rows: more than " + std::to_string(max_rows) +
                         " rows in one batch; send smaller batches");
  }
};

// A table given as rows of objects: [{"column": value, ...}, ...].
template <typename T>
Status ReadObjectTable(JsonReader& r, const std::string& table, RowSink& sink) {
  if (!r.EnterArray()) return ReaderError(r);
  std::string key;
  for (size_t i = 0; r.NextItem(); ++i) {
    if (sink.rows->size() >= sink.max_rows) return sink.Full();
    T row{};
    Status st = ReadObjectRow(
        r, [&] { return table + "[" + std::to_string(i) + "]"; }, key, row);
    if (!st.ok()) return st;
    sink.rows->push_back(std::move(row));
  }
  if (!r.ok()) return ReaderError(r);
  return Status::Ok();
}

// The "rows" of the columns form: arrays of values in `columns`' order (indexes into
// Codecs<T>()).
template <typename T>
Status ReadValueRows(JsonReader& r, const std::string& table, const std::vector<size_t>& columns,
                     RowSink& sink) {
  const auto& codecs = Codecs<T>();
  Type t{};
  if (!r.Peek(&t)) return ReaderError(r);
  if (t != Type::kArray) {
    return Status::Error("rows." + table + ".rows: " + Got("expected an array of rows", t));
  }
  if (!r.EnterArray()) return ReaderError(r);
  const auto count_error = [&](size_t i) {
    return Status::Error(table + "[" + std::to_string(i) + "]: expected " +
                         std::to_string(columns.size()) +
                         " values (one per column), got a different number");
  };
  for (size_t i = 0; r.NextItem(); ++i) {
    if (sink.rows->size() >= sink.max_rows) return sink.Full();
    if (!r.Peek(&t)) return ReaderError(r);
    if (t != Type::kArray) {
      return Status::Error(table + "[" + std::to_string(i) +
                           "]: " + Got("expected an array of values", t));
    }
    if (!r.EnterArray()) return ReaderError(r);
    T row{};
    size_t k = 0;
    for (; r.NextItem(); ++k) {
      if (k == columns.size()) return count_error(i);
      const FieldCodec<T>& field = codecs[columns[k]];
      if (auto why = field.read(r, row)) {
        return ValueError(r, table + "[" + std::to_string(i) + "]." + field.name, *why);
      }
    }
    if (!r.ok()) return ReaderError(r);
    if (k != columns.size()) return count_error(i);
    sink.rows->push_back(std::move(row));
  }
  if (!r.ok()) return ReaderError(r);
  return Status::Ok();
}

// A table in the columns form: {"columns": ["column", ...], "rows": [[value, ...], ...]}.
// "rows" may come before "columns" (read again once the columns are known).
template <typename T>
Status ReadColumnsTable(JsonReader& r, const std::string& table, RowSink& sink) {
  const auto& codecs = Codecs<T>();
  const std::string at = "rows." + table;
  if (!r.EnterObject()) return ReaderError(r);
  std::optional<std::vector<size_t>> columns;
  std::optional<std::string_view> early_rows;  // "rows" given before "columns"
  bool rows_read = false;
  std::string key, name;
  while (r.NextKey(&key)) {
    if (key == "columns") {
      if (columns) return Status::Error(at + ".columns: given twice");
      Type t{};
      if (!r.Peek(&t)) return ReaderError(r);
      if (t != Type::kArray) {
        return Status::Error(at + ".columns: " + Got("expected an array of column names", t));
      }
      columns.emplace();
      std::bitset<kMaxFields> seen;
      if (!r.EnterArray()) return ReaderError(r);
      while (r.NextItem()) {
        if (!r.Peek(&t)) return ReaderError(r);
        if (t != Type::kString) {
          return Status::Error(at + ".columns: " + Got("expected an array of column names", t));
        }
        if (!r.String(&name)) return ReaderError(r);
        const size_t i = FindField(codecs, name, columns->size());
        if (i == codecs.size())
          return Status::Error(at + ".columns: unknown column '" + name + "'");
        if (seen[i]) return Status::Error(at + ".columns: '" + name + "' is given twice");
        seen[i] = true;
        columns->push_back(i);
      }
      if (!r.ok()) return ReaderError(r);
      for (size_t i = 0; i < codecs.size(); ++i) {
        if (codecs[i].required && !seen[i]) {
          return Status::Error(at + ".columns: '" + codecs[i].name + "' missing (required)");
        }
      }
    } else if (key == "rows") {
      if (rows_read || early_rows) return Status::Error(at + ".rows: given twice");
      if (columns) {
        if (Status st = ReadValueRows<T>(r, table, *columns, sink); !st.ok()) return st;
        rows_read = true;
      } else {
        std::string_view raw;
        if (!r.Skip(&raw)) return ReaderError(r);
        early_rows = raw;
      }
    } else {
      return Status::Error(at + ": unknown key '" + key + "' (expected: columns, rows)");
    }
  }
  if (!r.ok()) return ReaderError(r);
  if (!columns) return Status::Error(at + ": 'columns' missing (the names of the rows' values)");
  if (early_rows) {
    JsonReader sub(*early_rows);
    if (Status st = ReadValueRows<T>(sub, table, *columns, sink); !st.ok()) return st;
    rows_read = true;
  }
  if (!rows_read) return Status::Error(at + ": 'rows' missing");
  return Status::Ok();
}

// The table of variant alternative `index`, in either form.
template <size_t I = 0>
Status ReadTableAt(size_t index, JsonReader& r, const std::string& table, RowSink& sink) {
  if constexpr (I < std::variant_size_v<Row>) {
    if (index != I) return ReadTableAt<I + 1>(index, r, table, sink);
    using T = std::variant_alternative_t<I, Row>;
    Type t{};
    if (!r.Peek(&t)) return ReaderError(r);
    if (t == Type::kArray) return ReadObjectTable<T>(r, table, sink);
    if (t == Type::kObject) return ReadColumnsTable<T>(r, table, sink);
    return Status::Error("rows." + table + ": " +
                         Got("expected an array of rows or {\"columns\": ..., \"rows\": ...}", t));
  } else {
    return Status::Error("rows." + table + ": no such table");
  }
}

// The text of a document (a run's fields, given as a document, for the decoder that reads
// text).
Expected<std::string> Text(const json& doc) {
  try {
    return doc.dump();
  } catch (const json::exception&) {
    return Status::Error("a string that is not valid UTF-8");
  }
}

template <typename T>
json Value(const T& v) {
  if constexpr (std::is_same_v<T, double>) {
    return std::isfinite(v) ? json(v) : json(nullptr);
  } else if constexpr (IsOptional<T>::value) {
    return v ? Value(*v) : json(nullptr);
  } else {
    return json(v);
  }
}

// {"column": value, ...}: every field, null where unknown.
template <typename T>
json Encode(const T& row) {
  json j = json::object();
  ForEachField(row, [&](const char* name, const auto& member) {
    using M = std::decay_t<decltype(member)>;
    if constexpr (std::is_same_v<M, std::vector<double>>) {
      if (member.empty()) return;  // an empty list may be left out
    }
    j[name] = Value(member);
  });
  return j;
}
// [value, ...] in column order.
template <typename T>
json EncodeValues(const T& row) {
  json j = json::array();
  ForEachField(row, [&](const char*, const auto& member) { j.push_back(Value(member)); });
  return j;
}
template <typename T>
json ColumnNames() {
  json names = json::array();
  T probe{};
  ForEachField(probe, [&](const char* name, const auto&) { names.push_back(name); });
  return names;
}

}  // namespace

const char* RowJsonTable(const Row& row) { return kTables[row.index()]; }

json RowsToJson(const std::vector<Row>& rows, RowLayout layout) {
  json doc = json::object();
  for (const Row& row : rows) {
    std::visit(
        [&](const auto& r) {
          json& table = doc[RowJsonTable(row)];
          if (layout == RowLayout::kObjects) {
            table.push_back(Encode(r));
            return;
          }
          if (table.is_null()) {
            table = json{{"columns", ColumnNames<std::decay_t<decltype(r)>>()},
                         {"rows", json::array()}};
          }
          table["rows"].push_back(EncodeValues(r));
        },
        row);
  }
  return doc;
}

Status ReadRows(JsonReader& reader, size_t max_rows, std::vector<Row>* rows, bool* too_many) {
  *too_many = false;
  static const std::map<std::string, size_t, std::less<>> index_of = [] {
    std::map<std::string, size_t, std::less<>> m;
    for (size_t i = 0; i < std::size(kTables); ++i) m[kTables[i]] = i;
    return m;
  }();
  JsonReader::Type t{};
  if (!reader.Peek(&t)) return ReaderError(reader);
  if (t != Type::kObject) {
    return Status::Error("rows: " + Got("expected an object of tables", t));
  }
  if (!reader.EnterObject()) return ReaderError(reader);
  RowSink sink{rows, max_rows, too_many};
  std::string table;
  while (reader.NextKey(&table)) {
    auto it = index_of.find(table);
    if (it == index_of.end()) {
      std::string names;
      for (const char* name : kTables) names += std::string(names.empty() ? "" : ", ") + name;
      return Status::Error("rows: unknown table '" + table + "' (tables: " + names + ")");
    }
    if (Status st = ReadTableAt(it->second, reader, table, sink); !st.ok()) return st;
  }
  if (!reader.ok()) return ReaderError(reader);
  return Status::Ok();
}

Expected<std::vector<Row>> RowsFromJsonText(std::string_view text, size_t max_rows) {
  JsonReader reader(text);
  std::vector<Row> rows;
  bool too_many = false;
  if (Status st = ReadRows(reader, max_rows, &rows, &too_many); !st.ok()) return st;
  if (!reader.End()) return ReaderError(reader);
  return rows;
}

json InsightsToJson(const std::vector<InsightRow>& insights) {
  json list = json::array();
  for (const InsightRow& r : insights) list.push_back(Encode(r));
  return list;
}

Expected<std::vector<InsightRow>> InsightsFromJsonText(std::string_view text) {
  JsonReader reader(text);
  JsonReader::Type t{};
  if (!reader.Peek(&t)) return ReaderError(reader);
  if (t != Type::kArray) return Status::Error("insights: " + Got("expected an array", t));
  if (!reader.EnterArray()) return ReaderError(reader);
  std::vector<InsightRow> out;
  std::set<int64_t> ordinals;  // the insights table's key: a repeat would fail in the store
  for (size_t i = 0; reader.NextItem(); ++i) {
    InsightRow r;
    Status st = ReadObject(reader, "insights[" + std::to_string(i) + "]", r);
    if (!st.ok()) return st;
    if (!ordinals.insert(r.ordinal).second) {
      return Status::Error("insights[" + std::to_string(i) + "].ordinal: " +
                           std::to_string(r.ordinal) + " is given twice (ordinals are unique)");
    }
    out.push_back(std::move(r));
  }
  if (!reader.ok() || !reader.End()) return ReaderError(reader);
  return out;
}

json RunInfoToJson(const RunInfo& info) { return Encode(info); }

Expected<RunInfo> RunInfoFromJson(const json& doc) {
  auto text = Text(doc);
  if (!text) return Status::Error("run: " + text.error());
  JsonReader reader(*text);
  RunInfo info;
  Status st = ReadObject(reader, "run", info);
  if (!st.ok()) return st;
  if (!reader.End()) return ReaderError(reader);
  if (info.status != "running" && info.status != "ok" && info.status != "failed") {
    return Status::Error("run.status: '" + info.status + "' is not running, ok or failed");
  }
  return info;
}

}  // namespace gpuprof::store
