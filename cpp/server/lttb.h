// Largest-Triangle-Three-Buckets downsampling (Steinarsson 2013): keeps the first and last
// points and, per bucket in between, the point that makes the largest triangle with the point
// kept before it and the mean of the next bucket. Keeps a series' peaks and shape at a few
// thousand points, so a 24 h run never reaches the browser as 86,400 points per GPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace gpuprof::server {

using SeriesPoint = std::pair<int64_t, double>;  // (ts_ns, value), ascending ts

inline std::vector<SeriesPoint> Lttb(const std::vector<SeriesPoint>& in, size_t threshold) {
  if (threshold >= in.size() || threshold < 3) {
    if (threshold >= in.size() || in.size() <= 2) return in;
    return {in.front(), in.back()};
  }
  std::vector<SeriesPoint> out;
  out.reserve(threshold);
  const double every = static_cast<double>(in.size() - 2) / static_cast<double>(threshold - 2);
  size_t a = 0;
  out.push_back(in[0]);
  for (size_t i = 0; i < threshold - 2; ++i) {
    // The next bucket's mean.
    size_t avg_start = static_cast<size_t>(std::floor((i + 1) * every)) + 1;
    size_t avg_end = std::min(static_cast<size_t>(std::floor((i + 2) * every)) + 1, in.size());
    if (avg_start >= avg_end) avg_start = avg_end - 1;
    double avg_x = 0, avg_y = 0;
    for (size_t j = avg_start; j < avg_end; ++j) {
      avg_x += static_cast<double>(in[j].first);
      avg_y += in[j].second;
    }
    const double n = static_cast<double>(avg_end - avg_start);
    avg_x /= n;
    avg_y /= n;
    // This bucket's point with the largest triangle (a, it, next mean).
    const size_t start = static_cast<size_t>(std::floor(i * every)) + 1;
    const size_t end = static_cast<size_t>(std::floor((i + 1) * every)) + 1;
    const double ax = static_cast<double>(in[a].first), ay = in[a].second;
    double best = -1;
    size_t pick = start;
    for (size_t j = start; j < end && j < in.size(); ++j) {
      const double area = std::fabs((ax - avg_x) * (in[j].second - ay) -
                                    (ax - static_cast<double>(in[j].first)) * (avg_y - ay));
      if (area > best) {
        best = area;
        pick = j;
      }
    }
    out.push_back(in[pick]);
    a = pick;
  }
  out.push_back(in.back());
  return out;
}

}  // namespace gpuprof::server
