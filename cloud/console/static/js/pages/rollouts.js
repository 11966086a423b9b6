// Rollouts: create a deployment, follow its waves and gates, pause/resume/abort/roll back.

import { api, items, post } from "../api.js";
import { badge, empty, facts, fmtNum, formValues, h, loader, notice, section, show, table, when } from "../ui.js";

const STRATEGIES = ["all-at-once", "canary", "waves", "rolling"];

export function render(view, { query }) {
  const status = h("div");
  const skill = h("select", { name: "skill", id: "deploy-skill", required: true });
  const version = h("select", { name: "version", id: "deploy-version", required: true });
  const group = h("select", { name: "group", id: "deploy-group", required: true });
  const strategy = h("select", { name: "strategy", id: "deploy-strategy" }, STRATEGIES.map((s) => h("option", { value: s }, s)));
  const canary = h("label", { hidden: true }, "canary size", h("input", { name: "canary", placeholder: "10% or a count" }));
  strategy.addEventListener("change", () => (canary.hidden = strategy.value !== "canary"));
  const form = h(
    "form",
    { class: "editor", dataset: { testid: "deploy-form" }, onsubmit: create },
    h("label", {}, "skill", skill),
    h("label", {}, "version", version),
    h("label", {}, "group", group),
    h("label", {}, "strategy", strategy),
    canary,
    h("label", {}, "priority", h("input", { name: "priority", type: "number", value: "0", step: "1" })),
    h("label", { class: "wide" }, "config", h("input", { name: "config", placeholder: "min_confidence=0.5,other=x" })),
    h(
      "details",
      { class: "wide" },
      h("summary", {}, "Rollout plan (JSON, optional: the keys of a plan file)"),
      h("textarea", { name: "plan", id: "deploy-plan", rows: 5, placeholder: '{"wave_interval_s": 60, "min_samples": 10, "gates": {"health": "10%"}}' }),
    ),
    h("button", { type: "submit" }, "Deploy"),
  );
  fillChoices(skill, version, group, query.get("group"));

  async function create(event) {
    event.preventDefault();
    const v = formValues(form);
    const body = {
      skill: v.skill,
      version: v.version,
      group: v.group,
      strategy: v.strategy,
      config: parseConfig(v.config),
      priority: Number(v.priority || 0),
    };
    if (v.strategy === "canary" && v.canary) body.canary = v.canary;
    if (v.plan) {
      try {
        body.plan = JSON.parse(v.plan);
      } catch (err) {
        notice(status, `Not deployed: the plan is not JSON (${err.message})`, false);
        return;
      }
    }
    let made;
    try {
      made = await post("/deployments", body);
    } catch (err) {
      notice(status, `Not deployed: ${err.message}`, false);
      return;
    }
    const id = (made?.deployment ?? made)?.id;
    location.hash = `#/rollouts/${id}`;
  }

  const list = h("div", { dataset: { testid: "deployments" } });
  view.append(h("h1", {}, "Rollouts"), section("New deployment", form, status), section("Deployments", list));
  return loader(list, () => api("/deployments"), drawList, "Loading deployments…");
}

function parseConfig(text) {
  const out = {};
  for (const pair of (text || "").split(",").map((p) => p.trim()).filter(Boolean)) {
    const at = pair.indexOf("=");
    out[at < 0 ? pair : pair.slice(0, at)] = at < 0 ? "" : pair.slice(at + 1); // the hub refuses a bad pair
  }
  return out;
}

