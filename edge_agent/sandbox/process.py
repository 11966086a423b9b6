"""A skill's control code in its own process, driven over a pipe.

The parent keeps one reader thread per process: it files ``emit`` events in a
bounded queue and replies in another, so every wait here has a deadline. A
timeout, a crash or a protocol violation kills the whole process group (the
skill may have started helpers) and reaps it; nothing is left running. A
confined skill (:class:`~edge_agent.sandbox.confine.Confinement`) starts
through the jail, and every process of its user is killed, wherever it went.

Split and joint inference: while an item is in flight the control process may
send ``tail`` requests. The thread waiting for the item's reply serves them, one
at a time, through the attached :class:`TailBroker` (the agent's split runtime,
bound to this skill version, so a skill can only reach its own models) and
writes each ``tail-reply`` itself: no second writer, and every tail is bounded
by the item's deadline. Each ``process`` request carries the broker's current
plan; the control process follows it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, NoReturn, Protocol

from edge_agent.errors import HealthCheckError, SandboxError
from edge_agent.sandbox.confine import Confinement
from edge_agent.sandbox.env import child_environment, encode_config
from edge_agent.sandbox.limits import SandboxLimits
from edge_agent.sandbox.logfile import SkillLog
from edge_agent.sandbox.memory import BusyRule, MemoryWatchdog
from edge_agent.sandbox.protocol import (
    MAX_TAILS_PER_ITEM,
    InferRecord,
    PipeProtocolError,
    TailAnswer,
    TailRequest,
    encode_frame,
    parse_infers,
    parse_profile,
    parse_tail_request,
    read_frame,
    tail_reply,
)

if TYPE_CHECKING:
    from skills.manifest import Manifest

__all__ = ["SkillItemError", "SkillProcess", "TailBroker"]

_WORKER_MODULE = "edge_agent.sandbox.worker"
_MAX_EVENTS = 1000
_MAX_PENDING_REPLIES = 64
_MAX_ERROR_CHARS = 4000
_REAP_GRACE_S = 2.0
_POLL_S = 0.01
_MAX_INFER_RECORDS = 10_000
_MAX_PROFILES = 16

_log = logging.getLogger(__name__)


class TailBroker(Protocol):
    """The agent's side of split inference for one skill version."""

    def plan(self) -> dict[str, str]:
        """The plan to send with the next item: a cut, ``device`` or ``joint`` per model."""
        ...

    def tail(self, request: TailRequest, timeout_s: float) -> TailAnswer:
        """Have the hub finish ``request`` within ``timeout_s``; never raises.

        Called on the thread that waits for the item, never on the agent's event loop.
        """
        ...


class SkillItemError(SandboxError):
    """The skill raised on one item; its process is still healthy."""


@dataclass(frozen=True)
class _End:
    """Put in the reply queue when the child's pipe closes or breaks."""

    reason: str


