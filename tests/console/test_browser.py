"""The console in a browser: log in, the fleet, devices, groups, rollouts, drift, usage, audit.

Headless Chromium against a real hub and real agents (:mod:`tests.console.rig`).
Every wait is a condition with a deadline (Playwright's ``expect``), never a
fixed sleep. Screenshots: the test's ``tmp_path`` and ``.build/console-screenshots/``.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.console.rig import VERSIONS, Rig, login, screenshot
from tests.support import wait_until

pytestmark = pytest.mark.slow

#: A rollout plan that moves as fast as the gates allow: one sample, no pause between waves.
FAST = {"wave_interval_s": 0, "min_samples": 1}


def _nav(page: Page, name: str) -> None:
    page.get_by_role("navigation", name="Console pages").get_by_role("link", name=name).click()


def _rows(page: Page, testid: str) -> list[str]:
    return page.get_by_test_id(testid).locator("tbody tr").all_inner_texts()


def test_a_token_logs_in_a_bad_one_is_refused_and_a_401_brings_the_login_back(
    page: Page, rig: Rig, tmp_path: Path
) -> None:
    page.goto("/")
    page.get_by_label("API token").fill("est_nosuch_secret")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("not accepted")
    expect(page.get_by_role("navigation", name="Console pages")).to_be_hidden()

    login(page, rig.token)
    expect(page.get_by_test_id("who")).to_contain_text("admin")
    assert page.evaluate("sessionStorage.getItem('edgeskill.token')") == rig.token
    screenshot(page, tmp_path, "overview")

    # The token goes bad under the page: the next request's 401 brings the login back.
    page.evaluate("sessionStorage.setItem('edgeskill.token', 'est_revoked_secret')")
    _nav(page, "Devices")
    expect(page.get_by_test_id("login")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("session has ended")

    login(page, rig.token)
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_test_id("login")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('edgeskill.token')") is None


def test_the_overview_shows_the_demo_fleet(page: Page, rig: Rig, tmp_path: Path) -> None:
    login(page, rig.token)
    expect(page.get_by_test_id("tile-online")).to_contain_text("3")
    groups = page.get_by_test_id("overview-groups")
    expect(groups.locator("tr", has_text="cameras")).to_contain_text("kind=camera")
    expect(page.get_by_role("link", name="digits").first).to_be_visible()
    screenshot(page, tmp_path, "overview-fleet")


def test_devices_filter_by_label_board_presence_and_text(
    page: Page, rig: Rig, tmp_path: Path
) -> None:
    login(page, rig.token)
    _nav(page, "Devices")
    table = page.get_by_test_id("device-table")
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(page.get_by_test_id("device-count")).to_have_text("1–3 of 3 devices")

    filters = page.get_by_test_id("device-filters")
    filters.get_by_label("label").fill("kind=camera")
    filters.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(2)
    assert all("kind=camera" in row for row in _rows(page, "device-table"))
    assert "label=kind%3Dcamera" in page.url  # the filter is in the address: it can be shared

    filters.get_by_label("board").fill("arm-cpu")
    filters.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("cam-2")
    screenshot(page, tmp_path, "devices-filtered")

    filters.get_by_role("button", name="Clear").click()
    filters.get_by_label("presence").select_option("offline")
    filters.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("empty")).to_have_text("No device matches these filters.")

    filters.get_by_role("button", name="Clear").click()
    filters.get_by_label("device id").fill("gw")
    filters.get_by_role("button", name="Filter").click()
    expect(table.locator("tbody tr")).to_have_count(1)
    page.get_by_role("link", name="gw-1").click()
    expect(page.get_by_role("heading", name="gw-1")).to_be_visible()
    expect(page.get_by_test_id("device-detail")).to_contain_text("kind=gateway")

    page.goto("/#/devices/cam-1")
    detail = page.get_by_test_id("device-detail")
    expect(detail).to_contain_text("running")
    expect(detail).to_contain_text(re.compile(r"onnx-cpu"))
    expect(page.get_by_test_id("device-quality").locator("tbody tr")).to_have_count(1)
    screenshot(page, tmp_path, "device-detail")


def test_a_group_is_previewed_as_it_is_typed_then_created(
    page: Page, rig: Rig, tmp_path: Path
) -> None:
    login(page, rig.token)
    _nav(page, "Groups")
    editor = page.get_by_test_id("group-editor")
    preview = page.get_by_test_id("group-preview")
    editor.get_by_label("selector").fill("kind=gateway")
    expect(page.get_by_test_id("preview-count")).to_have_text("1 matching device")
    expect(preview).to_contain_text("gw-1")
    editor.get_by_label("selector").fill("kind=camera")
    expect(page.get_by_test_id("preview-count")).to_have_text("2 matching devices")
    editor.get_by_label("selector").fill("kind=")
    expect(preview.get_by_role("alert")).to_be_visible()

    editor.get_by_label("name").fill("gateways")
    editor.get_by_label("selector").fill("kind=gateway")
    editor.get_by_role("button", name="Create group").click()
    expect(page.get_by_role("status").filter(has_text="created")).to_have_text(
        "Group gateways created."
    )
    expect(page.get_by_test_id("group-list").locator("tr", has_text="gateways")).to_contain_text(
        "kind=gateway"
    )
    screenshot(page, tmp_path, "groups")
    assert "gateways" in {g.name for g in rig.fleet.groups.list()}

    # A name taken is refused with the hub's message, and nothing changes.
    editor.get_by_label("name").fill("gateways")
    editor.get_by_label("selector").fill("kind=camera")
    editor.get_by_role("button", name="Create group").click()
    expect(page.get_by_role("alert").filter(has_text="Not created")).to_be_visible()

    _nav(page, "Audit")
    page.get_by_test_id("audit-filters").get_by_label("action").fill("groups.create")
    page.get_by_role("button", name="Search").click()
    expect(page.get_by_test_id("audit-table")).to_contain_text("group/gateways")


def _deploy(page: Page, version: str, strategy: str, plan: dict[str, object] | None = None) -> int:
    """Fill the rollout page's form; returns the new deployment's id (from the address).

    A canary is one device; ``plan`` goes in the plan field.
    """
    _nav(page, "Rollouts")
    form = page.get_by_test_id("deploy-form")
    form.get_by_label("skill").select_option("digits")
    expect(form.get_by_label("version").locator(f"option[value='{version}']")).to_have_count(1)
    form.get_by_label("version").select_option(version)
    form.get_by_label("group").select_option("cameras")
    form.get_by_label("strategy").select_option(strategy)
    if strategy == "canary":
        form.get_by_label("canary size").fill("1")
    if plan is not None:
        form.locator("summary").click()
        form.locator("#deploy-plan").fill(json.dumps(plan))
    form.get_by_role("button", name="Deploy").click()
    expect(page).to_have_url(re.compile(r"#/rollouts/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def _command(page: Page, name: str) -> None:
    """Press a rollout button and say yes to its question."""
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("rollout-controls").get_by_role("button", name=name).click()
    expect(page.get_by_role("status").filter(has_text="requested")).to_have_text(
        f"{name} requested."
    )


def test_a_canary_rollout_is_watched_to_its_end(page: Page, rig: Rig, tmp_path: Path) -> None:
    login(page, rig.token)
    dep_id = _deploy(page, VERSIONS[1], "canary", FAST)
    expect(page.get_by_role("heading", name=f"Deployment #{dep_id}")).to_be_visible()
    expect(page.get_by_test_id("rollout-phase")).to_have_text("completed")
    expect(page.get_by_test_id("device-progress")).to_have_text("2 succeeded (of 2)")
    expect(page.get_by_test_id("gates")).to_contain_text("pass")
    for name in ("pause", "resume", "abort", "rollback"):  # an ended rollout takes no command
        expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
    screenshot(page, tmp_path, "rollout-completed")
    assert rig.running("cam-1") == rig.running("cam-2") == VERSIONS[1]


def test_a_rollback_and_an_abort_put_the_devices_back(page: Page, rig: Rig, tmp_path: Path) -> None:
    cameras = ("cam-1", "cam-2")
    before = {d: rig.running(d) for d in cameras}
    login(page, rig.token)

    # A canary's one device moves, and the next wave would wait an hour: roll it back.
    dep_id = _deploy(page, VERSIONS[2], "canary", {**FAST, "wave_interval_s": 3600})
    expect(page.get_by_test_id("device-progress")).to_contain_text("1 succeeded")
    moved = [d for d in cameras if rig.running(d) == VERSIONS[2]]
    assert len(moved) == 1, {d: rig.running(d) for d in cameras}
    screenshot(page, tmp_path, "rollout-canary")
    _command(page, "rollback")
    expect(page.get_by_test_id("rollout-phase")).to_have_text("rolled_back")
    wait_until(lambda: rig.running(moved[0]) == before[moved[0]], 60, f"{moved[0]} back")
    screenshot(page, tmp_path, "rollout-rolled-back")

    # All at once, then aborted: both cameras fall back to what they ran.
    _deploy(page, VERSIONS[3], "all-at-once")
    expect(page.get_by_test_id("device-progress")).to_have_text("2 succeeded (of 2)")
    _command(page, "abort")
    expect(page.get_by_test_id("deployment-state")).to_have_text("aborted")
    wait_until(lambda: all(rig.running(d) == before[d] for d in cameras), 60, "the cameras back")
    page.goto(f"/#/devices/{moved[0]}")
    skills = page.get_by_test_id("device-detail").locator("tr", has_text="digits").first
    expect(skills).to_contain_text(str(before[moved[0]]))
    page.goto(f"/#/rollouts/{dep_id}")
    expect(page.get_by_test_id("rollout-phase")).to_have_text("rolled_back")
    screenshot(page, tmp_path, "rollout-aborted")


def test_the_drift_page_plots_accuracy_over_time(page: Page, rig: Rig, tmp_path: Path) -> None:
    login(page, rig.token)
    _nav(page, "Drift")
    expect(page.get_by_test_id("plot-accuracy").locator("canvas")).to_be_visible()
    expect(page.get_by_test_id("plot-drift").locator("canvas")).to_be_visible()
    expect(page.get_by_test_id("incidents").get_by_role("status")).to_have_count(0)  # loaded
    page.locator("#drift-group").select_option("cameras")
    expect(page.get_by_test_id("plot-accuracy").locator("canvas")).to_be_visible()
    screenshot(page, tmp_path, "drift")


def test_usage_is_exported_as_csv(page: Page, rig: Rig, tmp_path: Path) -> None:
    login(page, rig.token)
    _nav(page, "Usage")
    expect(page.get_by_test_id("usage-table")).to_contain_text("cam-1")
    with page.expect_download() as info:
        page.get_by_role("button", name="Export CSV").click()
    download = info.value
    assert download.suggested_filename.endswith(".csv")
    saved = tmp_path / download.suggested_filename
    download.save_as(saved)
    rows = list(csv.DictReader(io.StringIO(saved.read_text())))
    cameras = {r["device_id"] for r in rows if int(r["inferences"]) > 0}
    assert {"cam-1", "cam-2"} <= cameras, rows
    assert "gw-1" not in cameras
    screenshot(page, tmp_path, "usage")


def test_a_page_follows_the_hub_without_a_reload(page: Page, rig: Rig) -> None:
    login(page, rig.token)
    _nav(page, "Rollouts")
    table = page.get_by_test_id("deployment-table")
    expect(table.locator("tbody tr").first).to_be_visible()
    count = table.locator("tbody tr").count()
    # A deployment made behind the page's back (to a group of no device: nothing moves).
    if "nobody" not in {g.name for g in rig.fleet.groups.list()}:
        rig.fleet.groups.create("nobody", "kind=none")
    made = rig.fleet.deployments.create("digits", VERSIONS[0], "nobody")
    expect(table.locator("tbody tr")).to_have_count(count + 1)
    expect(table).to_contain_text(f"#{made.id}")
    stream = "the page uses the event stream (GET /api/v1/events/stream?token=...)"
    expect(page.get_by_test_id("live"), stream).to_have_text("live", timeout=15_000)
