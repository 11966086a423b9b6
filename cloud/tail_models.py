"""Tails the hub runs, loaded from the same signed bundle the device verified.

A tail is what the hub runs for one (skill, version, model): the segments of a
``[[split]]`` model (all of them; a request's cut says where to start) or the big
model of a ``[[joint]]`` pair. It is read from the hub's TUF repository only:
the target's signed length and SHA-256 are checked while the bundle is copied
out of the repository, before the archive is opened; then it is extracted with
the archive's safety checks, checked against its own manifest, and its models
are loaded into ONNX Runtime from memory. Nothing of the copy stays on disk.

Running takes a list of requests' feeds and returns their outputs, as one batch
when the segments take a dynamic batch dimension (their first input and output
dimension symbolic), else one by one; a batched run whose outputs do not come
back with the batch's rows marks that tail unbatchable and runs the requests
again one by one.
"""

from __future__ import annotations

import hashlib
import itertools
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from skills.archive import safe_extract
from skills.bundle import verify_tree
from skills.errors import SkillError
from skills.manifest import Manifest
from skills.split_plan import SplitPlan
from skills.trust import TrustRepository

__all__ = ["JOINT", "TailLoadError", "TailModel", "TamperedBundleError", "load_tail"]

#: The ``split`` of a joint request: run the pair's big model on the small one's inputs.
JOINT = "joint"
_COPY_CHUNK = 1024 * 1024
_FLOAT = "tensor(float)"
Feeds = dict[str, np.ndarray]


class TailLoadError(Exception):
    """The tail cannot be served: no such model or cut in the bundle, or the bundle is bad."""


class TamperedBundleError(TailLoadError):
    """The bundle on the hub's disk does not match its signed length and hash."""


@dataclass
class _Stage:
    """One ONNX Runtime session and what it reads and makes."""

    session: Any
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    #: Static input dims by name (``None`` where symbolic), for checking requests.
    shapes: dict[str, tuple[int | None, ...]]
    batchable: bool


@dataclass
class TailModel:
    """The loaded tail of one model of one skill version.

    Attributes:
        skill: The skill's name.
        version: Its version.
        model: The model's name.
        plan: The split plan (``None`` for a joint pair's big model).
        stages: One session per segment (or the big model alone).
    """

    skill: str
    version: str
    model: str
    plan: SplitPlan | None
    stages: list[_Stage]
    _unbatchable: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, split: str) -> tuple[int, tuple[str, ...]]:
        """The first stage the hub runs for ``split`` and the tensors a request sends.

        Raises:
            TailLoadError: This model has no such cut (or is not a joint big model).
        """
        if self.plan is None:
            if split != JOINT:
                raise TailLoadError(f"{self.model!r} is served for joint inference only")
            return 0, self.stages[0].inputs
        if split == JOINT:
            raise TailLoadError(f"{self.model!r} is a split model, not a joint pair's big model")
        try:
            cut = self.plan.cut(split)
        except SkillError as exc:
            raise TailLoadError(str(exc)) from exc
        if cut.after + 1 >= len(self.stages):
            raise TailLoadError(f"cut {split!r} leaves nothing for the hub")
        return cut.after + 1, cut.tensors

    @property
    def output_names(self) -> tuple[str, ...]:
        """What the hub sends back."""
        return self.plan.output_names if self.plan is not None else self.stages[-1].outputs

    def expected_shape(self, start: int, name: str) -> tuple[int | None, ...] | None:
        """The dims the first stage from ``start`` that reads ``name`` wants (None: unknown)."""
        for stage in self.stages[start:]:
            if name in stage.shapes:
                return stage.shapes[name]
        return None

    def batchable(self, start: int) -> bool:
        """Whether the stages from ``start`` take several requests as one batch."""
        with self._lock:
            known_bad = start in self._unbatchable
        return not known_bad and all(s.batchable for s in self.stages[start:])

    def run(
        self, start: int, feeds: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[list[Feeds | TailLoadError], int]:
        """Run the stages from ``start`` for each request's feeds (blocking; call in a worker).

        Returns:
            Each request's outputs (or why the tail refused its input), in order, and
            how many ONNX Runtime passes it took (1 for a batch).
        """
        if len(feeds) > 1 and self.batchable(start) and _same_shapes(feeds):
            rows = [next(iter(f.values())).shape[0] for f in feeds]
            joined = {n: np.concatenate([f[n] for f in feeds]) for n in feeds[0]}
            try:
                out = self._once(start, joined)
            except TailLoadError:
                out = None  # one request's input, perhaps: run them one by one below
            if out is not None and all(v.shape[:1] == (sum(rows),) for v in out.values()):
                bounds = np.cumsum([0, *rows])
                split: list[Feeds | TailLoadError] = [
                    {n: v[a:b] for n, v in out.items()} for a, b in itertools.pairwise(bounds)
                ]
                return split, 1
            if out is not None:
                with self._lock:  # the graph fixes its batch somewhere: never batch it again
                    self._unbatchable.add(start)
        return [self._guarded(start, f) for f in feeds], len(feeds)

    def _guarded(self, start: int, feeds: Mapping[str, np.ndarray]) -> Feeds | TailLoadError:
        try:
            return self._once(start, feeds)
        except TailLoadError as exc:
            return exc

    def _once(self, start: int, feeds: Mapping[str, np.ndarray]) -> Feeds:
        env: Feeds = dict(feeds)
        for stage in self.stages[start:]:
            try:
                values = stage.session.run(list(stage.outputs), {n: env[n] for n in stage.inputs})
            except KeyError as exc:
                raise TailLoadError(f"the request lacks tensor {exc}") from exc
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise TailLoadError(f"the tail refused the input: {str(exc)[:300]}") from exc
            env.update(zip(stage.outputs, (np.asarray(v) for v in values), strict=True))
        return {n: env[n] for n in self.output_names}


def _same_shapes(feeds: Sequence[Mapping[str, np.ndarray]]) -> bool:
    first = {n: v.shape[1:] for n, v in feeds[0].items()}
    return all(
        {n: v.shape[1:] for n, v in f.items()} == first and all(v.ndim for v in f.values())
        for f in feeds
    )


def load_tail(
    trust: TrustRepository,
    target_name: str,
    skill: str,
    version: str,
    model: str,
    *,
    work_dir: Path | None = None,
    threads: int = 0,
) -> TailModel:
    """Load a tail from the signed bundle ``target_name`` (blocking; call in a worker).

    Raises:
        TamperedBundleError: The file's length or SHA-256 differs from the signed ones.
        TailLoadError: The target is not signed, the bundle is unsafe or inconsistent,
            the manifest does not name ``model`` as a split model or a joint big
            model, or a segment does not load or takes other than float32 at a cut.
    """
    with tempfile.TemporaryDirectory(prefix="tail-", dir=work_dir) as tmp:
        root = Path(tmp)
        bundle = root / "bundle.skill"
        _copy_verified(trust, target_name, bundle)
        tree = root / "tree"
        try:
            safe_extract(bundle, tree)
            manifest = verify_tree(tree)
        except SkillError as exc:
            raise TailLoadError(f"bundle {target_name} cannot be served: {exc}") from exc
        if (manifest.name, manifest.version) != (skill, version):
            raise TailLoadError(f"bundle {target_name} holds {manifest.name} {manifest.version}")
        if manifest.split_for(model) is not None:
            plan, stages = _split_stages(tree, manifest, model, threads)
            return TailModel(skill, version, model, plan, stages)
        return TailModel(
            skill, version, model, None, [_joint_stage(tree, manifest, model, threads)]
        )


def _copy_verified(trust: TrustRepository, target_name: str, dest: Path) -> None:
    """Copy a signed target out of the repository, checking its length and hash."""
    try:
        ref = next((t for t in trust.targets() if t.name == target_name), None)
        if ref is None:
            raise TailLoadError(f"{target_name} is not a signed target")
        size, handle = trust.open_file(ref.path)
    except (SkillError, FileNotFoundError) as exc:
        raise TailLoadError(f"bundle {target_name} cannot be read: {exc}") from exc
    digest = hashlib.sha256()
    copied = 0
    with handle, dest.open("wb") as out:
        while copied <= ref.length and (chunk := handle.read(_COPY_CHUNK)):
            digest.update(chunk)
            out.write(chunk)
            copied += len(chunk)
    if size != ref.length or copied != ref.length or digest.hexdigest() != ref.sha256:
        raise TamperedBundleError(
            f"bundle {target_name} on the hub's disk does not match its signed length and "
            "hash; refusing to serve it"
        )


def _session(data: bytes, threads: int) -> Any:
    import onnxruntime as ort  # noqa: PLC0415 - only a hub that serves tails pays for it

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads > 0:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])


