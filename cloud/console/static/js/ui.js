// Small DOM helpers and the states every view shows: loading, error, empty.

/** h("a", {href: "#/"}, "text", child): an element; null/false children are skipped. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (key in el && typeof value !== "string") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : value);
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const loading = (what = "Loading…") => h("p", { class: "state loading", role: "status" }, what);

export const empty = (what) => h("p", { class: "state empty", dataset: { testid: "empty" } }, what);

export function errorBox(err, retry) {
  return h(
    "div",
    { class: "state error", role: "alert", dataset: { testid: "error" } },
    h("span", {}, err && err.message ? err.message : String(err)),
    retry ? h("button", { type: "button", onclick: retry }, "Retry") : null,
  );
}

/**
 * Keep `root` showing what `load()` returns, drawn by `draw(data)`.
 *
 * The first load shows "Loading…" (or the error, with Retry). A refresh keeps the
 * current content until the new data is in, and a failed refresh says so above the
 * stale content instead of throwing it away. Answers that arrive out of order are
 * dropped. Returns {refresh}.
 */
export function loader(root, load, draw, what) {
  let seq = 0;
  let shown = false;
  async function refresh() {
    const mine = ++seq;
    if (!shown) mount(root, loading(what));
    let data;
    try {
      data = await load();
    } catch (err) {
      if (mine !== seq || err.status === 401) return;
      if (shown) {
        root.querySelector(":scope > .stale")?.remove();
        root.prepend(h("p", { class: "state error stale", role: "alert" }, `Could not refresh: ${err.message}`));
      } else {
        mount(root, errorBox(err, refresh));
      }
      return;
    }
    if (mine !== seq) return;
    mount(root, draw(data));
    shown = true;
  }
  refresh();
  return { refresh };
}

/** A table; columns are [label, row => cell] pairs. Empty rows show `none`. */
export function table(columns, rows, none = "Nothing here yet.", props = {}) {
  if (!rows.length) return empty(none);
  return h(
    "table",
    props,
    h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", { scope: "col" }, label)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map(([, cell]) => h("td", {}, cell(row)))))),
  );
}

/** Key/value pairs as a definition list; values that are objects are shown as JSON. */
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.map(([key, value]) => [h("dt", {}, key), h("dd", {}, show(value))]),
  );
}

export function show(value) {
  if (value == null || value === "") return "–";
  if (value instanceof Node) return value;
  if (typeof value === "number") return fmtNum(value);
  if (typeof value === "object") return h("code", {}, JSON.stringify(value));
  return String(value);
}

export function fmtNum(n, digits = 3) {
  if (n == null || Number.isNaN(n)) return "–";
  if (Number.isInteger(n)) return n.toLocaleString("en");
  return Number(n.toFixed(digits)).toLocaleString("en", { maximumFractionDigits: digits });
}

export const pct = (n) => (n == null ? "–" : `${(n * 100).toFixed(1)}%`);

export function fmtTime(ms) {
  if (!ms) return "never";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function ago(ms) {
  if (!ms) return "never";
  const s = Math.round((Date.now() - ms) / 1000);
  if (s < 5) return "just now";
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 129600) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export const when = (ms) => h("time", { datetime: ms ? new Date(ms).toISOString() : "", title: fmtTime(ms) }, ago(ms));

/** A state word in a coloured pill: good, bad, warn or neutral by what it says. */
export function badge(state) {
  const text = String(state ?? "unknown");
  const good = /^(online|running|succeeded|completed|pass|ok|healthy|closed)$/;
  const bad = /(fail|offline|abort|rolled.?back|error|open|breach)/;
  const warn = /(stale|pending|progress|paused|canary|wave|soak|installing|warn|wait)/;
  const tone = good.test(text) ? "good" : bad.test(text) ? "bad" : warn.test(text) ? "warn" : "neutral";
  return h("span", { class: `badge ${tone}` }, text);
}

export function labelsText(labels) {
  return Object.entries(labels || {})
    .map(([k, v]) => `${k}=${v}`)
    .join(", ");
}

export function section(title, ...children) {
  return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...children);
}

/** Call `fn` once `ms` after the last call. */
export function debounce(fn, ms) {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** The form's fields as {name: trimmed value}. */
export function formValues(form) {
  const out = {};
  for (const [key, value] of new FormData(form)) out[key] = String(value).trim();
  return out;
}

/** A transient message under a form: ok (green) or error (red). */
export function notice(el, message, ok = true) {
  mount(el, message ? h("p", { class: `state ${ok ? "ok" : "error"}`, role: ok ? "status" : "alert" }, message) : null);
}
