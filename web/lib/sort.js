// Sorting with unknown values last. Pure functions, no DOM.
import { isUnknown } from "./format.js";

// Compares two sort keys in direction `dir` ("asc" or "desc"). Unknown keys (null, undefined,
// NaN) sort after every known key in BOTH directions; two unknowns are equal. Numbers compare
// numerically, everything else as strings (code-point order, so results do not depend on
// the browser's locale).
export function compareValues(a, b, dir = "asc") {
  const ua = isUnknown(a);
  const ub = isUnknown(b);
  if (ua || ub) return ua === ub ? 0 : ua ? 1 : -1;
  let c;
  if (typeof a === "number" && typeof b === "number") c = a - b;
  else {
    const sa = String(a);
    const sb = String(b);
    c = sa < sb ? -1 : sa > sb ? 1 : 0;
  }
  return dir === "desc" ? -c : c;
}

// Returns a new array of `rows` ordered by `key(row)` in direction `dir`, unknown keys last.
// Ties keep their input order (the sort is stable), so a previous order is a tie-breaker.
export function sortRows(rows, key, dir = "asc") {
  const keyed = rows.map((row, i) => [key(row), i, row]);
  keyed.sort((x, y) => compareValues(x[0], y[0], dir) || x[1] - y[1]);
  return keyed.map((k) => k[2]);
}

// The direction a column takes on a click: the other direction when it is already the sort
// column, else its preferred first direction.
export function nextDirection(currentKey, currentDir, clickedKey, firstDir = "asc") {
  if (currentKey === clickedKey) return currentDir === "asc" ? "desc" : "asc";
  return firstDir;
}
