// The report's Spark view (profile(spark=True)): the actions table, one page per action (plan
// tabs, the executed plan's operator tree with its SQL metrics, stage costs) and the badges
// that link a source line to its actions. Lays out payload.spark (built in C++,
// cpp/core/lines/spark.cc); decides nothing. Driver time and executor time are shown side by
// side, never added. Deep links: #view=spark (the table), #spark=<action index> (an action).
import { UNKNOWN, formatBytes, formatCount, formatNs, isUnknown } from "../lib/format.js";
import { el, escapeHtml } from "../lib/dom.js";
import { sortableTable } from "../lib/table.js";
import { lineHref, viewHref } from "./links.js";
import { card, section } from "./parts.js";

export function sparkHref(index) {
  return `#spark=${index}`;
}

// "#view=spark" -> "spark"; "#spark=3" -> "spark-3" (when the action exists); else null.
export function sparkViewKey(hash, spark) {
  if (!spark) return null;
  const params = new URLSearchParams(String(hash || "").replace(/^#/, ""));
  if (params.get("view") === "spark") return "spark";
  const n = params.get("spark");
  if (n !== null && /^\d+$/.test(n) && Number(n) < spark.actions.length) return `spark-${Number(n)}`;
  return null;
}

function num(key, label, get, fmt, extra = {}) {
  return { key, label, numeric: true, value: get, html: (r) => escapeHtml(fmt(get(r))), ...extra };
}

function where(data, a) {
  if (isUnknown(a.line)) return UNKNOWN;
  if (a.file === null) return escapeHtml(`${a.path}:${a.line}`);
  const label = `${data.files[a.file].display}:${a.line}`;
  return `<a href="${lineHref(a.file, a.line)}">${escapeHtml(label)}</a>`;
}

function statusCell(a) {
  return `<span class="spark-status spark-${escapeHtml(a.status)}" data-status="${escapeHtml(a.status)}">${escapeHtml(a.status)}</span>`;
}

function actionsView(data) {
  const s = data.spark;
  const parts = [];
  if (s.reason) parts.push(el("p", { class: "notice", role: "note", "data-spark-reason": "" }, s.reason));
  parts.push(el("div", { class: "cards" },
    card("spark-actions", "Actions", formatCount(s.actions.length)),
    card("spark-driver", "Driver time", formatNs(s.driver_time_ns), { sub: "how long the actions blocked the Python driver" }),
    card("spark-executor", "Executor time", formatNs(s.executor_time_ns), { sub: "sum of the tasks' run time on the executors" })));
  parts.push(el("p", { class: "meta" }, s.executor_time_note));
  const columns = [
    { key: "action", label: "Action", value: (a) => a.name,
      html: (a) => `<a href="${sparkHref(a.index)}" data-spark-action="${a.index}">${escapeHtml(a.name)}</a>` },
    { key: "location", label: "Line", value: (a) => `${a.path}\u0000${String(a.line).padStart(9, "0")}`,
      html: (a) => where(data, a) },
    { key: "status", label: "Status", value: (a) => a.status, html: statusCell },
    num("driver", "Driver time", (a) => a.driver_time_ns, formatNs),
    num("executor", "Executor time", (a) => a.executor_time_ns, formatNs),
    num("rows", "Rows", (a) => a.rows, formatCount),
    num("shuffle_read", "Shuffle read", (a) => a.shuffle_read_bytes, formatBytes),
    num("shuffle_write", "Shuffle write", (a) => a.shuffle_write_bytes, formatBytes),
    num("peak", "Peak memory", (a) => a.peak_memory_bytes, formatBytes),
  ];
  const t = sortableTable({ columns, rows: s.actions, sort: { key: "driver", dir: "desc" },
                            caption: `Spark actions (${s.actions.length})`, label: "Spark actions",
                            className: "spark-actions" });
  parts.push(t.table);
  return section("spark", "Spark", ...parts);
}

function metricText(m) {
  if (isUnknown(m.value)) return m.text || UNKNOWN;
  if (m.unit === "ns") return formatNs(m.value);
  if (m.unit === "bytes") return formatBytes(m.value);
  if (m.unit === "count") return formatCount(m.value);
  return String(m.value);
}

function operatorNode(op) {
  const metrics = op.metrics.length
    ? el("ul", { class: "spark-metrics" }, op.metrics.map((m) =>
      el("li", { "data-metric": m.name, title: m.text || "" }, `${m.name}: `, el("strong", {}, metricText(m)))))
    : null;
  return el("li", { class: op.codegen ? "spark-op spark-codegen" : "spark-op", "data-operator": op.name },
    el("span", { class: "spark-op-name", title: op.description || op.name }, op.name),
    metrics,
    op.children.length ? el("ul", { class: "spark-tree" }, op.children.map(operatorNode)) : null);
}

function planTabs(plans) {
  const keys = ["executed", "optimized", "analyzed", "parsed"].filter((k) => !isUnknown(plans[k]));
  if (!keys.length) return el("p", { class: "notice", role: "note" }, "Spark provided no plan for this action.");
  const pre = el("pre", { class: "spark-plan", "data-plan": keys[0] }, plans[keys[0]]);
  const buttons = keys.map((k, i) => el("button", { type: "button", role: "tab", "data-plan-tab": k,
                                                      "aria-selected": i === 0 ? "true" : "false" }, k));
  for (const b of buttons) {
    b.addEventListener("click", () => {
      for (const o of buttons) o.setAttribute("aria-selected", o === b ? "true" : "false");
      pre.textContent = plans[b.dataset.planTab];
      pre.dataset.plan = b.dataset.planTab;
    });
  }
  return el("div", { class: "spark-plans" }, el("div", { role: "tablist", class: "spark-tabs" }, buttons), pre);
}

function stagesTable(a) {
  const columns = [
    num("id", "Stage", (s) => s.id, formatCount, { firstDir: "asc" }),
    { key: "status", label: "Status", value: (s) => s.status, html: (s) => escapeHtml(s.status ?? UNKNOWN) },
    num("tasks", "Tasks", (s) => s.num_tasks, formatCount),
    num("run", "Executor run time", (s) => s.executor_run_time_ns, formatNs),
    num("cpu", "Executor CPU time", (s) => s.executor_cpu_time_ns, formatNs),
    num("sr", "Shuffle read", (s) => s.shuffle_read_bytes, formatBytes),
    num("sw", "Shuffle write", (s) => s.shuffle_write_bytes, formatBytes),
    num("spill", "Spill (mem / disk)", (s) => (isUnknown(s.memory_spilled_bytes) ? null : s.memory_spilled_bytes + (s.disk_spilled_bytes ?? 0)),
        formatBytes, { html: (s) => `${escapeHtml(formatBytes(s.memory_spilled_bytes))} / ${escapeHtml(formatBytes(s.disk_spilled_bytes))}` }),
    num("peak", "Peak execution memory", (s) => s.peak_execution_memory_bytes, formatBytes),
    num("in", "Input", (s) => s.input_bytes, formatBytes),
    num("in_rec", "Input records", (s) => s.input_records, formatCount),
  ];
  return sortableTable({ columns, rows: a.stages || [], sort: { key: "id", dir: "asc" },
                         caption: `Stages (${(a.stages || []).length})`, label: "Stages",
                         className: "spark-stages" }).table;
}

function actionView(data, index) {
  const a = data.spark.actions[index];
  const parts = [];
  const loc = el("p", { class: "meta" });
  loc.innerHTML = `${statusCell(a)} \u00b7 ${where(data, a)}` +
    (a.description ? ` \u00b7 ${escapeHtml(a.description)}` : "");
  parts.push(loc);
  if (a.error) parts.push(el("pre", { class: "notice spark-error", role: "note" }, a.error));
  parts.push(el("div", { class: "cards" },
    card("spark-driver", "Driver time", formatNs(a.driver_time_ns), { sub: "the Python call, blocked" }),
    card("spark-executor", "Executor time", formatNs(a.executor_time_ns),
         { sub: isUnknown(a.executor_time_ns) && a.reasons && a.reasons.executor_time_ns ? a.reasons.executor_time_ns : "sum over tasks" }),
    card("spark-rows", "Rows", formatCount(a.rows)),
    card("spark-shuffle", "Shuffle read / write", `${formatBytes(a.shuffle_read_bytes)} / ${formatBytes(a.shuffle_write_bytes)}`),
    card("spark-peak", "Peak memory", formatBytes(a.peak_memory_bytes))));
  parts.push(el("h2", {}, "Plans"), planTabs(a.plans || {}));
  parts.push(el("h2", {}, "Operators (executed plan)"));
  parts.push((a.operators || []).length
    ? el("ul", { class: "spark-tree spark-root" }, a.operators.map(operatorNode))
    : el("p", { class: "notice", role: "note" }, "No SQL execution was recorded for this action."));
  parts.push(el("h2", {}, "Stage costs"), stagesTable(a));
  parts.push(el("p", {}, el("a", { href: viewHref("spark") }, "\u2190 all Spark actions")));
  return section(`spark-${index}`, `Spark: ${a.name}`, ...parts);
}

export function buildSparkView(key, data) {
  return key === "spark" ? actionsView(data) : actionView(data, Number(key.slice(6)));
}

// The badges of source line `line` of payload file `file`: one link per action run there.
export function sparkLineBadges(data, file, line) {
  if (!data.spark) return "";
  const ids = data.spark.by_line[`${file}:${line}`];
  if (!ids) return "";
  return ids.map((i) => {
    const a = data.spark.actions[i];
    return ` <a class="spark-badge" href="${sparkHref(i)}" data-spark-badge="${i}" title="Spark ${escapeHtml(a.name)}: driver ${escapeHtml(formatNs(a.driver_time_ns))}, executor ${escapeHtml(formatNs(a.executor_time_ns))}">\u26a1 ${escapeHtml(a.name)}</a>`;
  }).join("");
}
