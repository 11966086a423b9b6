"""Skill control code in its own process: health checks, crashes, limits and the pipe protocol."""

from __future__ import annotations

import hashlib
import io
import os
import resource
import shutil
import struct
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.errors import HealthCheckError, SandboxError
from edge_agent.sandbox import MAX_FRAME_BYTES, PipeProtocolError, SkillItemError, SkillProcess
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.protocol import encode_frame, read_frame
from skills.manifest import Manifest, ModelVariant, Resources
from tests.support import wait_until

DIGITS_SOURCE = Path(__file__).resolve().parents[2] / "skills" / "library" / "digits"
RNG = np.random.default_rng(3)
WEIGHTS = RNG.normal(size=(64, 10)).astype(np.float32)
BIAS = RNG.normal(size=10).astype(np.float32)

# A skill whose behaviour each test picks through its config.
PROBE_SKILL = """
import os, resource, subprocess, sys, threading, time
import numpy as np
from skills.sdk import Skill


def _spin():
    while True:
        pass

class Probe(Skill):
    def setup(self, ctx):
        self.ctx = ctx
        mode = ctx.config.get("setup", "")
        if mode == "raise":
            raise RuntimeError("boom-in-setup-4711")
        if mode == "hang":
            time.sleep(600)
        if mode == "exit":
            print("dying-now-123", file=sys.stderr, flush=True)
            os._exit(5)
        if mode == "burn":  # a slow start: CPU-bound work before ready
            end = time.process_time() + float(ctx.config["burn_s"])
            while time.process_time() < end:
                pass
        if mode == "child":
            self.helper = subprocess.Popen(["sleep", "600"])
        print("stray print from setup")
        ctx.emit({"kind": "started"})

    def process(self, item):
        op = item["op"]
        if op == "echo":
            return {"echo": item["value"], "double": np.asarray(item["value"]) * 2}
        if op == "env":
            return {"env": dict(os.environ), "cwd": os.getcwd()}
        if op == "limits":
            return {"as": resource.getrlimit(resource.RLIMIT_AS)[0],
                    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                    "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
                    "memory_mb": os.environ["EDGESKILL_MEMORY_MB"]}
        if op == "helper":
            return {"pid": self.helper.pid}
        if op == "raise":
            raise ValueError("bad-item-99")
        if op == "crash":
            os._exit(3)
        if op == "sleep":
            time.sleep(item["seconds"])
            return {}
        if op == "hog":  # touch every page, then hold the memory a while
            block = np.ones(item["mb"] * 1024**2, dtype=np.uint8)
            time.sleep(item["hold_s"])
            return {"size": int(block.size)}
        if op == "spin":
            while True:
                pass
        if op == "spin_in_background":
            threading.Thread(target=_spin, daemon=True).start()
            return {}
        if op == "unsendable":
            return {"value": object()}
        raise KeyError(op)

    def teardown(self):
        if self.ctx.config.get("teardown") == "hang":
            time.sleep(600)
"""


def probe_dir(tmp_path: Path, **resources: float) -> tuple[Path, Manifest]:
    skill_dir = tmp_path / "probe"
    (skill_dir / "control").mkdir(parents=True)
    (skill_dir / "control" / "probe_skill.py").write_text(textwrap.dedent(PROBE_SKILL))
    manifest = Manifest(
        name="probe",
        version="0.1.0",
        entrypoint="probe_skill:Probe",
        resources=Resources(**resources),  # type: ignore[arg-type]
    )
    (skill_dir / "skill.toml").write_text(manifest.to_toml())
    return skill_dir, manifest


def probe(tmp_path: Path, config: dict[str, str] | None = None, **resources: float) -> SkillProcess:
    skill_dir, manifest = probe_dir(tmp_path, **resources)
    return SkillProcess(
        skill_dir, manifest, ["onnx-cpu"], config=config or {}, log_path=tmp_path / "probe.log"
    )


def gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (absent, or a zombie waiting for init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def digits_dir(tmp_path: Path) -> tuple[Path, Manifest]:
    """The built-in digits skill with a tiny linear classifier added, as the hub would."""
    skill_dir = tmp_path / "digits"
    shutil.copytree(DIGITS_SOURCE, skill_dir, ignore=shutil.ignore_patterns("__pycache__"))
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["image"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(WEIGHTS, "w"), numpy_helper.from_array(BIAS, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    data = model.SerializeToString()
    (skill_dir / "models").mkdir()
    (skill_dir / "models" / "classifier.onnx").write_bytes(data)
    source = Manifest.from_toml((skill_dir / "skill.toml").read_text())
    manifest = source.with_models(
        [
            ModelVariant(
                "classifier",
                "onnx-cpu",
                "models/classifier.onnx",
                hashlib.sha256(data).hexdigest(),
                len(data),
            )
        ]
    )
    (skill_dir / "skill.toml").write_text(manifest.to_toml())
    return skill_dir, manifest


def test_digits_skill_classifies_items_and_reports_low_confidence(tmp_path: Path) -> None:
    skill_dir, manifest = digits_dir(tmp_path)
    images = RNG.integers(0, 17, size=(4, 8, 8)).astype(np.float32)
    logits = (images / 16.0).reshape(4, 64) @ WEIGHTS + BIAS
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    threshold = float(np.median(probabilities.max(axis=1)))
    config = {"min_confidence": str(threshold)}
    with SkillProcess(
        skill_dir, manifest, ["openvino", "onnx-cpu"], config=config, log_path=tmp_path / "d.log"
    ) as proc:
        results = [proc.process({"image": image})[0] for image in images[:3]]
        scaled, latency = proc.process({"image": (images[3] / 16).ravel().tolist(), "scaled": True})
        results.append(scaled)
        events = proc.drain_events()
    assert [r["label"] for r in results] == probabilities.argmax(axis=1).tolist()
    np.testing.assert_allclose([r["confidence"] for r in results], probabilities.max(axis=1), 1e-5)
    assert latency > 0
    low = [i for i, p in enumerate(probabilities.max(axis=1)) if p < threshold]
    assert [e["confidence"] for e in events] == pytest.approx(
        [results[i]["confidence"] for i in low]
    )
    assert all(e["kind"] == "low_confidence" for e in events)


def test_digits_skill_rejects_malformed_images(tmp_path: Path) -> None:
    skill_dir, manifest = digits_dir(tmp_path)
    with SkillProcess(
        skill_dir, manifest, ["onnx-cpu"], config={}, log_path=tmp_path / "d.log"
    ) as proc:
        with pytest.raises(SkillItemError, match="expected 64"):
            proc.process({"image": [1.0, 2.0]})
        with pytest.raises(SkillItemError, match=r"lie in \[0, 1\]"):
            proc.process({"image": np.full(64, 5.0), "scaled": True})
        assert proc.process({"image": np.zeros((8, 8))})[0]["label"] in range(10)
        assert proc.drain_events() == []  # no min_confidence configured


def test_healthy_skill_round_trips_arrays_and_events(tmp_path: Path) -> None:
    with probe(tmp_path) as proc:
        value = np.arange(6, dtype=np.int16).reshape(2, 3)
        result, _ = proc.process({"op": "echo", "value": value})
        assert result["echo"].dtype == np.int16 and result["double"].tolist() == [
            [0, 2, 4],
            [6, 8, 10],
        ]
        assert proc.drain_events() == [{"kind": "started"}]
        assert proc.drain_events() == []
        pid = proc.pid
    assert not proc.alive and gone(pid)
    log = (tmp_path / "probe.log").read_text()
    assert "stray print from setup" in log  # print() went to the log, not into the pipe


def test_child_environment_is_clean_and_rooted_in_the_skill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGESKILL_HUB_TOKEN_SECRET", "s3cr3t-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret")
    with probe(tmp_path, config={"mode": "x"}) as proc:
        result, _ = proc.process({"op": "env"})
    env = result["env"]
    assert "s3cr3t-value" not in env.values() and "another-secret" not in env.values()
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert set(env) <= {"PATH", "LANG", "HOME", "PYTHONPATH", "LC_CTYPE"} | {
        k for k in env if k.startswith("EDGESKILL_")
    }
    assert env["HOME"] == str((tmp_path / "probe").resolve()) == result["cwd"]


def test_limits_are_set_in_the_child(tmp_path: Path) -> None:
    address_space = resource.getrlimit(resource.RLIMIT_AS)[0]
    with probe(tmp_path, memory_mb=64, max_open_files=100) as proc:
        result, _ = proc.process({"op": "limits"})
    # Memory is watched from the parent as resident memory, not capped as address space.
    assert result == {"as": address_space, "nofile": 100, "core": 0, "memory_mb": "64"}


def test_setup_error_fails_the_health_check_and_leaves_no_child(tmp_path: Path) -> None:
    proc = probe(tmp_path, config={"setup": "raise"})
    with pytest.raises(HealthCheckError, match="boom-in-setup-4711"):
        proc.start()
    assert not proc.alive and gone(proc.pid)


def test_a_child_that_dies_in_setup_fails_the_health_check_with_its_log(tmp_path: Path) -> None:
    proc = probe(tmp_path, config={"setup": "exit"})
    with pytest.raises(HealthCheckError, match=r"(?s)exit code 5.*dying-now-123"):
        proc.start()
    assert not proc.alive and gone(proc.pid)


def test_a_bundle_without_its_model_fails_the_health_check(tmp_path: Path) -> None:
    skill_dir = tmp_path / "unbuilt"
    shutil.copytree(DIGITS_SOURCE, skill_dir, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = Manifest.from_toml((skill_dir / "skill.toml").read_text())
    proc = SkillProcess(skill_dir, manifest, ["onnx-cpu"], config={}, log_path=tmp_path / "u.log")
    with pytest.raises(HealthCheckError, match="no model 'classifier'"):
        proc.start()


def test_setup_that_hangs_times_out(tmp_path: Path) -> None:
    proc = probe(tmp_path, config={"setup": "hang"}, startup_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(HealthCheckError, match="not ready within 1 s"):
        proc.start()
    assert time.monotonic() - started < 5
    assert not proc.alive and gone(proc.pid)


def test_crash_mid_process_is_a_sandbox_error(tmp_path: Path) -> None:
    with probe(tmp_path) as proc:
        with pytest.raises(SandboxError, match="exit code 3") as info:
            proc.process({"op": "crash"})
        assert not isinstance(info.value, SkillItemError)
        assert not proc.alive
        with pytest.raises(SandboxError, match="not running"):
            proc.process({"op": "echo", "value": 1})


def test_item_errors_leave_the_process_serving(tmp_path: Path) -> None:
    with probe(tmp_path) as proc:
        with pytest.raises(SkillItemError, match="bad-item-99"):
            proc.process({"op": "raise"})
        with pytest.raises(SkillItemError, match="bad result"):
            proc.process({"op": "unsendable"})
        with pytest.raises(PipeProtocolError, match="cannot be sent"):
            proc.process({"op": "echo", "value": {1, 2}})  # never leaves the parent
        assert proc.alive
        assert proc.process({"op": "echo", "value": 5})[0]["echo"] == 5


def test_a_skill_that_allocates_past_its_memory_limit_is_stopped(tmp_path: Path) -> None:
    with probe(tmp_path, memory_mb=256) as proc:
        pid = proc.pid
        with pytest.raises(
            SandboxError, match=r"killed: memory \d+ MB over the 256 MB limit.*SIGKILL"
        ) as info:
            proc.process({"op": "hog", "mb": 512, "hold_s": 30}, timeout=30)
        assert not isinstance(info.value, SkillItemError)
        assert not proc.alive and gone(pid)


def test_a_skill_under_its_memory_limit_keeps_running(tmp_path: Path) -> None:
    with probe(tmp_path, memory_mb=256) as proc:
        result, _ = proc.process({"op": "hog", "mb": 100, "hold_s": 1.0}, timeout=30)
        assert result == {"size": 100 * 1024**2}
        assert proc.alive


def test_a_slow_item_times_out_and_the_process_is_killed(tmp_path: Path) -> None:
    with probe(tmp_path) as proc:
        with pytest.raises(SandboxError, match=r"no reply within 0\.5 s"):
            proc.process({"op": "sleep", "seconds": 60}, timeout=0.5)
        assert not proc.alive and gone(proc.pid)


def test_cpu_limit_kills_a_spinning_skill(tmp_path: Path) -> None:
    with (
        probe(tmp_path, cpu_seconds=2) as proc,  # startup spends ~0.4 s of it
        pytest.raises(SandboxError, match=r"SIGXCPU|SIGKILL"),
    ):
        proc.process({"op": "spin"}, timeout=20)


def _busy_watched(tmp_path: Path, config: dict[str, str]) -> SkillProcess:
    skill_dir, manifest = probe_dir(tmp_path)
    limits = replace(
        SandboxLimits.from_resources(manifest.resources), busy_window_s=0.6, busy_cpu_fraction=0.5
    )
    return SkillProcess(
        skill_dir, manifest, ["onnx-cpu"], config=config, log_path=tmp_path / "p.log", limits=limits
    )


def test_a_busy_loop_with_no_item_in_flight_is_killed(tmp_path: Path) -> None:
    with _busy_watched(tmp_path, {}) as proc:
        proc.process({"op": "spin_in_background"}, timeout=10)
        wait_until(lambda: not proc.alive, 20, "the watchdog kills the busy loop")
        assert proc.kill_reason is not None and "busy loop" in proc.kill_reason


def test_a_slow_cpu_bound_start_is_not_taken_for_a_busy_loop(tmp_path: Path) -> None:
    with _busy_watched(tmp_path, {"setup": "burn", "burn_s": "1.5"}) as proc:
        ready = time.monotonic()
        # the watchdog samples every 0.1 s: three windows of idleness after ready
        # would have killed it had the start-up CPU counted
        while time.monotonic() < ready + 3 * 0.6:
            assert proc.alive, proc.kill_reason
            time.sleep(0.05)
        assert proc.kill_reason is None
        assert proc.process({"op": "echo", "value": 1}, timeout=10)[0]["echo"] == 1


def test_stop_kills_a_hanging_teardown_and_the_skills_helpers(tmp_path: Path) -> None:
    proc = probe(tmp_path, config={"setup": "child", "teardown": "hang"})
    proc.start()
    helper_pid = proc.process({"op": "helper"})[0]["pid"]
    started = time.monotonic()
    proc.stop(timeout=0.5)
    assert time.monotonic() - started < 3
    assert not proc.alive and gone(proc.pid)
    wait_until(lambda: gone(helper_pid), 5, "the skill's helper process to be gone")
    proc.stop()  # a second stop is harmless


def test_config_must_be_small_strings(tmp_path: Path) -> None:
    skill_dir, manifest = probe_dir(tmp_path)
    with pytest.raises(SandboxError, match="exceeds"):
        SkillProcess(skill_dir, manifest, [], config={"k": "x" * 70_000}, log_path=tmp_path / "l")
    with pytest.raises(SandboxError, match="strings"):
        SkillProcess(skill_dir, manifest, [], config={"k": 1}, log_path=tmp_path / "l")  # type: ignore[dict-item]


# -- the pipe protocol -----------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "int8", "uint16", "int64", "bool", "complex64"]
)
def test_arrays_survive_a_frame(dtype: str) -> None:
    array = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)
    frame = encode_frame({"a": array, "n": np.float32(1.5), "nested": [{"b": array[0]}]})
    message = read_frame(io.BytesIO(frame))
    assert message is not None
    assert message["a"].dtype == array.dtype and np.array_equal(message["a"], array)
    assert message["n"] == 1.5 and np.array_equal(message["nested"][0]["b"], array[0])
    message["a"][0, 0, 0] = 1  # decoded arrays are writable


def test_frames_that_lie_or_are_too_large_are_refused() -> None:
    def body(payload: bytes) -> io.BytesIO:
        return io.BytesIO(struct.pack(">I", len(payload)) + payload)

    with pytest.raises(PipeProtocolError, match="exceeds"):
        read_frame(io.BytesIO(struct.pack(">I", MAX_FRAME_BYTES + 1)))
    with pytest.raises(PipeProtocolError, match="short"):
        read_frame(io.BytesIO(struct.pack(">I", 10) + b"{}"))
    with pytest.raises(PipeProtocolError, match="not valid JSON"):
        read_frame(body(b"{nope"))
    with pytest.raises(PipeProtocolError, match="not an object"):
        read_frame(body(b"[1]"))
    with pytest.raises(PipeProtocolError, match="has 3 bytes"):
        read_frame(body(b'{"x":{"__ndarray__":"<f4","shape":[2],"b64":"AAAA"}}'))
    with pytest.raises(PipeProtocolError, match="not accepted"):
        read_frame(body(b'{"x":{"__ndarray__":"|O","shape":[1],"b64":"AAAAAAAAAAA="}}'))
    with pytest.raises(PipeProtocolError, match="cannot be sent"):
        encode_frame({"x": np.array([object()])})
    with pytest.raises(PipeProtocolError, match="exceeds"):
        encode_frame({"x": "a" * MAX_FRAME_BYTES})
    assert read_frame(io.BytesIO(b"")) is None


def test_pid_before_start_is_an_error(tmp_path: Path) -> None:
    proc = probe(tmp_path)
    assert not proc.alive
    with pytest.raises(SandboxError, match="not started"):
        _ = proc.pid
    with pytest.raises(SandboxError, match="not started"):
        proc.process({"op": "echo", "value": 1})
    assert os.environ.get("EDGESKILL_CONFIG") is None  # nothing leaked into the parent
