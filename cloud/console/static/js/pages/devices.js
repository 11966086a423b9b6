// Devices: a filtered list paged on the server (10,000 devices stay quick), and one device.

import { api, items } from "../api.js";
import { badge, empty, facts, fmtNum, h, labelsText, loader, pct, section, table, when } from "../ui.js";

const FILTERS = ["q", "label", "board", "presence", "skill", "version"];
const PAGE = 50;

export function render(view, { query }) {
  const filters = Object.fromEntries(FILTERS.map((k) => [k, query.get(k) || ""]));
  const cursors = [null]; // cursors[i]: the cursor of page i
  let page = 0;
  const results = h("div", { dataset: { testid: "device-results" } });

  const field = (name, label, props = {}) =>
    h("label", {}, label, h("input", { name, value: filters[name], ...props }));
  const presence = h(
    "select",
    { name: "presence" },
    ["", "online", "stale", "offline"].map((p) => h("option", { value: p, selected: p === filters.presence }, p || "any")),
  );
  const form = h(
    "form",
    { class: "filters", dataset: { testid: "device-filters" }, onsubmit: apply },
    field("q", "device id", { type: "search", placeholder: "contains…" }),
    field("label", "label", { placeholder: "kind=camera" }),
    field("board", "board", { placeholder: "x86-cpu" }),
    h("label", {}, "presence", presence),
    field("skill", "skill"),
    field("version", "version"),
    h("button", { type: "submit" }, "Filter"),
    h("button", { type: "button", class: "link", onclick: clear }, "Clear"),
  );

  function apply(event) {
    event?.preventDefault();
    for (const k of FILTERS) filters[k] = form.elements[k]?.value.trim() ?? "";
    const search = new URLSearchParams(Object.entries(filters).filter(([, v]) => v));
    history.replaceState(null, "", `#/devices${search.size ? `?${search}` : ""}`);
    cursors.length = 1;
    page = 0;
    list.refresh();
  }

  const list = loader(
    results,
    () => api("/devices", { query: { ...filters, limit: PAGE, cursor: cursors[page] } }),
    drawPage,
    "Loading devices…",
  );

  function drawPage(data) {
    const devices = items(data, "devices");
    const total = data?.total ?? devices.length;
    cursors[page + 1] = data?.next_cursor || null;
    const first = total ? page * PAGE + 1 : 0;
    const pager = h(
      "div",
      { class: "pager" },
      h("span", { dataset: { testid: "device-count" } }, `${fmtNum(first)}–${fmtNum(page * PAGE + devices.length)} of ${fmtNum(total)} devices`),
      h("button", { type: "button", disabled: page === 0, onclick: () => go(-1) }, "‹ Previous"),
      h("button", { type: "button", disabled: !cursors[page + 1], onclick: () => go(1) }, "Next ›"),
    );
    return [pager, deviceTable(devices, "No device matches these filters.")];
  }

  function clear() {
    for (const k of FILTERS) if (form.elements[k]) form.elements[k].value = "";
    apply();
  }

  function go(step) {
    page += step;
    list.refresh();
  }

  view.append(h("h1", {}, "Devices"), form, results);
  return list;
}

export function deviceTable(devices, none) {
  return table(
    [
      ["device", (d) => h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)],
      ["presence", (d) => badge(d.presence || (d.online ? "online" : "offline"))],
      ["labels", (d) => labelsText(d.labels)],
      ["board", (d) => d.board || "–"],
      ["skills", (d) => (d.reported || []).map((s) => `${s.name} ${s.version} (${s.state})`).join(", ") || "–"],
      ["last seen", (d) => when(d.last_seen_ms)],
    ],
    devices,
    none,
    { class: "devices", dataset: { testid: "device-table" } },
  );
}

export function renderDetail(view, { params: [id] }) {
  const body = h("div", { dataset: { testid: "device-detail" } });
  view.append(h("p", {}, h("a", { href: "#/devices" }, "‹ Devices")), h("h1", {}, id), body);
  return loader(body, () => api(`/devices/${encodeURIComponent(id)}`), drawDetail, "Loading the device…");
}

function drawDetail(data) {
  const detail = data.detail ?? data;
  const device = detail.device ?? detail;
  return [
    section(
      "Device",
      facts([
        ["presence", badge(device.presence || (device.online ? "online" : "offline"))],
        ["last seen", when(device.last_seen_ms)],
        ["last report", detail.reported_ms ? when(detail.reported_ms) : "never"],
        ["labels", labelsText(device.labels) || "–"],
        ["board", device.board],
        ["project", device.project],
        ["desired generation", device.desired_generation],
        ["reported generation", device.reported_generation],
      ]),
    ),
    section("Skills", skillTable(detail.skills || device.reported || [])),
    section("Health, latency, accuracy, drift (latest window)", quality(data.latest)),
    section("Recent events", events(items(detail.events))),
  ];
}

function skillTable(skills) {
  return table(
    [
      ["skill", (s) => h("a", { href: `#/skills/${encodeURIComponent(s.name)}` }, s.name)],
      ["desired", (s) => s.desired_version || "–"],
      ["reported", (s) => s.reported_version || s.version || "–"],
      ["state", (s) => badge(s.state || "not reported")],
      ["variant", (s) => s.variant || "–"],
      ["previous", (s) => s.previous_version || "–"],
      ["error", (s) => s.error || ""],
    ],
    skills,
    "No skill is desired on or reported by this device.",
  );
}

// {skill: {version, window_end_ms, latency_p50_ms, ..., accuracy, drift: {name: value}}}
function quality(latest) {
  const rows = Object.entries(latest || {}).map(([skill, w]) => ({ skill, ...w }));
  return table(
    [
      ["skill", (r) => `${r.skill} ${r.version ?? ""}`],
      ["window", (r) => when(r.window_end_ms)],
      ["inferences", (r) => fmtNum(r.inferences)],
      ["errors", (r) => badge(r.errors ? `${r.errors} errors` : "ok")],
      ["accuracy", (r) => pct(r.accuracy)],
      ["p50 / p95 latency", (r) => `${fmtNum(r.latency_p50_ms, 2)} / ${fmtNum(r.latency_p95_ms, 2)} ms`],
      ["drift", (r) => driftText(r.drift)],
    ],
    rows,
    "No telemetry from this device yet.",
    { dataset: { testid: "device-quality" } },
  );
}

function driftText(drift) {
  const pairs = Object.entries(drift || {}).filter(([k]) => k !== "drift.accuracy");
  return pairs.length ? pairs.map(([k, v]) => `${k.replace(/^drift\./, "")} ${fmtNum(v)}`).join(", ") : "–";
}

function events(list) {
  if (!list.length) return empty("No events recorded for this device.");
  const rows = [...list].reverse(); // newest first
  return table(
    [
      ["when", (e) => when(e.at_ms ?? e.created_ms ?? e.ts_ms)],
      ["kind", (e) => badge(e.kind ?? e.type)],
      ["detail", (e) => eventText(e)],
    ],
    rows,
  );
}

function eventText(e) {
  const detail = e.detail ?? e.data ?? e.payload ?? e.message;
  if (detail == null) return "";
  if (typeof detail === "string") return detail;
  return Object.entries(detail)
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" ");
}