class SkillProcess:
    """One running instance of a skill version's control code.

    Args:
        skill_dir: The installed version's folder (holds ``skill.toml``, ``control/``).
        manifest: The version's manifest; its ``resources`` set the limits.
        profile_targets: The device's targets, best first, for model selection.
        config: The skill's configuration (string to string, at most 64 KiB as JSON).
        log_path: File the child's stderr is appended to.
        python: The interpreter to run; this one by default.
        precisions: The device's preferred precisions, best first.
        providers: The device profile's ONNX Runtime providers, best first; the child
            opens its ONNX Runtime sessions with them (the CPU only when empty).
        limits: The limits it runs under; the manifest's, unclamped, by default.
        confinement: Its own user, folder and view; none (the agent's user) by default.

    Raises:
        SandboxError: The configuration is not strings or is too large.
    """

    def __init__(
        self,
        skill_dir: Path,
        manifest: Manifest,
        profile_targets: Sequence[str],
        *,
        config: Mapping[str, str],
        log_path: Path,
        python: str | None = None,
        precisions: Sequence[str] = (),
        providers: Sequence[str] = (),
        limits: SandboxLimits | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        self._skill_dir = skill_dir.resolve()
        self._manifest = manifest
        self._label = f"{manifest.name} {manifest.version}"
        self._targets = tuple(profile_targets)
        self._precisions = tuple(precisions)
        self._providers = tuple(providers)
        #: The model variant each loaded model runs, as the child reported when ready.
        self.models: dict[str, str] = {}
        self._config_json = encode_config(config)
        self._limits = limits or SandboxLimits.from_resources(manifest.resources)
        self._confinement = confinement
        # None until the skill is ready: start-up work is bounded by its own
        # timeout and is not a busy loop (it used to count, and a slow start on
        # a loaded machine got a healthy skill killed right after it was ready).
        self._idle_since: float | None = None
        self._log = SkillLog(log_path)
        self._python = python or sys.executable
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._replies: queue.Queue[dict[str, Any] | _End] = queue.Queue()
        self._events: deque[dict[str, Any]] = deque(maxlen=_MAX_EVENTS)
        self._events_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._reap_lock = threading.RLock()
        self._ended: str | None = None
        self._watchdog: MemoryWatchdog | None = None
        self._kill_reason: str | None = None
        self._next_id = 0
        #: Events lost because the queue was full or they were not objects.
        self.dropped_events = 0
        #: What the launcher lowered or refused of the manifest's requests.
        self.limit_notes: tuple[str, ...] = ()
        #: Per-segment device times (ms) of each split model, as profiled at setup.
        self.profiles: dict[str, tuple[float, ...]] = {}
        #: The emulated device slowdown the control process reported (1: none).
        self.slowdown = 1.0
        #: Tail requests refused without reaching the hub (not its own, malformed, too many).
        self.refused_tails = 0
        self._config = dict(config)
        self._broker: TailBroker | None = None
        self._infers: deque[tuple[InferRecord, ...]] = deque(maxlen=_MAX_INFER_RECORDS)

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the control process and wait until its ``setup()`` has finished.

        Raises:
            SandboxError: This instance was started before.
            HealthCheckError: The process could not start, ``setup()`` raised, the
                process died, or it was not ready within ``startup_timeout_s``. The
                message carries the skill's error or the tail of its log; the
                process has been killed and reaped.
        """
        if self._proc is not None:
            raise SandboxError(f"{self._label}: a SkillProcess starts only once")
        self._spawn()
        try:
            self._await_ready()
        except BaseException:
            self._terminate(grace_s=0.0)
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the skill to tear down and exit; kill its process group after ``timeout``.

        Safe to call more than once, and on a process that already died.
        """
        with self._request_lock:
            if self._proc is None or self._proc.returncode is not None:
                return
            if self._ended is None:
                with contextlib.suppress(SandboxError):
                    self._write(encode_frame({"op": "stop"}), time.monotonic() + timeout)
            self._terminate(grace_s=timeout)

    def __enter__(self) -> SkillProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        """Whether the process runs and its pipe works; a dead one is reaped here."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return False
        if self._ended is not None or self._exited():
            self._terminate(grace_s=0.0)
            return False
        return True

    @property
    def pid(self) -> int:
        """The control process's id.

        Raises:
            SandboxError: The process was never started.
        """
        if self._proc is None:
            raise SandboxError(f"{self._label}: not started")
        return self._proc.pid

    @property
    def manifest(self) -> Manifest:
        """The running version's manifest."""
        return self._manifest

    @property
    def skill_dir(self) -> Path:
        """The running version's folder."""
        return self._skill_dir

    @property
    def config(self) -> Mapping[str, str]:
        """The configuration it was started with."""
        return dict(self._config)

    def attach(self, broker: TailBroker | None) -> None:
        """Serve this skill's tail requests and plans through ``broker`` (``None``: refuse)."""
        self._broker = broker

    def _plan(self) -> dict[str, str]:
        """The broker's plan for the next item; all on the device without one (or on a bug)."""
        broker = self._broker
        if broker is None:
            return {}
        try:
            return broker.plan()
        except Exception:  # a planner bug must not fail the item: run it on the device
            _log.exception("%s: the split broker could not plan", self._label)
            return {}

    def drain_infers(self) -> list[tuple[InferRecord, ...]]:
        """The ``ctx.infer`` calls of each item answered since the last call, oldest first."""
        with self._events_lock:
            infers = list(self._infers)
            self._infers.clear()
        return infers

    # -- requests ---------------------------------------------------------------------

    def process(
        self, item: Mapping[str, Any], timeout: float = 10.0
    ) -> tuple[dict[str, Any], float]:
        """Have the skill process one item.

        Args:
            item: A JSON-able mapping; numpy arrays are allowed.
            timeout: Seconds to wait for the result.

        Returns:
            The skill's result and the round-trip latency in milliseconds.

        Raises:
            SkillItemError: The skill raised on this item (the process lives on).
            SandboxError: The item cannot be encoded (nothing was sent), or the
                process is not running, crashed, broke the protocol or did not
                answer within ``timeout``; in those cases it has been killed.
        """
        with self._request_lock:
            if self._proc is None:
                raise SandboxError(f"{self._label}: not started")
            self._next_id += 1
            request_id = self._next_id
            plan = self._plan()
            frame = encode_frame(
                {"op": "process", "id": request_id, "item": dict(item), "plan": plan}
            )
            if not self.alive:
                self._fail(f"not running ({self._ended or 'exited'})")
            started = time.perf_counter()
            deadline = time.monotonic() + timeout
            self._idle_since = None
            try:
                self._write(frame, deadline)
                reply = self._await_reply(request_id, deadline, timeout)
            finally:
                self._idle_since = time.monotonic()
            latency_ms = (time.perf_counter() - started) * 1000.0
            result = reply.get("result")
            if reply.get("ok") is True and not isinstance(result, dict):
                self._fail("sent a reply without a result object")
            if reply.get("ok") is True:
                with self._events_lock:
                    self._infers.append(tuple(parse_infers(reply.get("infers"))))
        if reply.get("ok") is not True:
            raise SkillItemError(f"{self._label} failed on an item:\n{_clip(reply.get('error'))}")
        assert isinstance(result, dict)  # checked above, under the lock
        return result, latency_ms

    def drain_events(self) -> list[dict[str, Any]]:
        """Take every event the skill emitted since the last call, oldest first."""
        with self._events_lock:
            events = list(self._events)
            self._events.clear()
        return events

    # -- internals --------------------------------------------------------------------

    def _command(self) -> tuple[list[str], dict[str, str]]:
        """The command line and environment: the worker, or the jail around it."""
        command = [self._python, "-s", "-B", "-P", "-m", _WORKER_MODULE]
        confined = self._confinement
        env = child_environment(
            self._skill_dir,
            self._targets,
            self._config_json,
            self._limits.to_env(),
            self._precisions,
            home=confined.work_dir if confined is not None else None,
            providers=self._providers,
        )
        if confined is None:
            return command, env
        if confined.kill_all():  # leftovers of an earlier run must not share its user
            raise HealthCheckError(f"{self._label}: earlier processes of its user survive")
        jail, extra = confined.command(self._python, command, self._skill_dir, self._limits)
        return jail, {**env, **extra}

    def _spawn(self) -> None:
        command, env = self._command()
        try:
            log = self._log.open_for_run(self._label)
        except OSError as exc:
            raise HealthCheckError(f"{self._label}: cannot open its log: {exc}") from exc
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=self._skill_dir,
                env=env,
                start_new_session=True,  # its own process group, killed as a whole
            )
        except OSError as exc:
            raise HealthCheckError(f"{self._label}: cannot start: {exc}") from exc
        finally:
            log.close()  # the child has its own copy
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._watchdog = self._make_watchdog(self._proc.pid)
        self._watchdog.start()
        os.set_blocking(self._proc.stdin.fileno(), False)  # writes honour deadlines
        self._reader = threading.Thread(
            target=self._read_loop,
            args=(self._proc.stdout,),
            name=f"skill-reader-{self._manifest.name}",
            daemon=True,
        )
        self._reader.start()

    def _make_watchdog(self, pid: int) -> MemoryWatchdog:
        limits, confined = self._limits, self._confinement
        busy = None
        if limits.busy_window_s > 0:
            busy = BusyRule(limits.busy_window_s, limits.busy_cpu_fraction, self._idle)
        if confined is None:
            return MemoryWatchdog(pid, limits.memory_mb, self._killed, busy=busy)

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            confined.kill_all()

        return MemoryWatchdog(
            pid, limits.memory_mb, self._killed, members=confined.members, kill=kill, busy=busy
        )

    def _idle(self) -> float | None:
        """Since when no item has been in flight; ``None`` while one is."""
        return self._idle_since

    @property
    def kill_reason(self) -> str | None:
        """Why a watchdog killed the process (memory, busy loop), if one did."""
        return self._kill_reason

    def _await_ready(self) -> None:
        timeout = self._manifest.resources.startup_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._replies.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self._terminate(grace_s=0.0)
                raise HealthCheckError(
                    f"{self._label} was not ready within {timeout:g} s{self._log.tail()}"
                ) from None
            if not (isinstance(message, dict) and message.get("op") == "profile"):
                break
            self._add_profile(message)
        if isinstance(message, dict) and message.get("op") == "ready":
            models = message.get("models")
            if isinstance(models, dict):
                self.models = {str(k)[:64]: str(v)[:128] for k, v in list(models.items())[:16]}
            self._idle_since = time.monotonic()
            return
        if isinstance(message, dict) and message.get("op") == "failed":
            self._terminate(grace_s=_REAP_GRACE_S)
            raise HealthCheckError(f"{self._label} setup failed:\n{_clip(message.get('error'))}")
        reason = message.reason if isinstance(message, _End) else "sent an unexpected message"
        self._terminate(grace_s=0.0)
        raise HealthCheckError(
            f"{self._label} died before it was ready ({reason}; exit code "
            f"{self._exit_code()}){self._log.tail()}"
        )

    def _add_profile(self, message: dict[str, Any]) -> None:
        """File a ``profile`` frame; a malformed one fails the start."""
        try:
            model, times = parse_profile(message)
        except PipeProtocolError as exc:
            self._terminate(grace_s=0.0)
            raise HealthCheckError(f"{self._label} sent a bad profile: {exc}") from exc
        if len(self.profiles) < _MAX_PROFILES or model in self.profiles:
            self.profiles[model] = times
        slowdown = message.get("slowdown")
        if isinstance(slowdown, int | float) and 1 <= slowdown < 1e6:
            self.slowdown = float(slowdown)

    def _serve_tail(
        self, message: dict[str, Any], item_id: int, served: int, deadline: float
    ) -> bool:
        """Answer one ``tail`` request of the item in flight; whether it reached the broker."""
        tail_id = message.get("id")
        if type(tail_id) is not int:
            self.refused_tails += 1
            return False  # nothing to answer to: the control process times out alone
        broker = self._broker
        try:
            request = parse_tail_request(message)
        except PipeProtocolError as exc:
            answer, asked = TailAnswer(None, f"refused: malformed tail request: {exc}"), False
        else:
            answer, asked = self._ask_broker(broker, request, item_id, served, deadline)
        if not asked:
            self.refused_tails += 1
        try:
            frame = encode_frame(tail_reply(tail_id, answer))
        except PipeProtocolError as exc:  # outputs too large for a frame
            frame = encode_frame(tail_reply(tail_id, TailAnswer(None, f"reply too large: {exc}")))
        self._write(frame, deadline)
        return asked

    def _ask_broker(
        self,
        broker: TailBroker | None,
        request: TailRequest,
        item_id: int,
        served: int,
        deadline: float,
    ) -> tuple[TailAnswer, bool]:
        if broker is None:
            return TailAnswer(None, "refused: no split inference for this skill"), False
        if request.item != item_id:
            return TailAnswer(None, "refused: not for the item in flight"), False
        if served >= MAX_TAILS_PER_ITEM:
            return TailAnswer(None, f"refused: over {MAX_TAILS_PER_ITEM} tails per item"), False
        try:
            return broker.tail(request, max(deadline - time.monotonic(), 0.0)), True
        except Exception as exc:  # a broker bug must not kill a healthy skill
            _log.exception("%s: the split broker failed", self._label)
            return TailAnswer(None, f"agent error: {exc}"), True

    def _read_loop(self, stream: IO[bytes]) -> None:
        """Runs in the reader thread until the pipe ends; never raises."""
        try:
            while (message := read_frame(stream)) is not None:
                if message.get("op") == "emit":
                    self._add_event(message.get("event"))
                elif self._replies.qsize() >= _MAX_PENDING_REPLIES:
                    reason = "flooded the pipe with unrequested replies"
                    break
                else:
                    self._replies.put(message)
            else:
                reason = "closed its pipe"
        except Exception as exc:  # a thread must not die with an exception
            reason = f"broke the pipe protocol: {exc}"
        reason = self._kill_reason or reason
        self._ended = reason
        self._replies.put(_End(reason))

    def _killed(self, reason: str) -> None:
        """The memory watchdog's word, given before it kills the group."""
        self._kill_reason = reason

    def _add_event(self, event: object) -> None:
        with self._events_lock:
            if not isinstance(event, dict) or len(self._events) == _MAX_EVENTS:
                self.dropped_events += 1
            if isinstance(event, dict):
                self._events.append(event)

    def _write(self, frame: bytes, deadline: float) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        view = memoryview(frame)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail("did not read its input in time")
            if not poller.poll(remaining * 1000.0):
                continue
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                continue
            except OSError as exc:
                self._fail(f"pipe broke: {exc}")
            view = view[written:]

    def _await_reply(self, request_id: int, deadline: float, timeout: float) -> dict[str, Any]:
        served = 0
        while True:
            try:
                message = self._replies.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                self._fail(f"gave no reply within {timeout:g} s")
            if isinstance(message, _End):
                self._fail(message.reason)
            if message.get("op") == "tail":
                served += self._serve_tail(message, request_id, served, deadline)
                continue
            if message.get("id") == request_id:
                return message
            # Anything else (a stray "ready", a reply to nobody) is ignored.

    def _exited(self) -> bool:
        """Whether the child has exited, without reaping it (so its group id stays ours)."""
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _terminate(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the child to exit, kill its group, reap, close pipes."""
        with self._reap_lock:
            proc = self._proc
            if proc is None or proc.returncode is not None:
                return
            if self._watchdog is not None:  # before the reap: it signals the group by pid
                self._watchdog.stop()
            deadline = time.monotonic() + grace_s
            while not self._exited() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            # The leader is not reaped yet, so its pid still names our group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if self._confinement is not None:  # including those that left the group
                self._confinement.kill_all()
            proc.wait()
            if self._ended is None:
                self._ended = f"stopped (exit code {proc.returncode})"
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            if self._reader is not None:  # the pipe is at EOF now: the group is gone
                self._reader.join(timeout=_REAP_GRACE_S)
            if proc.stdout is not None and (self._reader is None or not self._reader.is_alive()):
                proc.stdout.close()

    def _fail(self, reason: str) -> NoReturn:
        self._terminate(grace_s=0.0)
        raise SandboxError(
            f"{self._label} {reason}; the process was stopped (exit code "
            f"{self._exit_code()}){self._log.tail()}"
        )

    def _exit_code(self) -> str:
        code = self._proc.returncode if self._proc is not None else None
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"{code}, {signal.Signals(-code).name}"
        return str(code)


def _clip(text: object) -> str:
    value = str(text)
    return value if len(value) <= _MAX_ERROR_CHARS else "…" + value[-_MAX_ERROR_CHARS:]
