// Charts on dygraphs (the vendored classic script sets window.Dygraph and
// Dygraph.synchronize). A Chart is one <figure data-chart=ID> holding a legend and a plot; a
// ChartSet keeps the charts of a view, registers them on window.__gpuprof.charts for tests
// and benches, and synchronizes the crosshair and the zoom of its time charts.
import { el } from "/lib/dom.js";
import { UNKNOWN, isUnknown } from "/lib/format.js";
import { formatClock } from "/lib/units.js";
import { byteUnit, nearestIndex, niceTicks } from "/lib/series.js";

export const PALETTE = ["#1f5fbf", "#d9622b", "#1b9e77", "#8e44ad", "#c0392b", "#7f8c1f",
                        "#16a2b8", "#b7791f"];

function dygraphLib() {
  const D = window.Dygraph;
  if (!D) throw new Error("the chart library (dygraphs) did not load from /vendor/dygraphs/");
  return D;
}

// One chart. kind: "time" (x = epoch milliseconds, date axis; the window's charts share the
// crosshair and zoom), or "number" (x = a step, a duration...). format(y) formats values for
// axis and legend; formatX(x) the legend's x (defaults suit the kind).
export class Chart {
  constructor({ id, title, subtitle = null, kind = "time", format = String, formatAxis = null,
                formatX = null, formatXAxis = null, height = 190, options = {}, onZoom = null,
                startMs = null, className = "", syncKey = undefined, bytes = false }) {
    this.id = id;
    this.kind = kind;
    // Charts of one set with the same syncKey share crosshair and zoom; time charts by default.
    this.syncKey = syncKey === undefined ? (kind === "time" ? "time" : null) : syncKey;
    this.format = format;
    this.startMs = startMs; // the run's start (epoch ms): time legends add the offset into the run
    this.formatX = formatX || (kind === "time" ? (x) => timeLabel(x, this.startMs) : String);
    this.formatXAxis = formatXAxis;
    this.formatAxis = formatAxis || format;
    this.options = options;
    this.onZoom = onZoom;
    this.graph = null;
    this.rows = [];
    this.xs = [];
    this.labels = [];
    this.legend = el("div", { class: "legend", "aria-live": "off" });
    this.plot = el("div", { class: "plot", style: `height:${height}px` });
    this.empty = el("p", { class: "chart-empty", hidden: true, style: `height:${height + 12}px` });
    this.element = el("figure", { class: `chart ${className}`.trim(), "data-chart": id },
      el("figcaption", {},
        el("span", { class: "chart-title" }, title),
        subtitle ? el("span", { class: "chart-sub" }, subtitle) : null),
      this.legend, this.plot, this.empty);
    this.onDraw = null; // (chart) after every draw
    this.bytes = bytes; // y ticks on round binary units (MiB, GiB)
    this.showEmpty("Loading…");
  }

  // Shows a message instead of the chart (no data yet, not measured); reason goes in a tooltip.
  showEmpty(message, reason = null) {
    this.empty.textContent = message;
    if (reason) this.empty.title = reason;
    else this.empty.removeAttribute("title");
    this.empty.hidden = false;
    this.plot.hidden = true;
    this.legend.replaceChildren();
    this.element.dataset.empty = "1";
  }

  // rows: [[x, y1, y2...], ...] ascending x; labels: the series names; extra: more dygraph
  // options for this draw (dateWindow, colors...). Creates the graph on the first call with
  // rows; later calls update it in place. Returns whether a graph was (re)drawn.
  setData(rows, labels, extra = {}) {
    if (!rows.length) {
      this.showEmpty(extra.emptyMessage || "no samples in this window", extra.emptyReason || null);
      this.rows = [];
      this.xs = [];
      return false;
    }
    delete extra.emptyMessage;
    delete extra.emptyReason;
    this.rows = rows;
    this.xs = rows.map((r) => r[0]);
    this.empty.hidden = true;
    this.plot.hidden = false;
    delete this.element.dataset.empty;
    const labelsChanged = labels.length !== this.labels.length || labels.some((l, i) => l !== this.labels[i]);
    this.labels = labels;
    if (!this.graph) {
      this.create(rows, labels, extra);
    } else {
      const opts = { file: rows, ...extra };
      if (labelsChanged) opts.labels = ["x", ...labels];
      this.graph.updateOptions(opts);
    }
    return true;
  }

  create(rows, labels, extra) {
    const Dygraph = dygraphLib();
    const chart = this;
    const xAxis = this.kind === "time"
      ? { ticker: Dygraph.dateTicker, axisLabelFormatter: Dygraph.dateAxisLabelFormatter,
          valueFormatter: (x) => this.formatX(x), pixelsPerLabel: 80 }
      : { valueFormatter: (x) => this.formatX(x), pixelsPerLabel: 60,
          axisLabelFormatter: this.formatXAxis || ((x) => this.formatX(x)) };
    const options = {
      labels: ["x", ...labels],
      colors: PALETTE,
      legend: "always",
      labelsDiv: this.legend,
      legendFormatter: (data) => chart.legendFragment(data),
      axes: {
        x: { drawGrid: false, ...xAxis },
        y: { axisLabelFormatter: (v) => this.formatAxis(v), valueFormatter: (v) => this.format(v),
             axisLabelWidth: 66, pixelsPerLabel: 28,
             ...(this.bytes ? { ticker: (min, max, pixels) =>
               niceTicks(min, max, Math.max(2, Math.floor(pixels / 30)), byteUnit(Math.max(Math.abs(min), Math.abs(max))))
                 .map((v) => ({ v, label: this.formatAxis(v) })) } : {}) },
      },
      strokeWidth: 1.5,
      highlightCircleSize: 3,
      gridLineColor: "#e6e9ef",
      axisLineColor: "#c5cbd6",
      axisLabelFontSize: 11,
      includeZero: true,
      connectSeparatedPoints: true,
      xRangePad: 0,
      yRangePad: 2,
      rightGap: 8,
      animatedZooms: false,
      zoomCallback: (minX, maxX) => {
        if (chart.onZoom) chart.onZoom(minX, maxX, chart.graph ? chart.graph.isZoomed("x") : true, chart);
      },
      drawCallback: () => {
        if (chart.onDraw) chart.onDraw(chart);
      },
      ...this.options,
      ...extra,
    };
    this.graph = new Dygraph(this.plot, rows, options);
    // The crosshair follows the hovered time on every chart of the set (Dygraph.synchronize):
    // the synchronizer asks each other chart for the row at exactly that x, which charts fed
    // by different samplers rarely share; the nearest row inside the chart's own range is the
    // one that belongs to the crosshair.
    this.graph.getRowForX = (x) => {
      const xs = chart.xs;
      if (!xs.length || x < xs[0] || x > xs[xs.length - 1]) return -1;
      return nearestIndex(xs, x);
    };
  }

