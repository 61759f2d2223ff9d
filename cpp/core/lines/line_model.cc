#include "lines/line_model.h"

#include <fnmatch.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <map>
#include <tuple>
#include <utility>

namespace gpuprof::lines {

LineAggregator::LineAggregator() {
  stack_.resize(256);
  shadows_.reserve(16);
}

int32_t LineAggregator::InternFile(std::string_view path) {
  std::string key(path);
  auto it = file_ids_.find(key);
  if (it != file_ids_.end()) return it->second;
  auto id = static_cast<int32_t>(files_.size());
  files_.push_back(key);
  file_ids_.emplace(std::move(key), id);
  return id;
}

int32_t LineAggregator::AddCode(int32_t file_id, std::string qualname, int32_t first_line,
                                int32_t last_line) {
  if (first_line < 1) first_line = 1;
  if (last_line < first_line) last_line = first_line;
  Code c{file_id, std::move(qualname), first_line, first_line, {}, 0, 0, 0, 0, 0};
  c.cells.resize(static_cast<size_t>(last_line - first_line + 1));
  c.cell_count = static_cast<uint32_t>(c.cells.size());
  codes_.push_back(std::move(c));
  return static_cast<int32_t>(codes_.size() - 1);
}

LineAggregator::Cell* LineAggregator::GrowFor(int32_t code, int32_t line) noexcept {
  Code& c = codes_[static_cast<size_t>(code)];
  if (line < 1) return nullptr;
  // Rare: a line outside the registered range grows the array once (cold within hot).
  try {
    if (line < c.base_line) {
      c.cells.insert(c.cells.begin(), static_cast<size_t>(c.base_line - line), Cell{});
      c.base_line = line;
    }
    auto idx = static_cast<size_t>(line - c.base_line);
    if (idx >= c.cells.size()) c.cells.resize(idx + 1);
    c.cell_count = static_cast<uint32_t>(c.cells.size());
  } catch (...) {
    return nullptr;
  }
  // The array may have moved: open frames of this code find it and their cell again.
  for (size_t i = 0; i < depth_; ++i) {
    Frame& f = stack_[i];
    if (f.code != code) continue;
    if (f.cell != nullptr)
      f.cell = c.cells.data() + (f.cell - f.cells) + (f.base_line - c.base_line);
    f.cells = c.cells.data();
    f.base_line = c.base_line;
    f.cell_count = c.cell_count;
  }
  return &c.cells[static_cast<size_t>(line - c.base_line)];
}

void LineAggregator::LineOutsideRange(int32_t line) noexcept {
  Frame* f = top_;
  Cell* cell = GrowFor(f->code, line);
  f->cell = cell;
  if (cell != nullptr) ++cell->hits;
  if (publish_ != nullptr) publish_->store(LineKey(f->code, line), std::memory_order_relaxed);
}

bool LineAggregator::SaveShadow(int32_t code, int32_t line) noexcept {
  const Code& c = codes_[static_cast<size_t>(code)];
  if (codes_[static_cast<size_t>(top_->code)].file_id != c.file_id) return false;
  const Cell& cell = c.cells[static_cast<size_t>(line - c.base_line)];
  try {
    shadows_.push_back(ShadowSave{code, line, cell.wall_ns, cell.child_ns});
  } catch (...) {
    return false;  // out of memory: the line's time is counted per frame, as before
  }
  return true;
}

void LineAggregator::Unshadow() noexcept {
  const ShadowSave save = shadows_.back();
  shadows_.pop_back();
  Code& c = codes_[static_cast<size_t>(save.code)];
  Cell& cell = c.cells[static_cast<size_t>(save.line - c.base_line)];  // the array may have grown
  const int64_t net = (cell.wall_ns - save.wall0) - (cell.child_ns - save.child0);
  cell.wall_ns = save.wall0;
  cell.child_ns = save.child0;
  if (top_ != nullptr && top_->cell != nullptr) top_->cell->child_ns -= net;
}

bool LineAggregator::Repair(int32_t code, FrameKey key, int64_t now_ns, bool fresh_call) noexcept {
  // The frames above `key` have left; so has that frame itself unless this is the same
  // activation going on (a resume or an adoption of the same code), since keys are reused
  // only after a frame ends.
  for (size_t i = 0; i < depth_ && i < kRepairWindow; ++i) {
    if (stack_[depth_ - 1 - i].key != key) continue;
    ++mismatches_;
    for (size_t j = 0; j < i; ++j) Pop(now_ns);
    if (!fresh_call && top_->code == code) return true;
    Pop(now_ns);
    return false;
  }
  return false;
}

bool LineAggregator::GrowStack() noexcept {
  try {
    stack_.resize(stack_.size() * 2 + 16);
  } catch (...) {
    ++mismatches_;
    return false;
  }
  top_ = depth_ > 0 ? stack_.data() + depth_ - 1 : nullptr;
  return true;
}

void LineAggregator::ExitDeeper(FrameKey key, int64_t now_ns) noexcept {
  size_t i = depth_;
  while (i > 0 && stack_[i - 1].key != key) --i;
  if (i == 0) return;  // not open: began before tracing
  ++mismatches_;
  while (depth_ >= i) Pop(now_ns);
}

bool LineAggregator::IsOpen(FrameKey key) const noexcept {
  for (size_t i = 0; i < depth_; ++i)
    if (stack_[i].key == key) return true;
  return false;
}

int64_t LineAggregator::LatestEventNs() const noexcept {
  int64_t latest = 0;
  for (size_t i = 0; i < depth_; ++i)
    latest = std::max({latest, stack_[i].line_start, stack_[i].enter});
  return latest;
}

void LineAggregator::CloseAll(int64_t now_ns) noexcept {
  while (depth_ > 0) Pop(now_ns);
}

std::vector<LineStats> LineAggregator::Lines() const {
  std::vector<LineStats> out;
  for (const Code& c : codes_) {
    for (size_t i = 0; i < c.cells.size(); ++i) {
      const Cell& cell = c.cells[i];
      if (cell.hits == 0 && cell.wall_ns == 0 && cell.calls == 0) continue;
      LineStats s;
      s.file_id = c.file_id;
      s.line = c.base_line + static_cast<int32_t>(i);
      s.wall_time_ns = cell.wall_ns;
      s.self_time_ns = cell.wall_ns - cell.child_ns;
      s.hits = cell.hits;
      s.calls = cell.calls;
      out.push_back(s);
    }
  }
  // Several code objects can share a line (a lambda or comprehension on a def's line):
  // merge them so that a (file, line) appears once.
  std::sort(out.begin(), out.end(), [](const LineStats& a, const LineStats& b) {
    return a.file_id != b.file_id ? a.file_id < b.file_id : a.line < b.line;
  });
  std::vector<LineStats> merged;
  for (const LineStats& s : out) {
    if (!merged.empty() && merged.back().file_id == s.file_id && merged.back().line == s.line) {
      merged.back().wall_time_ns += s.wall_time_ns;
      merged.back().self_time_ns += s.self_time_ns;
      merged.back().hits += s.hits;
      merged.back().calls += s.calls;
    } else {
      merged.push_back(s);
    }
  }
  return merged;
}

std::vector<FunctionStats> LineAggregator::Functions() const {
  // Code objects with the same file, first line and qualname are one function to the user
  // (a notebook cell compiled in parts, a module or definition executed twice): one row.
  std::vector<FunctionStats> out;
  std::map<std::tuple<int32_t, int32_t, std::string_view>, size_t> row;
  for (const Code& c : codes_) {
    if (c.calls == 0 && c.total_ns == 0) continue;
    auto [it, fresh] = row.try_emplace({c.file_id, c.first_line, c.qualname}, out.size());
    if (!fresh) {
      FunctionStats& f = out[it->second];
      f.total_time_ns += c.total_ns;
      f.own_time_ns += c.own_ns;
      f.calls += c.calls;
      continue;
    }
    out.push_back(
        FunctionStats{c.qualname, c.file_id, c.first_line, c.total_ns, c.own_ns, c.calls});
  }
  return out;
}

std::string NormalizePath(std::string_view path, std::string_view cwd) {
  std::string full;
  if (!path.empty() && path.front() == '/') {
    full = std::string(path);
  } else {
    full = std::string(cwd) + "/" + std::string(path);
  }
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= full.size()) {
    size_t j = full.find('/', i);
    if (j == std::string::npos) j = full.size();
    std::string part = full.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    i = j + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::string ResolvedPath(const std::string& abs) {
  char buf[PATH_MAX];
  if (abs.empty() || ::realpath(abs.c_str(), buf) == nullptr) return {};
  std::string real(buf);
  return real == abs ? std::string() : real;
}

namespace {
bool Under(const std::string& abs, const std::string& dir) {
  return dir == "/" || abs == dir || abs.compare(0, dir.size() + 1, dir + "/") == 0;
}
}  // namespace

PathFilter::PathFilter(std::vector<std::string> roots, std::vector<std::string> include,
                       std::vector<std::string> exclude, std::string cwd,
                       std::vector<std::string> library_dirs)
    : include_(std::move(include)), exclude_(std::move(exclude)), cwd_(std::move(cwd)) {
  for (const auto& r : roots) {
    roots_.push_back(NormalizePath(r, cwd_));
    std::string real = ResolvedPath(roots_.back());
    if (!real.empty()) roots_.push_back(std::move(real));
  }
  // A library directory that holds a root is the user's project (profiling the stdlib's own
  // sources): it stays recorded.
  for (const auto& d : library_dirs) {
    if (d.empty()) continue;
    const std::string dir = NormalizePath(d, cwd_);
    for (std::string form : {dir, ResolvedPath(dir)}) {
      if (form.empty() || form == "/") continue;
      bool holds_root = std::any_of(roots_.begin(), roots_.end(),
                                    [&](const std::string& r) { return Under(r, form); });
      if (!holds_root) library_dirs_.push_back(std::move(form));
    }
  }
}

bool PathFilter::Matches(const std::vector<std::string>& patterns, const std::string& abs) const {
  for (const auto& p : patterns) {
    if (fnmatch(p.c_str(), abs.c_str(), 0) == 0) return true;
    for (const auto& r : roots_) {
      std::string prefix = r == "/" ? r : r + "/";
      if (abs.compare(0, prefix.size(), prefix) == 0 &&
          fnmatch(p.c_str(), abs.c_str() + prefix.size(), 0) == 0) {
        return true;
      }
    }
  }
  return false;
}

bool PathFilter::Library(const std::string& abs) const {
  if (abs.find("/site-packages/") != std::string::npos ||
      abs.find("/dist-packages/") != std::string::npos)
    return true;
  for (const auto& d : library_dirs_)
    if (Under(abs, d)) return true;
  return false;
}

bool PathFilter::UnderRoot(const std::string& abs) const {
  for (const auto& r : roots_)
    if (Under(abs, r)) return true;
  return false;
}

bool PathFilter::Recorded(std::string_view path) const {
  if (path.empty() || path.front() == '<') {
    // Synthetic file names (<string>, <stdin>, <frozen ...>, notebook cells) only by an
    // explicit include, and, as for files, an exclude wins over it.
    std::string p(path);
    for (const auto& pat : exclude_)
      if (fnmatch(pat.c_str(), p.c_str(), 0) == 0) return false;
    for (const auto& pat : include_)
      if (fnmatch(pat.c_str(), p.c_str(), 0) == 0) return true;
    return false;
  }
  const std::string abs = NormalizePath(path, cwd_);
  const std::string real = ResolvedPath(abs);  // empty: no other form
  auto either = [&](auto&& test) { return test(abs) || (!real.empty() && test(real)); };
  if (either([&](const std::string& p) { return Matches(exclude_, p); })) return false;
  if (either([&](const std::string& p) { return Matches(include_, p); })) return true;
  // The user's code by one of its names: under a root and not library code there (a package
  // linked from site-packages into the project is the project's; a library linked into the
  // project is not library code by the name it has there).
  return either([&](const std::string& p) { return UnderRoot(p) && !Library(p); });
}

}  // namespace gpuprof::lines
