// linescope's single-file HTML report: the payload it shows and the page that shows it.
//
// Two steps, both pure (no I/O, no environment):
//   1. BuildReportPayload: a `linescope-result/1` document (ProfileResult.to_dict() as JSON)
//      -> a `linescope-report/1` document. Everything the report *decides* is computed here:
//      per-file totals and hottest lines, overview cards, the most expensive lines, function
//      definition links, heat levels, the memory section (only when memory was collected)
//      and the GPU section (only for a backend that declares GPU collection, when it was
//      requested), including the card values, the notices for unavailable values and the
//      headline that says which method produced the numbers, the run status, which
//      columns a backend fills (a sampling backend has no Hits), the definitions calls link
//      to, and which reported lines lie outside the captured source (left out of every
//      total, listed in a diagnostic). The format is documented in
//      docs/linescope.md ("Report payload").
//   2. RenderReportHtml: the payload -> ONE self-contained HTML file. The web assets
//      (web/report/manifest.txt: ES modules, CSS, the page template) are embedded into this
//      library at build time and bundled into a single inline module script; the payload is
//      inlined in a <script type="application/json">. The page makes no network request
//      (a Content-Security-Policy forbids any) and works from file://.
//
// Unknown values stay null in the payload (the page shows "—"), never 0.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpuprof::lines {

inline constexpr const char* kReportFormat = "linescope-report/1";
inline constexpr const char* kResultFormat = "linescope-result/1";

// Heat levels are 0..kHeatLevels-1: 0 = no time; otherwise
// max(1, ceil((kHeatLevels-1) * sqrt(time / max_time))), max_time over all lines of the run.
inline constexpr int kHeatLevels = 10;
// The "most expensive lines" table of the overview.
inline constexpr size_t kTopLines = 50;
// The memory timeline is reduced to at most this many points (peak-preserving).
inline constexpr size_t kMaxTimelinePoints = 2000;
// A source line longer than this many characters (code points) is cut in the payload to its
// first kMaxSourceLineChars - 1 followed by "…" (U+2026): a generated line megabytes long
// would otherwise fill the page (and every table that shows it) with one cell.
inline constexpr size_t kMaxSourceLineChars = 1000;
// Lines outside the captured source (a file without a snapshot, or a line number past its
// end) are left out of every table and total; the diagnostic names at most this many.
inline constexpr size_t kMaxDroppedListed = 10;

// Parses a linescope-result/1 document and computes the linescope-report/1 payload (compact
// JSON). Errors (not JSON, wrong format, wrong field types) name the problem.
Expected<std::string> BuildReportPayload(std::string_view result_json);

// `line` (UTF-8, one source line) cut to kMaxSourceLineChars as the payload holds it.
std::string ClipSourceLine(std::string line);

// The level of `value` on the heat scale whose top is `max_value` (see kHeatLevels).
int HeatLevel(int64_t value, int64_t max_value);

// Reduces (t, v) points (t ascending) to at most `max_points`: equal index buckets, each
// keeping its highest-v point; the first and last points are kept.
std::vector<std::pair<int64_t, int64_t>> DownsampleKeepPeaks(
    const std::vector<std::pair<int64_t, int64_t>>& points, size_t max_points);

// The page: the embedded assets with `payload_json` inlined. Every '<' in the payload is
// written as \u003c, so no source text can end the script element or open a comment.
std::string RenderReportHtml(std::string_view payload_json);

// --- the asset bundler (exposed for tests) --------------------------------------------------
//
// The report's JavaScript is plain ES modules under web/ (no build step). They are inlined as
// one module script by this convention, checked when bundling:
//   - web/report/manifest.txt lists the modules in dependency order (a module imports only
//     modules listed before it); the last one is the entry point.
//   - imports are single top-level lines `import { a, b as c } from "./x.js";` with a relative
//     path; exports are declarations `export function|const|let|class NAME`.
//   - no default exports, export lists, re-exports, dynamic imports or side-effect imports.
// Each module becomes `const __ls_m<i> = (() => { <body>; return { exports }; })();` and each
// import `const { a, b: c } = __ls_m<j>;`. The bundle ends by publishing the module objects on
// `globalThis.__linescope.modules[path]` (used by the browser tests of the pure functions).
struct WebAsset {
  std::string path;  // relative to web/, e.g. "lib/format.js"
  std::string text;
};

// Bundles `modules` (manifest order) into one script. Errors name the module and the line.
Expected<std::string> BundleModules(const std::vector<WebAsset>& modules);

// The assets embedded at build time: the manifest's modules in order, the stylesheet and the
// page template (generated by cpp/core/lines/CMakeLists.txt from web/).
const std::vector<WebAsset>& EmbeddedModules();
const WebAsset& EmbeddedStylesheet();
const WebAsset& EmbeddedTemplate();

}  // namespace gpuprof::lines
