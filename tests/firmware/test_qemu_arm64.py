"""The proof on a foreign architecture: the arm64-cpu image's agent under qemu, end to end.

``edgeskill image build --target arm64-cpu`` makes the root file system (debootstrap
``--foreign --arch arm64``, qemu-aarch64-static for the second stage; cached), with the
hub's CA, TUF root and a claim token baked in. The test unpacks that tarball, runs the
first-boot script and the agent's launcher in a chroot (qemu user emulation through
binfmt_misc), and a real hub on loopback sees the device enrol (mutual TLS from then
on), install the digits skill and run it with LiteRT on the camera feed.

Needs root (chroot, mounts) and qemu-user-static + debootstrap; it installs them with
apt when missing and fails, never skips, when it cannot. Select it with ``-m qemu``.
Timings go to tests/bench/results/firmware_qemu.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud.hub import Hub
from cloud.service import FleetService
from edgeskill.firmware_build import Settings, build_image, ensure_tools
from protos.envelope import now_ms
from tests.edge_agent.digits_variants import export_named_tflite, train_digits_model
from tests.support import Fleet, wait_for_port, wait_until
from tests.support.skillkit import LIBRARY, VariantFile, build_skill

pytestmark = [pytest.mark.qemu, pytest.mark.slow, pytest.mark.timeout(1800)]
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "firmware_qemu.json"
AGENT_TIMEOUT_S = 420.0


def free_port_pair() -> int:
    from tests.integration.conftest import free_port_pair as pair  # noqa: PLC0415

    return pair()


@contextlib.contextmanager
def chroot_mounts(root: Path) -> Iterator[None]:
    """The chroot's root as a mount point and /proc inside it, unmounted (lazily) afterwards.

    Not /sys: under qemu-user, /proc/cpuinfo is the x86 host's while /sys lists CPUs,
    and ONNX Runtime's cpuinfo then crashes on import (seen: SIGSEGV); without /sys it
    falls back cleanly. /dev is not bound either: the image has its own device nodes,
    and a bound /dev under a test folder is one ``rm -rf`` away from the host's.
    """
    # The root bound onto itself, so that "/" in the chroot is a mount point as on a
    # device: the skill jail remounts it private (EINVAL on a plain folder).
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True, timeout=30)
    try:
        target = root / "proc"
        target.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(target)], check=True, timeout=30)
        try:
            yield
        finally:
            subprocess.run(["umount", "-l", str(target)], check=False, timeout=30)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False, timeout=30)


def chroot_pids(root: Path) -> list[int]:
    """Processes whose root is the chroot (the agent and its skills, all started here)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "root")) == root:
                    pids.append(int(entry.name))
    return pids


