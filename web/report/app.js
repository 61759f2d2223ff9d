// The linescope report page: reads the linescope-report/1 payload (inlined by the C++
// renderer, see docs/linescope.md) and renders the sidebar and the views. Everything the
// report decides (totals, heat levels, card values, notices) is computed in C++; this file
// only lays it out. Unknown values (null) render as "—" and sort last.
import { UNKNOWN, formatBytes, formatCount, formatNs, formatPercent, formatSignedBytes, isUnknown } from "../lib/format.js";
import { el, escapeHtml } from "../lib/dom.js";
import { sortableTable } from "../lib/table.js";
import { attachChartHover, lineChartSvg } from "../lib/chart.js";
import { lineHref, parseHash, viewHref } from "./links.js";
import { resolveCall, symbolIndex, tokenizePython, tokensToHtml } from "./highlight.js";
import { startTheme, themeToggle } from "./theme.js";
import { card, section } from "./parts.js";
import { buildSparkView, sparkLineBadges, sparkViewKey } from "./spark.js";

const data = JSON.parse(document.getElementById("linescope-data").textContent);
const cols = data.columns;
const main = document.getElementById("content");
const nav = document.getElementById("sidebar");
const topbar = document.getElementById("topbar");
startTheme();  // before anything renders: no flash of the other theme
const symbols = symbolIndex(data.symbols);
// Hits and Avg/hit only where the backend counts hits (never for a sampling backend).
const showHits = cols.hits !== false;

// ---- helpers ------------------------------------------------------------------------------

function sourceText(file, line) {
  const src = data.files[file].source;
  if (!src || line < 1 || line > src.length) return null;
  return src[line - 1];
}

function locationLabel(l) {
  return `${data.files[l.file].display}:${l.line}`;
}

function locationLink(l) {
  return `<a href="${lineHref(l.file, l.line)}">${escapeHtml(locationLabel(l))}</a>`;
}

// Each file's source tokenized once (triple-quoted strings span lines).
const tokenCache = new Map();
function fileTokens(file) {
  if (!tokenCache.has(file)) {
    const src = data.files[file].source;
    tokenCache.set(file, src ? tokenizePython(src) : null);
  }
  return tokenCache.get(file);
}

// The highlighted markup of a source line; calls link to their definitions. `trim` drops
// the indentation (tables that list lines of several places).
function codeHtml(file, line, trim = false) {
  const all = fileTokens(file);
  const tokens = all && line >= 1 && line <= all.length ? all[line - 1] : null;
  if (!tokens) return null;
  let list = tokens;
  if (trim && list.length) {
    list = list.map((t) => [...t]);
    list[0][1] = list[0][1].replace(/^\s+/, "");
    list[list.length - 1][1] = list[list.length - 1][1].replace(/\s+$/, "");
  }
  return tokensToHtml(list, (name, attribute) => {
    const target = resolveCall(symbols, name, attribute, file);
    return target ? lineHref(target.file, target.line) : null;
  });
}

function codeCell(text, file = null, line = null) {
  if (isUnknown(text)) return UNKNOWN;
  const html = file === null ? null : codeHtml(file, line, true);
  return `<code class="py">${html ?? escapeHtml(text.trim())}</code>`;
}

// A time on its heat level's background; unknown -> "—" (no badge).
function heatCell(ns, level, kind) {
  if (isUnknown(ns)) return UNKNOWN;
  return `<span class="heat heat-${level}" data-heat="${level}" data-kind="${kind}">${escapeHtml(formatNs(ns))}</span>`;
}

// A numeric column: sort key = the value, cell = its formatted text (unknown -> "—").
function numCol(key, label, get, fmt, extra = {}) {
  return { key, label, numeric: true, value: get, html: (r) => escapeHtml(fmt(get(r))), ...extra };
}

// A time with a bar for its share of the largest (share null: no bar, e.g. never ran).
function timeBar(ns, share) {
  const text = escapeHtml(formatNs(ns));
  if (isUnknown(share)) return text;
  const pct = Math.max(0, Math.min(100, share * 100)).toFixed(1);
  return `<span class="bar-cell"><span class="bar" style="width:${pct}%" aria-hidden="true"></span>` +
    `<span class="bar-text">${text}</span></span>`;
}

