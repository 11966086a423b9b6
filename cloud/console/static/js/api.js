// The hub's REST API (/api/v1), with the session's token on every request.
//
// The token lives in sessionStorage: it goes when the tab closes, and other tabs do
// not see it. A 401 forgets it and tells the app (event "edgeskill:unauthorized"),
// which brings the login back.

const KEY = "edgeskill.token";
const BASE = "/api/v1";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(KEY) || "";
}

export function setToken(value) {
  sessionStorage.setItem(KEY, value);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
}

export function apiUrl(path, query = {}) {
  const url = new URL(BASE + path, location.origin);
  for (const [key, value] of Object.entries(query)) {
    if (Array.isArray(value)) {
      for (const one of value) if (one !== "" && one != null) url.searchParams.append(key, one);
    } else if (value !== "" && value != null) {
      url.searchParams.set(key, value);
    }
  }
  return url;
}

async function send(path, { method = "GET", body, query, accept = "application/json" } = {}) {
  const headers = { Accept: accept };
  const secret = token();
  if (secret) headers.Authorization = `Bearer ${secret}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(apiUrl(path, query), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, `the hub cannot be reached (${err.message})`);
  }
  if (res.status === 401) {
    const message = await errorText(res);
    clearToken();
    window.dispatchEvent(new CustomEvent("edgeskill:unauthorized", { detail: message }));
    throw new ApiError(401, message);
  }
  if (!res.ok) throw new ApiError(res.status, await errorText(res));
  return res;
}

async function errorText(res) {
  try {
    const data = await res.json();
    if (typeof data.error === "string") return data.error;
    if (typeof data.detail === "string") return data.detail;
    if (Array.isArray(data.detail)) return data.detail.map((d) => d.msg || String(d)).join("; ");
  } catch {
    // not JSON: the status line says it
  }
  return `${res.status} ${res.statusText || "error"}`.trim();
}

/** GET (or another method) and parse JSON; throws ApiError with the hub's message. */
export async function api(path, options = {}) {
  const res = await send(path, options);
  if (res.status === 204) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export const post = (path, body = {}) => api(path, { method: "POST", body });

/** Fetch a CSV with the token and hand it to the browser as a file download. */
export async function download(path, query, fallbackName) {
  const res = await send(path, { query: { ...query, format: "csv" }, accept: "text/csv" });
  const blob = await res.blob();
  const disposition = res.headers.get("Content-Disposition") || "";
  const match = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(disposition);
  const name = match ? decodeURIComponent(match[1]) : fallbackName;
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  return name;
}

/** The list in a list answer: a bare array, or its items/devices/rows field. */
export function items(data, ...keys) {
  if (Array.isArray(data)) return data;
  if (!data || typeof data !== "object") return [];
  for (const key of [...keys, "items", "devices", "rows", "entries", "results"]) {
    if (Array.isArray(data[key])) return data[key];
  }
  return [];
}
