"""The browser tests' rig: a real hub serving the console, real agents, headless Chromium.

The ``rig`` fixture builds the demo's fleet (``edgeskill demo``'s shape, without
the training): a hub process started with ``hub serve --console-bind``, and
three agent processes that enrol with claim tokens and speak mutual TLS
(``cam-1`` and ``cam-2`` labelled ``kind=camera`` on two boards, ``gw-1``
``kind=gateway``), the ``digits`` skill published at several versions (a tiny
ONNX classifier instead of the trained CNN), the group ``cameras`` and
``digits 1.0.0`` deployed to it. Each camera replays a short labelled stream,
so there is telemetry to plot and to meter. One rig serves every test of a
module (on each pytest worker that runs some of them): tests must not rely on
what another test did, only on the rig's starting state.

The browser is Debian's Chromium (``/usr/bin/chromium``; ``make test`` installs
it), launched by Playwright's sync API: Playwright's own browser download is not
used. Each test gets a fresh browser context (its own sessionStorage, so its own
login). Screenshots go to the test's ``tmp_path`` and are copied to
``.build/console-screenshots/`` (git-ignored) for people to look at.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from cloud.service import FleetService
from skills.drift_reference import DriftReference, build_reference
from tests.support import Fleet, agent_args, free_port, wait_for_port, wait_until
from tests.support.skillkit import LIBRARY, VariantFile, build_skill

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / ".build" / "console-screenshots"
#: (device, labels, board), as in ``edgeskill demo``.
DEVICES = [
    ("cam-1", ["kind=camera"], "x86-cpu"),
    ("cam-2", ["kind=camera"], "arm-cpu"),
    ("gw-1", ["kind=gateway"], "x86-cpu"),
]
#: Published versions of ``digits``; the first is deployed to ``cameras`` by the rig.
VERSIONS = ("1.0.0", "1.1.0", "1.2.0", "1.3.0")
#: Items each camera classifies per skill version, and how fast (per second).
STREAM_ITEMS = 100
STREAM_RATE_HZ = 25
#: Seconds a page gets to show what the hub did (installs, rollouts, live updates).
DEADLINE_S = 90


@dataclass
class Rig:
    """The hub (with the console at ``url``), its agents, an admin token, and the hub's home."""

    url: str
    token: str
    home: Path
    work: Path
    fleet: FleetService  # the hub's home, opened in the test process too
    procs: Fleet

    def running(self, device_id: str) -> str | None:
        """The ``digits`` version the device reports running, or None."""
        for d in self.fleet.devices.list():
            if d.device_id == device_id:
                for s in d.reported:
                    if s.name == "digits" and s.state == "running":
                        return s.version
        return None

    def log(self, name: str) -> str:
        path = self.work / "logs" / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""


