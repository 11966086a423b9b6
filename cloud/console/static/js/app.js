// The console's shell: log in, route #/hash paths to pages, keep the page live.

import { api, clearToken, setToken, token } from "./api.js";
import { startLive } from "./live.js";
import { h, mount, notice } from "./ui.js";
import * as audit from "./pages/audit.js";
import * as devices from "./pages/devices.js";
import * as drift from "./pages/drift.js";
import * as groups from "./pages/groups.js";
import * as overview from "./pages/overview.js";
import * as rollouts from "./pages/rollouts.js";
import * as skills from "./pages/skills.js";
import * as usage from "./pages/usage.js";

// [pattern, nav entry, render]; the first match wins.
const ROUTES = [
  [/^\/?$/, "overview", overview.render],
  [/^\/devices\/(.+)$/, "devices", devices.renderDetail],
  [/^\/devices$/, "devices", devices.render],
  [/^\/groups$/, "groups", groups.render],
  [/^\/skills\/(.+)$/, "skills", skills.renderDetail],
  [/^\/skills$/, "skills", skills.render],
  [/^\/rollouts\/(\d+)$/, "rollouts", rollouts.renderDetail],
  [/^\/rollouts$/, "rollouts", rollouts.render],
  [/^\/drift$/, "drift", drift.render],
  [/^\/usage$/, "usage", usage.render],
  [/^\/audit$/, "audit", audit.render],
];

const view = document.getElementById("view");
let current = null; // the page shown: {refresh, dispose}
let stopLive = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = raw.split("?", 2);
  return { path, query: new URLSearchParams(search) };
}

function route() {
  if (!token()) return showLogin();
  const { path, query } = parseHash();
  current?.dispose?.();
  current = null;
  const match = ROUTES.map(([re, nav, render]) => [re.exec(path), nav, render]).find(([m]) => m);
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", Boolean(match && link.dataset.route === match[1]));
  }
  if (!match) {
    mount(view, h("p", { class: "state empty" }, `No page at ${path}. `, h("a", { href: "#/" }, "Go to the overview")));
    return;
  }
  const [m, , render] = match;
  const params = m.slice(1).map(decodeURIComponent);
  view.replaceChildren();
  current = render(view, { params, query }) || null;
}

function setMode(mode, why) {
  const live = document.getElementById("live");
  live.textContent = mode === "live" ? "live" : "polling 5 s";
  live.className = `live ${mode}`;
  live.title = why;
}

async function enter() {
  document.getElementById("top").hidden = false;
  stopLive?.();
  stopLive = startLive(() => current?.refresh?.(), setMode);
  route();
  try {
    const me = await api("/whoami");
    document.getElementById("who").textContent = describe(me);
  } catch {
    // a 401 brings the login back; anything else leaves the header without a name
  }
}

function describe(me) {
  if (!me) return "";
  const where = me.project ? ` · ${me.project}` : " · all projects";
  const scope = me.group ? ` · group ${me.group}` : "";
  return `${me.actor || "?"} (${me.role || "?"})${where}${scope}`;
}

function leave(message) {
  stopLive?.();
  stopLive = null;
  current?.dispose?.();
  current = null;
  clearToken();
  document.getElementById("top").hidden = true;
  document.getElementById("who").textContent = "";
  showLogin(message);
}

function showLogin(message = "") {
  document.getElementById("top").hidden = true;
  const status = h("div", { class: "login-status" });
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    placeholder: "est_…",
    "aria-label": "API token",
  });
  const form = h(
    "form",
    { class: "login card", dataset: { testid: "login" }, onsubmit: (e) => login(e, input, status) },
    h("h1", {}, "EdgeSkill console"),
    h("p", {}, "Log in with an API token (", h("code", {}, "edgeskill console token create"), ")."),
    h("label", { for: "token" }, "API token"),
    input,
    h("button", { type: "submit" }, "Log in"),
    status,
  );
  mount(view, form);
  if (message) notice(status, message, false);
  input.focus();
}

async function login(event, input, status) {
  event.preventDefault();
  const secret = input.value.trim();
  if (!secret) return;
  setToken(secret);
  notice(status, "Checking the token…");
  try {
    await api("/whoami");
  } catch (err) {
    clearToken();
    notice(status, err.status === 401 ? "That token was not accepted." : err.message, false);
    return;
  }
  if (/^#\/?login/.test(location.hash)) location.hash = "#/";
  enter();
}

window.addEventListener("edgeskill:unauthorized", (e) => {
  if (stopLive) leave(`Your session has ended (${e.detail || "token not accepted"}); log in again.`);
});
window.addEventListener("hashchange", () => (token() && stopLive ? route() : showLogin()));
document.getElementById("logout").addEventListener("click", () => leave("Logged out."));

if (token()) enter();
else showLogin();
