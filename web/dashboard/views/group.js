// A multi-rank job (/api/v1/groups/NAME): its ranks with their step-time medians, each rank's
// step times overlaid (one line per rank, from the rank's /steps) over the spread between
// the slowest and the fastest rank (the two charts share crosshair and zoom), and the group's
// insights (bucket skew, stragglers...). Re-read when one of its runs gets a batch.
import { el, escapeHtml } from "/lib/dom.js";
import { UNKNOWN, formatCount, formatNs, formatPercent, isUnknown } from "/lib/format.js";
import { mergeSeries } from "/lib/series.js";
import { sortableTable } from "/lib/table.js";
import { openLive } from "../api.js";
import { Chart, ChartSet } from "../charts.js";
import { Refresher } from "../refresher.js";
import { errorList, insightList, notEvaluatedList, pageHeader } from "../ui.js";

const STATUS_LABEL = { running: "live", ok: "ok", failed: "failed" };

function rankLabel(r) {
  return isUnknown(r.rank) ? `run ${r.run_id}` : `rank ${r.rank}`;
}

export function mountGroup(ctx) {
  const name = ctx.match.name;
  ctx.setTitle(`Group ${name}`);
  const charts = new ChartSet(ctx.hooks);
  const errors = el("div", { class: "errors" });
  const errs = errorList(errors);
  const summary = el("p", { class: "meta", id: "group-meta" }, "\u00a0");
  const ranksBox = el("div", { id: "ranks", class: "table-box" }, el("p", { class: "muted loading pad" }, "Analysing the group…"));
  const supersededBox = el("div", {});
  const insightsBox = el("div", { class: "panel-body" }, el("p", { class: "muted loading" }, "Analysing the group…"));
  const overlay = charts.add(new Chart({
    id: "rank_steps", title: "Step time per rank", subtitle: "one line per rank, by step number",
    kind: "number", format: formatNs, formatX: (x) => `step ${formatCount(x)}`, formatXAxis: (x) => formatCount(x),
    height: 240, syncKey: "steps",
  }));
  const spread = charts.add(new Chart({
    id: "rank_spread", title: "Spread across ranks", subtitle: "slowest minus fastest rank, per step",
    kind: "number", format: formatNs, formatX: (x) => `step ${formatCount(x)}`, formatXAxis: (x) => formatCount(x),
    height: 140, syncKey: "steps", options: { fillGraph: true, colors: ["#c0392b"] },
  }));
  ctx.root.append(
    el("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, el("a", { href: "#/runs" }, "Runs"), " / group"),
    pageHeader(`Group ${name}`), summary, errors,
    el("section", { class: "section" }, el("h2", {}, "Ranks"), ranksBox, supersededBox),
    el("section", { class: "section" }, el("h2", {}, "Step times"),
      el("div", { class: "stack-charts" }, overlay.element, spread.element)),
    el("section", { class: "panel", id: "insights" }, el("h2", {}, "Group insights"), insightsBox));

  let runIds = new Set();
  let ranks = [];

  function renderRanks(doc) {
    ranks = doc.ranks || [];
    runIds = new Set(ranks.map((r) => r.run_id));
    const live = ranks.filter((r) => r.status === "running").length;
    const world = ranks.find((r) => !isUnknown(r.world_size));
    summary.textContent = `${ranks.length} rank${ranks.length === 1 ? "" : "s"}` +
      (world ? ` of world size ${world.world_size}` : "") + (live ? ` \u00b7 ${live} live` : "");
    const medians = ranks.map((r) => (r.steady ? r.steady.p50_ns : null)).filter((m) => !isUnknown(m));
    const maxMedian = medians.length ? Math.max(...medians) : null;
    const minMedian = medians.length ? Math.min(...medians) : null;
    const dur = (field) => (r) => (r.steady ? r.steady[field] : null);
    const unknownCell = (reason) => `<span class="unknown" title="${escapeHtml(reason)}">${UNKNOWN}</span>`;
    const durCell = (field) => (r) => (isUnknown(dur(field)(r)) ? unknownCell("needs at least 2 steps") : escapeHtml(formatNs(dur(field)(r))));
    const fracCell = (key, reason) => (r) => (isUnknown(r[key]) ? unknownCell(reason) : escapeHtml(formatPercent(r[key])));
    const columns = [
      { key: "rank", label: "Rank", numeric: true, firstDir: "asc", value: (r) => r.rank,
        html: (r) => (isUnknown(r.rank) ? unknownCell("no rank recorded (RANK was not set)") : escapeHtml(r.rank)) },
      { key: "run", label: "Run", value: (r) => r.run_name,
        html: (r) => `<a href="#/runs/${r.run_id}">${escapeHtml(r.run_name)}</a> <span class="muted run-id">#${r.run_id}</span>` },
      { key: "host", label: "Host", value: (r) => r.hostname || null,
        html: (r) => (r.hostname ? escapeHtml(r.hostname) : unknownCell("no host name recorded")) },
      { key: "status", label: "Status", value: (r) => r.status,
        html: (r) => `<span class="badge badge-${escapeHtml(STATUS_LABEL[r.status] || "unknown")}">${r.status === "running" ? '<span class="pulse" aria-hidden="true"></span>' : ""}${escapeHtml(STATUS_LABEL[r.status] || r.status)}</span>` },
      { key: "steps", label: "Steps", numeric: true, value: (r) => r.steps, html: (r) => escapeHtml(formatCount(r.steps)) },
      { key: "median", label: "Median step", numeric: true, value: dur("p50_ns"),
        html: (r) => {
          const m = dur("p50_ns")(r);
          if (isUnknown(m)) return unknownCell("needs at least 2 steps");
          const width = maxMedian ? (100 * m) / maxMedian : 0;
          const slow = medians.length > 1 && m === maxMedian && maxMedian > minMedian ? " slowest" : "";
          return `<span class="bar-cell${slow}"><span class="bar" style="width:${width.toFixed(1)}%"></span><span class="bar-text">${escapeHtml(formatNs(m))}</span></span>`;
        } },
      { key: "mean", label: "Mean", numeric: true, value: dur("mean_ns"), html: durCell("mean_ns") },
      { key: "p99", label: "p99", numeric: true, value: dur("p99_ns"), html: durCell("p99_ns") },
      { key: "wait", label: "Loader wait", numeric: true, value: (r) => r.wait_fraction,
        html: fracCell("wait_fraction", "loader wait not measured") },
      { key: "comm", label: "Comm", numeric: true, value: (r) => r.comm_fraction,
        html: fracCell("comm_fraction", "no communication phase measured") },
      { key: "peer_wait", label: "Waiting for others", numeric: true, value: (r) => r.peer_wait_fraction,
        html: fracCell("peer_wait_fraction", "no bucket timed by this rank and another one") },
      { key: "clock", label: "Clock offset", numeric: true, value: (r) => r.clock_offset_ns,
        html: (r) => {
          if (isUnknown(r.clock_offset_ns)) {
            return unknownCell(r.clock_unaligned_reason || "no clock alignment recorded");
          }
          if (r.rank === doc.clock_alignment?.reference_rank && r.clock_offset_ns === 0) {
            return `<span class="muted" title="the clocks of the other ranks are measured against this one">reference</span>`;
          }
          const sign = r.clock_offset_ns < 0 ? "−" : "+";
          const pm = isUnknown(r.clock_uncertainty_ns) ? "" : ` ±${formatNs(r.clock_uncertainty_ns)}`;
          return escapeHtml(`${sign}${formatNs(Math.abs(r.clock_offset_ns))}${pm}`);
        } },
    ];
    const t = sortableTable({ columns, rows: ranks, sort: { key: "rank", dir: "asc" }, label: "Ranks",
                              rowAttrs: (r) => `data-rank="${escapeHtml(r.rank ?? "")}" data-run-id="${r.run_id}"` });
    const superseded = (doc.superseded_runs || []).length
      ? el("p", { class: "muted small" }, "Left out (a newer run of the same rank is used): " +
        doc.superseded_runs.map((s) => `run ${s.run_id} (${isUnknown(s.rank) ? "no rank" : `rank ${s.rank}`})`).join(", "))
      : null;
    const basis = doc.clock_alignment?.basis
      ? el("p", { class: "muted small", "data-clock-basis": "" }, doc.clock_alignment.basis)
      : null;
    ranksBox.replaceChildren(t.table);
    supersededBox.replaceChildren(basis || "", superseded || "");
    insightsBox.replaceChildren(insightList(doc.insights || [], { empty: "No group insights: nothing crossed a rule threshold." }),
                                notEvaluatedList(doc.not_evaluated) || "");
  }

  async function loadGroup() {
    const doc = await ctx.api(`/api/v1/groups/${encodeURIComponent(name)}`);
    if (!ctx.isActive()) return;
    renderRanks(doc);
    errs.clear("group");
  }

  async function loadSteps() {
    if (!ranks.length) {
      overlay.setData([], [], { emptyMessage: "no ranks" });
      spread.setData([], [], { emptyMessage: "no ranks" });
      return;
    }
    const width = Math.max(200, Math.min(4000, overlay.plot.clientWidth || overlay.element.clientWidth - 24 || 800));
    const results = await Promise.all(ranks.map((r) => ctx.api(`/api/v1/runs/${r.run_id}/steps?points=${width}`)));
    if (!ctx.isActive()) return;
    const lines = results.map((d) => (d.rows || []).map((row) => [row.first_step, row.duration_ns]));
    const rows = mergeSeries(lines);
    overlay.setData(rows, ranks.map(rankLabel), { emptyMessage: "no steps recorded yet" });
    const spreadRows = rows.map((row) => {
      const vals = row.slice(1).filter((v) => !isUnknown(v));
      return [row[0], vals.length >= 2 ? Math.max(...vals) - Math.min(...vals) : null];
    });
    spread.setData(ranks.length >= 2 ? spreadRows : [], ["slowest \u2212 fastest"], {
      emptyMessage: ranks.length >= 2 ? "no steps recorded yet" : "needs two ranks",
    });
    charts.refresh();
    errs.clear("steps");
  }

  const groupRefresher = new Refresher(loadGroup, 5000, {
    onError: (e) => { if (ctx.shouldShow(e)) errs.show("group", e, "Could not load the group"); },
  });
  const stepsRefresher = new Refresher(loadSteps, 2000, {
    onError: (e) => { if (ctx.shouldShow(e)) errs.show("steps", e, "Could not load the ranks' steps"); },
  });

  (async () => {
    await groupRefresher.flush();
    if (!ctx.isActive()) return;
    await stepsRefresher.flush();
    if (ctx.isActive()) ctx.ready();
  })();

  const live = openLive(null, {
    onEvent: (m) => {
      const mine = runIds.has(m.run_id) || (m.type === "run" && m.group_id === name);
      if (!mine) return;
      groupRefresher.request();
      stepsRefresher.request();
    },
    onState: (s) => ctx.setLive(s),
    onReopen: () => {
      groupRefresher.request();
      stepsRefresher.request();
    },
  });

  return {
    destroy() {
      live.close();
      groupRefresher.stop();
      stepsRefresher.stop();
      charts.destroy();
    },
  };
}
