// The console's views: live metric charts of the node that serves it and of every other
// member through it (GET /api/v1/samples[?node=B], permission status), with a replication
// lag chart for a node that replicates; its log (GET /api/v1/logs, permission admin) and the
// configuration versions (from cluster status).  Uses call(), el() and $() of console.js,
// byPartitionName() of order.js.
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

// The replication lag chart: one series per partition the node is active for (records
// committed there and not yet acknowledged by every in-sync sync replica); shown only
// for a node whose samples carry replication_pending (a node that replicates).
const LAG = { id: "chart-replication", title: "Replication lag (records not yet acknowledged)" };

let samples = [];                  // the serving node's samples
let others = {};                   // name -> { samples, error }: every other member's
let members = [];                  // [{name, state}] of the cluster status, the serving node first
let servingNode = "";
let samplesTimer = null;
let logsTimer = null;

// The partitions in a node's samples, and the samples flattened so that drawChart reads
// each partition's lag as a plain key ("lag:default.0").
function lagSeries(rows) {
  const names = new Set();
  for (const s of rows) { for (const p of Object.keys(s.replication_pending || {})) names.add(p); }
  return byPartitionName([...names].map(name => ({ name }))).map(p => ({ key: "lag:" + p.name, label: p.name }));
}

function flattenLag(rows) {
  return rows.map(s => {
    const flat = Object.assign({}, s);
    for (const [p, n] of Object.entries(s.replication_pending || {})) flat["lag:" + p] = n;
    return flat;
  });
}

// One node's charts: the four of CHARTS, and the lag chart when it replicates.  `suffix`
// names its canvases: "" for the serving node (chart-commits), "-node-B" for member B.
function chartFigures(suffix, replicating) {
  const charts = replicating ? CHARTS.concat([LAG]) : CHARTS;
  return charts.map(c => el("figure", { class: "chart" },
    el("figcaption", {}, c.title),
    el("canvas", { id: c.id + suffix, width: "520", height: "160", "data-points": "0" }),
    el("div", { id: c.id + suffix + "-legend", class: "legends" })));
}

function buildCharts() {
  $("charts").replaceChildren(...chartFigures("", false));
  $("charts-others").replaceChildren();
}

function drawNode(rows, suffix, container) {
  const last = rows.length ? rows[rows.length - 1].t : 0;
  const shown = flattenLag(rows.filter(s => s.t >= last - CHART_WINDOW));
  // The time axis spans the samples there are, from one minute up to five.
  const span = shown.length ? last - shown[0].t : 0;
  const seconds = Math.min(CHART_WINDOW, Math.max(MIN_WINDOW, Math.ceil(span / 30) * 30));
  const lag = lagSeries(shown);
  if (lag.length && !$(LAG.id + suffix)) container.replaceChildren(...chartFigures(suffix, true));
  const charts = lag.length ? CHARTS.concat([Object.assign({ series: lag }, LAG)]) : CHARTS;
  for (const c of charts) {
    const canvas = $(c.id + suffix);
    if (!canvas) continue;
    drawChart(canvas, shown, c.series, seconds);
    // What the chart shows, for a test (or a curious user) to read without pixels.
    canvas.dataset.points = String(shown.length);
    canvas.dataset.nonzero = String(shown.filter(s => c.series.some(({ key }) => s[key] > 0)).length);
    $(c.id + suffix + "-legend").replaceChildren(...chartLegend(shown, c.series));
  }
}

function drawCharts() {
  drawNode(samples, "", $("charts"));
  for (const m of members) {
    const box = $("charts-of-" + m.name);
    if (!box) continue;
    const other = others[m.name] || { samples: [], error: "" };
    box.querySelector(".error").textContent = other.error || "";
    drawNode(other.samples, "-node-" + m.name, box.querySelector(".charts"));
  }
}

// Called by console.js with every cluster status: the members whose charts are shown.
function setMembers(nodes, asked) {
  servingNode = asked || servingNode;
  members = (nodes || []).filter(n => n.name !== servingNode).map(n => ({ name: n.name, state: n.state }));
  const container = $("charts-others");
  for (const m of members) {
    if ($("charts-of-" + m.name)) continue;
    container.append(el("div", { id: "charts-of-" + m.name, class: "node-charts", "data-node": m.name },
      el("h3", {}, "Node " + m.name), el("p", { class: "error" }), el("div", { class: "charts" })));
    $("charts-of-" + m.name).querySelector(".charts").replaceChildren(...chartFigures("-node-" + m.name, false));
  }
}

// Every member's samples come through the node serving the console (GET /samples?node=B:
// it asks B over the node port), so the browser needs no other address nor credential.
async function pollMember(m) {
  const other = others[m.name] || (others[m.name] = { samples: [], error: "" });
  if (m.state === "Down") { other.error = `node ${m.name} is Down: no new samples`; return; }
  const since = other.samples.length ? other.samples[other.samples.length - 1].t : 0;
  const r = await call(`/samples?node=${encodeURIComponent(m.name)}&since=${since}`, undefined, "GET");
  if (!r.ok) { other.error = `metrics of ${m.name}: ${r.status} ${r.data && r.data.detail}`; return; }
  other.error = "";
  other.samples = other.samples.concat(r.data.samples || []).slice(-(r.data.capacity || CHART_WINDOW));
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
  servingNode = r.data.node || servingNode;
  samples = samples.concat(r.data.samples || []).slice(-(r.data.capacity || CHART_WINDOW));
  await Promise.all(members.map(pollMember));
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

// Which nodes a version applies to (G3), as `nonstop config list` says it.
function appliesTo(scope) {
  if (!scope) return "every node";
  return scope.group !== undefined ? "group " + scope.group : "nodes " + scope.nodes.join(", ");
}

// The configuration versions, from the cluster status the console polls anyway.
function showConfigurations(rows) {
  $("configurations").tBodies[0].replaceChildren(...(rows || []).map(c =>
    el("tr", { "data-config": `${c.type}/${c.name}/${c.version}`, "data-state": c.state },
      el("td", {}, c.type), el("td", {}, c.name), el("td", {}, c.version),
      el("td", { class: "config-" + c.state }, c.state), el("td", {}, appliesTo(c.applies_to)),
      el("td", {}, c.file || "-"))));
  $("configurations-none").hidden = (rows || []).length > 0;
}

function startViews() {
  stopViews();
  samples = [];
  others = {};
  members = [];
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