def _classifier(path: Path, weights: np.ndarray) -> Path:
    """The digits skill's model contract: ``image`` [N, 1, 8, 8] in, ``logits`` [N, 10] out."""
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "digits",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(weights, name="w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def _images(count: int, seed: int) -> np.ndarray:
    """Random 8x8 images scaled to [0, 1], as the agent's replay feeds them."""
    return np.random.default_rng(seed).random((count, 1, 8, 8)).astype(np.float32)


def _answers(x: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The classifier's classes and top-class confidences on ``x`` (numpy, as ONNX runs it)."""
    logits = x.reshape(len(x), 64).astype(np.float64) @ weights
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    return probabilities.argmax(axis=1), probabilities.max(axis=1)


def _reference(weights: np.ndarray) -> DriftReference:
    """A drift reference from the classifier's answers on other images of the same kind."""
    x = _images(500, seed=11)
    classes, confidences = _answers(x, weights)
    brightness = x.reshape(len(x), -1).mean(axis=1)
    return build_reference(classes, confidences, {"brightness": brightness})


def _stream(path: Path, weights: np.ndarray) -> Path:
    """A replay file the classifier gets about 80% right (labels: its own answer, mostly)."""
    x = _images(STREAM_ITEMS, seed=7)
    y = _answers(x, weights)[0].astype(np.int64)
    wrong = np.random.default_rng(5).random(STREAM_ITEMS) < 0.2
    y[wrong] = (y[wrong] + 1) % 10
    np.savez(path, x=x, y=y)
    return path


def _admin_token(home: Path) -> str:
    """An admin token, made as an operator would: with ``edgeskill console token create``."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgeskill.cli",
            "console",
            "token",
            "create",
            "--name",
            "browser-tests",
            "--role",
            "admin",
            "--home",
            str(home),
        ],
        capture_output=True,
        text=True,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    found = re.search(r"est_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", result.stdout)
    assert result.returncode == 0 and found, result.stdout + result.stderr
    return found.group(0)


def _start_agents(
    procs: Fleet, fleet: FleetService, work: Path, hub_url: str, source: Path
) -> None:
    root = fleet.trusted_root
    for device_id, labels, board in DEVICES:
        state = work / "agents" / device_id
        args = agent_args(hub_url, device_id, labels, state, root, source, board)
        token = fleet.identity.create_claim(dict(lb.split("=", 1) for lb in labels), uses=1)
        ca = str(fleet.home / "pki" / "ca.crt")
        enroll = f"grpcs://{fleet.config.enroll_bind}"
        args += ["--claim-token", token, "--hub-ca", ca, "--enroll-url", enroll]
        procs.start(device_id, [*args, "--source-rate", str(STREAM_RATE_HZ)])


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("console")
    home = work / "hub"
    grpc_port = free_port()  # the hub enrols on the next port, which free_port leaves free
    fleet = FleetService.init(home, grpc_bind=f"127.0.0.1:{grpc_port}")
    weights = np.random.default_rng(3).normal(size=(64, 10)).astype(np.float32)
    model = VariantFile("onnx-cpu", "fp32", _classifier(work / "digits.onnx", weights))
    reference = _reference(weights)
    for version in VERSIONS:
        bundle = build_skill(
            LIBRARY / "digits", version, [model], work / "dist", reference=reference
        )
        fleet.skills.publish(bundle)
    source = _stream(work / "stream.npz", weights)
    token = _admin_token(home)
    console_port = free_port()
    procs = Fleet(work / "logs")
    with contextlib.ExitStack() as stack:
        stack.callback(fleet.close)
        stack.callback(procs.stop_all)
        serve = ["hub", "serve", "--home", str(home), "--heartbeat", "2"]
        procs.start("hub", [*serve, "--console-bind", f"127.0.0.1:{console_port}"])
        wait_for_port(grpc_port)
        wait_for_port(console_port)
        _start_agents(procs, fleet, work, f"grpcs://127.0.0.1:{grpc_port}", source)
        rig = Rig(f"http://127.0.0.1:{console_port}", token, home, work, fleet, procs)
        try:
            wait_until(
                lambda: sum(d.online for d in fleet.devices.list()) == len(DEVICES),
                60,
                "three agents to connect",
            )
            fleet.groups.create("cameras", "kind=camera")
            fleet.deployments.create("digits", VERSIONS[0], "cameras")
            wait_until(
                lambda: all(rig.running(d) == VERSIONS[0] for d in ("cam-1", "cam-2")),
                60,
                "the cameras to run digits 1.0.0",
            )
            wait_until(
                lambda: fleet.telemetry.inferences_by_device().get("cam-1", 0) >= STREAM_ITEMS,
                30,
                "cam-1 to classify its stream",
            )
        except TimeoutError as exc:
            logs = "\n".join(f"--- {n}\n{rig.log(n)}" for n in ("hub", "cam-1", "gw-1"))
            raise AssertionError(f"{exc}\n{logs}") from exc
        yield rig


# Per test, not per session: Playwright's sync API runs an asyncio loop in this thread
# while it is started, and every later test of the worker that calls asyncio.run()
# would fail. A start and a chromium launch cost about a second.
@pytest.fixture
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture
def browser(playwright: Playwright) -> Iterator[Browser]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail(
            "no chromium: `make test` installs it (apt-get install chromium)", pytrace=False
        )
    browser = playwright.chromium.launch(
        executable_path=chromium, headless=True, args=["--no-sandbox"]
    )
    yield browser
    browser.close()


@pytest.fixture
def page(browser: Browser, rig: Rig) -> Iterator[Page]:
    """A fresh browser context on the console; the page's JavaScript errors fail the test."""
    context = browser.new_context(
        base_url=rig.url, accept_downloads=True, viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(DEADLINE_S * 1000)
    expect.set_options(timeout=DEADLINE_S * 1000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def login(page: Page, token: str) -> None:
    """Open the console and log in with ``token``; returns once the overview shows."""
    page.goto("/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("navigation", name="Console pages")).to_be_visible()


def screenshot(page: Page, tmp_path: Path, name: str) -> Path:
    """Save a full-page screenshot in ``tmp_path`` and a copy in .build/console-screenshots/."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, SCREENSHOTS / path.name)
    return path
