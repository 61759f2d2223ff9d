// A small SVG line chart (markup string) for time series such as the RSS timeline.
import { escapeHtml } from "./dom.js";

// points: [[x, y], ...] with x ascending. Returns SVG markup that scales to its container
// (viewBox). The highest point gets a marker (peaks matter for memory). Axis labels use
// formatX / formatY. An empty series yields a short text instead of a chart.
export function lineChartSvg(points, { width = 720, height = 220, formatX = String,
                                        formatY = String, label = "chart" } = {}) {
  if (!points.length) return `<p class="muted">no samples</p>`;
  const pad = { left: 72, right: 16, top: 14, bottom: 28 };
  const w = width - pad.left - pad.right;
  const h = height - pad.top - pad.bottom;
  const xs = points.map((p) => p[0]);
  const ys = points.map((p) => p[1]);
  const x0 = xs[0];
  const x1 = xs[xs.length - 1];
  let y0 = Math.min(...ys);
  let y1 = Math.max(...ys);
  if (y0 === y1) {
    y0 -= 1;
    y1 += 1;
  }
  const sx = (x) => pad.left + (x1 === x0 ? w / 2 : ((x - x0) / (x1 - x0)) * w);
  const sy = (y) => pad.top + h - ((y - y0) / (y1 - y0)) * h;
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
    `</svg>`;
}