async function fillChoices(skill, version, group, wantedGroup) {
  const option = (value, selected = false) => h("option", { value, selected }, value);
  try {
    const [skills, groups] = await Promise.all([api("/skills"), api("/groups")]);
    const names = items(skills, "skills").map((s) => s.name);
    skill.replaceChildren(...names.map((n) => option(n)));
    group.replaceChildren(...items(groups, "groups").map((g) => option(g.name, g.name === wantedGroup)));
    let loaded = null; // the skill whose versions the version list holds
    const versions = async () => {
      const name = skill.value;
      if (name === loaded) return;
      loaded = name;
      if (!name) return version.replaceChildren();
      const detail = await api(`/skills/${encodeURIComponent(name)}`);
      if (skill.value !== name) return; // another skill was picked meanwhile
      const list = items(detail, "versions").map((v) => (typeof v === "string" ? v : v.version));
      version.replaceChildren(...list.reverse().map((v) => option(v))); // newest first
    };
    skill.addEventListener("change", versions);
    await versions();
  } catch (err) {
    skill.replaceChildren(h("option", { value: "" }, `(could not load: ${err.message})`));
  }
}

function drawList(data) {
  const rows = items(data, "deployments").map((d) => ({ ...(d.deployment ?? d), status: d.state, rollout: d.rollout }));
  rows.sort((a, b) => b.id - a.id);
  return table(
    [
      ["id", (d) => h("a", { href: `#/rollouts/${d.id}` }, `#${d.id}`)],
      ["skill", (d) => `${d.skill} ${d.version}`],
      ["group", (d) => d.group],
      ["strategy", (d) => d.strategy],
      ["state", (d) => badge(d.rollout?.phase && d.rollout.phase !== "completed" ? d.rollout.phase : d.status || d.state)],
      ["created", (d) => when(d.created_ms)],
    ],
    rows,
    "Nothing deployed yet.",
    { dataset: { testid: "deployment-table" } },
  );
}

export function renderDetail(view, { params: [id] }) {
  const status = h("div");
  const body = h("div", { dataset: { testid: "rollout" } });
  const controls = h("div", { class: "controls", dataset: { testid: "rollout-controls" } });

  let shown = null; // the status on the page, for the questions below
  const act = (kind, ask) =>
    h("button", {
      type: "button",
      dataset: { action: kind },
      onclick: async () => {
        if (ask && !confirm(ask(Boolean(shown?.rollout)))) return;
        try {
          await post(`/deployments/${id}/${kind}`);
          notice(status, `${kind} requested.`);
        } catch (err) {
          notice(status, `${kind} refused: ${err.message}`, false);
        }
        page.refresh();
      },
    }, kind);
  const buttons = {
    pause: act("pause"),
    resume: act("resume"),
    abort: act("abort", (staged) =>
      staged
        ? `Abort deployment #${id}? Its rollout stops where it is: devices it moved keep the new version (roll back to move them back).`
        : `Abort deployment #${id}? Its devices fall back to what the other deployments say.`),
    rollback: act("rollback", () => `Roll deployment #${id} back? Every device it moved returns to the version it ran before.`),
  };
  controls.append(...Object.values(buttons));

  const page = loader(body, () => api(`/deployments/${id}`), (answer) => {
    const data = answer?.status ?? answer;
    shown = data;
    enable(buttons, data);
    return drawDetail(data);
  }, "Loading the deployment…");
  view.append(h("p", {}, h("a", { href: "#/rollouts" }, "‹ Rollouts")), h("h1", {}, `Deployment #${id}`), controls, status, body);
  enable(buttons, null);
  return page;
}

function enable(buttons, data) {
  const phase = data?.rollout?.phase ?? "";
  const state = data?.state ?? "";
  const staged = Boolean(data?.rollout);
  // A staged rollout that ended takes no command; one all at once can be aborted until it is.
  const ended = staged ? ["completed", "aborted", "rolled_back"].includes(phase) : ["aborted", "superseded"].includes(state);
  buttons.pause.disabled = !data || !staged || ended || phase === "paused";
  buttons.resume.disabled = !data || !staged || phase !== "paused";
  buttons.abort.disabled = !data || ended;
  buttons.rollback.disabled = !data || ended;
}

