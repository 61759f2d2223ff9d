// The building blocks every view of the report shares (app.js, spark.js): a headline card and
// a view section. DOM only, no data decisions.
import { el } from "../lib/dom.js";

export function card(id, label, value, { sub = null, notice = null, title = null } = {}) {
  return el("div", { class: "card", "data-card": id },
    el("h2", { class: "card-label" }, label),
    el("p", { class: "card-value", title }, value),
    notice ? el("p", { class: "notice", role: "note" }, notice) : null,
    sub ? el("p", { class: "card-sub" }, sub) : null);
}

export function section(id, title, ...children) {
  return el("section", { class: "view", "data-view": id, "aria-labelledby": `h-${id}` },
    el("h1", { id: `h-${id}` }, title), ...children);
}
