// Formatting of telemetry values for charts and cards (percent values, watts, degrees, rates,
// clock times). Pure functions, no DOM; unknown values render as UNKNOWN ("—"), never as 0.
import { UNKNOWN, formatBytes, isUnknown } from "./format.js";

// Three significant figures (at least the integer part): 0.123 -> "0.123", 12.34 -> "12.3",
// 123.4 -> "123", 1234 -> "1234".
function sig3(x) {
  const a = Math.abs(x);
  if (a === 0) return "0";
  if (Number(a.toFixed(1)) >= 100) return x.toFixed(0);
  if (Number(a.toFixed(2)) >= 10) return x.toFixed(1);
  if (a >= 0.01) return x.toFixed(2);
  return x.toPrecision(2);
}

function minus(text) {
  return text.replace(/^-/, "\u2212");
}

// A value already in percent (0..100, or more for "% of one core") -> "87.3%".
export function formatPct(value) {
  if (isUnknown(value)) return UNKNOWN;
  return minus(value.toFixed(1)) + "%";
}

// Watts -> "245 W", "12.5 W", "1.20 kW".
export function formatWatts(watts) {
  if (isUnknown(watts)) return UNKNOWN;
  if (Math.abs(watts) >= 1000) return minus(sig3(watts / 1000)) + " kW";
  return minus(sig3(watts)) + " W";
}

// Degrees Celsius -> "67 °C", "67.5 °C".
export function formatCelsius(c) {
  if (isUnknown(c)) return UNKNOWN;
  return minus(Number.isInteger(c) ? String(c) : c.toFixed(1)) + " \u00b0C";
}

// Bytes per second -> "12.0 MiB/s".
export function formatByteRate(bps) {
  if (isUnknown(bps)) return UNKNOWN;
  return formatBytes(bps) + "/s";
}

function pad2(n) {
  return String(n).padStart(2, "0");
}

// Milliseconds since the epoch -> local "HH:MM:SS".
export function formatClock(ms) {
  if (isUnknown(ms)) return UNKNOWN;
  const d = new Date(ms);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

// Milliseconds since the epoch -> local "YYYY-MM-DD HH:MM:SS".
export function formatDateTime(ms) {
  if (isUnknown(ms)) return UNKNOWN;
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${formatClock(ms)}`;
}
