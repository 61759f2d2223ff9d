// One run: header cards, per-GPU and host telemetry charts (one request per group, all GPUs
// at once), the stacked step-time breakdown, top kernels and the insights report. Live while
// the run is running: batch events re-read the series and steps (throttled, one request in
// flight at a time) and the report (at most every 5 s).
//
// The time charts share a crosshair and a zoom (Dygraph.synchronize). The window — "last
// 5 min", "last 1 h", "all", or a range dragged on any chart — lives in the hash
// (#/runs/ID?w=5m, ?from=NS&to=NS); every change re-queries /series for that window, which the
// server downsamples (LTTB) to about one point per pixel.
import { el, escapeHtml } from "/lib/dom.js";
import { UNKNOWN, formatBytes, formatCount, formatNs, formatPercent, isUnknown } from "/lib/format.js";
import { formatByteRate, formatCelsius, formatClock, formatDateTime, formatPct, formatWatts } from "/lib/units.js";
import { mergeSeries, xExtent } from "/lib/series.js";
import { sortableTable } from "/lib/table.js";
import { openLive } from "../api.js";
import { Chart, ChartSet } from "../charts.js";
import { Refresher } from "../refresher.js";
import { buildHash } from "../route.js";
import { card, errorList, insightList, notEvaluatedList, setCard, statusBadge } from "../ui.js";
import { followsNewest, parseWindow, rangeFromZoom, resolveWindow, sameWindow, windowKey,
         windowParams } from "../window.js";

const GPU_CHARTS = [
  { id: "gpu_util", metric: "gpu_util", title: "GPU utilization", format: formatPct,
    options: { valueRange: [0, 102] } },
  { id: "gpu_mem", metric: "gpu_mem", title: "GPU memory used", format: formatBytes, bytes: true },
  { id: "gpu_power", metric: "gpu_power", title: "GPU power", format: formatWatts, scale: 1 / 1000 },
  { id: "gpu_temp", metric: "gpu_temp", title: "GPU temperature", format: formatCelsius,
    options: { includeZero: false } },
];

const HOST_CHARTS = [
  { id: "host_cpu", title: "Host CPU", sub: "all cores", format: formatPct,
    lines: [{ metric: "host_cpu", label: "host" }], options: { valueRange: [0, 102] } },
  { id: "proc_cpu", title: "Training process CPU", sub: "% of one core", format: formatPct,
    lines: [{ metric: "proc_cpu", label: "process tree" },
            { metric: "job_cpu", label: "job's other ranks on this host" }] },
  { id: "host_mem", title: "Host memory", format: formatBytes, bytes: true,
    lines: [{ metric: "host_mem", label: "host used" }, { metric: "proc_rss", label: "process RSS" }] },
  { id: "host_disk_read", title: "Disk read", format: formatByteRate, bytes: true,
    lines: [{ metric: "host_disk_read", label: "read" }] },
];

const GPU_METRICS = GPU_CHARTS.map((c) => c.metric);
const HOST_METRICS = HOST_CHARTS.flatMap((c) => c.lines.map((l) => l.metric));

// The step-time breakdown's stacked parts, bottom to top.
const PHASES = [
  { key: "wait_ns", label: "loader wait", color: "#d9622b" },
  { key: "forward_ns", label: "forward", color: "#1f5fbf" },
  { key: "backward_ns", label: "backward", color: "#6f9be0" },
  { key: "optimizer_ns", label: "optimizer", color: "#1b9e77" },
  { key: "comm_ns", label: "comm", color: "#8e44ad" },
  { key: "other_ns", label: "other", color: "#9aa3b1" },
];

const WINDOW_BUTTONS = [["5m", "last 5 min"], ["1h", "last 1 h"], ["all", "all"]];

// The series of a /series answer, whether the list form ({series: [...]}) or a single one.
function seriesList(resp) {
  if (!resp) return [];
  if (Array.isArray(resp.series)) return resp.series;
  if (Array.isArray(resp.points)) return [resp];
  return [];
}

