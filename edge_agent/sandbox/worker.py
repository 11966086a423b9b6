"""The control process: ``python -m edge_agent.sandbox.worker``.

Started by :class:`edge_agent.sandbox.SkillProcess` in the skill's folder with
a clean environment. It takes the pipe protocol off fds 0/1 (so a stray
``print`` in skill code lands in the log, not in a frame), applies its resource
limits, imports the manifest's entrypoint from ``control/``, calls ``setup``,
profiles the segments of its split models (``profile`` frames), says ``ready``
(or ``failed``), then serves ``process`` requests until ``stop`` or the end of
its input.

``ctx.infer`` (:mod:`edge_agent.split.device`) follows the plan the agent sends
with each ``process`` request. Only while one is in flight, and only from the
thread running ``process``, may it ask the agent for a tail: it sends a ``tail``
frame and reads frames until the matching ``tail-reply`` or its deadline (the
manifest's ``deadline_ms`` plus a grace), then finishes on the device if the
answer failed or never came. A late reply is recognised by its id and dropped.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

from edge_agent.runtime import Runtime
from edge_agent.sandbox.env import (
    ENV_CONFIG,
    ENV_PRECISIONS,
    ENV_PROVIDERS,
    ENV_SKILL_DIR,
    ENV_TARGETS,
)
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.protocol import (
    MAX_INFERS_PER_ITEM,
    PipeProtocolError,
    TailAnswer,
    encode_frame,
    parse_tail_reply,
    read_frame,
)
from edge_agent.split.device import DeviceInference
from skills.manifest import Manifest
from skills.sdk import InferResult, Model, Skill

__all__ = ["main"]

#: Characters of a traceback sent up in a ``failed`` message or an error reply.
_MAX_ERROR_CHARS = 4000
#: Seconds past a split's deadline the control process waits for the agent's reply.
_TAIL_GRACE_S = 2.0
#: The skill configuration key that emulates a slower device for split segments.
SLOWDOWN_KEY = "split.device_slowdown"
#: The skill configuration key for how many timed runs each segment gets at setup.
PROFILE_REPEATS_KEY = "split.profile_repeats"

_log = logging.getLogger("edge_agent.sandbox.worker")


class _Channel:
    """Both ends of the pipe; writes are serialised because skills may emit from threads."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self._reader = reader
        self._writer = writer
        self._lock = threading.Lock()

    @classmethod
    def take_over_stdio(cls) -> _Channel:
        """Move the protocol to private fds; point fd 0 at /dev/null and fd 1 at the log."""
        proto_in, proto_out = os.dup(0), os.dup(1)  # dup'd fds are not inherited
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)
        # Unbuffered, so that select() on the descriptor sees every byte not yet read.
        return cls(os.fdopen(proto_in, "rb", buffering=0), os.fdopen(proto_out, "wb"))

    def send(self, message: Mapping[str, Any]) -> None:
        """Encode (raising PipeProtocolError before anything is written) and send a frame."""
        frame = encode_frame(message)
        with self._lock:
            self._writer.write(frame)
            self._writer.flush()

    def receive(self) -> dict[str, Any] | None:
        """The next frame, or ``None`` when the agent closed the pipe."""
        return read_frame(self._reader)

    def readable(self, timeout_s: float) -> bool:
        """Whether a frame starts within ``timeout_s`` (or the pipe ends)."""
        ready, _, _ = select.select([self._reader], [], [], max(timeout_s, 0.0))
        return bool(ready)