// What produced the GPU numbers (payload gpu.headline, decided in C++): the method, linked
// to the GPU view on the overview, when something was measured; else the sentence saying
// that nothing was.
function gpuHeadline(g, link) {
  if (!(g.measured && g.method)) {
    return [link ? el("a", { href: viewHref("gpu") }, g.headline) : g.headline];
  }
  const name = link ? el("a", { href: viewHref("gpu"), "data-method": g.method }, g.method)
                    : el("strong", { "data-method": g.method }, g.method);
  return ["GPU numbers: ", name, ` \u2014 ${g.method_label}`];
}

function lineRows(indices) {
  return indices.map((i) => data.lines[i]);
}

const locationCol = {
  key: "location", label: "Location",
  value: (l) => `${data.files[l.file].display}\u0000${String(l.line).padStart(9, "0")}`,
  html: locationLink,
};
const sourceCol = {
  key: "source", label: "Source", cls: "src",
  // sorted by the text shown: without its indentation
  value: (l) => { const t = sourceText(l.file, l.line); return isUnknown(t) ? t : t.trim(); },
  html: (l) => codeCell(sourceText(l.file, l.line), l.file, l.line),
};

// ---- views --------------------------------------------------------------------------------

function overviewView() {
  const o = data.overview;
  const parts = [];
  const started = isUnknown(data.started_at) ? UNKNOWN : new Date(data.started_at * 1000).toLocaleString();
  parts.push(el("p", { class: "meta" }, `backend ${data.backend} \u00b7 started ${started}`));
  if (data.gpu) {
    parts.push(el("p", { class: "meta gpu-headline" }, ...gpuHeadline(data.gpu, true)));
  }
  const warnings = [...data.warnings];
  if (data.dropped) warnings.push(data.dropped.message);
  if (warnings.length) {
    parts.push(el("section", { class: "warnings", "aria-labelledby": "h-warnings" },
      el("h2", { id: "h-warnings" }, `Warnings (${warnings.length})`),
      el("ul", {}, warnings.map((w) => el("li", {}, w)))));
  }
  parts.push(el("div", { class: "cards" },
    card("elapsed", "Elapsed", formatNs(o.elapsed_ns)),
    card("snapshots", "Source snapshots", formatCount(o.snapshots),
         { sub: `${formatCount(o.files)} file${o.files === 1 ? "" : "s"} recorded` }),
    card("functions", "Functions", formatCount(o.functions),
         { sub: o.functions_never_ran ? `${formatCount(o.functions_never_ran)} never ran` : null }),
    card("executed-lines", "Executed lines", formatCount(o.executed_lines))));
  const columns = [
    numCol("time", "Time", (l) => l.time_ns, formatNs,
           { html: (l) => heatCell(l.time_ns, l.heat, "time"),
             title: "wall time, including everything called from the line" }),
  ];
  if (cols.self) columns.push(numCol("self", "Own time", (l) => l.self_ns, formatNs));
  if (showHits) {
    columns.push(numCol("hits", "Hits", (l) => l.hits, formatCount),
                 numCol("avg", "Avg/hit", (l) => l.avg_ns, formatNs));
  }
  if (cols.samples) columns.push(numCol("samples", "Samples", (l) => l.samples, formatCount));
  if (cols.gpu) columns.push(numCol("gpu_time", "GPU time", (l) => l.gpu_time_ns, formatNs));
  columns.push(locationCol, sourceCol);
  const t = sortableTable({ columns, rows: lineRows(o.top_lines), sort: { key: "time", dir: "desc" },
                            caption: `Most expensive lines (top ${o.top_lines.length})`,
                            className: "lines", label: "Most expensive lines" });
  parts.push(t.table);
  return section("overview", "Overview", ...parts);
}

