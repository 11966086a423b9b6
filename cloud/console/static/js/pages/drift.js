// Drift and accuracy over time (uPlot, served from /assets/), and the drift incidents.

import { api, items } from "../api.js";
import { badge, empty, errorBox, facts, h, loader, loading, mount, section, table, when } from "../ui.js";

const RANGES = [
  ["1 hour", 3600e3],
  ["6 hours", 6 * 3600e3],
  ["24 hours", 24 * 3600e3],
  ["7 days", 7 * 24 * 3600e3],
  ["30 days", 30 * 24 * 3600e3],
];

export function render(view, { query }) {
  const skill = h("select", { name: "skill", id: "drift-skill" }, h("option", { value: "" }, "every skill"));
  const group = h("select", { name: "group", id: "drift-group" }, h("option", { value: "" }, "every group"));
  const range = h("select", { name: "range", id: "drift-range" }, RANGES.map(([label, ms], i) => h("option", { value: ms, selected: i === 0 }, `last ${label}`)));
  const form = h("form", { class: "filters", onsubmit: (e) => (e.preventDefault(), plots.refresh()) },
    h("label", {}, "skill", skill), h("label", {}, "group", group), h("label", {}, "period", range),
    h("button", { type: "submit" }, "Show"));
  for (const el of [skill, group, range]) el.addEventListener("change", () => plots.refresh());
  choices(skill, group, query.get("skill"), query.get("group"));

  const plotArea = h("div", { class: "plots", dataset: { testid: "drift-plots" } });
  const incidentArea = h("div", { dataset: { testid: "incidents" } });
  let charts = [];
  const dispose = () => {
    for (const c of charts) c.destroy();
    charts = [];
  };
  const plots = quietLoader(plotArea, () =>
    api("/drift/series", { query: { skill: skill.value, group: group.value, since: Date.now() - Number(range.value) } }),
    (data) => {
      dispose();
      charts = drawPlots(plotArea, data);
    },
  );
  const incidents = loader(incidentArea, () => api("/drift/incidents", { query: { all: true } }), drawIncidents, "Loading incidents…");
  view.append(h("h1", {}, "Drift and accuracy"), form, section("Over time", plotArea), section("Incidents", incidentArea));
  return {
    refresh: () => (plots.refresh(), incidents.refresh()),
    dispose,
  };
}

// Like ui.loader, but the drawing owns the element (uPlot keeps its canvases).
function quietLoader(root, load, draw) {
  let seq = 0;
  let shown = false;
  async function refresh() {
    const mine = ++seq;
    if (!shown) mount(root, loading("Loading the series…"));
    try {
      const data = await load();
      if (mine !== seq) return;
      draw(data);
      shown = true;
    } catch (err) {
      if (mine === seq && err.status !== 401) mount(root, errorBox(err, refresh));
    }
  }
  refresh();
  return { refresh };
}

async function choices(skill, group, wantSkill, wantGroup) {
  try {
    const [skills, groups] = await Promise.all([api("/skills"), api("/groups")]);
    for (const s of items(skills, "skills")) skill.append(h("option", { value: s.name, selected: s.name === wantSkill }, s.name));
    for (const g of items(groups, "groups")) group.append(h("option", { value: g.name, selected: g.name === wantGroup }, g.name));
  } catch {
    // the plots still show every skill and group
  }
}

/** The plots' columns: x in seconds, then accuracy, PSI of classes, PSI of confidence. */
export function columns(data) {
  const points = items(data?.points ?? data);
  const col = (key) => points.map((p) => (p[key] == null ? null : p[key]));
  return {
    t: points.map((p) => (p.t_ms ?? p.at_ms) / 1000),
    accuracy: col("accuracy"),
    psiClass: col("psi_class"),
    psiConfidence: col("psi_confidence"),
    alarms: points.filter((p) => p.alarms > 0).map((p) => (p.t_ms ?? p.at_ms) / 1000),
    windows: points.reduce((n, p) => n + (p.windows || 0), 0),
  };
}

function drawPlots(root, data) {
  const c = columns(data);
  if (!c.t.length) {
    mount(root, empty("No telemetry in this period: nothing to plot."));
    return [];
  }
  const numbers = summary(c);
  if (typeof window.uPlot !== "function") {
    mount(root, h("p", { class: "state error", role: "alert" }, "The plot library (uPlot) is not installed on the hub: run `make setup` (npm ci). The numbers:"), numbers);
    return [];
  }
  const accuracy = h("div", { class: "plot", dataset: { testid: "plot-accuracy" } });
  const drift = h("div", { class: "plot", dataset: { testid: "plot-drift" } });
  mount(root, numbers, h("h3", {}, "Accuracy (labelled windows)"), accuracy, h("h3", {}, "Drift (PSI; dashed lines: alarms)"), drift);
  const width = Math.max(320, root.clientWidth - 8);
  const plot = (el, series, data, y) =>
    new window.uPlot(
      {
        width,
        height: 220,
        scales: { x: { time: true }, y },
        series: [{}, ...series.map(([label], i) => ({ label, stroke: COLOURS[i], width: 2, spanGaps: true, points: { show: true, size: 4 } }))],
        axes: [{}, { size: 50 }],
        hooks: { draw: [(u) => marks(u, c.alarms)] },
      },
      [c.t, ...data],
      el,
    );
  return [
    plot(accuracy, [["accuracy"]], [c.accuracy], { range: [0, 1] }),
    plot(drift, [["PSI of classes"], ["PSI of confidence"]], [c.psiClass, c.psiConfidence], { range: (u, min, max) => [0, Math.max(0.3, max ?? 0)] }),
  ];
}

const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

// Dashed vertical lines where the drift detector raised alarms.
function marks(u, times) {
  const ctx = u.ctx;
  ctx.save();
  ctx.strokeStyle = "#dc2626";
  ctx.setLineDash([4, 4]);
  for (const t of times) {
    const x = u.valToPos(t, "x", true);
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
  }
  ctx.restore();
}

function summary(c) {
  const last = (xs) => [...xs].reverse().find((v) => v != null);
  return facts([
    ["telemetry windows", c.windows],
    ["latest accuracy", last(c.accuracy) ?? "–"],
    ["latest PSI (classes)", last(c.psiClass) ?? "–"],
    ["drift alarms", c.alarms.length],
  ]);
}

function drawIncidents(data) {
  const rows = items(data, "incidents").map((i) => i.state ?? i);
  return table(
    [
      ["id", (i) => `#${i.id}`],
      ["skill", (i) => `${i.skill} ${i.version}`],
      ["group", (i) => i.group],
      ["stage", (i) => badge(i.stage)],
      ["opened", (i) => when(i.opened_ms)],
      ["why", (i) => i.reason],
      ["canary", (i) => (i.deployment_id ? h("a", { href: `#/rollouts/${i.deployment_id}` }, `#${i.deployment_id} (${i.skill_version})`) : "–")],
      ["outcome", (i) => i.outcome || (i.closed_ms ? "closed" : "open")],
    ],
    rows,
    "No drift incidents.",
  );
}
