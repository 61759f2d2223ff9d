// Number formatting for report tables and cards. Pure functions, no DOM.
// Unknown values (null, undefined, NaN) always render as UNKNOWN ("—"), never as 0.

export const UNKNOWN = "\u2014";

export function isUnknown(v) {
  return v === null || v === undefined || (typeof v === "number" && Number.isNaN(v));
}

// Formats |v| scaled into `units` (each `step` times the previous) with three significant
// figures, promoting to the next unit when rounding reaches `step` (999.96 ms -> "1.00 s").
function scaled(v, units, step) {
  const sign = v < 0 ? "\u2212" : "";
  let x = Math.abs(v);
  let i = 0;
  while (i < units.length - 1 && x >= step) {
    x /= step;
    i += 1;
  }
  let text = i === 0 && Number.isInteger(x) ? String(x) : fixed3(x);
  if (i < units.length - 1 && Number(text) >= step) {
    x /= step;
    i += 1;
    text = fixed3(x);
  }
  return sign + text + " " + units[i];
}

// Three significant figures, decided on the rounded value (99.96 -> "100", not "100.0").
function fixed3(x) {
  if (Number(x.toFixed(1)) >= 100) return x.toFixed(0);
  if (Number(x.toFixed(2)) >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

// Nanoseconds -> "850 ns", "12.3 µs", "4.56 ms", "1.23 s"; minutes for long runs ("2 min 5 s"),
// hours for longer ones ("3 h 20 min"). The unit is chosen on the rounded value, so 59.96 s
// (three figures: 60.0) is "1 min 0 s", not "60.0 s"; 59.94 s is "59.9 s".
export function formatNs(ns) {
  if (isUnknown(ns)) return UNKNOWN;
  const seconds = Math.abs(ns) / 1e9;
  if (Number(fixed3(seconds)) >= 60) {
    const sign = ns < 0 ? "\u2212" : "";
    const total = Math.round(seconds);
    if (total >= 3600) {
      const minutes = Math.round(total / 60);
      return `${sign}${Math.floor(minutes / 60)} h ${minutes % 60} min`;
    }
    return `${sign}${Math.floor(total / 60)} min ${total % 60} s`;
  }
  return scaled(ns, ["ns", "\u00b5s", "ms", "s"], 1000);
}

// Bytes (binary units) -> "512 B", "1.50 KiB", "12.0 MiB", "3.25 GiB".
export function formatBytes(bytes) {
  if (isUnknown(bytes)) return UNKNOWN;
  return scaled(bytes, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], 1024);
}

// A change in bytes with an explicit sign: "+1.50 MiB", "\u22123.00 KiB", "0 B".
export function formatSignedBytes(bytes) {
  if (isUnknown(bytes)) return UNKNOWN;
  if (bytes > 0) return "+" + formatBytes(bytes);
  return formatBytes(bytes);
}

// Integers with thousands separators, independent of the locale: 1234567 -> "1,234,567".
export function formatCount(n) {
  if (isUnknown(n)) return UNKNOWN;
  const sign = n < 0 ? "\u2212" : "";
  const digits = String(Math.round(Math.abs(n)));
  return sign + digits.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// A fraction (0.1234) -> "12.3%".
export function formatPercent(fraction) {
  if (isUnknown(fraction)) return UNKNOWN;
  const p = fraction * 100;
  if (p !== 0 && Math.abs(p) < 0.1) return p > 0 ? "<0.1%" : ">\u22120.1%";
  return p.toFixed(1) + "%";
}
