"""The agent's half of split and joint inference: plans, tails, link learning, metrics.

One :class:`SplitRuntime` per agent owns the link estimate (every tail request
feeds it) and one :class:`SkillBroker` per running skill version with a
``[[split]]`` or ``[[joint]]`` section. The broker is attached to the skill's
:class:`~edge_agent.sandbox.SkillProcess`, which then:

* sends the broker's **plan** with every ``process`` request: the agent decides
  (it alone sees the link), each split model's coordinator planning with
  hysteresis on that request, and the control process follows; a ``tail-reply``
  carries the plan again, for the next call in the same item;
* hands each ``tail`` request to :meth:`SkillBroker.tail`, on the thread waiting
  for the item. The broker accepts only models of its own skill version's
  manifest and cuts of their own plans; it fills in the skill, version, model,
  request id and deadline itself, encodes the tensors with the manifest's codec,
  and runs the transport call on the agent's event loop
  (``asyncio.run_coroutine_threadsafe``), bounded by the manifest's deadline.

Every outcome is an answer, never an exception: a refusal, a timeout or a lost
link comes back as a failed :class:`~edge_agent.sandbox.protocol.TailAnswer`
and the control process finishes on the device; the route backs off
(device-only) and probes the hub again later.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from edge_agent.errors import InferRefusedError, TransportError
from edge_agent.sandbox.protocol import InferRecord, TailAnswer, TailRequest
from edge_agent.split.link import LinkEstimator, RequestSample
from edge_agent.split.routes import (
    DEVICE,
    JointRoute,
    Route,
    Shared,
    SplitCoordinator,
    SplitRefused,
    SplitSettings,
)
from protos import pb
from skills.errors import TensorCodecError
from skills.split_plan import PING

if TYPE_CHECKING:
    from edge_agent.sandbox.process import SkillProcess

__all__ = ["SkillBroker", "SplitRuntime", "TailTransport", "time_ping"]

log = logging.getLogger(__name__)

#: Seconds a waiting item thread allows the event loop beyond a request's deadline.
_LOOP_GRACE_S = 1.0


class TailTransport(Protocol):
    """The one transport call split inference needs."""

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """Have the hub run a tail.

        Raises:
            TransportError: The link failed or the call timed out
                (:class:`~edge_agent.errors.InferRefusedError` when the hub refused).
        """
        ...


class SkillBroker:
    """Split and joint inference for one skill version; a :class:`TailBroker`.

    Args:
        runtime: The agent's split runtime.
        skill: The skill's name.
        version: Its version.
        splits: Coordinators of its split models, by model.
        joints: Routes of its joint pairs, by small model.
        loop: The agent's event loop, where transport calls run.
    """

    def __init__(
        self,
        runtime: SplitRuntime,
        skill: str,
        version: str,
        splits: dict[str, SplitCoordinator],
        joints: dict[str, JointRoute],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.runtime = runtime
        self.skill = skill
        self.version = version
        self.splits = splits
        self.joints = joints
        self._loop = loop
        #: Requests refused before the hub: ``(model, reason)`` counts.
        self.refused: dict[str, int] = {}

    def plan(self) -> dict[str, str]:
        """The plan for the next item: each split model's cut, each joint pair's route."""
        decided = {model: route.decide() for model, route in self.splits.items()}
        return decided | {model: route.decide() for model, route in self.joints.items()}

    def tail(self, request: TailRequest, timeout_s: float) -> TailAnswer:
        """Have the hub finish ``request``; every failure is an answer.

        Called on the thread waiting for the item; blocks it up to the deadline.
        """
        route: Route | None = (
            self.joints.get(request.model)
            if request.split == "joint"
            else self.splits.get(request.model)
        )
        if route is None:
            return self._refuse(f"{request.model[:64]!r} is no split or joint model of this skill")
        try:
            message = pb.InferRequest(
                model=route.hub_model,
                split=request.split,
                inputs=route.encode(request.split, request.tensors),
                skill=self.skill,
                version=self.version,
                request_id=uuid.uuid4().hex,
                deadline_ms=int(route.deadline_s * 1000),
            )
        except SplitRefused as exc:
            return self._refuse(str(exc))
        if not route.hub_usable(route.clock()):  # backing off: the plan said device
            return TailAnswer(None, "the hub is backing off", route.decide())
        if _on_loop(self._loop):  # waiting here would block the loop it needs
            return TailAnswer(None, "agent error: tail requested on the event loop")
        return self._run(route, message, max(min(timeout_s, route.deadline_s), 0.0))

    def _run(self, route: Route, message: pb.InferRequest, budget_s: float) -> TailAnswer:
        """Run the transport call on the agent's loop and wait for it, bounded."""
        future = asyncio.run_coroutine_threadsafe(
            self.runtime.send(route, message, budget_s), self._loop
        )
        try:
            return future.result(budget_s + _LOOP_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            route.failed("timeout")
            return TailAnswer(None, "the agent's event loop did not answer in time", "device")
        except concurrent.futures.CancelledError:
            return TailAnswer(None, "the agent is stopping", "device")

    def _refuse(self, reason: str) -> TailAnswer:
        log.warning("%s %s: tail request refused: %s", self.skill, self.version, reason)
        self.refused[reason] = self.refused.get(reason, 0) + 1
        return TailAnswer(None, f"refused: {reason}")


class SplitRuntime:
    """The agent's split and joint inference: one link estimate, one broker per skill version.

    Args:
        transport: The connected transport, or ``None`` while offline.
        settings: Planning and back-off settings.
        link: The link estimator; a fresh one by default.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        transport: Callable[[], TailTransport | None],
        *,
        settings: SplitSettings | None = None,
        link: LinkEstimator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self.link = link or LinkEstimator()
        self._shared = Shared(self.link, threading.Lock(), settings or SplitSettings(), clock)
        self.brokers: dict[str, SkillBroker] = {}
        #: Set while a broker is attached: the ping loop sleeps on it otherwise.
        self._serving = asyncio.Event()

    def attach(self, name: str, version: str, proc: SkillProcess) -> SkillBroker | None:
        """Serve a started skill version's split and joint models; call on the event loop.

        Builds a coordinator per split model (its plan from the installed bundle, its
        device times from the process's profile) and a route per joint pair, and
        attaches the broker to the process. A version with neither gets none.

        Raises:
            RuntimeBackendError: A split plan in the installed version does not load.
        """
        from edge_agent.split.device import load_plan  # noqa: PLC0415 - numpy: a skill runs

        manifest = proc.manifest
        splits = {}
        for spec in manifest.splits:
            split_plan, _ = load_plan(proc.skill_dir, spec.plan)
            route = SplitCoordinator(name, version, spec, split_plan, self._shared)  # type: ignore[arg-type]
            profile = proc.profiles.get(spec.model)
            if profile is not None:
                route.set_profile(profile)
            splits[spec.model] = route
        joints = {
            spec.small: JointRoute(name, version, spec, self._shared) for spec in manifest.joints
        }
        if not splits and not joints:
            self.detach(name)
            proc.attach(None)
            return None
        broker = SkillBroker(self, name, version, splits, joints, asyncio.get_running_loop())
        self.brokers[name] = broker
        self._serving.set()
        proc.attach(broker)
        return broker

    def detach(self, name: str) -> None:
        """Forget a stopped skill's broker."""
        self.brokers.pop(name, None)
        if not self.brokers:
            self._serving.clear()

    def learn_device(self, name: str, version: str, records: Iterable[InferRecord]) -> None:
        """Learn the device's real run times from the ``ctx.infer`` calls of finished items."""
        broker = self.brokers.get(name)
        if broker is None or broker.version != version:
            return
        for record in records:
            route = broker.splits.get(record.model)
            if route is not None and record.device_ms > 0:
                crossed = record.path in ("split", "hub")
                route.learn_device(record.cut if crossed else DEVICE, record.device_ms)

    def observe_rtt(self, now: float, rtt_ms: float) -> None:
        """Learn from a round trip timed elsewhere (a ping the transport answered).

        Raises:
            ValueError: The values are negative or not finite.
        """
        with self._shared.lock:
            self.link.observe_rtt(now, rtt_ms)

    async def ping_forever(self) -> None:
        """Time a ping every ``ping_interval_s`` while a skill splits; the agent's module.

        Requests alone leave the RTT unknown: a large one mixes it with the
        transfer, and a device-only plan sends none. The ping is answered by the
        hub at once, over the same connection as the tails.
        """
        while True:
            await self._serving.wait()  # no wake-ups at all while nothing splits
            await asyncio.sleep(self._shared.settings.ping_interval_s)
            await self.ping()

    async def ping(self) -> float | None:
        """Time one ping to the hub and feed it to the link estimate.

        Returns:
            The round trip in ms, or None when no skill splits, the hub is not
            connected, or the ping failed (the tail requests learn of a bad link).
        """
        transport, target = self._transport(), self._ping_target()
        if transport is None or target is None:
            return None
        shared = self._shared
        rtt_ms = await time_ping(
            transport, *target, timeout_s=shared.settings.ping_timeout_s, clock=shared.clock
        )
        if rtt_ms is not None:
            self.observe_rtt(shared.clock(), rtt_ms)
        return rtt_ms

    def _ping_target(self) -> tuple[str, str, str] | None:
        """A skill version and model to name in a ping (the hub checks the names' form)."""
        for broker in self.brokers.values():
            for route in (*broker.splits.values(), *broker.joints.values()):
                return broker.skill, broker.version, route.hub_model
        return None

    async def send(self, route: Route, message: pb.InferRequest, budget_s: float) -> TailAnswer:
        """Run one tail request on the hub and learn from how it went; never raises."""
        clock = self._shared.clock
        transport = self._transport()
        started = clock()
        if transport is None:
            route.failed("link")
            return TailAnswer(None, "the hub is not connected", route.decide())
        try:
            async with asyncio.timeout(budget_s):
                response = await transport.infer_tail(message, budget_s)
        except TimeoutError:
            return self._failed(route, "timeout", "no answer before the deadline", message, started)
        except InferRefusedError as exc:
            return self._failed(route, "refused", f"the hub refused: {exc}", message, started)
        except TransportError as exc:
            timed_out = clock() - started >= 0.9 * budget_s
            kind = "timeout" if timed_out else "link"
            return self._failed(route, kind, f"the link failed: {exc}", message, started)
        ended = clock()
        try:
            if response.request_id and response.request_id != message.request_id:
                raise TensorCodecError("the answer is for another request")
            outputs = route.decode(response, route.output_names)
        except TensorCodecError as exc:
            route.failed("bad-response")
            return TailAnswer(None, f"bad answer from the hub: {exc}", route.decide())
        hub_ms = max(response.hub_ms, 0.0) + max(response.queue_ms, 0.0)
        route.succeeded(
            RequestSample(started, ended, message.ByteSize(), response.ByteSize(), hub_ms)
        )
        if isinstance(route, SplitCoordinator):
            route.learn_hub(message.split, response.hub_ms, response.queue_ms)
        return TailAnswer(outputs, "", route.decide())

    def _failed(
        self, route: Route, kind: str, error: str, message: pb.InferRequest, started: float
    ) -> TailAnswer:
        ended = self._shared.clock()
        sample = None
        if kind == "timeout":  # the request took at least this long: the link is no faster
            sample = RequestSample(started, max(ended, started), message.ByteSize(), 0)
        route.failed(kind, sample)
        return TailAnswer(None, error, route.decide())

    def metrics(self, name: str, version: str) -> dict[str, float]:
        """Gauges of one skill version for its telemetry window (empty when it has none)."""
        broker = self.brokers.get(name)
        if broker is None or broker.version != version:
            return {}
        with self._shared.lock:
            link = self.link.estimate()
        gauges = {"split.link_rtt_ms": link.rtt_ms, "split.link_bandwidth_bps": link.bandwidth_bps}
        for model, route in broker.splits.items():
            gauges[f"split.{model}.cut_index"] = float(route.cut_index())
            gauges[f"split.{model}.hub_scale"] = route.hub_scale
            gauges[f"split.{model}.device_scale"] = route.device_scale
            gauges[f"split.{model}.queue_ms"] = route.queue_ms
            gauges[f"split.{model}.profiled"] = float(route.profiled)
        routes: list[Route] = [*broker.splits.values(), *broker.joints.values()]
        for each in routes:
            for kind, count in each.outcomes.items():
                key = f"split.tails_{kind}_total"
                gauges[key] = gauges.get(key, 0.0) + count
        gauges["split.tails_refused_locally_total"] = float(sum(broker.refused.values()))
        return gauges


async def time_ping(
    transport: TailTransport,
    skill: str,
    version: str,
    model: str,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """Time one ping (an empty ``InferTail`` the hub answers at once) over ``transport``.

    The skill, version and model only name what the pinging skill splits; the hub
    checks their form, loads nothing and answers empty.

    Returns:
        The round trip in ms, or None when the ping failed or timed out.
    """
    message = pb.InferRequest(
        model=model,
        split=PING,
        skill=skill,
        version=version,
        request_id=uuid.uuid4().hex,
        deadline_ms=int(timeout_s * 1000),
    )
    started = clock()
    try:
        async with asyncio.timeout(timeout_s):
            response = await transport.infer_tail(message, timeout_s)
    except (TimeoutError, TransportError) as exc:
        log.debug("ping to the hub failed: %s", exc)
        return None
    if response.request_id != message.request_id:
        return None
    return (clock() - started) * 1000.0


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