class _Context:
    """The :class:`skills.sdk.SkillContext` the worker gives the skill."""

    def __init__(
        self,
        config: Mapping[str, str],
        skill_dir: Path,
        logger: logging.Logger,
        runtime: Runtime,
        channel: _Channel,
        inference: DeviceInference,
        manifest: Manifest,
    ) -> None:
        self.config = config
        self.skill_dir = skill_dir
        self.logger = logger
        self._runtime = runtime
        self._channel = channel
        self._inference = inference
        self._manifest = manifest
        self._item: int | None = None
        self._item_thread: int | None = None
        self._plan: dict[str, str] = {}
        self._next_tail = 0
        self.records: list[dict[str, Any]] = []

    def model(self, name: str) -> Model:
        return self._runtime.model(name)

    def emit(self, result: Mapping[str, Any]) -> None:
        if not isinstance(result, Mapping):
            raise ValueError(f"an event must be a mapping, not {type(result).__name__}")
        self._channel.send({"op": "emit", "event": dict(result)})

    def infer(self, model: str, feeds: Mapping[str, np.ndarray]) -> InferResult:
        on_item = self._item is not None and threading.get_ident() == self._item_thread
        result = self._inference.infer(
            model, feeds, plan=self._plan if on_item else {}, ask=self._ask if on_item else None
        )
        if on_item and len(self.records) < MAX_INFERS_PER_ITEM:
            record = {"model": model, "path": result.path, "cut": result.cut or ""}
            self.records.append(
                {**record, "fallback": result.fallback, "device_ms": result.device_ms}
            )
        return result

    def begin_item(self, item_id: int, plan: object) -> None:
        """Enter an item: its id, the agent's plan for it, no records yet."""
        self._item, self._item_thread = item_id, threading.get_ident()
        self._plan = {
            str(k): v for k, v in (plan.items() if isinstance(plan, dict) else ()) if type(v) is str
        }
        self.records = []

    def end_item(self) -> list[dict[str, Any]]:
        """Leave the item; its inference records."""
        self._item = self._item_thread = None
        records, self.records = self.records, []
        return records

    def _deadline_s(self, model: str) -> float:
        spec = self._manifest.split_for(model) or self._manifest.joint_for(model)
        deadline_ms = spec.deadline_ms if spec is not None else 1000
        return deadline_ms / 1000.0 + _TAIL_GRACE_S

    def _ask(self, model: str, split: str, tensors: Mapping[str, np.ndarray]) -> TailAnswer:
        """Send a ``tail`` frame and wait for its reply; a failure is an answer too."""
        self._next_tail += 1
        tail_id = self._next_tail
        message = {"op": "tail", "id": tail_id, "item": self._item, "model": model}
        try:
            self._channel.send({**message, "split": split, "tensors": dict(tensors)})
        except PipeProtocolError as exc:  # too large for a frame: finish here
            return TailAnswer(None, f"cannot send the tensors: {exc}")
        deadline = time.monotonic() + self._deadline_s(model)
        while self._channel.readable(deadline - time.monotonic()):
            reply = self._channel.receive()
            if reply is None:
                return TailAnswer(None, "the agent closed the pipe")
            if reply.get("op") == "tail-reply" and reply.get("id") == tail_id:
                return parse_tail_reply(reply)
            # A late reply to an earlier request: its item was finished on the device.
        return TailAnswer(None, "no reply from the agent before the deadline")


def _slowdown(config: Mapping[str, str]) -> float:
    """The emulated slowdown the configuration asks for (1: none)."""
    try:
        factor = float(config.get(SLOWDOWN_KEY, "1") or 1)
    except ValueError as exc:
        raise ValueError(f"{SLOWDOWN_KEY} must be a number, got {config[SLOWDOWN_KEY]!r}") from exc
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"{SLOWDOWN_KEY} must be >= 1, got {factor!r}")
    return factor


def _read_config(raw: str) -> dict[str, str]:
    config = json.loads(raw or "{}")
    if not isinstance(config, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config.items()
    ):
        raise ValueError(f"{ENV_CONFIG} must be a JSON object of strings")
    return config


def _load_skill_class(control_dir: Path, entrypoint: str) -> type[Skill]:
    """Import ``module:Class`` from ``control/`` and check it is a Skill defined there."""
    module_name, _, class_name = entrypoint.partition(":")
    sys.path.insert(0, str(control_dir))
    module = importlib.import_module(module_name)
    origin = Path(getattr(module, "__file__", None) or "/").resolve()
    if not origin.is_relative_to(control_dir.resolve()):
        raise ImportError(f"entrypoint module {module_name!r} is not in control/ ({origin})")
    skill_class = getattr(module, class_name, None)
    if not (isinstance(skill_class, type) and issubclass(skill_class, Skill)):
        raise TypeError(f"entrypoint {entrypoint!r} is not a skills.sdk.Skill subclass")
    return skill_class


