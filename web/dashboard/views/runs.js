// The runs list: every run on the server with its status, size and top insight; filters by
// name and status; 2–4 runs picked with the checkboxes open the comparison. Follows the live
// socket (all runs): a run created, updated or sent a batch re-reads the list (throttled).
import { el, escapeHtml } from "/lib/dom.js";
import { UNKNOWN, formatCount, formatNs, isUnknown } from "/lib/format.js";
import { formatDateTime } from "/lib/units.js";
import { sortableTable } from "/lib/table.js";
import { openLive } from "../api.js";
import { buildHash } from "../route.js";
import { Refresher } from "../refresher.js";
import { pageHeader } from "../ui.js";

const STATUS_LABEL = { running: "live", ok: "ok", failed: "failed" };

function statusCell(r) {
  const label = STATUS_LABEL[r.status] || r.status || UNKNOWN;
  const pulse = r.status === "running" ? `<span class="pulse" aria-hidden="true"></span>` : "";
  return `<span class="badge badge-${escapeHtml(STATUS_LABEL[r.status] || "unknown")}" data-status="${escapeHtml(r.status || "")}">${pulse}${escapeHtml(label)}</span>`;
}

function unknownCell(reason) {
  return `<span class="unknown" title="${escapeHtml(reason)}">${UNKNOWN}</span>`;
}

function headlineCell(r) {
  const h = r.headline;
  if (!h) return unknownCell("no insight for this run (nothing crossed a rule threshold, or nothing recorded yet)");
  const title = h.fix ? `fix: ${h.fix}` : "";
  return `<span class="headline" title="${escapeHtml(title)}"><span class="sev sev-${escapeHtml(h.severity)}" data-severity="${escapeHtml(h.severity)}">${escapeHtml(h.severity === "med" ? "medium" : h.severity)}</span> ${escapeHtml(h.message)}</span>`;
}

function startMs(r) {
  return isUnknown(r.start_unix_ns) ? null : r.start_unix_ns / 1e6;
}

