"""Split inference end to end: a real hub process, a real agent process, an emulated link.

The rig is the split demo's (:class:`edgeskill.demo_split.SplitRig`): the hub
publishes the built-in ``imagenet`` skill (EfficientNet-Lite0 cut into
segments), the agent reaches it through the user-space link emulator, and its
device is emulated as 8x slower (``split.device_slowdown``). What the agent
did is read from the telemetry it sent the hub (one window a second: the paths
of its ``ctx.infer`` calls, its current cut) and, per item, from the skill's
own log (``log_results``). Every wait has a deadline; nothing sleeps for a
fixed time to let something happen.

EfficientNet is exported once per session (torch, ~15 s) into a cache folder
that the rig and the demo's subprocess both read.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeskill.demo_split import (
    SKILL,
    LinkPhase,
    SplitRig,
    split_rig,
    write_photo_source,
)
from edgeskill.processes import wait_until

FAST = LinkPhase(1e9, 1.0)
SLOW = LinkPhase(1e6, 100.0)
CONFIG = {"split.device_slowdown": "8", "log_results": "true"}
_RESULT = re.compile(
    r"result item=(?P<item>\d+) path=(?P<path>\S+) cut=(?P<cut>\S+) fallback=(?P<fallback>\w+)"
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``XDG_CACHE_HOME`` holding EfficientNet-Lite0 exported (once per session)."""
    import torch  # noqa: PLC0415

    from cloud.models.imagenet_skill import default_cache_dir  # noqa: PLC0415
    from converters.efficientnet import export_efficientnet_lite0  # noqa: PLC0415

    root = tmp_path_factory.mktemp("xdg-cache")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(root)
        try:
            export_efficientnet_lite0(default_cache_dir())
        finally:
            if before is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = before
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six sample photos, preprocessed, as an agent replay file."""
    path = tmp_path_factory.mktemp("photos") / "photos.npz"
    write_photo_source(path)
    return path


@contextlib.contextmanager
def _rig(
    tmp_path: Path,
    model_cache: Path,
    source: Path,
    *,
    loop: bool,
    rate_hz: float,
    config: dict[str, str] = CONFIG,
) -> Iterator[SplitRig]:
    cache = model_cache / "edgeskill" / "models"
    with split_rig(
        tmp_path,
        first=FAST,
        source=source,
        loop=loop,
        rate_hz=rate_hz,
        config=config,
        cache_dir=cache,
    ) as rig:
        yield rig


def _cut_after(rig: SplitRig, since_ms: int, wanted: Callable[[str], bool]) -> Callable[[], bool]:
    """A check: a window that began after ``since_ms`` reports a cut ``wanted`` accepts."""

    def check() -> bool:
        for w in rig.windows():
            index = w.metrics.get("split.classifier.cut_index")
            if (
                w.window_start_ms >= since_ms
                and index is not None
                and wanted(rig.cut_names[int(index)])
            ):
                return True
        return False

    return check


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _remote(cut: str) -> bool:
    return cut != "device"


def _paths_since(rig: SplitRig, since_ms: int) -> dict[str, int]:
    totals: dict[str, int] = {}
    for w in rig.windows():
        if w.window_start_ms >= since_ms:
            for key, value in w.metrics.items():
                if key.startswith("split.path."):
                    path = key.removeprefix("split.path.")
                    totals[path] = totals.get(path, 0) + int(value)
    return totals


def test_the_cut_moves_when_the_emulated_link_changes(
    tmp_path: Path, model_cache: Path, photos: Path
) -> None:
    with _rig(tmp_path, model_cache, photos, loop=True, rate_hz=10.0) as rig:
        # A device 8x slower on a 1 Gbit/s link: the hub should run (most of) the model.
        wait_until(_cut_after(rig, 0, _remote), 120, "a cut that uses the hub on the fast link")
        fast_paths = _paths_since(rig, 0)
        assert fast_paths.get("hub", 0) + fast_paths.get("split", 0) > 0, fast_paths

        rig.set_link(SLOW)
        slow_since = _now_ms()
        # At 1 Mbit/s the 300 kB input misses its 1 s deadline; the device is cheaper.
        wait_until(_cut_after(rig, slow_since, lambda c: c == "device"), 45, "device on 1 Mbit/s")
        settled = _now_ms()
        wait_until(
            lambda: any(w.window_start_ms >= settled + 2000 for w in rig.windows()),
            30,
            "two more seconds of telemetry on the slow link",
        )
        slow_paths = _paths_since(rig, settled)
        # Probes (one a second at the cheapest cut) still cross; the items run on the device.
        assert slow_paths.get("device", 0) > slow_paths.get("hub", 0), slow_paths

        rig.set_link(FAST)
        back = _now_ms()
        wait_until(_cut_after(rig, back, _remote), 45, "the cut to come back to the hub")


def _results(log: Path) -> list[dict[str, str]]:
    if not log.is_file():
        return []
    return [m.groupdict() for m in _RESULT.finditer(log.read_text(encoding="utf-8"))]


def test_hub_gone_mid_request_every_item_gets_exactly_one_result(
    tmp_path: Path, model_cache: Path, photos: Path
) -> None:
    items = 100
    with np.load(photos) as data:
        x = data["x"]
    stream = tmp_path / "stream.npz"
    np.savez(stream, x=np.concatenate([x] * (items // len(x) + 1))[:items])
    # 16x slower: the hub's part is the main path, not only the link probes, even when
    # the hub shares a busy machine.
    config = {**CONFIG, "split.device_slowdown": "16"}
    with _rig(tmp_path / "rig", model_cache, stream, loop=False, rate_hz=8.0, config=config) as rig:
        log = rig.work / "agent" / "logs" / f"{SKILL}-{rig.build.version}.log"

        def hub_served() -> bool:
            recent = _results(log)[-3:]
            return len(recent) == 3 and all(r["path"] in ("hub", "split") for r in recent)

        wait_until(hub_served, 120, "three items in a row finished by the hub")
        hub = rig.fleet.procs["hub"]
        hub.send_signal(signal.SIGSTOP)  # the hub hangs with requests on it ...
        stopped_at = len(_results(log))
        wait_until(
            lambda: any(r["fallback"] == "True" for r in _results(log)[stopped_at:]),
            20,
            "an item the device finished after the hub stopped answering",
        )
        rig.stop_hub(signal.SIGKILL)  # ... then goes away altogether
        wait_until(lambda: len(_results(log)) >= items, 60, f"all {items} results")
        rig.start_hub()  # so that the telemetry waiting in the outbox can be counted

        results = _results(log)
        assert [int(r["item"]) for r in results] == list(range(1, items + 1))
        # The one item whose answer may have left the hub just before it stopped aside,
        # nothing reached the hub again.
        after = results[stopped_at + 1 :]
        assert all(r["path"] == "device" for r in after), after
        fallbacks = [r for r in results if r["fallback"] == "True"]
        assert fallbacks
        assert all(r["path"] == "device" and r["cut"] == "-" for r in fallbacks)

        def reported() -> int:
            return sum(w.inferences for w in rig.windows())

        wait_until(lambda: reported() >= items, 60, "every window to reach the restarted hub")
        windows = rig.windows()
        assert reported() == items
        assert sum(w.errors for w in windows) == 0
        paths = _paths_since(rig, 0)
        assert sum(paths.values()) == items, paths
        assert sum(int(w.metrics.get("split.fallbacks", 0)) for w in windows) == len(fallbacks)
        seqs = [int(w.metrics["seq"]) for w in windows]
        assert len(seqs) == len(set(seqs)), "a telemetry window arrived twice"


def test_split_demo_runs_and_the_cut_moves(tmp_path: Path, model_cache: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(model_cache), "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "edgeskill.cli", "demo", "--split", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if re.match(r"^│ \d ", line)]
    assert len(rows) == 3, done.stdout
    cuts = {row.split("│")[3].strip() for row in rows}
    assert len(cuts) >= 2, done.stdout