function filesView() {
  const rows = data.files.map((f, i) => ({ ...f, index: i }));
  const columns = [
    { key: "file", label: "File", value: (f) => f.display,
      html: (f) => `<a href="${lineHref(f.index)}" title="${escapeHtml(f.path)}">${escapeHtml(f.display)}</a>` },
    numCol("executed", "Executed lines", (f) => f.executed_lines, formatCount),
    numCol("time", "Time", (f) => f.time_ns, formatNs,
           { title: "sum of the lines' own time (self time where known, else wall time)" }),
    numCol("share", "Share", (f) => f.share, formatPercent),
    { key: "hottest", label: "Hottest line", numeric: true,
      value: (f) => (f.hottest === null ? null : data.lines[f.hottest].time_ns),
      html: (f) => {
        if (f.hottest === null) return UNKNOWN;
        const l = data.lines[f.hottest];
        return `<a href="${lineHref(l.file, l.line)}">L${l.line}</a> \u00b7 ${escapeHtml(formatNs(l.time_ns))}`;
      } },
  ];
  if (cols.gpu) columns.push(numCol("gpu_time", "GPU time", (f) => f.gpu_time_ns, formatNs));
  if (cols.memory) columns.push(numCol("memory", "Memory change", (f) => f.mem_bytes, formatSignedBytes));
  columns.push({ key: "snapshot", label: "Source", value: (f) => (f.source ? f.source.length : null),
                 html: (f) => (f.source ? `${formatCount(f.source.length)} lines` : UNKNOWN) });
  const t = sortableTable({ columns, rows, sort: { key: "time", dir: "desc" }, label: "Files",
                            className: "files" });
  return section("files", "Files", t.table);
}

function functionsView() {
  const columns = [
    { key: "name", label: "Function", value: (f) => f.name,
      html: (f) => `<a class="fn" href="${lineHref(f.file, f.line)}">${escapeHtml(f.name)}</a>` +
        (f.ran === false ? ' <span class="badge never-ran" title="listed, but not called while profiling">never ran</span>' : "") },
    { key: "location", label: "Defined in", value: (f) => `${data.files[f.file].display}\u0000${String(f.line).padStart(9, "0")}`,
      html: (f) => `<a href="${lineHref(f.file, f.line)}">${escapeHtml(`${data.files[f.file].display}:${f.line}`)}</a>` },
    numCol("total", "Total time", (f) => f.total_ns, formatNs,
           { title: "outermost activations only (no double counting under recursion)",
             html: (f) => timeBar(f.total_ns, f.share) }),
    numCol("own", "Own time", (f) => f.own_ns, formatNs, { title: "excluding recorded callees" }),
  ];
  // Calls and Avg/call only where functions are counted (never for a sampling backend).
  if (cols.function_calls !== false) {
    columns.push(numCol("calls", "Calls", (f) => f.calls, formatCount),
                 numCol("avg", "Avg/call", (f) => f.avg_ns, formatNs));
  }
  const t = sortableTable({ columns, rows: data.functions, sort: { key: "total", dir: "desc" },
                            label: "Functions", className: "functions",
                            rowAttrs: (f) => (f.ran === false ? 'class="never-ran"' : "") });
  return section("functions", "Functions", t.table);
}

