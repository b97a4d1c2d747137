// The console's views of the node that serves it: live metric charts (GET /api/v1/samples,
// permission status), its log (GET /api/v1/logs, permission admin) and the configuration
// versions (from cluster status).  Uses call(), el() and $() of console.js.
"use strict";

const CHART_WINDOW = 300;          // seconds shown at most: the node keeps five minutes of samples
const MIN_WINDOW = 60;             // seconds shown at least
const SAMPLES_EVERY = 2000;        // ms between two asks for new samples
const LOGS_EVERY = 5000;           // ms between two automatic log refreshes
const CHARTS = [
  { id: "chart-commits", title: "Transactions / s",
    series: [{ key: "commits_per_s", label: "commits" }, { key: "aborts_per_s", label: "aborts" }] },
  { id: "chart-latency", title: "Commit latency (ms)",
    series: [{ key: "latency_p50_ms", label: "p50" }, { key: "latency_p99_ms", label: "p99" }] },
  { id: "chart-groups", title: "Group commits / s",
    series: [{ key: "group_commits_per_s", label: "groups" }] },
  { id: "chart-group-size", title: "Group commit size (write sets)",
    series: [{ key: "group_size_mean", label: "mean" }, { key: "group_size_p99", label: "p99" }] },
];

let samples = [];
let samplesTimer = null;
let logsTimer = null;

function buildCharts() {
  $("charts").replaceChildren(...CHARTS.map(c => el("figure", { class: "chart" },
    el("figcaption", {}, c.title),
    el("canvas", { id: c.id, width: "520", height: "160", "data-points": "0" }),
    el("div", { id: c.id + "-legend", class: "legends" }))));
}

function drawCharts() {
  const last = samples.length ? samples[samples.length - 1].t : 0;
  const shown = samples.filter(s => s.t >= last - CHART_WINDOW);
  // The time axis spans the samples there are, from one minute up to five.
  const span = shown.length ? last - shown[0].t : 0;
  const seconds = Math.min(CHART_WINDOW, Math.max(MIN_WINDOW, Math.ceil(span / 30) * 30));
  for (const c of CHARTS) {
    const canvas = $(c.id);
    drawChart(canvas, shown, c.series, seconds);
    // What the chart shows, for a test (or a curious user) to read without pixels.
    canvas.dataset.points = String(shown.length);
    canvas.dataset.nonzero = String(shown.filter(s => c.series.some(({ key }) => s[key] > 0)).length);
    $(c.id + "-legend").replaceChildren(...chartLegend(shown, c.series));
  }
}

async function pollSamples() {
  const since = samples.length ? samples[samples.length - 1].t : 0;
  const r = await call("/samples?since=" + since, undefined, "GET");
  if (!r.ok) {
    $("charts-error").textContent = `metrics: refused (${r.status}) ${r.data && r.data.detail}`;
    return;
  }
  $("charts-error").textContent = "";
  $("charts-node").textContent = r.data.node || "";
  samples = samples.concat(r.data.samples || []).slice(-(r.data.capacity || CHART_WINDOW));
  drawCharts();
}

async function refreshLogs() {
  const params = new URLSearchParams({ limit: $("logs-limit").value });
  if ($("logs-level").value) params.set("level", $("logs-level").value);
  const text = $("logs-contains").value.trim();
  if (text) params.set("contains", text);
  const r = await call("/logs?" + params, undefined, "GET");
  const body = $("logs").tBodies[0];
  if (!r.ok) {
    $("logs-error").textContent = `logs: refused (${r.status}) ${r.data && r.data.detail}`;
    body.replaceChildren();
    if (r.status === 403) $("logs-follow").checked = false;  // asking again is refused again
    return;
  }
  $("logs-error").textContent = r.data.available ? "" : `logs: ${r.data.reason}`;
  // Newest first: what an operator looks for is at the top.
  body.replaceChildren(...(r.data.events || []).slice().reverse().map(e =>
    el("tr", { class: "level-" + e.level, "data-level": e.level },
      el("td", {}, e.time.replace("T", " ").replace(/(\.\d{3})\d*Z$/, "$1")), el("td", {}, e.level),
      el("td", {}, e.logger), el("td", { class: "message" }, e.message + (e.exc ? "\n" + e.exc : "")))));
}

// The configuration versions, from the cluster status the console polls anyway.
function showConfigurations(rows) {
  $("configurations").tBodies[0].replaceChildren(...(rows || []).map(c =>
    el("tr", { "data-config": `${c.type}/${c.name}/${c.version}`, "data-state": c.state },
      el("td", {}, c.type), el("td", {}, c.name), el("td", {}, c.version),
      el("td", { class: "config-" + c.state }, c.state), el("td", {}, c.file || "-"))));
  $("configurations-none").hidden = (rows || []).length > 0;
}

function startViews() {
  stopViews();
  samples = [];
  buildCharts();
  drawCharts();
  pollSamples();
  samplesTimer = setInterval(pollSamples, SAMPLES_EVERY);
  refreshLogs();
  logsTimer = setInterval(() => { if ($("logs-follow").checked) refreshLogs(); }, LOGS_EVERY);
}

function stopViews() {
  if (samplesTimer) clearInterval(samplesTimer);
  if (logsTimer) clearInterval(logsTimer);
  samplesTimer = logsTimer = null;
}

// console.js (loaded after this file) defines $(): wire the form once every script ran.
document.addEventListener("DOMContentLoaded", () => {
  $("logs-form").addEventListener("submit", event => { event.preventDefault(); refreshLogs(); });
  $("logs-level").addEventListener("change", refreshLogs);
});
