// Time-series helpers for charts: merging lines sampled at different x values into one
// table, nearest-point lookup, histograms and quantiles. Pure functions, no DOM.
import { isUnknown } from "./format.js";

// Merges lines into one table for a chart that needs a single x column.
// lines: [[[x, y], ...], ...], each sorted by x. Returns rows [[x, y0, y1, ...], ...] over the
// union of all x values (ascending, no duplicates). Where a line has no point of its own at an
// x inside its x range, its value is interpolated linearly between its neighbours: the point
// lies on the segment the chart draws anyway, so the picture is unchanged and a hover shows
// every line's value. Outside a line's range (before its first or after its last point) the
// value is null. Points with an unknown y are left out of their line.
export function mergeSeries(lines) {
  const clean = lines.map((pts) => pts.filter((p) => !isUnknown(p[0]) && !isUnknown(p[1])));
  const xs = [];
  for (const pts of clean) for (const p of pts) xs.push(p[0]);
  xs.sort((a, b) => a - b);
  const union = [];
  for (const x of xs) if (!union.length || union[union.length - 1] !== x) union.push(x);
  const rows = union.map((x) => {
    const row = new Array(clean.length + 1).fill(null);
    row[0] = x;
    return row;
  });
  clean.forEach((pts, li) => {
    if (!pts.length) return;
    let j = 0; // the first point of the line with x >= the row's x
    for (let r = 0; r < union.length; r++) {
      const x = union[r];
      if (x < pts[0][0] || x > pts[pts.length - 1][0]) continue;
      while (j < pts.length && pts[j][0] < x) j++;
      if (pts[j][0] === x) {
        rows[r][li + 1] = pts[j][1];
      } else {
        const [x0, y0] = pts[j - 1];
        const [x1, y1] = pts[j];
        rows[r][li + 1] = y0 + ((y1 - y0) * (x - x0)) / (x1 - x0);
      }
    }
  });
  return rows;
}

// The index of the value of `xs` (ascending) nearest to x; -1 for an empty array. Ties go to
// the lower index.
export function nearestIndex(xs, x) {
  if (!xs.length) return -1;
  let lo = 0;
  let hi = xs.length - 1;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  if (lo > 0 && x - xs[lo - 1] <= xs[lo] - x) return lo - 1;
  return lo;
}

// Histograms of several value lists on shared bins, so they can be drawn on one axis.
// valueLists: [[v, ...], ...] (unknown values skipped); weights (optional, parallel lists)
// count a value that many times (a row that stands for several steps). Returns
// { edges: [b0, ..., bn], counts: [[c...], ...], fractions: [[f...], ...] } with n = bins
// equal-width bins from the smallest to the largest value (one bin around a single value);
// an empty input gives no bins.
export function sharedHistogram(valueLists, bins = 30, weights = null) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const list of valueLists) {
    for (const v of list) {
      if (isUnknown(v)) continue;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (lo === Infinity) return { edges: [], counts: valueLists.map(() => []), fractions: valueLists.map(() => []) };
  if (lo === hi) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  const width = (hi - lo) / bins;
  const edges = Array.from({ length: bins + 1 }, (_, i) => lo + i * width);
  const counts = valueLists.map((list, li) => {
    const c = new Array(bins).fill(0);
    list.forEach((v, i) => {
      if (isUnknown(v)) return;
      const b = Math.min(bins - 1, Math.floor((v - lo) / width));
      c[b] += weights ? weights[li][i] : 1;
    });
    return c;
  });
  const fractions = counts.map((c) => {
    const total = c.reduce((a, b) => a + b, 0);
    return c.map((n) => (total ? n / total : 0));
  });
  return { edges, counts, fractions };
}

// Largest and smallest x over several lines of [x, y] points; null when all are empty.
export function xExtent(lines) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const pts of lines) {
    if (!pts.length) continue;
    lo = Math.min(lo, pts[0][0]);
    hi = Math.max(hi, pts[pts.length - 1][0]);
  }
  return lo === Infinity ? null : [lo, hi];
}

// A "nice" step at or above `raw`: 1, 2 or 5 times a power of ten.
export function niceStep(raw) {
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

// About `count` evenly spaced round values covering [min, max], counted in `unit` (ticks of a
// bytes axis fall on round numbers of MiB or GiB: unit = byteUnit(max)).
export function niceTicks(min, max, count, unit = 1) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (!(max > min)) return [min];
  const step = niceStep((max - min) / unit / Math.max(1, count)) * unit;
  const ticks = [];
  for (let k = Math.ceil(min / step - 1e-9); k * step <= max + step * 1e-9; k++) {
    ticks.push(Number((k * step).toPrecision(12)));
  }
  return ticks;
}

// The binary unit (1, 1024, 1024², ...) in which `maxAbs` bytes reads as 1 to 1023.
export function byteUnit(maxAbs) {
  let u = 1;
  while (Math.abs(maxAbs) >= 1024 * u && u < 1024 ** 5) u *= 1024;
  return u;
}