function memoryView() {
  const m = data.memory;
  const peakAt = isUnknown(m.peak_t_ns) ? "" : ` at ${formatNs(m.peak_t_ns)}`;
  const parts = [
    el("div", { class: "cards" },
      card("rss-start", "Start RSS", formatBytes(m.start_bytes)),
      card("rss-peak", "Peak RSS", formatBytes(m.peak_bytes), { sub: peakAt ? `reached${peakAt}` : null }),
      card("rss-end", "End RSS", formatBytes(m.end_bytes)),
      card("rss-change", "Change", formatSignedBytes(m.change_bytes))),
  ];
  const chart = el("figure", { class: "chart-box" });
  chart.innerHTML = lineChartSvg(m.timeline, { formatX: formatNs, formatY: formatBytes,
                                               label: "host memory (RSS) over time" }) +
    `<figcaption>Host memory (${escapeHtml(m.source)}) over time: ${formatCount(m.samples)} samples` +
    (isUnknown(m.interval_ns) ? "" : `, every ${escapeHtml(formatNs(m.interval_ns))}`) +
    (m.timeline.length ? " \u00b7 point at the chart (or focus it and use the arrow keys) for the values" : "") +
    `</figcaption>`;
  attachChartHover(chart, m.timeline, {
    describe: ([t, rss]) => `${formatNs(t)} \u00b7 RSS ${formatBytes(rss)}`,
  });
  parts.push(chart);
  if (!m.per_line) {
    parts.push(el("p", { class: "notice", role: "note" },
      `RSS changes were not attributed to lines${m.reason ? ": " + m.reason : ""}`));
  }
  const columns = [];
  if (cols.memory) columns.push(numCol("memory", "Memory change", (l) => l.mem_bytes, formatSignedBytes));
  if (cols.memory_peak) columns.push(numCol("memory_peak", "Peak RSS", (l) => l.mem_peak_bytes, formatBytes));
  if (columns.length) {
    columns.push(numCol("time", "Time", (l) => l.time_ns, formatNs));
    if (showHits) columns.push(numCol("hits", "Hits", (l) => l.hits, formatCount));
    columns.push(locationCol, sourceCol);
    const t = sortableTable({ columns, rows: lineRows(m.lines), sort: { key: columns[0].key, dir: "desc" },
                              caption: "Memory by line", label: "Memory by line", className: "memory-lines" });
    parts.push(t.table);
  }
  return section("memory", "Memory", ...parts);
}

function gpuView() {
  const g = data.gpu;
  const parts = [];
  parts.push(el("p", { class: "method" }, ...gpuHeadline(g, false)));
  parts.push(el("div", { class: "cards" },
    card("gpu-time", "Attributed GPU time", formatNs(g.time.value_ns),
         { sub: "sum of the lines' GPU time", notice: g.time.notice }),
    card("gpu-memory", "GPU peak memory", formatBytes(g.memory.peak_bytes),
         { sub: "the highest GPU peak of any line", notice: g.memory.notice }),
    card("driver-time", "Driver time", formatNs(g.driver.time_ns), { sub: g.driver.label })));
  const facts = [];
  if (g.devices.length) facts.push(el("li", {}, `Devices: ${g.devices.join(", ")}`));
  if (g.aggregation_note) facts.push(el("li", { "data-fact": "aggregation" }, g.aggregation_note));
  if (g.scope_note) facts.push(el("li", { "data-fact": "scope" }, g.scope_note));
  facts.push(el("li", {}, "GPU work runs asynchronously: a line can return before its device work finishes, so GPU time and driver time are separate measurements."));
  parts.push(el("ul", { class: "facts" }, facts));
  if (data.dropped && !isUnknown(data.dropped.gpu_time_ns)) {
    parts.push(el("p", { class: "notice dropped", role: "note" }, data.dropped.message));
  }
  if (g.diagnostics.length) {
    parts.push(el("section", { class: "warnings", "aria-labelledby": "h-gpu-diag" },
      el("h2", { id: "h-gpu-diag" }, "GPU diagnostics"),
      el("ul", {}, g.diagnostics.map((d) => el("li", {}, d)))));
  }
  const columns = [
    numCol("gpu_time", "GPU time", (l) => l.gpu_time_ns ?? null, formatNs,
           { html: (l) => heatCell(l.gpu_time_ns, l.gpu_heat, "gpu") }),
    numCol("gpu_memory", "GPU peak memory", (l) => l.gpu_peak_bytes ?? null, formatBytes),
    numCol("driver", "Driver time", (l) => l.time_ns, formatNs, { title: "wall time of the line" }),
    locationCol, sourceCol,
  ];
  const t = sortableTable({ columns, rows: lineRows(g.lines), sort: { key: "gpu_time", dir: "desc" },
                            caption: `GPU-measured lines (${g.lines.length})`,
                            label: "GPU-measured lines", className: "gpu-lines" });
  parts.push(t.table);
  return section("gpu", "GPU", ...parts);
}

