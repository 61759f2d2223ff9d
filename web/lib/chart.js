// A small SVG line chart (markup string) for time series such as the RSS timeline, and its
// hover readout (attachChartHover).
import { escapeHtml } from "./dom.js";

// Where the points land in the chart's viewBox: { sx(x), sy(y), pad, w, h, x0, x1, y0, y1 }.
export function chartGeometry(points, { width = 720, height = 220 } = {}) {
  const pad = { left: 72, right: 16, top: 14, bottom: 28 };
  const w = width - pad.left - pad.right;
  const h = height - pad.top - pad.bottom;
  const x0 = points[0][0];
  const x1 = points[points.length - 1][0];
  let y0 = Infinity;
  let y1 = -Infinity;
  for (const p of points) {
    if (p[1] < y0) y0 = p[1];
    if (p[1] > y1) y1 = p[1];
  }
  if (y0 === y1) {
    y0 -= 1;
    y1 += 1;
  }
  const sx = (x) => pad.left + (x1 === x0 ? w / 2 : ((x - x0) / (x1 - x0)) * w);
  const sy = (y) => pad.top + h - ((y - y0) / (y1 - y0)) * h;
  return { sx, sy, pad, w, h, x0, x1, y0, y1, width, height };
}

// The index of the point whose x is nearest `x` (points sorted by x).
export function nearestIndex(points, x) {
  let lo = 0;
  let hi = points.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] < x) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && Math.abs(points[lo - 1][0] - x) <= Math.abs(points[lo][0] - x)) return lo - 1;
  return lo;
}

// points: [[x, y], ...] with x ascending. Returns SVG markup that scales to its container
// (viewBox). The highest point gets a marker (peaks matter for memory). Axis labels use
// formatX / formatY. An empty series yields a short text instead of a chart.
export function lineChartSvg(points, { width = 720, height = 220, formatX = String,
                                        formatY = String, label = "chart" } = {}) {
  if (!points.length) return `<p class="muted">no samples</p>`;
  const { sx, sy, pad, w, h, x0, x1, y0, y1 } = chartGeometry(points, { width, height });
  const path = points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
  const area = `${path}L${sx(x1).toFixed(1)},${(pad.top + h).toFixed(1)}L${sx(x0).toFixed(1)},${(pad.top + h).toFixed(1)}Z`;
  let peak = 0;
  for (let i = 1; i < points.length; i++) if (points[i][1] > points[peak][1]) peak = i;
  const [px, py] = points[peak];
  const ticks = [y1, (y0 + y1) / 2, y0].map((y) =>
    `<line class="grid" x1="${pad.left}" x2="${pad.left + w}" y1="${sy(y).toFixed(1)}" y2="${sy(y).toFixed(1)}"/>` +
    `<text class="tick" x="${pad.left - 6}" y="${(sy(y) + 4).toFixed(1)}" text-anchor="end">${escapeHtml(formatY(y))}</text>`);
  return `<svg class="chart" viewBox="0 0 ${width} ${height}" role="img" aria-label="${escapeHtml(label)}">` +
    ticks.join("") +
    `<path class="area" d="${area}"/><path class="line" d="${path}"/>` +
    `<circle class="peak" cx="${sx(px).toFixed(1)}" cy="${sy(py).toFixed(1)}" r="4"><title>${escapeHtml("peak " + formatY(py) + " at " + formatX(px))}</title></circle>` +
    `<text class="tick" x="${pad.left}" y="${height - 8}" text-anchor="start">${escapeHtml(formatX(x0))}</text>` +
    `<text class="tick" x="${pad.left + w}" y="${height - 8}" text-anchor="end">${escapeHtml(formatX(x1))}</text>` +
    `<g class="hover" visibility="hidden"><line class="cursor" x1="0" x2="0" y1="${pad.top}" y2="${pad.top + h}"/>` +
    `<circle class="dot" cx="0" cy="0" r="4"/></g>` +
    `<rect class="hit" x="${pad.left}" y="${pad.top}" width="${w}" height="${h}" fill="transparent"/>` +
    `</svg>`;
}

// Hover values for a chart made by lineChartSvg inside `box` (an element that positions
// the readout): the point nearest the pointer is marked and its x and y shown as
// `describe(point)` text. The chart also takes keyboard focus: arrow keys step through the
// points, Home / End jump to the ends, Escape hides the readout.
export function attachChartHover(box, points, { width = 720, height = 220,
                                                describe = (p) => `${p[0]}: ${p[1]}` } = {}) {
  const svg = box.querySelector("svg.chart");
  if (!svg || !points.length) return null;
  const g = chartGeometry(points, { width, height });
  const hover = svg.querySelector("g.hover");
  const cursor = hover.querySelector(".cursor");
  const dot = hover.querySelector(".dot");
  const readout = document.createElement("div");
  readout.className = "chart-readout";
  readout.setAttribute("role", "status");
  readout.setAttribute("aria-live", "polite");
  readout.hidden = true;
  box.append(readout);
  svg.setAttribute("tabindex", "0");
  let current = -1;
  function show(i) {
    current = Math.max(0, Math.min(points.length - 1, i));
    const [x, y] = points[current];
    const cx = g.sx(x);
    const cy = g.sy(y);
    cursor.setAttribute("x1", cx.toFixed(1));
    cursor.setAttribute("x2", cx.toFixed(1));
    dot.setAttribute("cx", cx.toFixed(1));
    dot.setAttribute("cy", cy.toFixed(1));
    hover.setAttribute("visibility", "visible");
    readout.textContent = describe(points[current]);
    readout.hidden = false;
    readout.dataset.index = String(current);
    // Beside the point, inside the chart: left of it in the right half.
    const rect = svg.getBoundingClientRect();
    const boxRect = box.getBoundingClientRect();
    const scale = rect.width / g.width;
    const left = rect.left - boxRect.left + cx * scale;
    const top = rect.top - boxRect.top + cy * scale;
    readout.style.top = `${Math.max(0, top - 34)}px`;
    if (cx > g.pad.left + g.w / 2) {
      readout.style.left = "";
      readout.style.right = `${Math.max(0, boxRect.width - left + 10)}px`;
    } else {
      readout.style.right = "";
      readout.style.left = `${left + 10}px`;
    }
  }
  function hide() {
    hover.setAttribute("visibility", "hidden");
    readout.hidden = true;
  }
  svg.addEventListener("pointermove", (e) => {
    const rect = svg.getBoundingClientRect();
    if (!rect.width) return;
    const vx = ((e.clientX - rect.left) / rect.width) * g.width;
    const frac = g.w > 0 ? (vx - g.pad.left) / g.w : 0;
    const x = g.x0 + Math.max(0, Math.min(1, frac)) * (g.x1 - g.x0);
    show(nearestIndex(points, x));
  });
  svg.addEventListener("pointerleave", hide);
  svg.addEventListener("blur", hide);
  svg.addEventListener("keydown", (e) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
    if (step) show(current < 0 ? 0 : current + step);
    else if (e.key === "Home") show(0);
    else if (e.key === "End") show(points.length - 1);
    else if (e.key === "Escape") hide();
    else return;
    e.preventDefault();
  });
  return { show, hide };
}
