"""The hub's half of split and joint inference: check, entitle, load, batch, answer.

Both transports hand each ``InferRequest`` to :meth:`TailServer.infer` with
the device their connection names (never the request's ``device_id``). The
server

1. checks the request's fields (names, lengths, the tensor count) and that its
   deadline has not passed; a ``ping`` (no tensors) is answered here, empty, so
   the agent can time the round trip of its link (the transport has already
   checked that the device is registered);
2. answers a resend (same device, same ``request_id``, within ``dedupe_s``)
   with the first request's answer, without running it again;
3. asks the core whether the device is entitled to the skill version (it is in
   the device's desired state, or the device reports it running) and which
   signed target holds it;
4. loads the tail from that signed bundle (:mod:`cloud.tail_models`; cached per
   skill, version and model, at most ``max_models``; a failed load is remembered
   for ``failed_load_s``);
5. decodes the tensors with :mod:`skills.tensor_codec` under its caps and checks
   them against the tail's input shapes, so hostile input is refused before it
   reaches ONNX Runtime and changes nothing;
6. runs the tail batched with other devices' requests (:mod:`cloud.tail_batching`)
   and answers with the outputs in fp32, the batch's run time (``hub_ms``) and the
   request's wait for it (``queue_ms``).

Every refusal is a :class:`TailRefusedError` whose ``code`` is a wire code of
:data:`protos.topics.INFER_ERROR_CODES` (a gRPC status on gRPC, an ``Error``
message on MQTT).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cloud.errors import HubError
from cloud.tail_batching import BatchSettings, Overloaded, TailBatcher
from cloud.tail_models import TailLoadError, TailModel, TamperedBundleError, load_tail
from protos import pb
from skills.errors import ManifestError, TensorCodecError
from skills.manifest import parse_version
from skills.split_plan import PING
from skills.tensor_codec import WIRE_LIMITS, CodecLimits, decode_protos, encode_protos
from skills.trust import TrustRepository

__all__ = ["Entitle", "TailRefusedError", "TailServer", "TailSettings"]

log = logging.getLogger(__name__)

_SKILL_RE = re.compile(r"[a-z][a-z0-9-]{0,62}")
_MODEL_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_ID_RE = re.compile(r"[!-~]{1,64}")
_MAX_SPLIT_CHARS = 256
#: Wire codes after which a resend should be tried again rather than answered the same.
_TRANSIENT = frozenset({"resource-exhausted", "deadline-exceeded", "unavailable"})

#: ``entitle(device, skill, version)``: the signed target of a skill version the device
#: may use. Raises TailRefusedError (not entitled) or StoreError.
Entitle = Callable[[str, str, str], Awaitable[str]]
ModelKey = tuple[str, str, str]


class TailRefusedError(HubError):
    """The hub will not run this inference request.

    Attributes:
        code: A wire code of :data:`protos.topics.INFER_ERROR_CODES`.
        message: Why, for the device.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class TailSettings:
    """Caps and tuning of tail serving.

    Attributes:
        batching: Dynamic batching and worker caps.
        limits: Caps on the tensors of one request (and of one answer).
        max_rows: The largest batch dimension one request may send.
        max_models: Tails kept loaded (least recently used ones are dropped).
        default_deadline_ms: A request's deadline when it names none.
        max_deadline_ms: The longest deadline honoured.
        dedupe_s: How long an answer is kept for a resend of its request.
        dedupe_entries: Answers kept for resends, over all devices.
        entitlement_ttl_s: How long a device's entitlement to a version is believed.
        failed_load_s: How long a tail that failed to load is not tried again.
        threads: ONNX Runtime threads per session (0: its default).
        work_dir: Where bundles are unpacked while loading (the system's temp folder).
    """

    batching: BatchSettings = field(default_factory=BatchSettings)
    limits: CodecLimits = WIRE_LIMITS
    max_rows: int = 64
    max_models: int = 8
    default_deadline_ms: int = 5_000
    max_deadline_ms: int = 60_000
    dedupe_s: float = 30.0
    dedupe_entries: int = 1024
    entitlement_ttl_s: float = 2.0
    failed_load_s: float = 10.0
    threads: int = 0
    work_dir: Path | None = None


