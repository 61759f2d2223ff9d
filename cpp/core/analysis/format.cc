#include "analysis/format.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace gpuprof::analysis {

std::string StrFormat(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out;
  if (n > 0) {
    out.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data(), out.size(), fmt, args);
    out.resize(static_cast<size_t>(n));
  }
  va_end(args);
  return out;
}

std::string FormatDuration(double ns, int extra_digits) {
  const double a = std::fabs(ns);
  const int e = extra_digits < 0 ? 0 : extra_digits;
  if (a < 1e3) return StrFormat("%.*f ns", e, ns);
  if (a < 1e6) return StrFormat("%.*f µs", 1 + e, ns / 1e3);
  if (a < 1e9) return StrFormat("%.*f ms", 1 + e, ns / 1e6);
  if (a < 60e9) return StrFormat("%.*f s", 2 + e, ns / 1e9);
  if (a < 3600e9) return StrFormat("%.*f min", 1 + e, ns / 60e9);
  return StrFormat("%.*f h", 1 + e, ns / 3600e9);
}

std::pair<std::string, std::string> FormatDurations(double a_ns, double b_ns) {
  std::pair<std::string, std::string> out{FormatDuration(a_ns), FormatDuration(b_ns)};
  for (int extra = 1; extra <= 3 && a_ns != b_ns && out.first == out.second; ++extra) {
    out = {FormatDuration(a_ns, extra), FormatDuration(b_ns, extra)};
  }
  return out;
}

bool DurationsDiffer(double a_ns, double b_ns) {
  const auto [a, b] = FormatDurations(a_ns, b_ns);
  return a != b;
}

std::string FormatMinutes(double ns) {
  const double a = std::fabs(ns);
  if (a == 0) return "0 s";
  if (a < 1e9) return FormatDuration(ns);
  if (a < 9.95e9) return StrFormat("%.1f s", ns / 1e9);
  if (a < 59.5e9) return StrFormat("%.0f s", ns / 1e9);
  return StrFormat("%.0f min", ns / 60e9);
}

std::string FormatPercent(double fraction, int decimals) {
  return StrFormat("%.*f%%", decimals, fraction * 100.0);
}

std::string FormatCompact(double value) {
  std::string s = StrFormat("%.1f", value);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  if (s == "-0") s = "0";
  return s;
}

std::string FormatUsd(double usd) {
  if (usd > 0 && usd < 0.005) return "<$0.01";
  return StrFormat("$%.2f", usd);
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) return StrFormat("%.0f B", v);
  return StrFormat("%.1f %s", v, kUnits[unit]);
}

size_t DisplayColumns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count UTF-8 lead bytes
  return n;
}

std::string PadRight(const std::string& text, size_t width) {
  const size_t cols = DisplayColumns(text);
  return cols >= width ? text : text + std::string(width - cols, ' ');
}

std::string PadLeft(const std::string& text, size_t width) {
  const size_t cols = DisplayColumns(text);
  return cols >= width ? text : std::string(width - cols, ' ') + text;
}

std::string ValidUtf8(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // No overlong forms, no surrogates, nothing above U+10FFFF.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  return out;
}

std::string NumberRanges(const std::vector<int64_t>& numbers) {
  std::string out;
  for (size_t i = 0; i < numbers.size();) {
    size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(numbers[i]);
    if (j > i) out += "–" + std::to_string(numbers[j]);
    i = j + 1;
  }
  return out;
}

std::string Ordinal(int64_t n) {
  const int64_t tens = n % 100;
  const int64_t last = n % 10;
  const char* suffix = "th";
  if (tens < 11 || tens > 13) {
    if (last == 1) suffix = "st";
    if (last == 2) suffix = "nd";
    if (last == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

std::optional<int64_t> StepPeriod(const std::vector<int64_t>& steps) {
  if (steps.size() < 3) return std::nullopt;
  const int64_t period = steps[1] - steps[0];
  if (period <= 0) return std::nullopt;
  for (size_t i = 2; i < steps.size(); ++i) {
    if (steps[i] - steps[i - 1] != period) return std::nullopt;
  }
  return period;
}

std::string FormatStepSet(const std::vector<int64_t>& steps) {
  const size_t n = steps.size();
  if (n == 0) return "no steps";
  if (n == 1) return "step " + std::to_string(steps[0]);
  const auto joined = [&](size_t count) {
    std::string out;
    for (size_t i = 0; i < count; ++i) {
      if (i) out += i + 1 == count && count == n ? " and " : ", ";
      out += std::to_string(steps[i]);
    }
    return out;
  };
  if (n <= 3) return "steps " + joined(n);
  if (const auto period = StepPeriod(steps)) {
    return StrFormat("%zu steps, every %s (%lld, %lld, …, %lld)", n,
                     *period == 1 ? "step" : Ordinal(*period).c_str(),
                     static_cast<long long>(steps[0]), static_cast<long long>(steps[1]),
                     static_cast<long long>(steps[n - 1]));
  }
  return StrFormat("%zu steps (%s, …)", n, joined(3).c_str());
}

std::string Plural(size_t n, const char* singular, const char* plural) {
  return StrFormat("%zu %s", n, n == 1 ? singular : plural);
}

namespace {
// One decimal below 100, none above: "3.1", "820".
std::string Scaled(double v) {
  return std::fabs(v) < 99.95 ? StrFormat("%.1f", v) : StrFormat("%.0f", v);
}
}  // namespace

std::string FormatBandwidth(double bps) {
  const double a = std::fabs(bps);
  if (a < 1e3) return StrFormat("%.0f B/s", bps);
  if (a < 1e6) return Scaled(bps / 1e3) + " kB/s";
  if (a < 1e9) return Scaled(bps / 1e6) + " MB/s";
  return Scaled(bps / 1e9) + " GB/s";
}

std::string FormatCount(double n) {
  const double a = std::fabs(n);
  if (a < 1e3) return StrFormat("%.0f", n);
  if (a < 1e6) return (a < 99.95e3 ? FormatCompact(n / 1e3) : Scaled(n / 1e3)) + "k";
  return (a < 99.95e6 ? FormatCompact(n / 1e6) : Scaled(n / 1e6)) + "M";
}

std::string ShellQuoteIfNeeded(const std::string& s) {
  if (s.find_first_of(" \t'\"$") == std::string::npos && !s.empty()) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

std::string FormatRatio(double ratio) { return StrFormat("%.1f×", ratio); }

std::string WaitSourceLabel(const std::optional<std::string>& source) {
  if (!source) return "source unknown";
  if (*source == "gap") return "inter-step gap";
  if (*source == "dataloader") return "DataLoader next()";
  if (*source == "explicit") return "wrap_dataloader";
  return *source;
}

}  // namespace gpuprof::analysis
