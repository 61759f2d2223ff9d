#include "clock/clock.h"

namespace gpuprof::clock {

Anchor Anchor::Take() noexcept {
  // Bracket the wall read with two monotonic reads and use their midpoint: the pair is
  // then off by at most half the bracket width.
  const int64_t before = NowNs();
  const int64_t unix_now = UnixNowNs();
  const int64_t after = NowNs();
  return Anchor{before + (after - before) / 2, unix_now};
}

}  // namespace gpuprof::clock