def _stage(path: Path, where: str, threads: int, float_inputs: set[str] | None = None) -> _Stage:
    try:
        session = _session(path.read_bytes(), threads)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise TailLoadError(f"{where} does not load: {str(exc)[:300]}") from exc
    ins, outs = session.get_inputs(), session.get_outputs()
    shapes = {i.name: tuple(d if isinstance(d, int) else None for d in i.shape) for i in ins}
    for info in ins:
        if (float_inputs is None or info.name in float_inputs) and info.type != _FLOAT:
            raise TailLoadError(f"{where} takes {info.name!r} as {info.type}, not float32")
    batchable = all(len(v.shape) > 0 and not isinstance(v.shape[0], int) for v in [*ins, *outs])
    return _Stage(
        session, tuple(i.name for i in ins), tuple(o.name for o in outs), shapes, batchable
    )


def _split_stages(
    tree: Path, manifest: Manifest, model: str, threads: int
) -> tuple[SplitPlan, list[_Stage]]:
    spec = manifest.split_for(model)
    assert spec is not None
    top = tree.resolve()
    plan_path = (tree / spec.plan).resolve()
    try:
        if not plan_path.is_relative_to(top):
            raise TailLoadError(f"split plan {spec.plan!r} leaves the bundle")
        plan = SplitPlan.load(plan_path)
    except SkillError as exc:
        raise TailLoadError(f"split plan of {model!r}: {exc}") from exc
    sent = {n for cut in plan.cuts for n in cut.tensors}
    stages = []
    for index, segment in enumerate(plan.segments):
        path = (plan_path.parent / segment.file).resolve()
        if not path.is_relative_to(top) or not path.is_file():
            raise TailLoadError(f"segment {segment.file!r} of {model!r} is missing")
        stage = _stage(path, f"segment {index} of {model!r}", threads, sent)
        if set(stage.inputs) != set(segment.inputs) or set(stage.outputs) != set(segment.outputs):
            raise TailLoadError(f"segment {index} of {model!r} does not match its plan")
        stage.inputs, stage.outputs = segment.inputs, segment.outputs
        stages.append(stage)
    return plan, stages


def _joint_stage(tree: Path, manifest: Manifest, model: str, threads: int) -> _Stage:
    if not any(j.big == model for j in manifest.joints):
        raise TailLoadError(f"{manifest.name} {manifest.version} has no split or joint {model!r}")
    variants = [v for v in manifest.variants(model) if v.target == "onnx-cpu"]
    if not variants:
        raise TailLoadError(f"joint big model {model!r} has no onnx-cpu variant")
    best = next((v for v in variants if v.precision == "fp32"), variants[0])
    return _stage(tree / best.path, f"joint big model {model!r}", threads)