class TailServer:
    """Serves tails to devices for one hub process.

    Attributes:
        counts: Requests by outcome (``ok``, ``duplicate``, refusal codes, ``tampered``).
        batcher: The batcher (its ``batch_sizes`` say how well batching works).
    """

    def __init__(
        self, trust: TrustRepository, entitle: Entitle, settings: TailSettings | None = None
    ) -> None:
        self.settings = settings or TailSettings()
        self._trust = trust
        self._entitle = entitle
        self.batcher = TailBatcher(self.settings.batching)
        self.counts: Counter[str] = Counter()
        self._models: OrderedDict[ModelKey, TailModel] = OrderedDict()
        self._loading: dict[ModelKey, asyncio.Task[TailModel]] = {}
        self._failed: dict[ModelKey, tuple[float, TailRefusedError]] = {}
        self._answers: OrderedDict[tuple[str, str], tuple[float, asyncio.Task[pb.InferResponse]]]
        self._answers = OrderedDict()
        self._entitled: dict[tuple[str, str, str], tuple[float, str]] = {}

    async def infer(
        self, device_id: str, request: pb.InferRequest, *, deadline_s: float | None = None
    ) -> pb.InferResponse:
        """Run the tail ``request`` asks for on behalf of ``device_id``.

        Args:
            device_id: The device, as its connection names it.
            request: The request (its ``device_id`` is ignored).
            deadline_s: The transport's own deadline (gRPC's), if shorter.

        Raises:
            TailRefusedError: The request is refused; ``code`` says why.
            StoreError: The store failed while checking the entitlement.
        """
        _check_request(request, self.settings)
        if request.split == PING:  # the agent timing the link: no model, no store
            if request.inputs:
                raise self._refuse("invalid-argument", f"a {PING!r} request carries no tensors")
            self.counts["ping"] += 1
            return pb.InferResponse(request_id=request.request_id)
        budget_ms = request.deadline_ms or self.settings.default_deadline_ms
        budget_s = min(budget_ms, self.settings.max_deadline_ms) / 1000.0
        if deadline_s is not None:
            budget_s = min(budget_s, deadline_s)
        if budget_s <= 0:
            raise self._refuse("deadline-exceeded", "the request's deadline has passed")
        task = self._dedupe(device_id, request, time.monotonic() + budget_s)
        try:
            response = await asyncio.shield(task)
        except TailRefusedError as exc:
            self.counts[exc.code] += 1
            raise
        self.counts["ok"] += 1
        return response

    def _dedupe(
        self, device_id: str, request: pb.InferRequest, deadline: float
    ) -> asyncio.Task[pb.InferResponse]:
        key = (device_id, request.request_id)
        now = time.monotonic()
        found = self._answers.get(key)
        if found is not None and now - found[0] < self.settings.dedupe_s:
            self.counts["duplicate"] += 1
            return found[1]
        task = asyncio.create_task(self._serve(device_id, request, deadline))
        task.add_done_callback(lambda done: self._forget_transient(key, done))
        self._answers[key] = (now, task)
        self._answers.move_to_end(key)
        # Oldest first: drop the expired ones and any beyond the cap (answers hold outputs).
        while self._answers and (
            len(self._answers) > self.settings.dedupe_entries
            or now - next(iter(self._answers.values()))[0] >= self.settings.dedupe_s
        ):
            self._answers.popitem(last=False)
        return task

    def _forget_transient(self, key: tuple[str, str], task: asyncio.Task[pb.InferResponse]) -> None:
        exc = None if task.cancelled() else task.exception()
        transient = task.cancelled() or (
            exc is not None and (not isinstance(exc, TailRefusedError) or exc.code in _TRANSIENT)
        )
        found = self._answers.get(key)
        if transient and found is not None and found[1] is task:
            del self._answers[key]

    async def _serve(
        self, device_id: str, request: pb.InferRequest, deadline: float
    ) -> pb.InferResponse:
        skill, version = request.skill, request.version
        try:  # the first request for a tail waits for its load, within its own deadline
            async with asyncio.timeout_at(_loop_time(deadline)):
                target = await self._entitled_target(device_id, skill, version)
                model = await self._model(target, skill, version, request.model)
        except TimeoutError as exc:  # the load goes on (shielded) for the requests after it
            raise self._refuse(
                "deadline-exceeded", "the tail was still loading at the request's deadline"
            ) from exc
        try:
            start, names = model.start(request.split)
        except TailLoadError as exc:
            raise self._refuse("not-found", str(exc)) from exc
        feeds = self._decode(model, start, names, request)
        key = (skill, version, request.model, request.split)
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                result = await self.batcher.run(key, model, start, feeds)
        except TimeoutError as exc:
            raise self._refuse(
                "deadline-exceeded", "no worker was free before the deadline"
            ) from exc
        except Overloaded as exc:
            raise self._refuse("resource-exhausted", f"the hub is overloaded: {exc}") from exc
        except TailLoadError as exc:
            raise self._refuse("invalid-argument", str(exc)) from exc
        outputs = {n: np.asarray(v, np.float32) for n, v in result.outputs.items()}
        names_out = list(model.output_names)
        try:
            protos = encode_protos(outputs, names_out, "fp32", self.settings.limits)
        except TensorCodecError as exc:
            raise self._refuse("resource-exhausted", f"the answer is over a cap: {exc}") from exc
        return pb.InferResponse(
            outputs=protos,
            hub_ms=result.hub_ms,
            queue_ms=result.queue_ms,
            request_id=request.request_id,
        )

    def _decode(
        self, model: TailModel, start: int, names: tuple[str, ...], request: pb.InferRequest
    ) -> dict[str, np.ndarray]:
        try:
            feeds = decode_protos(list(request.inputs), names, self.settings.limits)
        except TensorCodecError as exc:
            raise self._refuse("invalid-argument", f"bad tensors: {exc}") from exc
        rows = {x.shape[0] if x.ndim else 0 for x in feeds.values()}
        if len(rows) != 1 or not 1 <= next(iter(rows)) <= self.settings.max_rows:
            raise self._refuse(
                "invalid-argument",
                f"tensors need one batch dimension of 1..{self.settings.max_rows}",
            )
        for name, value in feeds.items():
            want = model.expected_shape(start, name)
            if want is not None and (
                len(want) != value.ndim
                or any(w is not None and w != d for w, d in zip(want, value.shape, strict=True))
            ):
                raise self._refuse(
                    "invalid-argument", f"tensor {name!r} has shape {value.shape}, wanted {want}"
                )
        return feeds

    async def _entitled_target(self, device_id: str, skill: str, version: str) -> str:
        key = (device_id, skill, version)
        now = time.monotonic()
        cached = self._entitled.get(key)
        if cached is not None and now - cached[0] < self.settings.entitlement_ttl_s:
            return cached[1]
        target = await self._entitle(device_id, skill, version)
        if len(self._entitled) >= 10_000:
            self._entitled.clear()
        self._entitled[key] = (now, target)
        return target

    async def _model(self, target: str, skill: str, version: str, model: str) -> TailModel:
        key = (skill, version, model)
        found = self._models.get(key)
        if found is not None:
            self._models.move_to_end(key)
            return found
        failed = self._failed.get(key)
        if failed is not None and time.monotonic() - failed[0] < self.settings.failed_load_s:
            raise failed[1]
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._load(key, target))
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        return await asyncio.shield(task)

    async def _load(self, key: ModelKey, target: str) -> TailModel:
        skill, version, model = key
        try:
            loaded = await asyncio.to_thread(
                load_tail,
                self._trust,
                target,
                skill,
                version,
                model,
                work_dir=self.settings.work_dir,
                threads=self.settings.threads,
            )
        except TamperedBundleError as exc:
            self.counts["tampered"] += 1
            log.error("%s", exc)  # the operator's news; the device gets a refusal
            refusal = TailRefusedError("not-found", f"no verified tail of {skill} {version}")
            self._failed[key] = (time.monotonic(), refusal)
            raise refusal from exc
        except TailLoadError as exc:
            refusal = TailRefusedError("not-found", str(exc))
            self._failed[key] = (time.monotonic(), refusal)
            raise refusal from exc
        self._failed.pop(key, None)
        self._models[key] = loaded
        while len(self._models) > self.settings.max_models:
            self._models.popitem(last=False)
        log.info("serving the tail of %s %s %s", skill, version, model)
        return loaded

    @staticmethod
    def _refuse(code: str, message: str) -> TailRefusedError:
        return TailRefusedError(code, message)

    async def close(self) -> None:
        """Stop batching; requests still waiting are cancelled."""
        await self.batcher.close()
        for task in list(self._loading.values()):
            task.cancel()


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` instant on the event loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline - time.monotonic())


def _check_request(request: pb.InferRequest, settings: TailSettings) -> None:
    """Refuse malformed fields before anything is looked up.

    Raises:
        TailRefusedError: ``invalid-argument``, naming the field.
    """
    problem = ""
    if _SKILL_RE.fullmatch(request.skill) is None:
        problem = "skill: not a skill name"
    elif _MODEL_RE.fullmatch(request.model) is None:
        problem = "model: not a model name"
    elif not 0 < len(request.split) <= _MAX_SPLIT_CHARS:
        problem = f"split: 1..{_MAX_SPLIT_CHARS} characters"
    elif _ID_RE.fullmatch(request.request_id) is None:
        problem = "request_id: 1..64 printable ASCII characters"
    elif len(request.inputs) > settings.limits.max_tensors:
        problem = f"inputs: more than {settings.limits.max_tensors} tensors"
    else:
        try:
            parse_version(request.version)
        except ManifestError:
            problem = "version: not a MAJOR.MINOR.PATCH version"
    if problem:
        raise TailRefusedError("invalid-argument", f"bad inference request: {problem}")
