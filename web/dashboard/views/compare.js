// 2–4 runs side by side (/api/v1/compare): headline numbers in one table, the step-time
// distributions overlaid (a histogram of each run's step times from its /steps, and the step
// times over the steps), and each run's insights.
import { el } from "/lib/dom.js";
import { UNKNOWN, formatCount, formatNs, formatPercent, isUnknown } from "/lib/format.js";
import { formatDateTime } from "/lib/units.js";
import { mergeSeries, sharedHistogram } from "/lib/series.js";
import { Chart, ChartSet, PALETTE } from "../charts.js";
import { insightList, pageHeader, statusBadge } from "../ui.js";

function unknown(reason) {
  return el("span", { class: "unknown", title: reason }, UNKNOWN);
}

function dist(r) {
  return r.steps ? (r.steps.steady || r.steps.all) : null;
}

export function mountCompare(ctx) {
  const ids = ctx.match.ids;
  ctx.setTitle("Compare runs");
  const charts = new ChartSet(ctx.hooks);
  const errors = el("div", { class: "errors" });
  const body = el("div", { id: "compare" }, el("p", { class: "muted loading" }, "Analysing the runs…"));
  ctx.root.append(
    el("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, el("a", { href: "#/runs" }, "Runs"), " / compare"),
    pageHeader(`Compare ${ids.length} runs`), errors, body);

  if (ids.length < 2 || ids.length > 4) {
    body.replaceChildren(el("p", { class: "error-box", role: "alert" },
      "Pick 2 to 4 runs to compare (", el("code", {}, "#/compare?runs=1,2"), ")."));
    ctx.ready();
    return {};
  }

  function statsTable(runs) {
    const colors = runs.map((_, i) => PALETTE[i % PALETTE.length]);
    const head = el("tr", {}, el("th", { scope: "col" }, ""),
      runs.map((r, i) => el("th", { scope: "col", "data-run-id": r.run.run_id },
        el("span", { class: "swatch", style: `background:${colors[i]}` }),
        el("a", { href: `#/runs/${r.run.run_id}`, class: "run-name" }, r.run.run_name),
        el("span", { class: "muted run-id" }, ` #${r.run.run_id}`))));
    const line = (label, cell) => el("tr", {}, el("th", { scope: "row" }, label),
      runs.map((r) => el("td", { class: "num" }, cell(r))));
    const durationCell = (field) => (r) => {
      const d = dist(r);
      return d ? formatNs(d[field]) : unknown("needs at least 2 steps");
    };
    const rows = [
      line("Status", (r) => statusBadge(r.run.status)),
      line("Host", (r) => r.run.hostname || unknown("no host name recorded")),
      line("GPU", (r) => (r.run.gpu_model ? `${r.run.gpu_model}${isUnknown(r.run.gpu_count) ? "" : ` \u00d7 ${r.run.gpu_count}`}` : unknown("GPU model unknown"))),
      line("Started", (r) => (isUnknown(r.run.start_unix_ns) ? unknown("no start time") : formatDateTime(r.run.start_unix_ns / 1e6))),
      line("Duration", (r) => (isUnknown(r.run.duration_ns) ? unknown("nothing recorded yet") : formatNs(r.run.duration_ns))),
      line("Steps", (r) => (r.steps && !isUnknown(r.steps.count) ? formatCount(r.steps.count) : unknown("not counted"))),
      line("Median step time", durationCell("p50_ns")),
      line("Mean step time", durationCell("mean_ns")),
      line("p99 step time", durationCell("p99_ns")),
      line("Fastest / slowest", (r) => {
        const d = dist(r);
        return d ? `${formatNs(d.min_ns)} / ${formatNs(d.max_ns)}` : unknown("needs at least 2 steps");
      }),
      line("Loader wait", (r) => {
        const f = r.steps && r.steps.breakdown ? r.steps.breakdown.wait_fraction : null;
        return isUnknown(f) ? unknown("not measured") : formatPercent(f);
      }),
      line("MFU", (r) => (isUnknown(r.mfu && r.mfu.value) ? unknown((r.mfu && r.mfu.reason) || "not computed") : formatPercent(r.mfu.value))),
      line("Insights", (r) => {
        const list = r.insights || [];
        const high = list.filter((i) => i.severity === "high").length;
        return `${list.length}${high ? ` (${high} high)` : ""}`;
      }),
    ];
    // The fastest median is marked, so the comparison reads at a glance.
    const medians = runs.map((r) => (dist(r) ? dist(r).p50_ns : null));
    const known = medians.filter((m) => !isUnknown(m));
    if (known.length >= 2) {
      const best = Math.min(...known);
      medians.forEach((m, i) => {
        if (m === best) rows[6].cells[i + 1].classList.add("best");
        else if (!isUnknown(m) && best > 0) {
          rows[6].cells[i + 1].append(el("span", { class: "delta" }, ` +${((m / best - 1) * 100).toFixed(1)}%`));
        }
      });
    }
    return el("table", { class: "data compare-table", id: "compare-table" }, el("thead", {}, head), el("tbody", {}, rows));
  }

  (async () => {
    let doc;
    try {
      doc = await ctx.api(`/api/v1/compare?runs=${ids.join(",")}`);
    } catch (e) {
      ctx.reportError(e, "Could not compare the runs", body);
      if (ctx.isActive()) ctx.ready();
      return;
    }
    if (!ctx.isActive()) return;
    const runs = doc.runs || [];
    const hist = charts.add(new Chart({
      id: "compare_hist", title: "Step-time distribution", subtitle: "share of steps per step-time bin",
      kind: "number", format: (v) => formatPercent(v), formatX: (x) => formatNs(x), height: 220,
      options: { stepPlot: true, fillGraph: true, fillAlpha: 0.12 },
    }));
    const over = charts.add(new Chart({
      id: "compare_steps", title: "Step time over the run", subtitle: "by step number",
      kind: "number", format: formatNs, formatX: (x) => `step ${formatCount(x)}`,
      formatXAxis: (x) => formatCount(x), height: 220, syncKey: null,
    }));
    const insightCols = el("div", { class: "compare-insights" }, runs.map((r, i) =>
      el("section", { class: "panel", "data-run-id": r.run.run_id },
        el("h3", {}, el("span", { class: "swatch", style: `background:${PALETTE[i % PALETTE.length]}` }), r.run.run_name),
        insightList(r.insights || []))));
    body.replaceChildren(
      statsTable(runs),
      el("div", { class: "chart-grid two" }, hist.element, over.element),
      el("h2", {}, "Insights"),
      insightCols);

    // Each run's step times (bucket means on long runs, weighted by the steps they stand for).
    const width = Math.max(200, Math.min(4000, over.element.clientWidth - 24 || 800));
    const results = await Promise.allSettled(runs.map((r) => ctx.api(`/api/v1/runs/${r.run.run_id}/steps?points=${width}`)));
    if (!ctx.isActive()) return;
    const labels = runs.map((r) => `${r.run.run_name} #${r.run.run_id}`);
    const stepRows = results.map((res) => (res.status === "fulfilled" ? res.value.rows || [] : []));
    results.forEach((res, i) => {
      if (res.status === "rejected" && ctx.shouldShow(res.reason)) {
        errors.append(el("div", { class: "error-box", role: "alert" }, `Steps of ${labels[i]}: ${res.reason.message}`));
      }
    });
    const durations = stepRows.map((rows) => rows.map((r) => r.duration_ns));
    const weights = stepRows.map((rows) => rows.map((r) => r.steps || 1));
    const h = sharedHistogram(durations, 40, weights);
    const histRows = h.edges.slice(0, -1).map((e, b) => [e, ...h.fractions.map((f) => f[b])]);
    if (histRows.length) histRows.push([h.edges[h.edges.length - 1], ...h.fractions.map((f) => f[f.length - 1])]);
    hist.setData(histRows, labels, { emptyMessage: "no steps recorded" });
    const lines = stepRows.map((rows) => rows.map((r) => [r.first_step, r.duration_ns]));
    over.setData(mergeSeries(lines), labels, { emptyMessage: "no steps recorded" });
    charts.refresh();
    ctx.ready();
  })();

  return {
    destroy() {
      charts.destroy();
    },
  };
}