function heatLegend() {
  const swatches = [];
  for (let level = 1; level < data.heat.levels; level++) {
    swatches.push(`<span class="swatch heat-${level}" data-level="${level}"></span>`);
  }
  const legend = el("div", { class: "heat-legend", role: "img",
                             "aria-label": "heat scale: light = little time, dark = most time" });
  legend.innerHTML = `<span class="legend-label">heat</span><span class="legend-end">less</span>${swatches.join("")}` +
    `<span class="legend-end">${escapeHtml(formatNs(data.heat.max_time_ns))} (hottest line)</span>`;
  return legend;
}

function sourceView(fileIndex) {
  const f = data.files[fileIndex];
  const stats = new Map();
  for (const l of data.lines) if (l.file === fileIndex) stats.set(l.line, l);
  const count = Math.max(f.source ? f.source.length : 0, ...stats.keys(), 0);
  const rows = [];
  for (let n = 1; n <= count; n++) {
    const s = stats.get(n);
    if (!f.source && !s) continue;
    rows.push({ line: n, s: s || null, text: f.source ? (f.source[n - 1] ?? null) : null });
  }
  const stat = (get) => (r) => (r.s ? get(r.s) : null);
  const cell = (get, fmt) => (r) => (r.s ? escapeHtml(fmt(get(r.s))) : "");
  const c = (key, label, get, fmt, extra = {}) =>
    ({ key, label, numeric: true, value: stat(get), html: cell(get, fmt), ...extra });
  const columns = [
    { key: "line", label: "Line", numeric: true, firstDir: "asc", value: (r) => r.line, cls: "ln",
      html: (r) => `<a href="${lineHref(fileIndex, r.line)}" aria-label="line ${r.line}">${r.line}</a>` },
    c("time", "Time", (s) => s.time_ns, formatNs,
      { html: (r) => (r.s ? heatCell(r.s.time_ns, r.s.heat, "time") : "") }),
  ];
  if (cols.self) columns.push(c("self", "Own time", (s) => s.self_ns, formatNs));
  if (showHits) {
    columns.push(c("hits", "Hits", (s) => s.hits, formatCount),
                 c("avg", "Avg/hit", (s) => s.avg_ns, formatNs));
  }
  if (cols.cpu) columns.push(c("cpu", "CPU time", (s) => s.cpu_ns, formatNs));
  if (cols.samples) columns.push(c("samples", "Samples", (s) => s.samples, formatCount));
  if (cols.memory) columns.push(c("memory", "Memory", (s) => s.mem_bytes, formatSignedBytes));
  if (cols.memory_peak) columns.push(c("memory_peak", "Peak RSS", (s) => s.mem_peak_bytes, formatBytes));
  if (cols.gpu) {
    columns.push(
      c("gpu_time", "GPU time", (s) => s.gpu_time_ns, formatNs,
        { html: (r) => (r.s ? heatCell(r.s.gpu_time_ns, r.s.gpu_heat, "gpu") : "") }),
      c("gpu_memory", "GPU peak memory", (s) => s.gpu_peak_bytes, formatBytes));
  }
  columns.push({ key: "source", label: "Source", cls: "src",
                 value: (r) => (r.text === null ? null : r.text.trim()),
                 html: (r) => (r.text === null ? UNKNOWN
                   : `<code class="py">${codeHtml(fileIndex, r.line) ?? escapeHtml(r.text)}</code>`)
                   + sparkLineBadges(data, fileIndex, r.line) });
  const t = sortableTable({
    columns, rows, sort: { key: "line", dir: "asc" }, label: `Source of ${f.display}`,
    className: "source",
    rowAttrs: (r) => `id="L${r.line}" data-line="${r.line}"${r.s ? ' class="executed"' : ""}`,
  });
  const parts = [el("p", { class: "meta", title: f.path }, f.path)];
  parts.push(el("p", { class: "meta" },
    `${formatCount(f.executed_lines)} executed lines \u00b7 ${formatNs(f.time_ns)} own time` +
    (f.hottest === null ? "" : ` \u00b7 hottest line ${data.lines[f.hottest].line}`)));
  if (!f.source) {
    parts.push(el("p", { class: "notice", role: "note" },
      "The source of this file was not captured; only its executed lines are listed."));
  }
  parts.push(heatLegend(), t.table);
  const view = section(`source-${fileIndex}`, f.display, ...parts);
  view.dataset.file = String(fileIndex);
  t.table.addEventListener("sorted", () => markLine(view, view.dataset.target || null));
  return view;
}