export function mountRuns(ctx) {
  ctx.setTitle("Runs");
  const selected = [];
  let runs = null;
  let table = null;
  let sortState = { key: "start", dir: "desc" };

  const nameFilter = el("input", { id: "filter-name", type: "search", placeholder: "Filter by name",
                                   "aria-label": "Filter by run name", autocomplete: "off" });
  const statusFilter = el("select", { id: "filter-status", "aria-label": "Filter by status" },
    el("option", { value: "" }, "All statuses"),
    el("option", { value: "running" }, "Live"),
    el("option", { value: "ok" }, "OK"),
    el("option", { value: "failed" }, "Failed"));
  const compare = el("button", { id: "compare", class: "btn btn-primary", type: "button", disabled: true },
    "Compare");
  const pickNote = el("span", { class: "muted pick-note", id: "pick-note" }, "Pick 2–4 runs to compare");
  const count = el("span", { class: "muted", id: "run-count" });
  const errors = el("div", { class: "errors" });
  const tableBox = el("div", { class: "table-box", id: "runs-table-box" },
    el("p", { class: "muted loading" }, "Loading runs…"));

  ctx.root.append(
    pageHeader("Runs", count),
    el("div", { class: "toolbar" }, nameFilter, statusFilter, el("span", { class: "spacer" }), pickNote, compare),
    errors, tableBox);

  function updatePicks() {
    const n = selected.length;
    compare.disabled = n < 2 || n > 4;
    pickNote.textContent = n === 0 ? "Pick 2–4 runs to compare"
      : n === 1 ? "1 run picked: pick 1–3 more" : `${n} runs picked`;
    for (const box of tableBox.querySelectorAll("input[data-pick]")) {
      const id = Number(box.dataset.pick);
      box.checked = selected.includes(id);
      box.disabled = !box.checked && n >= 4;
    }
  }

  compare.addEventListener("click", () => {
    if (selected.length >= 2 && selected.length <= 4) {
      location.hash = buildHash(["compare"], { runs: selected.join(",") });
    }
  });
  tableBox.addEventListener("change", (e) => {
    const box = e.target.closest("input[data-pick]");
    if (!box) return;
    const id = Number(box.dataset.pick);
    const i = selected.indexOf(id);
    if (box.checked && i < 0 && selected.length < 4) selected.push(id);
    if (!box.checked && i >= 0) selected.splice(i, 1);
    updatePicks();
  });
  nameFilter.addEventListener("input", render);
  statusFilter.addEventListener("change", render);

  const columns = [
    { key: "pick", label: "", value: (r) => (selected.includes(r.run_id) ? 0 : 1),
      html: (r) => `<input type="checkbox" data-pick="${r.run_id}" aria-label="pick run ${r.run_id} (${escapeHtml(r.run_name)}) to compare"${selected.includes(r.run_id) ? " checked" : ""}>`,
      cls: "pick", title: "picked runs first" },
    { key: "status", label: "Status", value: (r) => r.status, html: statusCell },
    { key: "name", label: "Name", value: (r) => r.run_name,
      html: (r) => `<a href="#/runs/${r.run_id}" data-run-link="${r.run_id}">${escapeHtml(r.run_name)}</a> <span class="muted run-id">#${r.run_id}</span>` },
    { key: "group", label: "Group", value: (r) => r.group_id,
      html: (r) => isUnknown(r.group_id) ? unknownCell("not part of a multi-rank group")
        : `<a href="${buildHash(["groups", r.group_id])}" data-group-link="${escapeHtml(r.group_id)}">${escapeHtml(r.group_id)}</a>${isUnknown(r.rank) ? "" : ` <span class="muted">rank ${escapeHtml(r.rank)}</span>`}` },
    { key: "host", label: "Host", value: (r) => r.hostname,
      html: (r) => (r.hostname ? escapeHtml(r.hostname) : unknownCell("no host name recorded")) },
    { key: "start", label: "Started", value: startMs, numeric: true, firstDir: "desc",
      html: (r) => (startMs(r) === null ? unknownCell("no start time") : escapeHtml(formatDateTime(startMs(r)))) },
    { key: "duration", label: "Duration", value: (r) => r.duration_ns, numeric: true,
      html: (r) => (isUnknown(r.duration_ns) ? unknownCell("nothing recorded yet") : escapeHtml(formatNs(r.duration_ns))) },
    { key: "steps", label: "Steps", value: (r) => r.steps, numeric: true,
      html: (r) => (isUnknown(r.steps) ? unknownCell("not counted") : escapeHtml(formatCount(r.steps))) },
    { key: "headline", label: "Top insight", cls: "headline-cell",
      value: (r) => (r.headline ? ({ high: 0, med: 1, low: 2, info: 3 }[r.headline.severity] ?? 4) : null),
      html: headlineCell, title: "the most severe insight of the run (sorts by severity)" },
  ];

  function render() {
    if (!runs) return;
    const name = nameFilter.value.trim().toLowerCase();
    const status = statusFilter.value;
    const rows = runs.filter((r) => (!name || String(r.run_name).toLowerCase().includes(name)) &&
                                     (!status || r.status === status));
    if (table) sortState = table.state;
    const t = sortableTable({
      columns, rows, sort: sortState, label: "Runs",
      rowAttrs: (r) => `data-run-id="${r.run_id}" data-status="${escapeHtml(r.status || "")}" data-name="${escapeHtml(r.run_name)}"`,
    });
    if (!rows.length) {
      const tbody = t.table.tBodies[0];
      tbody.innerHTML = `<tr><td class="empty" colspan="${columns.length}">${escapeHtml(
        runs.length ? "no run matches the filters" : "no runs yet: record one with gpuprof.profile(server=...) or gpuprof push")}</td></tr>`;
    }
    table = t;
    tableBox.replaceChildren(t.table);
    count.textContent = rows.length === runs.length ? `${formatCount(runs.length)} runs`
      : `${formatCount(rows.length)} of ${formatCount(runs.length)} runs`;
    updatePicks();
  }

  async function load() {
    try {
      const data = await ctx.api("/api/v1/runs");
      if (!ctx.isActive()) return;
      runs = data.runs || [];
      errors.replaceChildren();
      render();
    } catch (e) {
      if (!ctx.isActive()) return;
      ctx.reportError(e, "Could not list the runs", errors);
    } finally {
      if (ctx.isActive()) ctx.ready();
    }
  }

  const refresher = new Refresher(load, 1500, { onError: (e) => ctx.reportError(e, "Could not list the runs", errors) });
  refresher.flush();
  const live = openLive(null, {
    onEvent: (m) => {
      if (m.type === "run" || m.type === "batch") refresher.request();
    },
    onState: (s) => ctx.setLive(s),
    onReopen: () => refresher.request(),
  });

  return {
    destroy() {
      refresher.stop();
      live.close();
    },
  };
}