def _start_skill(channel: _Channel) -> tuple[Skill, Runtime, _Context]:
    """Apply the limits, build the context, import the skill, run its setup, profile."""
    env = os.environ
    SandboxLimits.from_env(env).apply()
    skill_dir = Path(env[ENV_SKILL_DIR])
    targets = [t for t in env.get(ENV_TARGETS, "").split(",") if t]
    config = _read_config(env.get(ENV_CONFIG, ""))
    manifest = Manifest.from_toml((skill_dir / "skill.toml").read_text(encoding="utf-8"))
    precisions = [p for p in env.get(ENV_PRECISIONS, "").split(",") if p]
    providers = [p for p in env.get(ENV_PROVIDERS, "").split(",") if p]
    runtime = Runtime(skill_dir, manifest, targets, precisions=precisions, providers=providers)
    onnx_target = next((t for t in targets if t.startswith("onnx-")), "onnx-cpu")
    slowdown = _slowdown(config)
    inference = DeviceInference(
        skill_dir, manifest, runtime, target=onnx_target, slowdown=slowdown, providers=providers
    )
    logger = logging.getLogger(f"skill.{manifest.name}")
    ctx = _Context(config, skill_dir, logger, runtime, channel, inference, manifest)
    skill = _load_skill_class(skill_dir / "control", manifest.entrypoint)()
    skill.setup(ctx)
    repeats = int(config.get(PROFILE_REPEATS_KEY, "5") or 5)
    for model, times in inference.profile(max(1, min(repeats, 100))).items():
        channel.send(
            {
                "op": "profile",
                "model": model,
                "segment_ms": times,
                "slowdown": slowdown,
                "slowdown_mode": "sleep" if slowdown > 1 else "none",
            }
        )
    return skill, runtime, ctx


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= _MAX_ERROR_CHARS else "…" + text[-_MAX_ERROR_CHARS:]


def _handle(skill: Skill, ctx: _Context, message: Mapping[str, Any]) -> dict[str, Any]:
    """Run one ``process`` request; any failure becomes an error reply for that item."""
    request_id = message.get("id")
    item = message.get("item")
    if not isinstance(item, dict):
        return {"id": request_id, "ok": False, "error": "item must be an object"}
    started = time.perf_counter()
    ctx.begin_item(request_id if type(request_id) is int else -1, message.get("plan"))
    try:
        result = skill.process(item)
        if not isinstance(result, Mapping):
            raise TypeError(f"process() returned {type(result).__name__}, not a mapping")
    except Exception as exc:  # the traceback travels up in the reply, not into the log
        ctx.end_item()
        return {"id": request_id, "ok": False, "error": _error_text(exc)}
    ms = (time.perf_counter() - started) * 1000.0
    infers = ctx.end_item()
    return {"id": request_id, "ok": True, "result": dict(result), "ms": ms, "infers": infers}


def _reply(channel: _Channel, reply: dict[str, Any]) -> None:
    try:
        channel.send(reply)
    except PipeProtocolError as exc:  # the skill returned something that cannot travel
        channel.send({"id": reply.get("id"), "ok": False, "error": f"bad result: {exc}"})


def _serve(skill: Skill, ctx: _Context, channel: _Channel) -> int:
    """Answer requests until ``stop`` or end of input; teardown either way."""
    status = 0
    try:
        while (message := channel.receive()) is not None:
            op = message.get("op")
            if op == "stop":
                break
            if op == "process":
                _reply(channel, _handle(skill, ctx, message))
            elif op == "tail-reply":
                continue  # a reply that came after its item was finished on the device
            else:
                channel.send({"id": message.get("id"), "ok": False, "error": f"unknown op {op!r}"})
    except (PipeProtocolError, OSError):
        _log.exception("the agent's pipe broke")
        status = 2
    try:
        skill.teardown()
    except Exception:
        _log.exception("teardown failed")
    return status


def main() -> int:
    """Run the control process; the return value is its exit status."""
    channel = _Channel.take_over_stdio()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        skill, runtime, ctx = _start_skill(channel)
    except BaseException as exc:  # SystemExit from setup fails the check too
        _log.error("setup failed:\n%s", "".join(traceback.format_exception(exc)))
        channel.send({"op": "failed", "error": _error_text(exc)})
        return 1
    models = {
        name: f"{m.target}/{m.precision} on {m.backend}/{m.provider}"
        for name, m in runtime.loaded.items()
    }
    channel.send({"op": "ready", "models": models})
    return _serve(skill, ctx, channel)


if __name__ == "__main__":
    sys.exit(main())
