// The audit log: who changed what, searchable, exportable as CSV.

import { api, download, items } from "../api.js";
import { formValues, h, loader, notice, table, when } from "../ui.js";

export function render(view, { query }) {
  const status = h("div");
  const field = (name, label, props = {}) => h("label", {}, label, h("input", { name, value: query.get(name) || "", ...props }));
  const form = h(
    "form",
    { class: "filters", dataset: { testid: "audit-filters" }, onsubmit: (e) => (e.preventDefault(), log.refresh()) },
    field("q", "text", { type: "search", placeholder: "target, before/after…" }),
    field("actor", "actor", { placeholder: "token:…" }),
    field("action", "action", { placeholder: "deployments.create" }),
    h("label", {}, "since", h("input", { name: "since", type: "datetime-local" })),
    h("label", {}, "until", h("input", { name: "until", type: "datetime-local" })),
    h("button", { type: "submit" }, "Search"),
    h("button", { type: "button", id: "audit-csv", onclick: exportCsv }, "Export CSV"),
  );

  function filters() {
    const v = formValues(form);
    const ms = (text) => (text ? Date.parse(`${text}Z`) : "");
    return { q: v.q, actor: v.actor, action: v.action, since: ms(v.since), until: ms(v.until) };
  }

  async function exportCsv() {
    try {
      notice(status, `Saved ${await download("/audit", filters(), "audit.csv")}.`);
    } catch (err) {
      notice(status, `Export failed: ${err.message}`, false);
    }
  }

  const body = h("div", { dataset: { testid: "audit" } });
  const log = loader(body, () => api("/audit", { query: filters() }), draw, "Loading the audit log…");
  view.append(h("h1", {}, "Audit log"), h("p", { class: "hint" }, "Times are UTC."), form, status, body);
  return log;
}

function draw(data) {
  return table(
    [
      ["when", (e) => when(e.at_ms)],
      ["actor", (e) => e.actor],
      ["action", (e) => h("code", {}, e.action)],
      ["target", (e) => e.target],
      ["change", (e) => change(e.before, e.after)],
    ],
    items(data, "entries"),
    "No audit entries match.",
    { dataset: { testid: "audit-table" } },
  );
}

function change(before, after) {
  const keys = new Set([...Object.keys(before || {}), ...Object.keys(after || {})]);
  const parts = [];
  for (const k of keys) {
    const b = JSON.stringify(before?.[k]);
    const a = JSON.stringify(after?.[k]);
    if (b !== a) parts.push(`${k}: ${b ?? "–"} → ${a ?? "–"}`);
  }
  return parts.join("; ");
}
