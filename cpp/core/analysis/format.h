// Text formatting shared by the summary block, the full report and rule messages.
// Pure functions; every value a human reads goes through one of these so that the same
// quantity looks the same everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpuprof::analysis {

// printf into a std::string (format checked by the compiler).
std::string StrFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// 850 ns, 12.3 µs, 121.3 ms, 2.41 s, 3.5 min, 2.1 h. `extra_digits` adds decimals (for telling
// two close values apart: FormatDurations).
std::string FormatDuration(double ns, int extra_digits = 0);
// Two durations that a sentence compares ("from A to B", "A vs B"), each as FormatDuration, with
// as many extra decimals (up to 3) as it takes for different values to read differently. Values
// that still read the same are equal for a reader: DurationsDiffer says whether they do.
std::pair<std::string, std::string> FormatDurations(double a_ns, double b_ns);
bool DurationsDiffer(double a_ns, double b_ns);
// Run length for the cost line: "366.0 ms" below a second, "4.2 s" below 10 s, "41 s" below a
// minute, else whole minutes ("231 min"). A non-zero length never reads "0 s".
std::string FormatMinutes(double ns);
// A fraction (0.3412) as a percentage with `decimals` digits: "34%", "34.1%".
std::string FormatPercent(double fraction, int decimals = 0);
// A number with at most one decimal, trailing ".0" dropped: 989, 417.5, 15.7.
std::string FormatCompact(double value);
// US dollars: "$0.14", "$47.20"; a positive amount under half a cent is "<$0.01".
std::string FormatUsd(double usd);
// Binary units with one decimal: "512 B", "3.2 MiB", "79.6 GiB".
std::string FormatBytes(double bytes);
// A rate in decimal (SI) units, as disks and links are quoted: "850 B/s", "3.1 MB/s",
// "820 MB/s", "24.1 GB/s" (one decimal below 100 of a unit).
std::string FormatBandwidth(double bytes_per_second);
// A count with an SI suffix: "850", "6.1k", "5k", "120k", "1.2M".
std::string FormatCount(double n);
// A ratio with one decimal and a multiplication sign: "2.7×".
std::string FormatRatio(double ratio);
// Display columns of UTF-8 text (code points; every character is taken as one column).
size_t DisplayColumns(const std::string& text);
// Pads with spaces to `width` display columns (UTF-8 code points), left- or right-aligned.
std::string PadRight(const std::string& text, size_t width);
std::string PadLeft(const std::string& text, size_t width);
// `s` as one shell word: unchanged when it needs no quoting, else in single quotes.
std::string ShellQuoteIfNeeded(const std::string& s);
// steps.wait_source for a reader: "inter-step gap", "DataLoader next()",
// "wrap_dataloader"; "source unknown" when null.
std::string WaitSourceLabel(const std::optional<std::string>& source);
// `text` with every byte sequence that is not valid UTF-8 replaced by U+FFFD, so that text read
// from a damaged or hand-edited DB prints (and converts to a Python str) cleanly.
std::string ValidUtf8(const std::string& text);
// "1 sample", "3 samples".
std::string Plural(size_t n, const char* singular, const char* plural);
// "1–3, 5, 7–9" for ascending numbers (runs of consecutive ones as a range).
std::string NumberRanges(const std::vector<int64_t>& numbers);
// Ascending step numbers for a reader: "step 25", "steps 25, 50 and 80", "5 steps, every 25th
// (25, 50, …, 125)" when at least 3 are evenly spaced, else "7 steps (25, 31, 90, …)".
std::string FormatStepSet(const std::vector<int64_t>& steps);
// The spacing of at least 3 ascending, evenly spaced step numbers (25 for 24, 49, 74); nullopt
// otherwise.
std::optional<int64_t> StepPeriod(const std::vector<int64_t>& steps);
// "1st", "2nd", "3rd", "11th", "25th".
std::string Ordinal(int64_t n);
// "—" for an unknown value, else f(value).
template <typename T, typename F>
std::string OrDash(const std::optional<T>& value, F f) {
  return value ? f(*value) : std::string("—");
}

}  // namespace gpuprof::analysis
