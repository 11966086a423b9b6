"""``edgeskill demo --drift``: cameras' inputs shift mid-run, and the hub's drift loop answers.

Like ``edgeskill demo`` (a hub and agents as separate processes, the digits
CNN trained by the model factory, the ``digits`` skill built, signed and
deployed), with four cameras replaying the held-out digits in a loop and
uploading low-confidence inputs with their labels (``drift.samples=on``).
Once the fleet's accuracy is measured, three cameras are restarted on a
shifted stream (inverted digits, inverted with noise, rotated 90°; the labels
stay the true ones): a camera whose lens or exposure changed. The hub's drift
loop (run every second here, with a short policy) opens an incident, retrains
on the original data plus the shifted samples, builds the next patch version
and deploys it as an accuracy-gated canary, then to every camera.

The demo reports what happened (promoted, rolled back or failed), prints
fleet accuracy, drift PSI and versions per phase, writes ``drift.png`` (when
matplotlib is installed) and ``drift-loop.json`` into the work folder, and
exits 0 only when fleet accuracy came back within a point of its level before
the shift.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from cloud.drift.incident import Stage
from cloud.errors import HubError
from cloud.service import FleetService
from edgeskill.demo import _build_and_publish, _identity_args, _start_hub, _workdir
from edgeskill.drift_timeline import (
    Event,
    Window,
    fleet_accuracy,
    phase_row,
    recovered_at,
    shift_images,
    timeline,
    window_of,
    write_plot,
)
from edgeskill.processes import Fleet, agent_args, free_port, wait_until
from protos.envelope import now_ms

__all__ = ["CAMERAS", "run_drift_demo"]

#: (device, board, shift after the baseline or None).
CAMERAS = [
    ("cam-1", "x86-cpu", "invert"),
    ("cam-2", "arm-cpu", "invert"),
    ("cam-3", "x86-cpu", "invert"),
    ("cam-4", "arm-cpu", None),
]
GROUP = "cameras"
RATE_HZ = "40"
#: A short policy and loop, so the whole loop closes in a minute or two.
SETTINGS: dict[str, Any] = {
    "psi_threshold": 1.0, "min_devices": 3, "min_share": 0.5, "min_samples": 30, "min_labelled": 20,
    "window_s": 4.0, "hold_s": 0.0, "cooldown_s": 0.0, "retrain_samples": 1500,
    "canary": "2", "canary_wait_s": 3.0, "canary_min_samples": 40,
}  # fmt: skip
DEPLOY_CONFIG = {"drift.samples": "on", "drift.samples_below": "1.0", "drift.samples_max": "24"}
BASELINE_S = 6.0
LOOP_TIMEOUT_S = 240.0
RECOVER_TIMEOUT_S = 60.0
BIN_MS = 2000
END_STAGES = (Stage.PROMOTED, Stage.ROLLED_BACK, Stage.FAILED, Stage.CLEARED)


def run_drift_demo(console: Console, *, workdir: Path | None = None) -> int:
    """Run the drift demo; returns the exit status (0: the loop closed, accuracy recovered)."""
    with _workdir(workdir, "edgeskill-drift-demo-") as work:
        started = time.monotonic()
        service = FleetService.init(work / "hub", grpc_bind=f"127.0.0.1:{free_port()}")
        fleet = Fleet(work / "logs")
        try:
            status = _demo(console, service, fleet, work)
        except (TimeoutError, HubError, OSError) as exc:
            console.print(f"[red]drift demo failed:[/] {exc}; logs in {work / 'logs'}")
            status = 1
        finally:
            fleet.stop_all()
            service.close()
        console.print(f"drift demo finished in {time.monotonic() - started:.1f} s")
        if workdir is not None:
            console.print(f"state, logs, drift.png and drift-loop.json in {work}")
        return status


def _demo(console: Console, service: FleetService, fleet: Fleet, work: Path) -> int:
    holdout, _ = _build_and_publish(console, service, work)
    streams = _write_streams(holdout, work)
    hub_url = _start_hub(fleet, service, work, "--drift-interval", "1")
    service.groups.create(GROUP, "kind=camera")
    service.drift.set_settings(GROUP, **SETTINGS)
    args = {}
    for device, board, _ in CAMERAS:
        labels = ["kind=camera"]
        base = agent_args(hub_url, device, labels, work / "agents" / device,
                          service.trusted_root, None, board)  # fmt: skip
        args[device] = [*base, "--source-loop", "--source-rate", RATE_HZ,
                        *_identity_args(service, labels)]  # fmt: skip
        fleet.start(device, [*args[device], "--source", str(holdout)])
    wait_until(lambda: sum(d.online for d in service.devices.list()) == len(CAMERAS), 60,
               "four cameras to connect")  # fmt: skip
    service.deployments.create("digits", "1.0.0", GROUP, config=DEPLOY_CONFIG)
    console.print(f"deployed digits 1.0.0 to {len(CAMERAS)} cameras, drift samples on")
    t0 = now_ms()
    with console.status("baseline: every camera classifying the plain stream"):
        wait_until(lambda: _reporting(service, t0) == len(CAMERAS), 60, "baseline telemetry")
        time.sleep(BASELINE_S)
    shift_ms = now_ms()
    baseline, _ = fleet_accuracy(_windows(service, shift_ms - round(BASELINE_S * 1000), shift_ms))
    console.print(f"baseline fleet accuracy {baseline:.3f}")
    for device, _, kind in CAMERAS:
        if kind is not None:
            fleet.stop(device)
            fleet.start(device, [*args[device], "--source", str(streams[device])])
    console.print(f"shift: {', '.join(f'{d} {k}' for d, _, k in CAMERAS if k)}")
    events = _follow(console, service, shift_ms)
    return _report(console, service, work, baseline, shift_ms, events)


def _write_streams(holdout: Path, work: Path) -> dict[str, Path]:
    with np.load(holdout) as data:
        x, y = data["x"], data["y"]
    out = {}
    for i, (device, _, kind) in enumerate(CAMERAS):
        if kind is not None:
            out[device] = work / f"shifted-{device}.npz"
            with out[device].open("wb") as fh:
                np.savez(fh, x=shift_images(x, kind, seed=i), y=y)
    return out


def _records(service: FleetService, since_ms: int) -> list[Window]:
    return [window_of(r) for r in service.drift.windows(since_ms) if r.skill == "digits"]


def _windows(service: FleetService, start_ms: int, end_ms: int) -> list[Window]:
    return [w for w in _records(service, start_ms) if w.end_ms < end_ms]


def _reporting(service: FleetService, since_ms: int) -> int:
    return len({w.device for w in _records(service, since_ms) if w.labelled})


def _follow(console: Console, service: FleetService, shift_ms: int) -> list[Event]:
    """Print each incident stage as the drift loop reaches it; the events to mark."""
    events, seen = [Event("shift", shift_ms)], set()
    deadline = time.monotonic() + LOOP_TIMEOUT_S
    with console.status("waiting for the fleet alarm") as status:
        while time.monotonic() < deadline:
            record = _incident(service, shift_ms)
            if record is not None:
                for change in record.state.history:
                    if change.stage not in seen:
                        seen.add(change.stage)
                        events.append(_announce(console, record, change, shift_ms))
                        status.update(_waiting_for(change.stage))
                if record.state.stage in END_STAGES:
                    return events
            time.sleep(0.5)
    raise TimeoutError(f"the drift loop did not finish within {LOOP_TIMEOUT_S:.0f} s")


def _incident(service: FleetService, shift_ms: int) -> Any:
    found = [r for r in service.drift.incidents(everything=True) if r.state.opened_ms >= shift_ms]
    return found[0] if found else None


def _announce(console: Console, record: Any, change: Any, shift_ms: int) -> Event:
    s, after = record.state, f"+{(change.at_ms - shift_ms) / 1000:.1f} s"
    words = {
        Stage.OPEN: f"alarm: incident {s.id} opened ({s.reason})",
        Stage.RETRAINING: f"retraining: job {s.job_id} on the original data + drift samples",
        Stage.BUILT: f"built and signed digits {s.skill_version} (model {s.model_id})",
        Stage.CANARY: f"canary: deployment {s.deployment_id} of {s.skill_version}",
        Stage.PROMOTED: f"promoted {s.skill_version} to every camera",
    }
    text = words.get(change.stage, f"incident {s.id} {change.stage}: {s.outcome}")
    console.print(f"{after:>9}  {text}")
    names = {Stage.OPEN: "alarm", Stage.CANARY: "canary", Stage.PROMOTED: "promotion"}
    return Event(names.get(change.stage, str(change.stage)), change.at_ms)


def _waiting_for(stage: Stage) -> str:
    return {
        Stage.OPEN: "waiting for enough labelled drift samples to retrain",
        Stage.RETRAINING: "retraining, then checking the new model on the shifted hold-out",
        Stage.BUILT: "deploying the canary",
        Stage.CANARY: "canary running, gated on accuracy",
    }.get(stage, "")


def _report(
    console: Console, service: FleetService, work: Path, baseline: float, shift_ms: int,
    events: list[Event],
) -> int:  # fmt: skip
    at = {e.name: e.at_ms for e in events}
    recovered = None
    if "promotion" in at:
        recovered = _wait_recovered(console, service, baseline, at["promotion"])
    end_ms = now_ms()
    windows = _records(service, shift_ms - round(BASELINE_S * 1000))
    points = timeline(windows, BIN_MS, shift_ms - round(BASELINE_S * 1000))
    _table(console, windows, shift_ms, at, end_ms)
    drawn = write_plot(work / "drift.png", points, [*events, *_recovered(recovered)], shift_ms)
    console.print(f"wrote {work / 'drift.png'}" if drawn else "no plot: matplotlib not installed")
    numbers = _numbers(baseline, windows, shift_ms, at, recovered, end_ms)
    (work / "drift-loop.json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    if recovered is None:
        console.print(f"[red]the loop did not close:[/] fleet accuracy did not come back "
                      f"within 1 point of {baseline:.3f}")  # fmt: skip
        return 1
    console.print(f"loop closed: alarm {numbers['alarm_s']} s, recovered "
                  f"{numbers['recovered_s']} s after the shift")  # fmt: skip
    return 0


def _recovered(at_ms: int | None) -> list[Event]:
    return [] if at_ms is None else [Event("recovered", at_ms)]


def _wait_recovered(
    console: Console, service: FleetService, baseline: float, promoted_ms: int
) -> int | None:
    deadline = time.monotonic() + RECOVER_TIMEOUT_S
    with console.status("waiting for fleet accuracy to recover"):
        while time.monotonic() < deadline:
            points = timeline(_records(service, promoted_ms), BIN_MS, promoted_ms)
            found = recovered_at(points[:-1], promoted_ms, baseline - 0.01)  # whole bins only
            if found is not None:
                return found
            time.sleep(1.0)
    return None


def _table(
    console: Console, windows: list[Window], shift_ms: int, at: dict[str, int], end_ms: int
) -> None:
    table = Table("phase", "seconds", "fleet accuracy", "labelled", "drift PSI", "versions",
                  title="edgeskill demo --drift: before and after")  # fmt: skip
    marks: list[tuple[str, Callable[[], int | None]]] = [
        ("before the shift", lambda: shift_ms - round(BASELINE_S * 1000)),
        ("shifted, before the alarm", lambda: shift_ms),
        ("incident: retraining", lambda: at.get("alarm")),
        ("canary", lambda: at.get("canary")),
        ("after promotion", lambda: at.get("promotion")),
    ]
    starts = [(name, start()) for name, start in marks]
    known = [(name, s) for name, s in starts if s is not None]
    for (name, start), nxt in zip(known, [*[s for _, s in known[1:]], end_ms], strict=True):
        table.add_row(*phase_row(name, windows, start, nxt))
    console.print(table)


def _numbers(
    baseline: float, windows: list[Window], shift_ms: int, at: dict[str, int],
    recovered: int | None, end_ms: int,
) -> dict[str, Any]:  # fmt: skip
    def seconds(ms: int | None) -> float | None:
        return None if ms is None else round((ms - shift_ms) / 1000, 1)

    first_stage_after = at.get("canary", end_ms)
    shifted, _ = fleet_accuracy(w for w in windows if shift_ms <= w.end_ms < first_stage_after)
    # From the bin that recovered on: the promotion's own rollout (cameras still on the old
    # version for a second or two) is the transition, not the fleet after the loop closed.
    after_from = at.get("promotion", end_ms) if recovered is None else recovered - BIN_MS
    after, _ = fleet_accuracy(w for w in windows if after_from <= w.end_ms)
    return {
        "alarm_s": seconds(at.get("alarm")),
        "recovered_s": seconds(recovered),
        "accuracy_before": round(baseline, 4),
        "accuracy_shifted": round(shifted, 4),
        "accuracy_after": None if np.isnan(after) else round(after, 4),
        "events_s": {name: seconds(ms) for name, ms in at.items()},
        "cameras": [{"device": d, "shift": k} for d, _, k in CAMERAS],
    }
