"""The control process: ``python -m edge_agent.sandbox.worker``.

Started by :class:`edge_agent.sandbox.SkillProcess` in the skill's folder with
a clean environment. It takes the pipe protocol off fds 0/1 (so a stray
``print`` in skill code lands in the log, not in a frame), applies its resource
limits, imports the manifest's entrypoint from ``control/``, calls ``setup``,
says ``ready`` (or ``failed``), then serves ``process`` requests until ``stop``
or the end of its input.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from edge_agent.runtime import Runtime
from edge_agent.sandbox.env import ENV_CONFIG, ENV_PRECISIONS, ENV_SKILL_DIR, ENV_TARGETS
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.protocol import PipeProtocolError, encode_frame, read_frame
from skills.manifest import Manifest
from skills.sdk import Model, Skill

__all__ = ["main"]

#: Characters of a traceback sent up in a ``failed`` message or an error reply.
_MAX_ERROR_CHARS = 4000

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
        return cls(os.fdopen(proto_in, "rb"), os.fdopen(proto_out, "wb"))

    def send(self, message: Mapping[str, Any]) -> None:
        """Encode (raising PipeProtocolError before anything is written) and send a frame."""
        frame = encode_frame(message)
        with self._lock:
            self._writer.write(frame)
            self._writer.flush()

    def receive(self) -> dict[str, Any] | None:
        """The next frame, or ``None`` when the agent closed the pipe."""
        return read_frame(self._reader)


class _Context:
    """The :class:`skills.sdk.SkillContext` the worker gives the skill."""

    def __init__(
        self,
        config: Mapping[str, str],
        skill_dir: Path,
        logger: logging.Logger,
        runtime: Runtime,
        channel: _Channel,
    ) -> None:
        self.config = config
        self.skill_dir = skill_dir
        self.logger = logger
        self._runtime = runtime
        self._channel = channel

    def model(self, name: str) -> Model:
        return self._runtime.model(name)

    def emit(self, result: Mapping[str, Any]) -> None:
        if not isinstance(result, Mapping):
            raise ValueError(f"an event must be a mapping, not {type(result).__name__}")
        self._channel.send({"op": "emit", "event": dict(result)})


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


def _start_skill(channel: _Channel) -> tuple[Skill, Runtime]:
    """Apply the limits, build the context, import the skill and run its setup."""
    env = os.environ
    SandboxLimits.from_env(env).apply()
    skill_dir = Path(env[ENV_SKILL_DIR])
    targets = [t for t in env.get(ENV_TARGETS, "").split(",") if t]
    config = _read_config(env.get(ENV_CONFIG, ""))
    manifest = Manifest.from_toml((skill_dir / "skill.toml").read_text(encoding="utf-8"))
    precisions = [p for p in env.get(ENV_PRECISIONS, "").split(",") if p]
    runtime = Runtime(skill_dir, manifest, targets, precisions=precisions)
    logger = logging.getLogger(f"skill.{manifest.name}")
    ctx = _Context(config, skill_dir, logger, runtime, channel)
    skill = _load_skill_class(skill_dir / "control", manifest.entrypoint)()
    skill.setup(ctx)
    return skill, runtime


def _error_text(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= _MAX_ERROR_CHARS else "…" + text[-_MAX_ERROR_CHARS:]


def _handle(skill: Skill, message: Mapping[str, Any]) -> dict[str, Any]:
    """Run one ``process`` request; any failure becomes an error reply for that item."""
    request_id = message.get("id")
    item = message.get("item")
    if not isinstance(item, dict):
        return {"id": request_id, "ok": False, "error": "item must be an object"}
    started = time.perf_counter()
    try:
        result = skill.process(item)
        if not isinstance(result, Mapping):
            raise TypeError(f"process() returned {type(result).__name__}, not a mapping")
    except Exception as exc:  # the traceback travels up in the reply, not into the log
        return {"id": request_id, "ok": False, "error": _error_text(exc)}
    ms = (time.perf_counter() - started) * 1000.0
    return {"id": request_id, "ok": True, "result": dict(result), "ms": ms}


def _reply(channel: _Channel, reply: dict[str, Any]) -> None:
    try:
        channel.send(reply)
    except PipeProtocolError as exc:  # the skill returned something that cannot travel
        channel.send({"id": reply.get("id"), "ok": False, "error": f"bad result: {exc}"})


def _serve(skill: Skill, channel: _Channel) -> int:
    """Answer requests until ``stop`` or end of input; teardown either way."""
    status = 0
    try:
        while (message := channel.receive()) is not None:
            op = message.get("op")
            if op == "stop":
                break
            if op == "process":
                _reply(channel, _handle(skill, message))
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
        skill, runtime = _start_skill(channel)
    except BaseException as exc:  # SystemExit from setup fails the check too
        _log.error("setup failed:\n%s", "".join(traceback.format_exception(exc)))
        channel.send({"op": "failed", "error": _error_text(exc)})
        return 1
    models = {
        name: f"{m.target}/{m.precision} on {m.backend}/{m.provider}"
        for name, m in runtime.loaded.items()
    }
    channel.send({"op": "ready", "models": models})
    return _serve(skill, channel)


if __name__ == "__main__":
    sys.exit(main())
