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
//   - Another code object running on the line that calls it (a generator expression, a
//     lambda, a 3.11 comprehension on that same line) is inside that line's time already:
//     its time on the shared line is not added again (wall time of the line stays the
//     caller's inclusive time); what it spends there itself, outside recorded callees, is
//     that line's self time. Its hits still count (each resumption is a hit, as settrace
//     reports them).
//   - Recursion: a line's wall time is summed over all activations (like line_profiler), so
//     a recursive call line counts the inner activations once per level. A function's
//     `total_time_ns` counts only outermost activations (no double counting); `own_time_ns`
//     excludes traced callees and is always additive.
//   - Unknown stays unknown: memory and GPU values are std::nullopt unless a backend
//     measured them (issue 5 fills GpuStats).
#pragma once

#include <atomic>
#include <cstddef>
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
  int64_t calls = 0;  // fresh calls of recorded functions made while this line was current
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

// An opaque identity of one frame activation, chosen by the tracer (the interpreter's
// frame address). Keys of frames that are alive at the same time differ; a key may be
// reused after its frame ended.
using FrameKey = uintptr_t;

// Aggregates events of ONE thread into dense per-code-object line arrays.
//
// The tracer reports frames by key: Enter when a frame starts or resumes, Line for each new
// line, Exit when it returns, suspends or unwinds. A tracer that does not see every call
// start (sys.monitoring with PY_START disabled) relies on Line returning false for a key
// that is not the innermost open frame, and then reports that frame with Enter.
//
// Threading: not thread-safe; the owner (the tracer) calls every method from the measured
// thread, or after that thread stopped feeding it.
// Cost: the event methods are noexcept and allocate nothing after warm-up (the frame stack
// grows only when a new maximum depth is reached; a line outside the range registered for a
// code object grows that object's array once). Line and the innermost-frame case of Exit are
// inline, branch-light and touch only the top frame and one line cell.
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

  // Cold. From now on the innermost frame's current line is stored into `*out` (relaxed) at
  // every line change, as LineKey(code, line), or 0 when no recorded frame is open: another
  // thread (the memory sampler) reads it to charge what it measures to the running line.
  // `*out` must outlive the aggregator's use of it; nullptr stops publishing.
  void PublishTo(std::atomic<uint64_t>* out) noexcept {
    publish_ = out;
    Publish();
  }
  static constexpr uint64_t LineKey(int32_t code, int32_t line) noexcept {
    return (static_cast<uint64_t>(static_cast<uint32_t>(code) + 1) << 32) |
           static_cast<uint32_t>(line);
  }
  static constexpr int32_t KeyCode(uint64_t key) noexcept {
    return static_cast<int32_t>(static_cast<uint32_t>(key >> 32) - 1);
  }
  static constexpr int32_t KeyLine(uint64_t key) noexcept {
    return static_cast<int32_t>(static_cast<uint32_t>(key));
  }
  int32_t code_file(int32_t code) const { return codes_[static_cast<size_t>(code)].file_id; }

  // Hot path, measured thread only.
  // A frame `key` of `code` starts (fresh_call = true, counts a call) or resumes after a
  // suspend / is adopted because it began before tracing (fresh_call = false). `line` is
  // the line it resumes on (no hit counted), or <= 0 when the next Line() names it.
  // If `key` is already open among the innermost frames (exit events were missed), the
  // frames above it are closed; so is that frame and a new one is pushed, unless this
  // continues it (fresh_call = false, same code).
  void Enter(int32_t code, FrameKey key, int64_t now_ns, bool fresh_call, int32_t line) noexcept {
    if (top_ != nullptr && (top_->key == key || (depth_ > 1 && top_[-1].key == key)) &&
        Repair(code, key, now_ns, fresh_call))
      return;
    Push(code, key, now_ns, fresh_call, line);
  }

  // Enter() followed by Line(key, line): a frame whose start the tracer learns from its
  // first line event.
  void EnterAtLine(int32_t code, FrameKey key, int64_t now_ns, bool fresh_call,
                   int32_t line) noexcept {
    if (top_ != nullptr && (top_->key == key || (depth_ > 1 && top_[-1].key == key)) &&
        Repair(code, key, now_ns, fresh_call)) {
      Line(key, line, now_ns);
      return;
    }
    Push(code, key, now_ns, fresh_call, line);
    if (top_ != nullptr && top_->key == key && top_->cell != nullptr) ++top_->cell->hits;
  }

  // A new line starts in frame `key`. Returns false, recording nothing, when `key` is not
  // the innermost open frame: the caller then reports the frame with Enter() and calls
  // Line() again.
  bool Line(FrameKey key, int32_t line, int64_t now_ns) noexcept {
    Frame* f = top_;
    if (f == nullptr || f->key != key) return false;
    if (f->cell != nullptr) f->cell->wall_ns += now_ns - f->line_start;
    f->line_start = now_ns;
    auto idx = static_cast<uint32_t>(line - f->base_line);
    if (idx >= f->cell_count) [[unlikely]] {
      LineOutsideRange(line);  // nothing is live after the call: the hot path saves no registers
      return true;
    }
    Cell* cell = f->cells + idx;
    f->cell = cell;
    ++cell->hits;
    if (publish_ != nullptr) publish_->store(LineKey(f->code, line), std::memory_order_relaxed);
    return true;
  }

  // Hot: EnterAtLine() of a fresh call in its common case, in one step. Returns false,
  // changing nothing, when the general path is needed: `key` is open near the top (a
  // repair), the stack is full, `line` lies outside the code's line array, or the caller's
  // current line lies inside it (a shadowing frame, see ShadowSave).
  bool TryEnterFreshAtLine(int32_t code, FrameKey key, int64_t now_ns, int32_t line) noexcept {
    Code& c = codes_[static_cast<size_t>(code)];
    auto idx = static_cast<uint32_t>(line - c.base_line);
    if (idx >= c.cell_count || depth_ == stack_.size()) return false;
    if (top_ != nullptr && (top_->key == key || (depth_ > 1 && top_[-1].key == key))) return false;
    if (SharedCallerLine(code, c) > 0) return false;
    Cell* cell = c.cells.data() + idx;
    PushFrame(c, code, key, cell, now_ns, kFresh);
    ++cell->hits;
    if (publish_ != nullptr) publish_->store(LineKey(code, line), std::memory_order_relaxed);
    return true;
  }

  // The current line of frame `key` starts again without a line change (a backward jump
  // to the same line: a one-line loop or an inlined comprehension): its slice is closed
  // and a new one begins, counting a hit. Returns false, recording nothing, when `key` is
  // not the innermost open frame or it has no current line yet.
  bool RepeatLine(FrameKey key, int64_t now_ns) noexcept {
    Frame* f = top_;
    if (f == nullptr || f->key != key || f->cell == nullptr) return false;
    f->cell->wall_ns += now_ns - f->line_start;
    f->line_start = now_ns;
    ++f->cell->hits;
    return true;
  }

  // Forgets the innermost frame's current line slice (its hit and its time so far): the
  // line that is stopping the session (`with profile():` on exit, `session.stop()`).
  void DiscardCurrentLine() noexcept {
    if (top_ == nullptr || top_->cell == nullptr) return;
    --top_->cell->hits;
    top_->cell = nullptr;
    Publish();
  }

  // Frame `key` leaves (return, unwind, or a suspend: yield / await). Frames above it
  // (missed exit events) are closed first; a key that is not open (a frame that began
  // before tracing and ran no recorded line) records nothing.
  void Exit(FrameKey key, int64_t now_ns) noexcept {
    if (!ExitTop(key, now_ns)) ExitDeeper(key, now_ns);
  }
  // Exit of the innermost frame only: true when `key` was it (tracers try this first and
  // decide what an unknown key means only when it fails).
  bool ExitTop(FrameKey key, int64_t now_ns) noexcept {
    if (top_ == nullptr || top_->key != key) return false;
    Pop(now_ns);
    return true;
  }

  // Closes every open frame at `now_ns` (the session stops inside them). Idempotent.
  void CloseAll(int64_t now_ns) noexcept;

  // Cold: the latest time an open frame started its current line or was entered (0 when
  // none is open).
  int64_t LatestEventNs() const noexcept;
  size_t depth() const { return depth_; }
  bool IsOpen(FrameKey key) const noexcept;  // cold: scans the stack
  int64_t mismatches() const { return mismatches_; }

  // Results: lines with at least one hit or nonzero time; functions with calls or time.
  std::vector<LineStats> Lines() const;
  std::vector<FunctionStats> Functions() const;

 private:
  struct Cell {
    int64_t wall_ns = 0;
    int64_t child_ns = 0;  // time in recorded callees while this line ran (self = wall - child)
    int64_t hits = 0;
    int64_t calls = 0;  // fresh calls of recorded functions started from this line
  };
  struct Code {
    int32_t file_id;
    std::string qualname;
    int32_t first_line;       // the definition's line (FunctionStats)
    int32_t base_line;        // line of cells[0]; lowered when a line below it appears
    std::vector<Cell> cells;  // index = line - base_line
    uint32_t cell_count = 0;  // cells.size(), kept for the hot path
    int64_t total_ns = 0;
    int64_t own_ns = 0;
    int64_t calls = 0;
    int32_t active = 0;  // open frames of this code on the stack (recursion)
  };
  struct Frame {
    FrameKey key;
    Cell* cell;           // the current line's cell; nullptr before the first line
    int64_t line_start;   // when the current line started
    int64_t enter;        // when this frame (activation slice) was entered
    int64_t child;        // recorded-callee time within this slice
    Cell* cells;          // the code's line array (refreshed when it grows)
    int32_t base_line;    // ... its first line
    uint32_t cell_count;  // ... and size
    int32_t code;
    // kFresh: this slice began with a fresh call (counted on the caller's line); kShadowed:
    // it has an entry on shadows_ (see ShadowSave).
    int32_t flags;
  };
  static constexpr int32_t kFresh = 1, kShadowed = 2;
  // A frame of another code object running on its caller's current source line (a
  // generator expression, lambda or 3.11 comprehension on the line that calls it): the
  // caller's line time already includes it, so what this activation adds to its own cell
  // for that line (wall and child time, against the values at entry) is taken out again
  // when it leaves, and the net (time on the line outside recorded callees) counts as the
  // caller line's self time. Rare, so kept beside the frame stack (same nesting), not in it.
  struct ShadowSave {
    int32_t code;
    int32_t line;
    int64_t wall0;
    int64_t child0;
  };
  // Frames this close to the top are searched when Enter() gets a key that is already open
  // (the innermost one and its caller: missed exit events are a repair path, not a case
  // the tracers produce).
  static constexpr size_t kRepairWindow = 2;

  [[gnu::cold]] Cell* GrowFor(int32_t code, int32_t line) noexcept;  // a line outside the range
  // Cold, from Line(): the innermost frame's new line lies outside its code's line array.
  [[gnu::noinline, gnu::cold]] void LineOutsideRange(int32_t line) noexcept;
  // Cold: `key` is open near the top (missed exit events). Closes the frames above it;
  // true when that frame goes on (no push), false when it was closed too (push a new one).
  bool Repair(int32_t code, FrameKey key, int64_t now_ns, bool fresh_call) noexcept;
  void Push(int32_t code, FrameKey key, int64_t now_ns, bool fresh_call, int32_t line) noexcept {
    Code& c = codes_[static_cast<size_t>(code)];
    Cell* cell = nullptr;
    if (line > 0) {
      auto idx = static_cast<uint32_t>(line - c.base_line);
      cell = idx < c.cell_count ? c.cells.data() + idx : GrowFor(code, line);
    }
    if (depth_ == stack_.size() && !GrowStack()) return;
    int32_t flags = fresh_call ? kFresh : 0;
    if (const int32_t shared = SharedCallerLine(code, c); shared > 0 && SaveShadow(code, shared))
      flags |= kShadowed;
    PushFrame(c, code, key, cell, now_ns, flags);
    if (publish_ != nullptr && cell != nullptr) Publish();
  }
  // The new innermost frame (the stack has room for it).
  void PushFrame(Code& c, int32_t code, FrameKey key, Cell* cell, int64_t now_ns,
                 int32_t flags) noexcept {
    top_ = stack_.data() + depth_++;
    *top_ =
        Frame{key, cell, now_ns, now_ns, 0, c.cells.data(), c.base_line, c.cell_count, code, flags};
    c.calls += flags & kFresh;
    ++c.active;
  }
  // The caller's current line when a new frame of `code` (`c`) would run on it — another
  // code object whose line range holds that line (see ShadowSave) — else 0.
  int32_t SharedCallerLine(int32_t code, const Code& c) const noexcept {
    const Frame* t = top_;
    if (t == nullptr || t->cell == nullptr || t->code == code) return 0;
    const int32_t line = t->base_line + static_cast<int32_t>(t->cell - t->cells);
    return static_cast<uint32_t>(line - c.base_line) < c.cell_count ? line : 0;
  }
  bool GrowStack() noexcept;  // cold: a new maximum depth; false (counted) when out of memory
  // Cold. When the caller of a new frame of `code` is in the same file on `line`: saves the
  // frame's cell for that line (true), see ShadowSave.
  [[gnu::noinline, gnu::cold]] bool SaveShadow(int32_t code, int32_t line) noexcept;
  // Cold, after the leaving frame's Pop: its ShadowSave. Takes back out what the frame added
  // to that cell, and its net (the time it spent on the line outside recorded callees) out
  // of the caller line's callee time, where Pop put it.
  [[gnu::noinline, gnu::cold]] void Unshadow() noexcept;
  void Pop(int64_t now_ns) noexcept {
    Frame* f = top_;
    if (f->cell != nullptr) f->cell->wall_ns += now_ns - f->line_start;
    Code& c = codes_[static_cast<size_t>(f->code)];
    int64_t elapsed = now_ns - f->enter;
    c.own_ns += elapsed - f->child;
    if (--c.active == 0) c.total_ns += elapsed;
    if (--depth_ == 0) {
      top_ = nullptr;
      if (publish_ != nullptr) Publish();
      return;
    }
    top_ = f - 1;
    top_->child += elapsed;
    if (top_->cell != nullptr) {
      top_->cell->child_ns += elapsed;
      top_->cell->calls += f->flags & kFresh;
    }
    if (publish_ != nullptr) Publish();
    if ((f->flags & kShadowed) != 0) [[unlikely]]
      Unshadow();  // a frame with a caller only (a depth-1 frame has none)
  }
  // The innermost frame's current line (or 0) to the publish target, if any.
  void Publish() noexcept {
    if (publish_ == nullptr) return;
    const Frame* f = top_;
    publish_->store(f != nullptr && f->cell != nullptr
                        ? LineKey(f->code, f->base_line + static_cast<int32_t>(f->cell - f->cells))
                        : 0,
                    std::memory_order_relaxed);
  }
  void ExitDeeper(FrameKey key, int64_t now_ns) noexcept;

  std::vector<std::string> files_;
  std::unordered_map<std::string, int32_t> file_ids_;
  std::vector<Code> codes_;
  std::vector<Frame> stack_;         // open frames are stack_[0, depth_); its size is the capacity
  std::vector<ShadowSave> shadows_;  // one per open frame flagged kShadowed, innermost last
  size_t depth_ = 0;
  Frame* top_ = nullptr;  // &stack_[depth_ - 1], nullptr when empty
  int64_t mismatches_ = 0;
  std::atomic<uint64_t>* publish_ = nullptr;
};

