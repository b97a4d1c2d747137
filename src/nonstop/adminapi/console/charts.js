// Line charts on a <canvas>, plain JavaScript (no library, no build step): the console's
// live metrics.  drawChart(canvas, samples, series, window) draws the samples of the last
// `window` seconds; a null value is a gap (a second without commits has no latency).
"use strict";

const CHART_COLORS = ["#1f6fb2", "#d9534f", "#2e8b57", "#8a5cb8"];

// A round upper end for the y axis: 1, 2 or 5 times a power of ten, at least `value`.
function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) { if (step * power >= value) return step * power; }
  return 10 * power;
}

function formatValue(value) {
  if (value === null || value === undefined) return "-";
  if (value >= 100) return value.toFixed(0);
  if (value >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

// series: [{key, label}]; samples: [{t, <key>: number|null}], oldest first.
function drawChart(canvas, samples, series, windowSeconds) {
  const ctx = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height;
  const left = 44, right = 8, top = 8, bottom = 20;
  const plotW = width - left - right, plotH = height - top - bottom;
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px sans-serif";
  const now = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  const start = now - windowSeconds;
  let max = 0;
  for (const s of samples) {
    for (const { key } of series) { if (s[key] !== null && s[key] > max) max = s[key]; }
  }
  const yMax = niceCeiling(max);
  const x = t => left + ((t - start) / windowSeconds) * plotW;
  const y = v => top + plotH - (v / yMax) * plotH;
  // Grid and axes: four horizontal lines with their values, the time span below.
  ctx.strokeStyle = "#e4e4e4"; ctx.fillStyle = "#666"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4, py = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(left, py); ctx.lineTo(width - right, py); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(formatValue(v), left - 4, py);
  }
  ctx.textAlign = "left"; ctx.textBaseline = "top";
  ctx.fillText(windowSeconds >= 120 ? `-${Math.round(windowSeconds / 60)} min` : `-${Math.round(windowSeconds)} s`,
    left, top + plotH + 4);
  ctx.textAlign = "right";
  ctx.fillText("now", width - right, top + plotH + 4);
  series.forEach(({ key }, i) => {
    ctx.strokeStyle = CHART_COLORS[i % CHART_COLORS.length]; ctx.lineWidth = 1.5;
    ctx.fillStyle = ctx.strokeStyle;
    ctx.beginPath();
    const known = s => s.t >= start && s[key] !== null && s[key] !== undefined;
    samples.forEach((s, j) => {
      if (!known(s)) return;
      const joined = j > 0 && known(samples[j - 1]);
      if (joined) ctx.lineTo(x(s.t), y(s[key])); else ctx.moveTo(x(s.t), y(s[key]));
      // A point with no neighbour would draw nothing: a dot shows it.
      if (!joined && !(j + 1 < samples.length && known(samples[j + 1]))) {
        ctx.fillRect(x(s.t) - 1.5, y(s[key]) - 1.5, 3, 3);
      }
    });
    ctx.stroke();
  });
}

// The legend under a chart: each series' colour, label and latest value.
function chartLegend(samples, series) {
  const last = samples.length ? samples[samples.length - 1] : {};
  return series.map(({ key, label }, i) => {
    const item = document.createElement("span");
    item.className = "legend";
    item.style.borderColor = CHART_COLORS[i % CHART_COLORS.length];
    item.textContent = `${label} ${formatValue(last[key])}`;
    return item;
  });
}
