// rosterd's charts: the bounded history of GET /rosterd/history drawn with uPlot
// (vendor/uPlot.iife.min.js, MIT), then one point appended per `sample` event of the
// page's stream. Per node: memory held by role, stacked, against the capacity line.
// Per role: requests/s, generated tokens/s, queue wait p50 (solid) and p95 (dashed).
// Loads (green) and stops (red) are marks on every time axis.
"use strict";

const COLORS = ["#2f6fde", "#d9822b", "#2e9e6b", "#a347c2", "#c73e4e", "#3aa5b8",
  "#8a6d3b", "#5b6abf", "#b5527f", "#6b8e23"];
const MARK_COLORS = { loaded: "rgba(46,158,107,0.8)", stopped: "rgba(199,62,78,0.8)" };
const CHART_HEIGHT = 170;

const charts = {
  history: null,  // GET /rosterd/history's JSON, with the stream's points appended
  plots: {},      // chart id -> {plot, key}
  roleColors: {},
};

function roleColor(role) {
  if (!(role in charts.roleColors)) {
    charts.roleColors[role] = COLORS[Object.keys(charts.roleColors).length % COLORS.length];
  }
  return charts.roleColors[role];
}

function translucent(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${alpha})`;
}

async function loadHistory() {
  let response;
  try {
    response = await fetch("/rosterd/history", {
      headers: headers({ Accept: "application/json" }),
      cache: "no-store",
    });
  } catch (_) { return; }
  if (!response.ok) return;
  charts.history = await response.json();
  drawCharts();
}

function nulls(n) { return new Array(n).fill(null); }

function appendSample(point) {
  // One `sample` event: the same shape as a column of GET /rosterd/history.
  const h = charts.history;
  if (!h) return;
  if (h.t.length && point.t <= h.t[h.t.length - 1]) return; // already had it
  const n = h.t.length;
  h.t.push(point.t);
  for (const name of new Set([...Object.keys(h.nodes), ...Object.keys(point.nodes)])) {
    const given = point.nodes[name] || { capacity_bytes: null, roles: {} };
    const node = h.nodes[name] || (h.nodes[name] = { capacity_bytes: nulls(n), roles: {} });
    node.capacity_bytes.push(given.capacity_bytes);
    for (const role of Object.keys(given.roles)) {
      if (!node.roles[role]) node.roles[role] = nulls(n);
    }
    for (const [role, values] of Object.entries(node.roles)) values.push(given.roles[role] ?? null);
  }
  for (const role of new Set([...Object.keys(h.roles), ...Object.keys(point.roles)])) {
    const given = point.roles[role] || {};
    const series = h.roles[role] || (h.roles[role] = {});
    for (const name of ["requests_per_s", "tokens_per_s", "queue_wait_p50_s", "queue_wait_p95_s"]) {
      if (!series[name]) series[name] = nulls(n);
      series[name].push(given[name] ?? null);
    }
  }
  h.marks.push(...point.marks);
  // The same bound as the server's: at most `points` points, marks inside the window.
  while (h.t.length > h.points) {
    h.t.shift();
    for (const node of Object.values(h.nodes)) {
      node.capacity_bytes.shift();
      for (const values of Object.values(node.roles)) values.shift();
    }
    for (const series of Object.values(h.roles)) {
      for (const values of Object.values(series)) values.shift();
    }
  }
  h.marks = h.marks.filter((m) => m.at >= h.t[0] - h.interval_s);
  drawCharts();
}

function marksPlugin(node) {
  // Vertical lines at each load and stop (of `node` only, when given).
  return {
    hooks: {
      draw: [(u) => {
        const h = charts.history;
        if (!h) return;
        const ctx = u.ctx;
        ctx.save();
        ctx.lineWidth = 1.5;
        for (const mark of h.marks) {
          if (node && mark.node !== node) continue;
          const x = Math.round(u.valToPos(mark.at, "x", true));
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = MARK_COLORS[mark.kind] || "#888";
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
        }
        ctx.restore();
      }],
    },
  };
}

function figure(container, id, title) {
  let fig = container.querySelector(`figure[data-chart="${CSS.escape(id)}"]`);
  if (!fig) {
    fig = el("figure", { class: "chart", "data-chart": id },
      el("figcaption", { text: title }), el("div", { class: "plot" }));
    container.append(fig);
  }
  return fig;
}

function place(fig, id, key, opts, data) {
  // A plot is rebuilt when its series change (a role came or went), else given new data.
  const held = charts.plots[id];
  const width = Math.max(280, fig.clientWidth - 8);
  if (held && held.key === key && held.plot.root.isConnected) {
    if (Math.abs(held.plot.width - width) > 2) held.plot.setSize({ width, height: CHART_HEIGHT });
    held.plot.setData(data);
  } else {
    if (held) held.plot.destroy();
    const plotBox = fig.querySelector(".plot");
    plotBox.replaceChildren();
    opts.width = width;
    opts.height = CHART_HEIGHT;
    charts.plots[id] = { key, plot: new uPlot(opts, data, plotBox) };
  }
  const values = data.slice(1).flat().filter((v) => typeof v === "number");
  fig.dataset.points = String(data[0].length);
  fig.dataset.peak = String(values.length ? Math.max(...values) : 0);
}

function axes(unit) {
  return [{}, { size: 56, values: (u, ticks) => ticks.map((v) => `${+v.toFixed(2)}${unit}`) }];
}

function drawMemory(container, name, node, t) {
  // Stacked by role: series k holds the sum of the first k roles, drawn from the largest
  // down so that each smaller sum covers the fill beneath it; the legend shows each
  // role's own figure.
  const roles = Object.keys(node.roles).sort();
  const own = roles.map((role) => node.roles[role].map((v) => (typeof v === "number" ? v / GIB : null)));
  const sums = [];
  let running = t.map(() => 0);
  for (const values of own) {
    running = running.map((sum, i) => sum + (values[i] || 0));
    sums.push(running);
  }
  const capacity = node.capacity_bytes.map((v) => (typeof v === "number" ? v / GIB : null));
  const series = [{}, { label: "capacity", stroke: "#555", dash: [6, 4], width: 1.5,
    value: (u, v) => (v === null ? "–" : `${v.toFixed(2)} GiB`) }];
  const data = [t, capacity];
  for (let k = roles.length - 1; k >= 0; k--) {
    const role = roles[k];
    series.push({
      label: role,
      stroke: roleColor(role),
      fill: translucent(roleColor(role), 0.55),
      width: 1,
      value: (u, v, s, i) => (i === null || own[k][i] === null ? "–" : `${own[k][i].toFixed(2)} GiB`),
    });
    data.push(sums[k]);
  }
  const fig = figure(container, `memory:${name}`, `node ${name}: memory held by role (GiB) against capacity`);
  place(fig, `memory:${name}`, roles.join(","), {
    series, axes: axes(" G"), scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 0.01)] } },
    plugins: [marksPlugin(name)],
  }, data);
}

function drawPerRole(container, id, title, names, unit) {
  const h = charts.history;
  const roles = Object.keys(h.roles).sort();
  const series = [{}];
  const data = [h.t];
  for (const role of roles) {
    names.forEach((name, i) => {
      series.push({
        label: names.length > 1 ? `${role} ${name.replace("queue_wait_", "").replace("_s", "")}` : role,
        stroke: roleColor(role),
        width: 1.5,
        dash: i ? [5, 4] : undefined,
        points: { show: true, size: 4 },
        value: (u, v) => (v === null ? "–" : `${+v.toFixed(3)}${unit}`),
      });
      data.push(h.roles[role][name]);
    });
  }
  const fig = figure(container, id, title);
  place(fig, id, roles.join(","), {
    series, axes: axes(unit),
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(max, 0.001)] } },
    plugins: [marksPlugin(null)],
  }, data);
}

function drawCharts() {
  const h = charts.history;
  if (!h || typeof uPlot === "undefined") return;
  const minutes = (h.points * h.interval_s) / 60;
  $("charts-window").textContent =
    `(${h.t.length} of ${h.points} points, one every ${h.interval_s} s: the last ${+minutes.toFixed(1)} min)`;
  const memory = $("memory-charts");
  const names = Object.keys(h.nodes);
  for (const fig of memory.querySelectorAll("figure")) {
    if (!names.includes(fig.dataset.chart.slice("memory:".length))) fig.remove();
  }
  for (const name of names) drawMemory(memory, name, h.nodes[name], h.t);
  const traffic = $("traffic-charts");
  drawPerRole(traffic, "requests", "requests / s by role", ["requests_per_s"], "");
  drawPerRole(traffic, "tokens", "generated tokens / s by role", ["tokens_per_s"], "");
  drawPerRole(traffic, "queue-wait", "queue wait by role, s (p50 solid, p95 dashed)",
    ["queue_wait_p50_s", "queue_wait_p95_s"], " s");
}

window.addEventListener("resize", () => drawCharts());
