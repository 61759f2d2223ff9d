// Shared by the schema tests of both backends (EveryDescriptorMatchesTheSchema in
// sqlite_store_test.cc and pg_store_test.cc).
#pragma once

#include <set>
#include <string>
#include <type_traits>

#include "store/rows.h"

namespace gpuprof::store::schema_check {

// Whether column `where` ("table.column") of row type T may be nullable in the DDL although its
// member is not std::optional: a NULL there reads as 0 / "" (runs.hostname, runs.pid) or cannot
// happen (runs.run_id: the rowid), and PhaseGpuRow only writes (its gpu_ns always has a value).
template <class T>
bool PlainMemberMayBeNullable(const std::string& where) {
  static const std::set<std::string> kNullableWithDefault = {"runs.run_id", "runs.hostname",
                                                             "runs.pid"};
  return std::is_same_v<T, PhaseGpuRow> || kNullableWithDefault.count(where) > 0;
}

}  // namespace gpuprof::store::schema_check
