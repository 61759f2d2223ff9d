// Small pieces of the dashboard's pages: badges, cards, error boxes, insight lists.
import { el } from "/lib/dom.js";
import { UNKNOWN, isUnknown } from "/lib/format.js";

const STATUS_LABELS = { running: "live", ok: "ok", failed: "failed" };

// A run's status as a badge: running shows as "live".
export function statusBadge(status) {
  const label = STATUS_LABELS[status] || status || UNKNOWN;
  return el("span", { class: `badge badge-${STATUS_LABELS[status] || "unknown"}`, "data-status": status || "" },
    status === "running" ? el("span", { class: "pulse", "aria-hidden": "true" }) : null, label);
}

const SEVERITY_LABELS = { high: "high", med: "medium", low: "low", info: "info" };

export function severityChip(severity) {
  return el("span", { class: `sev sev-${severity || "info"}`, "data-severity": severity || "" },
    SEVERITY_LABELS[severity] || severity || UNKNOWN);
}

// A value cell: the formatted value, or "—" with the reason as a tooltip.
export function valueText(value, format, reason = "not measured") {
  if (isUnknown(value)) return el("span", { class: "unknown", title: reason }, UNKNOWN);
  return document.createTextNode(format(value));
}

// A headline card. value: a node or text; opts.title: a tooltip on the value (the reason for
// "—"); opts.sub: a line under it; opts.testid: data-testid of the value.
export function card(id, label, value, { title = null, sub = null, testid = null } = {}) {
  return el("div", { class: "card", "data-card": id },
    el("div", { class: "card-label" }, label),
    el("div", { class: "card-value", title, "data-testid": testid }, value),
    el("div", { class: "card-sub" }, sub || ""));
}

// Replaces a card's value (and tooltip, sub line) in place.
export function setCard(root, id, value, { title = null, sub } = {}) {
  const c = root.querySelector(`[data-card="${id}"]`);
  if (!c) return;
  const v = c.querySelector(".card-value");
  v.replaceChildren(value instanceof Node ? value : document.createTextNode(String(value)));
  if (title) v.title = title;
  else v.removeAttribute("title");
  if (sub !== undefined) c.querySelector(".card-sub").textContent = sub || "";
}

// An API or page error, shown in the page (never swallowed).
export function errorBox(err, context = "") {
  const status = err && err.status ? ` (HTTP ${err.status})` : "";
  const message = err && err.message ? err.message : String(err);
  return el("div", { class: "error-box", role: "alert", "data-error": err && err.status ? err.status : "error" },
    el("strong", {}, context ? `${context}: ` : "Error: "), message + status);
}

// A panel slot whose content is replaced by the newest state (loading text, content, error).
export function slot(attrs = {}) {
  return el("div", attrs, el("p", { class: "muted loading" }, "Loading…"));
}

// Insights as a list: severity, message, fix (and what each finding explains).
export function insightList(insights, { empty = "No insights: nothing crossed a rule threshold." } = {}) {
  if (!insights || !insights.length) return el("p", { class: "muted empty-note", "data-empty": "1" }, empty);
  return el("ol", { class: "insights" }, insights.map((i) =>
    el("li", { class: `insight insight-${i.severity}`, "data-rule": i.rule_id },
      el("div", { class: "insight-head" }, severityChip(i.severity),
        el("span", { class: "insight-msg" }, i.message)),
      i.fix ? el("div", { class: "insight-fix" }, el("span", { class: "fix-label" }, "Fix"), i.fix) : null,
      el("div", { class: "insight-meta" }, `${i.rule_id}${i.family ? ` \u00b7 ${i.family}` : ""}` +
        (i.explains && i.explains.length ? ` \u00b7 explains ${i.explains.join(", ")}` : "")))));
}

// Rules that could not be evaluated, folded away under a summary line.
export function notEvaluatedList(items) {
  if (!items || !items.length) return null;
  return el("details", { class: "not-evaluated" },
    el("summary", {}, `Not evaluated (${items.length}): an input was not measured or the run is too short`),
    el("ul", {}, items.map((n) => el("li", {}, el("code", {}, n.rule_id), ` \u2014 ${n.reason}`))));
}

export function pageHeader(title, ...rest) {
  return el("div", { class: "page-head" }, el("h1", {}, title), ...rest);
}

// A box of errors keyed by their source: show() replaces that source's error, clear() removes
// it once the source works again, so a recovered request leaves no stale message.
export function errorList(container) {
  const shown = new Map();
  return {
    show(key, err, where) {
      const box = errorBox(err, where);
      box.dataset.source = key;
      if (shown.has(key)) shown.get(key).replaceWith(box);
      else container.append(box);
      shown.set(key, box);
    },
    clear(key) {
      if (!shown.has(key)) return;
      shown.get(key).remove();
      shown.delete(key);
    },
  };
}