def test_arm64_image_agent_enrols_installs_and_runs_digits_with_litert(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the qemu proof needs root (chroot and mounts); run the tests as root")
    t0 = time.monotonic()
    ensure_tools("aarch64")  # apt-get installs qemu-user-static/debootstrap when missing
    timings: dict[str, float] = {}

    # The hub: the digits skill with a TFLite and an ONNX variant, deployed to cameras.
    model, data = train_digits_model(epochs=3)
    tflite = export_named_tflite(model, data.test.x[:1], tmp_path / "models" / "digits.tflite")
    from converters.onnx_export import export_onnx  # noqa: PLC0415

    onnx = export_onnx(model, data.test.x[:1], tmp_path / "models" / "digits.onnx")
    variants = [VariantFile("tflite", "fp32", tflite), VariantFile("onnx-cpu", "fp32", onnx)]
    bundle = build_skill(LIBRARY / "digits", "1.0.0", variants, tmp_path / "dist")
    port = free_port_pair()
    home = tmp_path / "hub"
    hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}")
    fleet = Fleet(tmp_path / "logs")
    root = tmp_path / "root"
    try:
        FleetService(hub).skills.publish(bundle)
        hub.store.create_group("cameras", "kind=camera")
        hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=now_ms())
        token = tmp_path / "claim-token"
        token.write_text(hub.enroller().create_claim({"kind": "camera"}) + "\n")
        fleet.start("hub", ["hub", "serve", "--home", str(home)])
        wait_for_port(port)

        # The image, with this hub baked in.
        settings = Settings(
            hub_url=f"grpcs://127.0.0.1:{port}",
            enroll_url=f"grpcs://{hub.config.enroll_bind}",
            labels="kind=camera",
            hub_ca=home / "pki" / "ca.crt",
            trusted_root=home / "trust" / "metadata" / "root.json",
            claim_token=token,
        )
        start = time.monotonic()
        image = build_image("arm64-cpu", tmp_path / "image", settings, say=lambda _: None)
        timings["image_build_s"] = time.monotonic() - start
        assert image.rootfs_tar is not None

        # Flash: unpack the tarball; give the camera a feed (the held-out digits).
        root.mkdir()
        subprocess.run(["tar", "-C", str(root), "-xzf", str(image.rootfs_tar)], check=True)
        assert (root / "usr" / "bin" / "qemu-aarch64-static").exists()
        feed = root / "var" / "lib" / "edgeskill-feed" / "holdout.npz"
        feed.parent.mkdir(parents=True)
        np.savez(feed, x=data.test.x[:200].astype(np.float32), y=data.test.y[:200])
        env_file = root / "etc" / "edgeskill" / "agent.env"
        env_file.write_text(
            env_file.read_text().replace(
                "EDGESKILL_AGENT_ARGS=",
                "EDGESKILL_AGENT_ARGS='--source /var/lib/edgeskill-feed/holdout.npz "
                "--source-loop --source-rate 20 --telemetry-window 2'",
            )
        )
        with chroot_mounts(root):
            arch = subprocess.run(
                ["chroot", str(root), "uname", "-m"], capture_output=True, text=True, check=True
            )
            assert arch.stdout.strip() == "aarch64"  # emulated
            boot = subprocess.run(
                ["chroot", str(root), "/opt/edgeskill/bin/edgeskill-firstboot"],
                capture_output=True, text=True, check=True, timeout=120,
            )  # fmt: skip
            device = (root / "etc" / "edgeskill" / "device-id").read_text().strip()
            assert device in boot.stdout
            start = time.monotonic()
            agent = fleet.spawn(
                "agent", ["chroot", str(root), "/opt/edgeskill/bin/edgeskill-agent"]
            )
            try:
                _wait_running(hub, device, fleet, agent, timings, start)
            finally:
                agent.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.wait(30)
                for pid in chroot_pids(root.resolve()):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                fleet.procs.pop("agent", None)
        state = root / "var" / "lib" / "edgeskill"
        assert (state / "identity" / "device.crt").exists()  # enrolled: mTLS from then on
        skill_logs = "".join(p.read_text(errors="replace") for p in (state / "logs").rglob("*.log"))
        assert "digits ready on litert (tflite)" in skill_logs, skill_logs[-2000:]
        timings["total_s"] = time.monotonic() - t0
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"arm64-cpu": timings}, indent=2) + "\n")
        print(json.dumps(timings, indent=2))
    finally:
        fleet.stop_all()
        hub.close()


def _wait_running(
    hub: Hub,
    device: str,
    fleet: Fleet,
    agent: subprocess.Popen[bytes],
    timings: dict[str, float],
    start: float,
) -> None:
    log = fleet.logs / "agent.log"

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""

    def stage(name: str, check, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
        def done() -> bool:
            if agent.poll() is not None:
                raise AssertionError(f"the agent exited ({agent.returncode}):\n{tail()}")
            return bool(check())

        try:
            wait_until(done, timeout_s, name)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; agent log:\n{tail()}") from exc
        timings[f"{name}_s"] = time.monotonic() - start

    def profile() -> dict:  # type: ignore[type-arg]
        record = hub.store.get_device(device)
        return dict(record.profile) if record is not None else {}

    stage("enrolled", lambda: hub.store.get_device(device) is not None, AGENT_TIMEOUT_S)
    stage("registered", lambda: bool(profile()), AGENT_TIMEOUT_S)
    registered = profile()
    assert (registered.get("board"), registered.get("arch")) == ("arm64-cpu", "aarch64")
    assert "tflite" in registered.get("targets", ()), registered

    def running() -> bool:
        rep = hub.store.reported_for(device)
        for s in rep.skills if rep else ():
            if s.name == "digits" and s.state == "failed":
                raise AssertionError(f"digits failed on the device: {s.error}\n{tail()}")
            if s.name == "digits" and s.state == "running":
                return True
        return False

    stage("running", running, AGENT_TIMEOUT_S)

    def served() -> bool:
        return sum(r.inferences for r in hub.store.telemetry_for(device, "digits")) >= 20

    stage("inferences", served, AGENT_TIMEOUT_S)
    windows = hub.store.telemetry_for(device, "digits")
    labelled = sum(r.labelled for r in windows)
    correct = sum(r.correct for r in windows)
    assert labelled > 0 and correct / labelled > 0.8, (labelled, correct)
    timings["accuracy"] = correct / labelled
