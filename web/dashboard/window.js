// The run view's time window: "all", "last 5 min" / "last 1 h" (following the newest data) or
// a fixed range from a drag-zoom, kept in the hash (?w=5m, ?from=NS&to=NS). Pure functions;
// nanoseconds are run-relative.

export const LAST_WINDOWS = { "5m": 300e9, "1h": 3600e9 };

function nonNegativeInt(text) {
  if (text === null || text === undefined || !/^\d+$/.test(text)) return null;
  const n = Number(text);
  return Number.isSafeInteger(n) ? n : null;
}

// query: URLSearchParams (or anything with get()). Unknown or malformed parameters give "all".
export function parseWindow(query) {
  const w = query.get("w");
  if (w && Object.hasOwn(LAST_WINDOWS, w)) return { kind: "last", key: w, ns: LAST_WINDOWS[w] };
  const from = nonNegativeInt(query.get("from"));
  const to = nonNegativeInt(query.get("to"));
  if (from !== null && to !== null && to > from) return { kind: "range", from_ns: from, to_ns: to };
  return { kind: "all" };
}

// The hash parameters of a window (buildHash leaves out null ones).
export function windowParams(w) {
  if (w.kind === "last") return { w: w.key, from: null, to: null };
  if (w.kind === "range") return { w: null, from: w.from_ns, to: w.to_ns };
  return { w: null, from: null, to: null };
}

// The key of the window's button: "5m", "1h", "all", or "range" (no button).
export function windowKey(w) {
  return w.kind === "last" ? w.key : w.kind;
}

// The run-relative range to ask the server for: { from_ns, to_ns }, or null for the whole run.
// "last N" ends at the newest data (newestNs) and is the whole run while that is unknown.
export function resolveWindow(w, newestNs) {
  if (w.kind === "range") return { from_ns: w.from_ns, to_ns: w.to_ns };
  if (w.kind === "last") {
    if (newestNs === null || newestNs === undefined || !(newestNs >= 0)) return null;
    return { from_ns: Math.max(0, Math.round(newestNs - w.ns)), to_ns: Math.round(newestNs) };
  }
  return null;
}

// Whether the window moves with new data (re-queried live) or stays where the user put it.
export function followsNewest(w) {
  return w.kind !== "range";
}

// A drag-zoom on a chart whose x axis is wall-clock milliseconds -> a fixed range window.
// startMs: the run's start in epoch milliseconds. Null when the range is empty.
export function rangeFromZoom(minMs, maxMs, startMs) {
  const from = Math.max(0, Math.round((minMs - startMs) * 1e6));
  const to = Math.max(0, Math.round((maxMs - startMs) * 1e6));
  return to > from ? { kind: "range", from_ns: from, to_ns: to } : null;
}

export function sameWindow(a, b) {
  return windowKey(a) === windowKey(b) &&
    (a.kind !== "range" || (a.from_ns === b.from_ns && a.to_ns === b.to_ns));
}
