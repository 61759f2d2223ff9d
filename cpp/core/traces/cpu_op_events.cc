#include "traces/cpu_op_events.h"

#include <algorithm>
#include <map>

namespace gpuprof::traces {

Expected<std::vector<CpuOpTotal>> AggregateCpuOps(std::vector<CpuOpEvent> events) {
  for (const CpuOpEvent& e : events) {
    if (e.duration_ns < 0) {
      return Status::Error("CPU operator event '" + e.name + "' has a negative duration (" +
                           std::to_string(e.duration_ns) + " ns)");
    }
  }
  std::sort(events.begin(), events.end(), [](const CpuOpEvent& a, const CpuOpEvent& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.duration_ns > b.duration_ns;
  });
  // The call tree, per thread: parent[i] is the innermost open event holding event i.
  constexpr size_t kNone = static_cast<size_t>(-1);
  const size_t n = events.size();
  std::vector<size_t> parent(n, kNone);
  std::vector<std::vector<size_t>> children(n);
  auto end_of = [&](size_t i) { return events[i].start_ns + events[i].duration_ns; };
  std::vector<size_t> stack;  // the open events of the current thread
  for (size_t i = 0; i < n; ++i) {
    if (!stack.empty() && events[stack.back()].thread != events[i].thread) stack.clear();
    while (!stack.empty() && events[i].start_ns >= end_of(stack.back())) stack.pop_back();
    if (!stack.empty()) {
      parent[i] = stack.back();
      children[stack.back()].push_back(i);
    }
    stack.push_back(i);
  }
  // An operator whose only child has its own name (aten::sum dispatching to aten::sum) is one
  // call, as key_averages counts it: the child is dropped and its children move up.
  std::vector<bool> dropped(n, false);
  for (size_t i = 0; i < n; ++i) {  // parents come before their children
    const size_t p = parent[i];
    if (p == kNone || children[p].size() != 1 || events[p].name != events[i].name) continue;
    dropped[i] = true;
    children[p] = std::move(children[i]);
    for (size_t c : children[p]) parent[c] = p;
  }
  std::map<std::string, CpuOpTotal> by_name;
  for (size_t i = 0; i < n; ++i) {
    if (dropped[i]) continue;
    int64_t child_ns = 0;  // clipped to the event: a child overrunning its end (jitter)
    for (size_t c : children[i]) {
      child_ns += std::max<int64_t>(0, std::min(end_of(c), end_of(i)) - events[c].start_ns);
    }
    CpuOpTotal& t = by_name[events[i].name];
    t.calls += 1;
    t.total_ns += events[i].duration_ns;
    t.self_ns += std::max<int64_t>(0, events[i].duration_ns - child_ns);
  }
  std::vector<CpuOpTotal> out;
  out.reserve(by_name.size());
  for (auto& [name, t] : by_name) {
    t.name = name;
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const CpuOpTotal& a, const CpuOpTotal& b) {
    return a.self_ns != b.self_ns ? a.self_ns > b.self_ns : a.name < b.name;
  });
  return out;
}

}  // namespace gpuprof::traces