export function mountRun(ctx) {
  const id = ctx.match.id;
  const hooks = ctx.hooks;
  const charts = new ChartSet(hooks);
  let run = null; // the /api/v1/runs entry
  let startMs = null;
  let newestNs = null;
  let lastStep = null;
  let stepsTotal = null;
  let win = parseWindow(ctx.query);
  let windowGen = 0;
  let markWindow = false;
  let report = null;
  let seriesDrawn = false;
  let destroyed = false;
  let appliedWindow = null; // the x range (epoch ms) the time charts were last drawn with
  let runReady = null; // the promise of loadRun (the run's fields, its start time)
  let runFailed = false;

  // ---- layout ---------------------------------------------------------------------------
  const title = el("h1", { id: "run-name" }, `Run ${id}`);
  const badge = el("span", { id: "run-status" });
  const meta = el("p", { class: "meta", id: "run-meta" }, "\u00a0");
  const runError = el("p", { class: "run-error", id: "run-error", hidden: true });
  const errors = el("div", { class: "errors", id: "run-errors" });
  const cards = el("div", { class: "cards" },
    card("duration", "Duration", UNKNOWN),
    card("steps", "Steps", UNKNOWN),
    card("last-step", "Last step", UNKNOWN, { testid: "last-step" }),
    card("median-step", "Median step time", UNKNOWN, { title: "computing the report…" }),
    card("mfu", "MFU", UNKNOWN, { title: "computing the report…" }),
    card("gpu-util", "Mean GPU utilization", UNKNOWN, { title: "computing the report…" }));
  const windowButtons = WINDOW_BUTTONS.map(([key, label]) =>
    el("button", { type: "button", class: "seg", "data-window": key, "aria-pressed": "false" }, label));
  const windowLabel = el("span", { class: "window-label", id: "window-label" });
  const toolbar = el("div", { class: "toolbar window-bar", role: "toolbar", "aria-label": "Time window" },
    el("span", { class: "segmented" }, windowButtons), windowLabel, el("span", { class: "spacer" }),
    el("span", { class: "hint" }, "Drag on a chart to zoom \u00b7 double-click for all"));
  const gpuGrid = el("div", { class: "chart-grid", id: "gpu-charts" });
  const hostGrid = el("div", { class: "chart-grid", id: "host-charts" });
  const stepsBox = el("div", { class: "wide-chart", id: "step-chart" });
  const insightsBox = el("div", { class: "panel-body" }, el("p", { class: "muted loading" }, "Computing insights…"));
  const kernelsBox = el("div", { class: "panel-body" }, el("p", { class: "muted loading" }, "Loading kernels…"));
  const kernelsHeading = el("h2", { id: "h-kernels" }, "Top kernels");

  const body = el("div", { class: "run-body" }, cards, toolbar,
    el("section", { class: "section", "aria-labelledby": "h-gpus" }, el("h2", { id: "h-gpus" }, "GPUs"), gpuGrid),
    el("section", { class: "section", "aria-labelledby": "h-host" }, el("h2", { id: "h-host" }, "Host"), hostGrid),
    el("section", { class: "section", "aria-labelledby": "h-steps" },
      el("h2", { id: "h-steps" }, "Step time breakdown"), stepsBox),
    el("div", { class: "panels" },
      el("section", { class: "panel", id: "insights", "aria-labelledby": "h-insights" },
        el("h2", { id: "h-insights" }, "Insights"), insightsBox),
      el("section", { class: "panel", id: "kernels", "aria-labelledby": "h-kernels" },
        kernelsHeading, kernelsBox)));
  ctx.root.append(
    el("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, el("a", { href: "#/runs" }, "Runs"), " / ", el("span", {}, `#${id}`)),
    el("div", { class: "page-head" }, title, badge),
    meta, runError, errors, body);

  const onZoom = (minX, maxX, zoomed) => {
    if (startMs === null) return;
    if (!zoomed) {
      setWindow({ kind: "all" });
      return;
    }
    // A vertical drag zooms y only: the x range is the one the window put there. (The other
    // charts already show the new x range: the synchronizer moved them while this one drew.)
    const shown = appliedWindow;
    if (shown && Math.abs(shown[0] - minX) < 1 && Math.abs(shown[1] - maxX) < 1) return;
    const w = rangeFromZoom(minX, maxX, startMs);
    if (w) setWindow(w);
  };

  for (const spec of GPU_CHARTS) {
    const c = charts.add(new Chart({ id: spec.id, title: spec.title, format: spec.format,
                                      bytes: !!spec.bytes, options: spec.options || {}, onZoom }));
    gpuGrid.append(c.element);
  }
  for (const spec of HOST_CHARTS) {
    const c = charts.add(new Chart({ id: spec.id, title: spec.title, subtitle: spec.sub || null,
                                      format: spec.format, bytes: !!spec.bytes,
                                      options: spec.options || {}, onZoom }));
    hostGrid.append(c.element);
  }
  const stepChart = charts.add(new Chart({
    id: "steps", title: "Step time by phase", subtitle: "stacked, per step (or mean of a bucket of steps)",
    kind: "number", format: formatNs, height: 220,
    formatX: (x) => `step ${formatCount(x)}`, formatXAxis: (x) => formatCount(x),
    options: { stackedGraph: true, stepPlot: true, fillGraph: true, fillAlpha: 0.55, strokeWidth: 1,
               connectSeparatedPoints: false, includeZero: true },
  }));
  stepsBox.append(stepChart.element);

  // ---- header -----------------------------------------------------------------------------
  function renderHeader() {
    if (!run) return;
    title.textContent = run.run_name;
    ctx.setTitle(run.run_name);
    badge.replaceChildren(statusBadge(run.status));
    const gpu = run.gpu_model ? `${run.gpu_model}${isUnknown(run.gpu_count) ? "" : ` \u00d7 ${run.gpu_count}`}`
      : isUnknown(run.gpu_count) ? "GPU unknown" : `${run.gpu_count} GPU${run.gpu_count === 1 ? "" : "s"}`;
    const parts = [run.hostname || "host unknown", gpu,
                   startMs === null ? "start unknown" : `started ${formatDateTime(startMs)}`];
    const group = run.group_id
      ? [" \u00b7 group ", el("a", { href: buildHash(["groups", run.group_id]) }, run.group_id),
         isUnknown(run.rank) ? "" : ` rank ${run.rank}${isUnknown(run.world_size) ? "" : ` of ${run.world_size}`}`]
      : [];
    meta.replaceChildren(parts.join(" \u00b7 "), ...group);
    renderDuration();
  }

  function renderDuration() {
    const ns = run && run.status !== "running" && !isUnknown(run.duration_ns) ? run.duration_ns
      : (newestNs ?? (run ? run.duration_ns : null));
    setCard(cards, "duration", isUnknown(ns) ? UNKNOWN : formatNs(ns),
            { title: isUnknown(ns) ? "nothing recorded yet" : null,
              sub: run && run.status === "running" ? "so far (live)" : "" });
  }

  function renderSteps() {
    setCard(cards, "steps", isUnknown(stepsTotal) ? UNKNOWN : formatCount(stepsTotal),
            { title: isUnknown(stepsTotal) ? "no steps recorded yet" : null });
    setCard(cards, "last-step", isUnknown(lastStep) ? UNKNOWN : formatCount(lastStep),
            { title: isUnknown(lastStep) ? "no steps recorded yet" : null });
    const v = cards.querySelector('[data-testid="last-step"]');
    v.dataset.value = isUnknown(lastStep) ? "" : String(lastStep);
  }

  function updateWindowUi() {
    const key = windowKey(win);
    for (const b of windowButtons) b.setAttribute("aria-pressed", String(b.dataset.window === key));
    const r = resolveWindow(win, newestNs);
    let text;
    if (!r) text = "whole run";
    else if (startMs === null) text = `${formatNs(r.from_ns)} – ${formatNs(r.to_ns)} into the run`;
    else text = `${formatClock(startMs + r.from_ns / 1e6)} \u2013 ${formatClock(startMs + r.to_ns / 1e6)} (${formatNs(r.to_ns - r.from_ns)})`;
    windowLabel.textContent = win.kind === "range" ? `zoomed: ${text}` : text;
    windowLabel.dataset.window = key;
  }

  function setWindow(w, { push = true } = {}) {
    if (sameWindow(w, win)) {
      // "all" again after a double-click: redraw the whole run.
      if (w.kind !== "all") return;
    }
    win = w;
    windowGen += 1;
    markWindow = true;
    if (push) history.pushState(null, "", buildHash(["runs", id], windowParams(w)));
    updateWindowUi();
    seriesRefresher.flush().then(() => kernelRefresher.request());
  }

  for (const b of windowButtons) {
    b.addEventListener("click", () => {
      const key = b.dataset.window;
      setWindow(key === "all" ? { kind: "all" } : parseWindow(new URLSearchParams(`w=${key}`)));
    });
  }

  // ---- data -------------------------------------------------------------------------------
  async function loadRun() {
    const data = await ctx.api(`/api/v1/runs?id=${id}`);
    const found = (data.runs || []).find((r) => r.run_id === id);
    if (!found) {
      const err = new Error(`there is no run ${id} on this server`);
      err.status = 404;
      throw err;
    }
    run = found;
    startMs = isUnknown(run.start_unix_ns) ? 0 : run.start_unix_ns / 1e6;
    for (const c of charts.charts.values()) if (c.kind === "time") c.startMs = startMs;
    if (!isUnknown(run.duration_ns)) newestNs = Math.max(newestNs ?? 0, run.duration_ns);
    if (!isUnknown(run.steps) && stepsTotal === null) stepsTotal = run.steps;
    renderHeader();
    renderSteps();
    updateWindowUi();
  }

  function pointsFor(chartId) {
    // About one point per pixel of the plot (its figure's width: the plot itself is hidden
    // until it has data).
    const c = charts.get(chartId);
    const w = c.plot.clientWidth || (c.element.clientWidth - 24) || 800;
    return Math.max(100, Math.min(4000, Math.round(w)));
  }

  function seriesUrl(metrics, chartId, range) {
    let url = `/api/v1/runs/${id}/series?metric=${metrics.join(",")}&gpu=all&points=${pointsFor(chartId)}`;
    if (range) url += `&from_ns=${range.from_ns}&to_ns=${range.to_ns}`;
    return url;
  }

  function toLine(points, scale = 1) {
    return points.map((p) => [startMs + p[0] / 1e6, p[1] === null ? null : p[1] * scale]);
  }

  async function loadSeries() {
    const gen = windowGen;
    const wantMark = markWindow;
    markWindow = false;
    if (win.kind === "last") await runReady; // "last N" ends at the newest data
    const range = resolveWindow(win, newestNs);
    const [gpu, host] = await Promise.all([
      ctx.api(seriesUrl(GPU_METRICS, "gpu_util", range)),
      ctx.api(seriesUrl(HOST_METRICS, "host_cpu", range)),
    ]);
    await runReady; // x = the run's start + ts_ns
    if (destroyed || gen !== windowGen) return; // a newer window's answer follows
    const gpuList = seriesList(gpu);
    const hostList = seriesList(host);
    const plan = [];
    for (const spec of GPU_CHARTS) {
      const lines = gpuList.filter((s) => s.metric === spec.metric)
        .sort((a, b) => (a.gpu ?? 0) - (b.gpu ?? 0));
      plan.push({ chart: charts.get(spec.id), labels: lines.map((s) => (s.gpu === null || s.gpu === undefined ? "GPU" : `GPU ${s.gpu}`)),
                  lines: lines.map((s) => toLine(s.points, spec.scale || 1)), what: "GPU samples" });
    }
    for (const spec of HOST_CHARTS) {
      const found = spec.lines.map((l) => [l, hostList.find((s) => s.metric === l.metric)]).filter(([, s]) => s && s.points.length);
      plan.push({ chart: charts.get(spec.id), labels: found.map(([l]) => l.label),
                  lines: found.map(([, s]) => toLine(s.points)), what: "host samples" });
    }
    // One x range for every time chart: the window, or for "all" the span of all the data.
    const extent = xExtent(plan.flatMap((p) => p.lines));
    if (extent) newestNs = Math.max(newestNs ?? 0, Math.round((extent[1] - startMs) * 1e6));
    let dateWindow = null;
    if (range) dateWindow = [startMs + range.from_ns / 1e6, startMs + range.to_ns / 1e6];
    else if (extent && extent[1] > extent[0]) dateWindow = extent;
    charts.presetWindow(dateWindow);
    appliedWindow = dateWindow;
    for (const p of plan) {
      const rows = mergeSeries(p.lines);
      p.chart.setData(rows, p.labels, {
        dateWindow,
        emptyMessage: `no ${p.what} in this window`,
        emptyReason: telemetryReason(p.what.startsWith("GPU") ? "gpu" : "host"),
      });
    }
    charts.refresh();
    seriesDrawn = true;
    renderDuration();
    updateWindowUi();
    if (wantMark) performance.mark("gpuprof:window");
  }

  function telemetryReason(source) {
    if (!report || !Array.isArray(report.telemetry)) return null;
    const t = report.telemetry.find((x) => x.source === source);
    if (!t) return null;
    return t.available ? null : (t.reason || "not measured");
  }

  async function loadSteps() {
    const width = stepChart.plot.clientWidth || (stepChart.element.clientWidth - 24) || 1000;
    const data = await ctx.api(`/api/v1/runs/${id}/steps?points=${Math.max(50, Math.min(4000, Math.round(width)))}`);
    if (destroyed) return;
    stepsTotal = data.steps_total;
    const rows = data.rows || [];
    if (rows.length) lastStep = Math.max(lastStep ?? -Infinity, rows[rows.length - 1].last_step);
    renderSteps();
    let parts = PHASES.filter((p) => rows.some((r) => !isUnknown(r[p.key])));
    const missing = PHASES.filter((p) => !parts.includes(p)).map((p) => p.label);
    let sub = data.steps_per_row > 1 ? `mean of every ${formatCount(data.steps_per_row)} steps` : "per step";
    if (!parts.length) {
      parts = [{ key: "duration_ns", label: "step time", color: "#1f5fbf" }];
      sub += " \u00b7 no phase timings recorded";
    } else if (missing.length) {
      sub += ` \u00b7 not measured: ${missing.join(", ")}`;
    }
    stepChart.element.querySelector(".chart-sub").textContent = sub;
    const table = rows.map((r) => [r.first_step, ...parts.map((p) => (isUnknown(r[p.key]) ? null : r[p.key]))]);
    stepChart.setData(table, parts.map((p) => p.label), {
      colors: parts.map((p) => p.color),
      emptyMessage: "no steps recorded yet",
      emptyReason: "a step ends at each optimizer.step() (auto mode) or prof.step() block",
    });
    charts.refresh();
  }

  async function loadReport() {
    const doc = await ctx.api(`/api/v1/runs/${id}`);
    if (destroyed) return;
    report = doc;
    const steps = doc.steps || {};
    const dist = steps.steady || steps.all;
    setCard(cards, "median-step", dist ? formatNs(dist.p50_ns) : UNKNOWN, {
      title: dist ? null : "needs at least 2 steps",
      sub: dist ? `p99 ${formatNs(dist.p99_ns)}` : "",
    });
    const mfu = doc.mfu || {};
    setCard(cards, "mfu", isUnknown(mfu.value) ? UNKNOWN : formatPercent(mfu.value), {
      title: isUnknown(mfu.value) ? (mfu.reason || "not computed") : null,
      sub: isUnknown(mfu.value) ? "" : `${mfu.achieved_tflops != null ? mfu.achieved_tflops.toFixed(1) : UNKNOWN} of ${mfu.peak_tflops != null ? mfu.peak_tflops.toFixed(0) : UNKNOWN} TFLOPs ${mfu.dtype || ""}`,
    });
    const g = doc.gpu || {};
    setCard(cards, "gpu-util", isUnknown(g.mean_util_pct) ? UNKNOWN : formatPct(g.mean_util_pct), {
      title: isUnknown(g.mean_util_pct) ? (telemetryReason("gpu") || "no GPU samples") : null,
      sub: isUnknown(g.peak_mem_used_bytes) ? "" : `peak memory ${formatBytes(g.peak_mem_used_bytes)}`,
    });
    if (doc.run && doc.run.error) {
      runError.textContent = `The run failed: ${doc.run.error}`;
      runError.hidden = false;
    }
    if (doc.run && run) {
      // The report's run fields are as new as the report.
      run = { ...run, status: doc.run.status, gpu_model: doc.run.gpu_model ?? run.gpu_model,
              gpu_count: doc.run.gpu_count ?? run.gpu_count };
      renderHeader();
    }
    const list = insightList(doc.insights || []);
    insightsBox.replaceChildren(list, notEvaluatedList(doc.not_evaluated) || "");
    insightsBox.dataset.count = String((doc.insights || []).length);
    for (const c of [...GPU_CHARTS, ...HOST_CHARTS]) {
      const chart = charts.get(c.id);
      if (chart.element.dataset.empty) {
        const reason = telemetryReason(GPU_CHARTS.includes(c) ? "gpu" : "host");
        if (reason) chart.empty.title = reason;
      }
    }
  }

  async function loadKernels() {
    const range = win.kind === "all" ? null : resolveWindow(win, newestNs);
    let url = `/api/v1/runs/${id}/kernels?top=15`;
    if (range) url += `&from_ns=${range.from_ns}&to_ns=${range.to_ns}`;
    const data = await ctx.api(url);
    if (destroyed) return;
    if (!data.recorded) {
      kernelsBox.replaceChildren(el("p", { class: "muted empty-note", "data-recorded": "false" },
        `not recorded \u2014 ${data.reason || "no kernel trace for this run"}`));
      return;
    }
    // A CPU run's "kernels" are its traced steps' CPU operators: host time, labelled so.
    const cpu = data.kind === "cpu_operators";
    const timeKey = cpu ? "self_cpu_ns" : "gpu_ns";
    const total = cpu ? data.total_self_cpu_ns : data.total_gpu_ns;
    const unit = cpu ? "operator" : "kernel";
    const columns = [
      { key: "name", label: cpu ? "CPU operator" : "Kernel", value: (k) => k.name, cls: "kernel-name",
        html: (k) => `<code title="${escapeHtml(k.name)}">${escapeHtml(k.name)}</code>` },
      { key: "source", label: "Source", value: (k) => k.source, html: (k) => escapeHtml(k.source ?? UNKNOWN) },
      { key: "calls", label: "Calls", numeric: true, value: (k) => k.calls, html: (k) => escapeHtml(formatCount(k.calls)) },
      { key: "time", label: cpu ? "Self CPU time" : "GPU time", numeric: true, value: (k) => k[timeKey],
        html: (k) => escapeHtml(formatNs(k[timeKey])) },
      { key: "mean", label: "Mean", numeric: true, value: (k) => k.mean_ns, html: (k) => escapeHtml(formatNs(k.mean_ns)) },
      { key: "share", label: "Share", numeric: true, value: (k) => k.share_pct,
        html: (k) => (isUnknown(k.share_pct) ? UNKNOWN
          : `<span class="share"><span class="share-bar" style="width:${Math.max(0, Math.min(100, k.share_pct)).toFixed(1)}%"></span>${escapeHtml(formatPct(k.share_pct))}</span>`) },
    ];
    const t = sortableTable({ columns, rows: data.kernels || [], sort: { key: "time", dir: "desc" },
                              label: cpu ? "Top CPU operators by self CPU time" : "Top kernels by GPU time",
                              className: "compact" });
    const note = el("p", { class: "muted small", "data-kind": data.kind },
      `${formatCount(data.kernels_total)} ${unit}s, ${formatNs(total)} ${cpu ? "self CPU time (host time: a CPU run has no GPU kernels)" : "GPU time"} in ${formatCount(data.windows)} traced window${data.windows === 1 ? "" : "s"}` +
      (data.sources && data.sources.length ? ` \u00b7 ${data.sources.join(", ")}` : "") +
      (win.kind === "all" ? "" : " \u00b7 windows starting in the selected time range"));
    kernelsHeading.textContent = cpu ? "Top CPU operators" : "Top kernels";
    kernelsBox.replaceChildren(t.table, note);
  }

  // Errors of the charts' requests go to the list above the cards (cleared when the request
  // works again); the report's and the kernels' into their panels.
  const errs = errorList(errors);
  const tracked = (key, where, task) => new Refresher(async () => {
    await task();
    errs.clear(key);
  }, key === "series" || key === "steps" ? 1000 : 5000, {
    onError: (e) => {
      if (ctx.isActive() && !runFailed && ctx.shouldShow(e)) errs.show(key, e, where);
    },
  });
  const inBox = (box, where, task, interval) => new Refresher(task, interval, {
    onError: (e) => {
      if (ctx.isActive()) ctx.reportError(e, where, box);
    },
  });
  const seriesRefresher = tracked("series", "Telemetry", loadSeries);
  const stepsRefresher = tracked("steps", "Steps", loadSteps);
  const reportRefresher = inBox(insightsBox, "Insights", loadReport, 5000);
  const kernelRefresher = inBox(kernelsBox, "Kernels", loadKernels, 5000);

  // ---- first render -------------------------------------------------------------------------
  updateWindowUi();
  // The run's fields, the series and the steps are asked for at once (the series wait for the
  // run's start time before they are drawn). The report may take seconds on a long run and
  // the kernels are not charts: both are asked for once the charts are drawn, so that a server
  // that answers one request at a time (SQLite storage) never holds the charts behind them.
  runReady = loadRun();
  (async () => {
    const charted = Promise.all([seriesRefresher.flush(), stepsRefresher.flush()]);
    try {
      await runReady;
    } catch (e) {
      runFailed = true;
      if (ctx.isActive()) {
        // Without the run there is nothing to chart: the error is the page.
        body.remove();
        errors.replaceChildren();
        ctx.reportError(e, "Could not load the run", errors);
        ctx.ready();
      }
      return;
    }
    if (!ctx.isActive()) return;
    live = startLive();
    await charted;
    if (!ctx.isActive() || runFailed) return;
    ctx.ready();
    reportRefresher.flush();
    kernelRefresher.flush();
  })();

  // ---- live -------------------------------------------------------------------------------
  let live = null;
  const startLive = () => openLive(id, {
    onEvent: (m) => {
      if (m.run_id !== id) return;
      if (m.type === "batch") {
        if (!isUnknown(m.last_step)) {
          lastStep = Math.max(lastStep ?? -Infinity, m.last_step);
          renderSteps();
        }
        if (!isUnknown(m.last_ts_ns)) {
          newestNs = Math.max(newestNs ?? 0, m.last_ts_ns);
          renderDuration();
        }
        if (seriesDrawn && followsNewest(win)) seriesRefresher.request();
        stepsRefresher.request();
        reportRefresher.request();
        kernelRefresher.request();
      } else if (m.type === "run" && run) {
        const ended = run.status === "running" && m.status !== "running";
        run = { ...run, run_name: m.run_name ?? run.run_name, status: m.status ?? run.status,
                end_ns: m.end_ns ?? run.end_ns, group_id: m.group_id ?? run.group_id };
        if (ended && !isUnknown(m.end_ns)) run.duration_ns = m.end_ns;
        renderHeader();
        if (ended) {
          seriesRefresher.request();
          stepsRefresher.request();
          reportRefresher.request();
          kernelRefresher.request();
        }
      }
    },
    onState: (s) => ctx.setLive(s),
    onReopen: () => {
      seriesRefresher.request();
      stepsRefresher.request();
      reportRefresher.request();
    },
  });

  return {
    onQuery(query) {
      const w = parseWindow(query);
      if (!sameWindow(w, win)) setWindow(w, { push: false });
    },
    destroy() {
      destroyed = true;
      if (live) live.close();
      for (const r of [seriesRefresher, stepsRefresher, reportRefresher, kernelRefresher]) r.stop();
      charts.destroy();
    },
  };
}
