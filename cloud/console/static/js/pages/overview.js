// Fleet overview: presence per group, versions in the field, alerts.

import { api, items } from "../api.js";
import { badge, empty, fmtNum, h, loader, section, table } from "../ui.js";

export function render(view) {
  const body = h("div", { dataset: { testid: "overview" } });
  view.append(h("h1", {}, "Fleet overview"), body);
  return loader(body, () => api("/fleet/overview"), draw, "Loading the fleet…");
}

function draw(answer) {
  const data = answer?.overview ?? answer;
  const groups = items(data?.groups).map((g) => ({ ...g, name: g.name ?? g.group }));
  const totals = data?.totals || sum(groups);
  return [
    h(
      "div",
      { class: "tiles" },
      tile("online", totals.online, "good"),
      tile("stale", totals.stale, "warn"),
      tile("offline", totals.offline, "bad"),
      tile("devices", (totals.online || 0) + (totals.stale || 0) + (totals.offline || 0), "neutral"),
    ),
    answer?.fleet_stopped ? h("p", { class: "state error", role: "alert" }, "The fleet-wide stop switch is on: no rollout moves.") : null,
    section("Groups", groupTable(groups)),
    section("Versions in the field", versions(data?.versions)),
    section("Alerts", alerts(items(data?.alerts))),
  ];
}

function sum(groups) {
  const out = { online: 0, stale: 0, offline: 0 };
  for (const g of groups) for (const k of Object.keys(out)) out[k] += g[k] || 0;
  return out;
}

function tile(label, value, tone) {
  return h(
    "div",
    { class: `tile ${tone}`, dataset: { testid: `tile-${label}` } },
    h("strong", {}, fmtNum(value ?? 0)),
    h("span", {}, label),
  );
}

function groupTable(groups) {
  return table(
    [
      ["group", (g) => h("a", { href: devicesOf(g) }, g.name)],
      ["selector", (g) => h("code", {}, g.selector || "")],
      ["online", (g) => fmtNum(g.online ?? 0)],
      ["stale", (g) => fmtNum(g.stale ?? 0)],
      ["offline", (g) => fmtNum(g.offline ?? 0)],
      ["", (g) => bar(g)],
    ],
    groups,
    "No groups yet: make one on the Groups page.",
    { dataset: { testid: "overview-groups" } },
  );
}

// The device list filtered to the group, when its selector is one label (else the groups page).
function devicesOf(g) {
  const one = /^\s*([A-Za-z0-9._/-]+)\s*=\s*([A-Za-z0-9._/-]+)\s*$/.exec(g.selector || "");
  return one ? `#/devices?label=${encodeURIComponent(`${one[1]}=${one[2]}`)}` : "#/groups";
}

function bar(g) {
  const total = (g.online || 0) + (g.stale || 0) + (g.offline || 0);
  if (!total) return "";
  const part = (k, tone) => h("span", { class: tone, style: `flex:${g[k] || 0}`, title: `${g[k] || 0} ${k}` });
  return h("div", { class: "bar", role: "img", "aria-label": `${g.online || 0} of ${total} online` },
    part("online", "good"), part("stale", "warn"), part("offline", "bad"));
}

// {skill: {version: count}} or [{skill, version, devices}]
function versions(raw) {
  let rows = [];
  if (Array.isArray(raw)) {
    rows = raw.map((r) => ({ skill: r.skill ?? r.name, version: r.version, devices: r.devices ?? r.count ?? 0 }));
  } else if (raw && typeof raw === "object") {
    for (const [skill, byVersion] of Object.entries(raw)) {
      for (const [version, devices] of Object.entries(byVersion || {})) rows.push({ skill, version, devices });
    }
  }
  return table(
    [
      ["skill", (r) => h("a", { href: `#/skills/${encodeURIComponent(r.skill)}` }, r.skill)],
      ["version", (r) => r.version],
      ["devices", (r) => fmtNum(r.devices)],
    ],
    rows,
    "No device reports a skill yet.",
  );
}

function alerts(list) {
  if (!list.length) return empty("No alerts: no open drift incidents, failed installs or stopped rollouts.");
  return h(
    "ul",
    { class: "alerts", dataset: { testid: "alerts" } },
    list.map((a) => h("li", {}, badge(a.kind || a.type || "alert"), " ", alertText(a))),
  );
}

function alertText(a) {
  const text = a.message || a.text || a.reason || "";
  const link =
    a.kind === "rollout" && a.ref != null ? `#/rollouts/${a.ref}`
    : a.kind === "drift" ? "#/drift"
    : a.device_id ? `#/devices/${encodeURIComponent(a.device_id)}`
    : null;
  return link ? h("a", { href: link }, text || link) : text;
}
