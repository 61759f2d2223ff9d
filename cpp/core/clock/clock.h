// Monotonic nanosecond clock and the per-run wall-clock anchor.
#pragma once

#include <cstdint>
#include <ctime>

namespace gpuprof::clock {

// CLOCK_MONOTONIC in nanoseconds. Safe from any thread; noexcept; no allocation.
inline int64_t NowNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// CLOCK_REALTIME in nanoseconds since the Unix epoch.
inline int64_t UnixNowNs() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Pairs one monotonic reading with one wall-clock reading taken back to back, so that a
// monotonic timestamp of this run can be converted to Unix time (for cross-run and
// cross-rank alignment). All timestamps stored for a run are monotonic ns relative to
// `mono_ns` ("run-relative ns").
struct Anchor {
  int64_t mono_ns = 0;
  int64_t unix_ns = 0;

  static Anchor Take() noexcept;
  int64_t ToRelative(int64_t mono) const noexcept { return mono - mono_ns; }
  int64_t ToUnix(int64_t mono) const noexcept { return unix_ns + (mono - mono_ns); }
};

}  // namespace gpuprof::clock
