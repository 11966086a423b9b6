// Usage (metering): inferences per device, skill and version in a period, and its CSV.

import { api, download, items } from "../api.js";
import { fmtNum, h, loader, notice, section, table } from "../ui.js";

const DAY = 24 * 3600e3;
const PAGE = 500;
const PERIODS = [
  ["today", () => [startOfDay(0), Date.now() + 1]],
  ["last 24 hours", () => [Date.now() - DAY, Date.now() + 1]],
  ["last 7 days", () => [Date.now() - 7 * DAY, Date.now() + 1]],
  ["last 30 days", () => [Date.now() - 30 * DAY, Date.now() + 1]],
  ["this month", () => [startOfMonth(0), startOfMonth(1)]],
  ["last month", () => [startOfMonth(-1), startOfMonth(0)]],
  ["custom", null],
];

function startOfDay(offset) {
  const d = new Date();
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() + offset);
}

function startOfMonth(offset) {
  const d = new Date();
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + offset, 1);
}

export function render(view) {
  const status = h("div");
  const period = h("select", { name: "period", id: "usage-period" }, PERIODS.map(([label], i) => h("option", { value: i, selected: i === 2 }, label)));
  const from = h("input", { type: "date", name: "from", id: "usage-from" });
  const to = h("input", { type: "date", name: "to", id: "usage-to" });
  const custom = h("span", { class: "custom", hidden: true }, h("label", {}, "from (UTC)", from), h("label", {}, "to (UTC, inclusive)", to));
  // The report comes a page of rows at a time (the totals count the whole period):
  // cursors[i] opens page i; a new period starts again at the first page.
  const cursors = [null];
  let page = 0;
  function restart() {
    cursors.length = 1;
    page = 0;
    report.refresh();
  }
  function go(step) {
    page += step;
    report.refresh();
  }

  const form = h(
    "form",
    { class: "filters", onsubmit: (e) => (e.preventDefault(), restart()) },
    h("label", {}, "period", period),
    custom,
    h("button", { type: "submit" }, "Show"),
    h("button", { type: "button", id: "usage-csv", onclick: exportCsv }, "Export CSV"),
  );
  period.addEventListener("change", () => {
    custom.hidden = PERIODS[period.value][1] !== null;
    if (custom.hidden) restart();
  });

  function range() {
    const pick = PERIODS[period.value][1];
    if (pick) return pick();
    const since = from.value ? Date.parse(`${from.value}T00:00:00Z`) : 0;
    const until = to.value ? Date.parse(`${to.value}T00:00:00Z`) + DAY : Date.now() + 1;
    return [since, until];
  }

  async function exportCsv() {
    const [since, until] = range();
    try {
      const name = await download("/usage", { since, until }, `usage-${new Date(since).toISOString().slice(0, 10)}.csv`);
      notice(status, `Saved ${name}.`);
    } catch (err) {
      notice(status, `Export failed: ${err.message}`, false);
    }
  }

  const body = h("div", { dataset: { testid: "usage" } });
  const report = loader(body, () => {
    const [since, until] = range();
    return api("/usage", { query: { since, until, limit: PAGE, cursor: cursors[page] } });
  }, drawPage, "Loading usage…");

  function drawPage(data) {
    cursors[page + 1] = data?.next_cursor || null;
    const shown = items(data, "rows").length;
    const pager = h(
      "div",
      { class: "pager", hidden: page === 0 && !cursors[1] },
      h("span", {}, `rows ${fmtNum(page * PAGE + (shown ? 1 : 0))}–${fmtNum(page * PAGE + shown)}`),
      h("button", { type: "button", disabled: page === 0, onclick: () => go(-1) }, "‹ Previous"),
      h("button", { type: "button", disabled: !cursors[page + 1], onclick: () => go(1) }, "Next ›"),
    );
    return [...drawUsage(data), pager];
  }
  view.append(h("h1", {}, "Usage"), form, status, section("", body));
  return report;
}

function drawUsage(data) {
  const rows = items(data, "rows");
  return [
    h("p", { class: "count", dataset: { testid: "usage-total" } }, `${fmtNum(data?.total_inferences ?? rows.reduce((n, r) => n + (r.inferences || 0), 0))} inferences in this period`),
    table(
      [
        ["device", (r) => h("a", { href: `#/devices/${encodeURIComponent(r.device_id)}` }, r.device_id)],
        ["skill", (r) => r.skill],
        ["version", (r) => r.version],
        ["inferences", (r) => fmtNum(r.inferences)],
        ["windows", (r) => fmtNum(r.windows)],
      ],
      rows,
      "No inferences were metered in this period.",
      { dataset: { testid: "usage-table" } },
    ),
  ];
}
