// The line-profile model of linescope: per-line and per-function statistics and the
// aggregation that a tracer (cpp/python/line_tracer.cc) feeds from the interpreter's events.
//
// Measurement contract (what the numbers mean):
//   - Wall time of a line is inclusive: the time from the line's start event to the next
//     line / suspend / return event of the same frame, including everything called from the
//     line (traced user functions, untraced dependencies, C extensions, I/O, sleeps).
//     `self_time_ns` is the same minus the time spent in traced (recorded) callees.
//   - A suspended generator / coroutine frame accrues no time; the time goes to whatever runs
//     on the thread meanwhile (usually the line that drives the generator or event loop).
//   - Recursion: a line's wall time is summed over all activations (like line_profiler), so
//     a recursive call line counts the inner activations once per level. A function's
//     `total_time_ns` counts only outermost activations (no double counting); `own_time_ns`
//     excludes traced callees and is always additive.
//   - Unknown stays unknown: memory and GPU values are std::nullopt unless a backend
//     measured them (issue 5 fills GpuStats).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpuprof::lines {

// GPU time and device-memory peak attributed to one line. Separate measurement domain from
// driver (CPU wall) time; each field unknown (nullopt) unless measured.
struct GpuStats {
  std::optional<int64_t> time_ns;
  std::optional<int64_t> peak_memory_bytes;
};

struct LineStats {
  int32_t file_id = -1;
  int32_t line = 0;
  int64_t wall_time_ns = 0;  // inclusive, see the contract above
  int64_t self_time_ns = 0;  // minus traced callees
  int64_t hits = 0;
  std::optional<int64_t> memory_bytes;  // net memory change; unknown unless measured
  std::optional<GpuStats> gpu;          // unknown unless a GPU-capable backend measured it
};

struct FunctionStats {
  std::string qualname;
  int32_t file_id = -1;
  int32_t first_line = 0;
  int64_t total_time_ns = 0;  // inclusive, outermost activations only
  int64_t own_time_ns = 0;    // minus traced callees
  int64_t calls = 0;          // fresh calls (a generator resume is not a call)
};

// Aggregates events of ONE thread into dense per-code-object line arrays.
//
// Threading: not thread-safe; the owner (the tracer) calls every method from the measured
// thread, or after that thread stopped feeding it.
// Cost: the event methods (Enter/Leave/Line) are noexcept and allocate nothing after warm-up
// (the frame stack grows only when a new maximum depth is reached; a line outside the range
// registered for a code object grows that object's array once).
class LineAggregator {
 public:
  LineAggregator();
  LineAggregator(const LineAggregator&) = delete;
  LineAggregator& operator=(const LineAggregator&) = delete;

  // Cold path. Returns a stable id for `path` (same path -> same id).
  int32_t InternFile(std::string_view path);
  const std::vector<std::string>& files() const { return files_; }

  // Cold path. Registers a code object (a function body, module or class body) whose lines
  // lie in [first_line, last_line]. Returns its code index for the event methods.
  int32_t AddCode(int32_t file_id, std::string qualname, int32_t first_line, int32_t last_line);
  size_t code_count() const { return codes_.size(); }

  // Hot path, measured thread only.
  // A frame of `code` starts (fresh_call = true, counts a call) or resumes after a suspend
  // (fresh_call = false). `line` is the line it resumes on (no hit counted), or <= 0 when
  // the next Line() event will name it.
  void Enter(int32_t code, int64_t now_ns, bool fresh_call, int32_t line) noexcept;
  // The top frame leaves: `finished` for return / unwind, false for a suspend (yield, await).
  void Leave(int64_t now_ns, bool finished) noexcept;
  // The frame of `code` leaves (tracers use this form). Frames above it (missed exit events)
  // are closed first; when `code` is not on the stack (its frame began before tracing and
  // ran no traced line) nothing is recorded.
  void Exit(int32_t code, int64_t now_ns, bool finished) noexcept;
  // A new line starts in the frame of `code`. If `code` is not the top frame (tracing began
  // inside a running frame, or an exit event was missed) the stack is repaired: frames above
  // a matching frame are closed as finished; without a match the frame is adopted (pushed,
  // no call counted).
  void Line(int32_t code, int32_t line, int64_t now_ns) noexcept;
  // Closes every open frame at `now_ns` (the session stops inside them). Idempotent.
  void CloseAll(int64_t now_ns) noexcept;

  size_t depth() const { return stack_.size(); }
  int64_t mismatches() const { return mismatches_; }

  // Results: lines with at least one hit or nonzero time; functions with calls or time.
  std::vector<LineStats> Lines() const;
  std::vector<FunctionStats> Functions() const;

 private:
  struct Cell {
    int64_t wall_ns = 0;
    int64_t self_ns = 0;
    int64_t hits = 0;
  };
  struct Code {
    int32_t file_id;
    std::string qualname;
    int32_t first_line;
    std::vector<Cell> cells;  // index = line - first_line
    int64_t total_ns = 0;
    int64_t own_ns = 0;
    int64_t calls = 0;
    int32_t active = 0;  // open frames of this code on the stack (recursion)
  };
  struct Frame {
    int32_t code;
    int32_t line;          // current line, <= 0 when none yet
    int64_t line_start;    // when the current line started
    int64_t line_child;    // traced-callee time within the current line
    int64_t enter;         // when this frame (activation slice) was entered
    int64_t child;         // traced-callee time within this slice
  };

  void CloseLine(Frame& f, int64_t now_ns) noexcept;
  void Pop(int64_t now_ns) noexcept;
  Cell* CellFor(int32_t code, int32_t line) noexcept;

  std::vector<std::string> files_;
  std::unordered_map<std::string, int32_t> file_ids_;
  std::vector<Code> codes_;
  std::vector<Frame> stack_;
  int64_t mismatches_ = 0;
};

// Decides which source files are recorded. Pure; cold path (the tracer caches per code).
//   recorded(path) = (under a root OR matches an include pattern)
//                    AND NOT matches an exclude pattern
//                    AND NOT (inside site-packages / dist-packages, unless an include matched)
// Patterns are fnmatch globs where `*` also matches '/', tried against the absolute path and
// against the path relative to each root. Relative `path`s are taken relative to `cwd`.
class PathFilter {
 public:
  PathFilter(std::vector<std::string> roots, std::vector<std::string> include,
             std::vector<std::string> exclude, std::string cwd);
  bool Recorded(std::string_view path) const;

 private:
  bool Matches(const std::vector<std::string>& patterns, const std::string& abs) const;
  std::vector<std::string> roots_;
  std::vector<std::string> include_;
  std::vector<std::string> exclude_;
  std::string cwd_;
};

// Lexically normalises an absolute path ("a/./b/../c" -> "a/c"); no filesystem access.
std::string NormalizePath(std::string_view path, std::string_view cwd);

}  // namespace gpuprof::lines