// Decides which source files are recorded. Cold path (the tracers cache per file).
//   recorded(path) = (under a root OR matches an include pattern)
//                    AND NOT matches an exclude pattern
//                    AND NOT (a library file, unless an include matched): inside
//                    site-packages / dist-packages, or under one of `library_dirs` (the
//                    interpreter's standard library) that holds no root
// Patterns are fnmatch globs where `*` also matches '/', tried against the absolute path and
// against the path relative to each root. Relative `path`s are taken relative to `cwd`.
// Symbolic links: a root, a library directory and a file are also taken by their resolved
// path (realpath(3), the only filesystem access): a file is recorded when either of its
// names lies under a root and is not library code by that name (a root reached through a
// link records the files under it whichever way they were imported; a package linked from
// site-packages into the project is recorded); an exclude that matches either form wins.
class PathFilter {
 public:
  PathFilter(std::vector<std::string> roots, std::vector<std::string> include,
             std::vector<std::string> exclude, std::string cwd,
             std::vector<std::string> library_dirs = {});
  bool Recorded(std::string_view path) const;

 private:
  bool Matches(const std::vector<std::string>& patterns, const std::string& abs) const;
  bool Library(const std::string& abs) const;
  bool UnderRoot(const std::string& abs) const;
  std::vector<std::string> roots_;
  std::vector<std::string> include_;
  std::vector<std::string> exclude_;
  std::vector<std::string> library_dirs_;
  std::string cwd_;
};

// The resolved form of an absolute path (realpath(3)); empty when it cannot be resolved
// (missing file) or equals `abs`.
std::string ResolvedPath(const std::string& abs);

// Lexically normalises an absolute path ("a/./b/../c" -> "a/c"); no filesystem access.
std::string NormalizePath(std::string_view path, std::string_view cwd);

}  // namespace gpuprof::lines