  // The legend: the hovered x and each series' value there; with nothing hovered, the newest
  // value of each series. Built as nodes (no markup from data).
  legendFragment(data) {
    const frag = document.createDocumentFragment();
    let row = null;
    let xText;
    if (data.x !== undefined && data.x !== null) {
      const i = nearestIndex(this.xs, data.x);
      row = i >= 0 ? this.rows[i] : null;
      xText = this.formatX(data.x);
      this.element.dataset.selected = "1";
    } else {
      delete this.element.dataset.selected;
      xText = this.kind === "time" ? "latest" : "";
    }
    if (xText) frag.append(el("span", { class: "legend-x" }, xText));
    data.series.forEach((s, k) => {
      let v = null;
      if (row) v = row[k + 1];
      else {
        for (let i = this.rows.length - 1; i >= 0; i--) {
          const y = this.rows[i][k + 1];
          if (!isUnknown(y)) { v = y; break; }
        }
      }
      const text = isUnknown(v) ? UNKNOWN : this.format(v);
      frag.append(el("span", { class: "legend-item", "data-series": s.label, title: isUnknown(v) ? "no value at this point" : null },
        el("span", { class: "swatch", style: `background:${s.color}` }),
        el("span", { class: "legend-label" }, s.label),
        el("span", { class: "legend-value" }, text)));
    });
    return frag;
  }

  destroy() {
    if (this.graph) this.graph.destroy();
    this.graph = null;
  }
}

// "12:03:04 · +5 min 3 s" for an epoch-millisecond x of a run that started at startMs.
export function timeLabel(ms, startMs) {
  if (isUnknown(ms)) return UNKNOWN;
  const clock = formatClock(ms);
  if (isUnknown(startMs)) return clock;
  const off = Math.max(0, ms - startMs) / 1000;
  const h = Math.floor(off / 3600);
  const m = Math.floor((off % 3600) / 60);
  const s = Math.floor(off % 60);
  const rel = h ? `${h} h ${m} min` : m ? `${m} min ${s} s` : `${(off).toFixed(off < 10 ? 1 : 0)} s`;
  return `${clock} \u00b7 +${rel}`;
}

// The charts of one view. Time charts are synchronized (crosshair and zoom, not the y range)
// once there are two or more. hooks: window.__gpuprof; each chart's graph is published as
// hooks.charts[id], the synchronizer as hooks.sync.
export class ChartSet {
  constructor(hooks) {
    this.hooks = hooks;
    this.registry = hooks.charts;
    this.charts = new Map();
    this.syncs = new Map(); // syncKey -> { ids, sync }
  }

  add(chart) {
    this.charts.set(chart.id, chart);
    return chart;
  }

  get(id) {
    return this.charts.get(id);
  }

  // Publishes the graphs and (re)synchronizes each sync group when its charts changed.
  refresh() {
    for (const [id, c] of this.charts) {
      if (c.graph) this.registry[id] = c.graph;
    }
    const groups = new Map();
    for (const c of this.charts.values()) {
      if (!c.syncKey || !c.graph) continue;
      if (!groups.has(c.syncKey)) groups.set(c.syncKey, []);
      groups.get(c.syncKey).push(c);
    }
    for (const [key, list] of groups) {
      const ids = list.map((c) => c.id).join(",");
      const old = this.syncs.get(key);
      if (old && old.ids === ids) continue;
      if (old && old.sync) old.sync.detach();
      const sync = list.length >= 2
        ? dygraphLib().synchronize(list.map((c) => c.graph), { selection: true, zoom: true, range: false })
        : null;
      this.syncs.set(key, { ids, sync });
    }
    const time = this.syncs.get("time") || this.syncs.values().next().value;
    this.hooks.sync = time ? time.sync : null;
  }

  // Sets the x window of every time chart without drawing (the next setData draws), so the
  // synchronizer finds nothing to propagate.
  presetWindow(dateWindow) {
    for (const c of this.charts.values()) {
      if (c.kind === "time" && c.graph) c.graph.updateOptions({ dateWindow }, true);
    }
  }

  destroy() {
    for (const { sync } of this.syncs.values()) if (sync) sync.detach();
    this.syncs.clear();
    for (const [id, c] of this.charts) {
      if (this.registry[id] === c.graph) delete this.registry[id];
      c.destroy();
    }
    this.hooks.sync = null;
    this.charts.clear();
  }
}
