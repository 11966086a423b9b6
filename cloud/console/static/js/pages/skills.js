// The skill catalogue: skills, their versions, and where each version came from.

import { api, items } from "../api.js";
import { empty, fmtNum, fmtTime, h, loader, section, show, table } from "../ui.js";

export function render(view) {
  const body = h("div", { dataset: { testid: "skills" } });
  view.append(h("h1", {}, "Skills"), body);
  return loader(body, () => api("/skills"), drawList, "Loading the catalogue…");
}

function drawList(data) {
  const skills = items(data, "skills");
  const rows = skills.map((s) => ({
    name: s.name,
    versions: items(s.versions ?? []).map((v) => (typeof v === "string" ? v : v.version)),
    latest: s.latest ?? s.version ?? "",
    description: s.description ?? "",
  }));
  return table(
    [
      ["skill", (s) => h("a", { href: `#/skills/${encodeURIComponent(s.name)}` }, s.name)],
      ["versions", (s) => s.versions.join(", ") || s.latest || "–"],
      ["description", (s) => s.description],
    ],
    rows,
    "No skill is published yet (edgeskill skill push).",
    { dataset: { testid: "skill-table" } },
  );
}

export function renderDetail(view, { params: [name] }) {
  const body = h("div", { dataset: { testid: "skill-detail" } });
  view.append(h("p", {}, h("a", { href: "#/skills" }, "‹ Skills")), h("h1", {}, name), body);
  return loader(body, () => api(`/skills/${encodeURIComponent(name)}`), drawDetail, "Loading the skill…");
}

function drawDetail(data) {
  const versions = items(data, "versions");
  if (!versions.length) return empty("This skill has no published version.");
  return [...versions]
    .sort((a, b) => (b.created_ms || 0) - (a.created_ms || 0))
    .map((v) =>
      section(
        `${v.name || data.name || ""} ${v.version}`,
        h(
          "dl",
          { class: "facts" },
          h("dt", {}, "published"),
          h("dd", {}, fmtTime(v.created_ms)),
          h("dt", {}, "bundle"),
          h("dd", {}, h("code", {}, v.target_name || "–"), v.size ? ` (${fmtNum(v.size)} bytes)` : ""),
          v.sha256 ? [h("dt", {}, "sha256"), h("dd", {}, h("code", {}, v.sha256))] : null,
        ),
        lineage(
          v.lineage ??
            (Array.isArray(data.lineage) ? data.lineage.filter((s) => s.version === v.version) : null),
        ),
      ),
    );
}

// Lineage: a chain of records (dataset -> job -> model -> variant -> artefact), or a mapping.
function lineage(raw) {
  if (raw == null) return h("p", { class: "state empty" }, "No lineage recorded (built outside the model factory).");
  const steps = Array.isArray(raw) ? raw : Object.entries(raw).map(([kind, value]) => ({ kind, value }));
  if (!steps.length) return h("p", { class: "state empty" }, "No lineage recorded (built outside the model factory).");
  return h(
    "ol",
    { class: "lineage", dataset: { testid: "lineage" } },
    steps.map((step) => h("li", {}, stepText(step))),
  );
}

function stepText(step) {
  if (typeof step !== "object" || step === null) return String(step);
  if ("artifact_id" in step) {
    // One artefact the version ships, back to the data it was trained on.
    const pct = (x) => (x == null ? "–" : `${(100 * x).toFixed(1)}%`);
    return [
      h("strong", {}, step.dataset ? `${step.dataset} v${step.dataset_version}` : "no data set"),
      step.job_id != null ? ` → job ${step.job_id}` : "",
      " → model ",
      h("strong", {}, step.model),
      ` (${step.arch}, test ${pct(step.test_accuracy)})`,
      ` → variant ${step.variant} (${pct(step.variant_accuracy)})`,
      ` → artefact ${step.artifact_id} for ${step.target}`,
    ];
  }
  if ("value" in step && Object.keys(step).length === 2) return [h("strong", {}, step.kind), " ", show(step.value)];
  const kind = step.kind ?? step.type ?? "";
  const rest = Object.entries(step).filter(([k]) => k !== "kind" && k !== "type");
  return [h("strong", {}, kind), " ", rest.map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(" · ")];
}