function drawDetail(data) {
  const dep = data.deployment ?? data;
  const devices = items(data.devices ?? []);
  const counts = {};
  for (const d of devices) counts[d.status] = (counts[d.status] || 0) + 1;
  return [
    section(
      "Deployment",
      facts([
        ["skill", `${dep.skill} ${dep.version}`],
        ["group", dep.group],
        ["strategy", dep.strategy],
        ["state", h("span", { dataset: { testid: "deployment-state" } }, badge(data.state ?? dep.state))],
        ["created", when(dep.created_ms)],
        ["config", Object.keys(dep.config || {}).length ? dep.config : "–"],
      ]),
    ),
    data.rollout ? rollout(data.rollout) : null,
    section(
      "Devices",
      h("p", { class: "count", dataset: { testid: "device-progress" } }, progressText(counts, devices.length)),
      progressBar(counts, devices.length),
      table(
        [
          ["device", (d) => h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)],
          ["status", (d) => badge(d.status)],
          ["reason", (d) => d.reason || ""],
        ],
        devices,
        "The group selects no device now.",
      ),
    ),
  ];
}

function progressText(counts, total) {
  if (!total) return "no target devices";
  const parts = Object.entries(counts).map(([k, n]) => `${fmtNum(n)} ${k}`);
  return `${parts.join(" · ")} (of ${fmtNum(total)})`;
}

function progressBar(counts, total) {
  if (!total) return null;
  const tone = { succeeded: "good", failed: "bad", offline: "bad", "in progress": "warn", pending: "neutral" };
  return h(
    "div",
    { class: "bar", role: "img", "aria-label": progressText(counts, total) },
    Object.entries(counts).map(([k, n]) => h("span", { class: tone[k] || "neutral", style: `flex:${n}`, title: `${n} ${k}` })),
  );
}

function rollout(r) {
  const waves = items(r.waves ?? []);
  return section(
    "Rollout",
    facts([
      ["phase", h("span", { dataset: { testid: "rollout-phase" } }, badge(r.phase))],
      ["reason", r.reason || "–"],
      ["waves opened", r.waves_opened],
      ["devices admitted", `${fmtNum(r.admitted)} of ${fmtNum(r.targets)}`],
    ]),
    waves.length
      ? table(
          [
            ["wave", (w) => w.index ?? w.wave],
            ["devices", (w) => fmtNum(w.devices ?? w.size)],
            ["succeeded", (w) => fmtNum(w.succeeded ?? 0)],
            ["failed", (w) => fmtNum(w.failed ?? 0)],
            ["opened", (w) => when(w.opened_ms)],
          ],
          waves,
        )
      : h("div", { class: "bar", role: "img", "aria-label": `${r.admitted} of ${r.targets} admitted` },
          h("span", { class: "good", style: `flex:${r.admitted || 0}` }),
          h("span", { class: "neutral", style: `flex:${Math.max(0, (r.targets || 0) - (r.admitted || 0))}` })),
    h("h3", {}, "Gates"),
    gates(r.gates),
    Object.keys(r.candidate || {}).length ? h("h3", {}, "KPIs (candidate / baseline)") : null,
    Object.keys(r.candidate || {}).length ? kpis(r.candidate, r.baseline || {}) : null,
  );
}

function gates(list) {
  const rows = items(list ?? []).map((g) => (Array.isArray(g) ? { name: g[0], verdict: g[1], reason: g[2] } : g));
  if (!rows.length) return empty("No gates: nothing is checked between waves.");
  return table(
    [
      ["gate", (g) => g.name ?? g.gate],
      ["verdict", (g) => badge(g.verdict ?? g.status)],
      ["why", (g) => g.reason ?? ""],
    ],
    rows,
    "",
    { dataset: { testid: "gates" } },
  );
}

function kpis(candidate, baseline) {
  return table(
    [
      ["kpi", ([k]) => k],
      ["candidate", ([, v]) => show(v)],
      ["baseline", ([k]) => show(baseline[k])],
    ],
    Object.entries(candidate),
  );
}