// ---- navigation ---------------------------------------------------------------------------

const available = { overview: true, files: true, functions: true, memory: !!data.memory, gpu: !!data.gpu };
const builders = { overview: overviewView, files: filesView, functions: functionsView,
                   memory: memoryView, gpu: gpuView };
const cache = new Map();

function buildNav() {
  const items = [["overview", "Overview", null], ["files", "Files", data.files.length],
                 ["functions", "Functions", data.functions.length]];
  if (available.memory) items.push(["memory", "Memory", null]);
  if (available.gpu) items.push(["gpu", "GPU", null]);
  if (data.spark) items.push(["spark", "Spark", data.spark.actions.length]);
  nav.append(
    el("p", { class: "brand" }, "linescope"),
    el("ul", { class: "sections" }, items.map(([view, label, n]) =>
      el("li", {}, el("a", { href: viewHref(view), "data-nav": view }, label,
                      n === null ? null : el("span", { class: "count" }, formatCount(n)))))),
    el("h2", { class: "nav-heading", id: "nav-sources" }, "Sources"));
  const list = el("ul", { class: "sources", id: "source-list", "aria-labelledby": "nav-sources" },
    data.files.map((f, i) =>
      el("li", {}, el("a", { href: lineHref(i), "data-nav": `source-${i}`, title: f.path }, f.display))));
  nav.append(sourceFinder(list), list);
}

// "Find a source": filters the sidebar's sources as one types (every word must occur in
// the name or the path, any case). Enter opens the first match; the arrow keys move between
// the input and the matches; Escape clears.
function sourceFinder(list) {
  const input = el("input", { type: "search", id: "find-source", class: "find",
                              placeholder: "Find a source\u2026", "aria-label": "Find a source",
                              "aria-controls": "source-list", autocomplete: "off",
                              spellcheck: "false" });
  const status = el("p", { class: "find-status", id: "find-status", role: "status",
                           "aria-live": "polite" });
  const items = [...list.children].map((li, i) =>
    ({ li, a: li.firstElementChild,
       text: `${data.files[i].display}\n${data.files[i].path}`.toLowerCase() }));
  const visible = () => items.filter((it) => !it.li.hidden).map((it) => it.a);
  function filter() {
    const words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const it of items) {
      it.li.hidden = !words.every((w) => it.text.includes(w));
      shown += it.li.hidden ? 0 : 1;
    }
    status.textContent = !words.length ? "" : shown === 0 ? "No source matches"
      : `${formatCount(shown)} of ${formatCount(items.length)} sources`;
  }
  input.addEventListener("input", filter);
  input.addEventListener("keydown", (e) => {
    const first = visible()[0];
    if (e.key === "Enter" && first) {
      e.preventDefault();
      first.click();
    } else if (e.key === "ArrowDown" && first) {
      e.preventDefault();
      first.focus();
    } else if (e.key === "Escape" && input.value) {
      e.preventDefault();
      input.value = "";
      filter();
    }
  });
  list.addEventListener("keydown", (e) => {
    if (e.key !== "ArrowDown" && e.key !== "ArrowUp") return;
    const links = visible();
    const at = links.indexOf(document.activeElement);
    if (at < 0) return;
    e.preventDefault();
    const next = at + (e.key === "ArrowDown" ? 1 : -1);
    if (next < 0) input.focus();
    else if (next < links.length) links[next].focus();
  });
  return el("div", { class: "finder" }, input, status);
}

