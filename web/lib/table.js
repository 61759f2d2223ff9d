// A sortable <table>: every column sorts on a click of its header button; a second click
// toggles the direction. Unknown values sort last in both directions (sort.js).
import { escapeHtml } from "./dom.js";
import { nextDirection, sortRows } from "./sort.js";

// columns: [{ key, label, value(row) -> sort key (null = unknown), html(row) -> cell markup
//             (escaped by the caller), numeric?: bool, firstDir?: "asc"|"desc", title?,
//             cls?: extra class of the column's cells }]
// rows: any objects. sort: { key, dir } initial order. rowAttrs(row) -> attribute markup for
// the <tr> (escaped by the caller). caption: visible table title (or null).
// Returns { table, sortBy(key, dir), state, rowCount }. Each row's markup is built and parsed
// once; a later sort only moves the existing rows, so re-sorting a few thousand rows is cheap.
export function sortableTable({ columns, rows, sort, rowAttrs, caption, className, label }) {
  const table = document.createElement("table");
  table.className = "data" + (className ? " " + className : "");
  if (label) table.setAttribute("aria-label", label);
  if (caption) {
    const c = document.createElement("caption");
    c.textContent = caption;
    table.append(c);
  }
  const thead = table.createTHead();
  const headRow = thead.insertRow();
  const tbody = table.createTBody();
  const state = { key: sort ? sort.key : columns[0].key, dir: sort ? sort.dir : "asc" };

  for (const col of columns) {
    const th = document.createElement("th");
    th.scope = "col";
    th.dataset.key = col.key;
    th.className = [col.numeric ? "num" : "", col.cls || ""].filter(Boolean).join(" ");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "sort";
    if (col.title) button.title = col.title;
    button.append(document.createTextNode(col.label));
    const arrow = document.createElement("span");
    arrow.className = "arrow";
    arrow.setAttribute("aria-hidden", "true");
    button.append(arrow);
    button.addEventListener("click", () => {
      const dir = nextDirection(state.key, state.dir, col.key,
                                col.firstDir || (col.numeric ? "desc" : "asc"));
      sortBy(col.key, dir);
    });
    th.append(button);
    headRow.append(th);
  }

  function markup(row) {
    const cells = columns.map((c) => {
      const cls = [c.numeric ? "num" : "", c.cls || ""].filter(Boolean).join(" ");
      return `<td${cls ? ` class="${cls}"` : ""}>${c.html(row)}</td>`;
    });
    return `<tr${rowAttrs ? " " + rowAttrs(row) : ""}>${cells.join("")}</tr>`;
  }

  // Rows are parsed once (first sort); later sorts move the existing <tr> nodes.
  let rowNodes = null;

  function sortBy(key, dir) {
    const col = columns.find((c) => c.key === key);
    if (!col) return;
    state.key = key;
    state.dir = dir;
    for (const th of headRow.children) {
      const on = th.dataset.key === key;
      th.setAttribute("aria-sort", on ? (dir === "asc" ? "ascending" : "descending") : "none");
      th.querySelector(".arrow").textContent = on ? (dir === "asc" ? "\u25b2" : "\u25bc") : "";
    }
    const order = sortRows(rows.map((_, i) => i), (i) => col.value(rows[i]), dir);
    if (!rows.length) {
      tbody.innerHTML = `<tr><td class="empty" colspan="${columns.length}">${escapeHtml("nothing recorded")}</td></tr>`;
    } else if (rowNodes === null) {
      tbody.innerHTML = order.map((i) => markup(rows[i])).join("");
      rowNodes = new Array(rows.length);
      order.forEach((i, k) => { rowNodes[i] = tbody.rows[k]; });
    } else {
      const frag = document.createDocumentFragment();
      for (const i of order) frag.append(rowNodes[i]);
      tbody.append(frag);
    }
    table.dispatchEvent(new CustomEvent("sorted", { detail: { key, dir } }));
  }

  sortBy(state.key, state.dir);
  return { table, sortBy, get state() { return { ...state }; }, rowCount: rows.length };
}
