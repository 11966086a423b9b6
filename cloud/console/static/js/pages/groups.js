// Groups: the list, and an editor that previews the devices a selector matches as you type.

import { api, items, post } from "../api.js";
import { debounce, errorBox, fmtNum, formValues, h, loader, loading, mount, notice, section, table } from "../ui.js";
import { deviceTable } from "./devices.js";

export function render(view) {
  const preview = h("div", { class: "preview", dataset: { testid: "group-preview" } });
  const status = h("div");
  const selector = h("input", {
    name: "selector",
    id: "group-selector",
    required: true,
    placeholder: "kind=camera,site in (a,b)",
    autocomplete: "off",
  });
  const form = h(
    "form",
    { class: "editor", dataset: { testid: "group-editor" }, onsubmit: create },
    h("label", {}, "name", h("input", { name: "name", id: "group-name", required: true, placeholder: "cameras" })),
    h("label", { class: "wide" }, "selector", selector),
    h("button", { type: "submit" }, "Create group"),
  );
  let previewSeq = 0;
  const refreshPreview = debounce(async () => {
    const text = selector.value.trim();
    const mine = ++previewSeq;
    if (!text) {
      mount(preview, h("p", { class: "state empty" }, "Type a selector to see the devices it matches."));
      return;
    }
    mount(preview, loading("Matching devices…"));
    try {
      const data = await api("/groups/preview", { query: { selector: text } });
      if (mine !== previewSeq) return;
      const devices = items(data, "devices");
      const count = data?.count ?? data?.total ?? devices.length;
      mount(
        preview,
        h("p", { class: "count", dataset: { testid: "preview-count" } }, `${fmtNum(count)} matching device${count === 1 ? "" : "s"}`, devices.length < count ? ` (first ${devices.length} shown)` : ""),
        deviceTable(devices, "No device matches this selector now."),
      );
    } catch (err) {
      if (mine === previewSeq) mount(preview, errorBox(err));
    }
  }, 250);
  selector.addEventListener("input", refreshPreview);

  const list = h("div", { dataset: { testid: "group-list" } });
  const groups = loader(list, () => api("/groups"), drawGroups, "Loading groups…");

  async function create(event) {
    event.preventDefault();
    const { name, selector: sel } = formValues(form);
    try {
      await post("/groups", { name, selector: sel });
    } catch (err) {
      notice(status, `Not created: ${err.message}`, false);
      return;
    }
    notice(status, `Group ${name} created.`);
    form.reset();
    refreshPreview();
    groups.refresh();
  }

  view.append(
    h("h1", {}, "Groups"),
    section("New group", form, status, preview),
    section("All groups", list),
  );
  refreshPreview();
  return { refresh: () => (groups.refresh(), refreshPreview()) };
}

function drawGroups(data) {
  return table(
    [
      ["name", (g) => g.name],
      ["selector", (g) => h("code", {}, g.selector)],
      ["devices", (g) => fmtNum(g.devices ?? g.count ?? 0)],
      ["", (g) => h("a", { href: `#/rollouts?group=${encodeURIComponent(g.name)}` }, "deploy…")],
    ],
    items(data, "groups"),
    "No groups yet.",
  );
}