// The bar above the page: run status (a failed run with its error), backend, start and
// elapsed time, and the theme toggle.
function buildTopbar() {
  if (!topbar) return;
  const failed = data.status === "failed";
  const status = data.status || "success";
  const started = isUnknown(data.started_at) ? UNKNOWN : new Date(data.started_at * 1000).toLocaleString();
  const facts = el("div", { class: "run-facts" },
    el("span", { class: `status status-${failed ? "failed" : status === "success" ? "success" : "other"}`,
                 "data-status": status }, failed ? "\u2716 failed" : status === "success" ? "\u2714 success" : status),
    el("span", { class: "fact", "data-fact": "backend" }, "backend ", el("strong", {}, data.backend),
       data.sampled ? el("span", { class: "badge" }, "sampled") : null),
    el("span", { class: "fact", "data-fact": "elapsed" }, `elapsed ${formatNs(data.elapsed_ns)}`),
    el("span", { class: "fact", "data-fact": "started" }, `started ${started}`));
  topbar.append(el("div", { class: "topbar-row" },
    el("span", { class: "brand" }, "linescope"), facts, themeToggle()));
  if (failed) {
    topbar.append(el("div", { class: "run-error", role: "alert" },
      el("strong", {}, "The profiled run failed"),
      data.error ? el("pre", { class: "error-text" }, data.error) : el("span", {}, ": no error message was recorded.")));
  }
  topbar.classList.toggle("failed", failed);
}

function markLine(view, line) {
  for (const row of view.querySelectorAll("tr.target")) row.classList.remove("target");
  if (!line) return null;
  const row = view.querySelector(`tr[data-line="${line}"]`);
  if (row) row.classList.add("target");
  return row;
}

// `navigated`: the user followed a link (not the first rendering of the page).
function route(hash = location.hash, navigated = true) {
  const want = parseHash(hash);
  let key = want.view;
  const sparkKey = sparkViewKey(hash, data.spark);  // spark.js: #view=spark, #spark=N
  if (sparkKey) {
    key = sparkKey;
  } else if (want.view === "source") {
    key = want.file < data.files.length ? `source-${want.file}` : "overview";
  } else if (!available[key]) {
    key = "overview";
  }
  let view = cache.get(key);
  if (!view) {
    view = key.startsWith("source-") ? sourceView(Number(key.slice(7)))
      : key.startsWith("spark") ? buildSparkView(key, data) : builders[key]();
    cache.set(key, view);
  }
  if (main.firstElementChild !== view) main.replaceChildren(view);
  for (const a of nav.querySelectorAll("a[data-nav]")) {
    if (a.dataset.nav === key) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${view.querySelector("h1").textContent} \u2014 linescope`;
  const line = key.startsWith("source-") ? want.line : null;
  view.dataset.target = line || "";
  const row = markLine(view, line);
  if (row) row.scrollIntoView({ block: "center" });
  // On a narrow screen the sidebar sits above the content: a followed link scrolls to the
  // view, not back to the sidebar.
  else window.scrollTo(0, navigated && main.offsetTop > 0 ? main.offsetTop : 0);
  main.focus({ preventScroll: true });
}

// The report's own "#..." links are followed here, not by the browser: in a notebook the
// report is an <iframe srcdoc>, whose relative links resolve against the notebook page's URL
// and would navigate the frame away from the report. Where the document has a URL of its own
// the hash changes too (history, deep links); in about:srcdoc only the view does.
document.addEventListener("click", (e) => {
  const a = e.target instanceof Element ? e.target.closest('a[href^="#"]') : null;
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey ||
      e.altKey) return;
  e.preventDefault();
  const hash = a.getAttribute("href");
  if (location.protocol === "about:") route(hash);
  else if (location.hash === hash) route(hash);
  else location.hash = hash;  // -> hashchange -> route
});

buildTopbar();
buildNav();
window.addEventListener("hashchange", () => route(location.hash));
route(location.hash, false);
document.body.dataset.ready = "true";
