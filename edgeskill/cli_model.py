"""``edgeskill model``: train, compress and convert models on a hub, and show their lineage.

Every command works on a hub home (``--home``, default ``.edgeskill/hub``);
the hub and torch are imported only when a command runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.tree import Tree

from edgeskill._common import _fleet, audited, print_error
from edgeskill.cli_split import split

if TYPE_CHECKING:
    from cloud.models import (
        ArtifactRecord,
        EpochRecord,
        JobRecord,
        Lineage,
        ModelFactory,
        VariantMetrics,
        VariantRecord,
    )
    from cloud.models.job_backends import JobBackend

console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 120)
app = typer.Typer(
    help="Train, compress and convert models; list them with their lineage.",
    no_args_is_help=True,
)

HomeOpt = Annotated[
    Path,
    typer.Option(
        "--home", envvar="EDGESKILL_HOME", help="The hub's home folder (config, keys, store)."
    ),
]
DEFAULT_HOME = Path(".edgeskill/hub")
app.command("split")(split)
DEFAULT_VARIANTS = "int8,pruned+int8,distilled+int8"
BACKENDS = ("onnxruntime", "openvino", "litert")


@contextmanager
def _factory(home: Path) -> Iterator[ModelFactory]:
    """Open the hub at ``home``; any hub error ends the command with exit code 2."""
    with _fleet(home) as fleet:
        yield fleet.models


def _kb(size: int) -> str:
    return f"{size / 1000:.1f} kB"


# -- train ---------------------------------------------------------------------


@app.command("train")
def train(
    dataset: Annotated[str, typer.Option(help="A built-in data set.")] = "digits",
    dataset_dir: Annotated[
        Path | None,
        typer.Option(help="A folder-per-class image data set (snapshotted into the hub)."),
    ] = None,
    dataset_name: Annotated[
        str | None, typer.Option(help="Name of the --dataset-dir data set (default: folder).")
    ] = None,
    arch: Annotated[str, typer.Option(help="digits-cnn or mobilenet.")] = "digits-cnn",
    epochs: Annotated[int, typer.Option(help="Passes over the training split.")] = 8,
    lr: Annotated[float, typer.Option(help="Learning rate (Adam).")] = 0.01,
    batch_size: Annotated[int, typer.Option(help="Images per training step.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the data split.")] = 0,
    width: Annotated[float, typer.Option(help="MobileNet width multiplier.")] = 1.0,
    image_size: Annotated[
        int | None, typer.Option(help="Side images are resized to (default 8 or 32).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Name of the model to make.")] = None,
    resume: Annotated[
        int | None, typer.Option(help="Resume this failed or interrupted job instead.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also copy the model's ONNX file here.")] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="Torch threads of the job (on ray also the CPUs it asks for; "
            "default: every CPU here, 1 on ray)."
        ),
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            envvar="EDGESKILL_JOB_BACKEND",
            help="Where the job runs: local (a worker process) or ray (the 'ray' extra).",
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            envvar="EDGESKILL_RAY_ADDRESS",
            help="The Ray cluster: auto, host:port or ray://host:port "
            "(default: a Ray instance started for this command).",
        ),
    ] = None,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Train a model in a separate job (checkpoint every epoch, resumable on either backend).

    Examples:
      edgeskill model train --home hub
      edgeskill model train --arch mobilenet --dataset-dir photos/ --epochs 20 --home hub
      edgeskill model train --resume 3 --home hub
      edgeskill model train --backend ray --ray-address auto --home hub
    """
    job_backend = _job_backend(backend, ray_address)
    if threads is None:
        threads = 1 if job_backend.name == "ray" else (os.cpu_count() or 1)
    with _fleet(home) as fleet:
        factory = fleet.models
        if resume is not None:
            job = factory.tables.get_job(resume)
        else:
            record = (
                factory.add_folder_dataset(dataset_dir, name=dataset_name)
                if dataset_dir is not None
                else factory.add_builtin_dataset(dataset)
            )
            console.print(
                f"data set {record.name} v{record.version}: {record.samples} images, "
                f"{len(record.classes)} classes, {record.content_hash[:19]}"
            )
            job = factory.submit_training(
                record.id, arch=arch, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                width=width, image_size=image_size, model_name=name,
            )  # fmt: skip
        job = _run_with_progress(factory, job, max(1, threads), job_backend)
        ran = {
            "model": job.model_name,
            "arch": job.arch,
            "dataset_id": job.dataset_id,
            "epochs": job.epochs,
            "status": job.status,
            "resumed": resume is not None,
        }
        audited(fleet, "models.train", f"job/{job.id}", after=ran)
        if job.status != "succeeded":
            console.print(f"[red]job {job.id} {job.status}:[/] {job.error}")
            console.print(f"resume it with `edgeskill model train --resume {job.id}`")
            raise typer.Exit(1)
        model = factory.tables.get_model(job.model_name)
        if out is not None:
            factory.export_blob(model.onnx_sha256, out)
    resumed = f", resumed from epoch {job.resumed_from_epoch}" if job.resumed_from_epoch else ""
    accuracy = model.test_accuracy or 0.0
    console.print(
        f"job {job.id} succeeded{resumed}: model {model.id} [bold]{model.name}[/], "
        f"test accuracy {accuracy:.3f}" + (f"; wrote {out}" if out is not None else "")
    )


def _job_backend(name: str, ray_address: str | None) -> JobBackend:
    """The backend ``--backend`` names; a bad choice ends the command with exit code 2."""
    from cloud.errors import HubError  # noqa: PLC0415
    from cloud.models.job_backends import backend_named  # noqa: PLC0415

    try:
        return backend_named(name, ray_address=ray_address)
    except HubError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc


def _run_with_progress(
    factory: ModelFactory, job: JobRecord, threads: int, backend: JobBackend
) -> JobRecord:
    columns = (
        TextColumn("[bold]job {task.fields[job]}[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[metrics]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("epochs", total=job.epochs, job=job.id, metrics="starting")

        def show(epochs: Sequence[EpochRecord]) -> None:
            last = epochs[-1]
            metrics = f"loss {last.train_loss:.3f}  val acc {last.val_accuracy:.3f}"
            progress.update(task, completed=len(epochs), metrics=metrics)

        return factory.jobs.run(job.id, on_progress=show, threads=threads, backend=backend)


# -- compress and convert ------------------------------------------------------


@app.command("compress")
def compress(
    model: Annotated[str, typer.Argument(help="Model id or name.")],
    variants: Annotated[
        str,
        typer.Option(
            help="Comma-separated: int8, magnitude, pruned, pruned+int8, distilled, "
            "distilled+int8, pruned+distilled+int8."
        ),
    ] = DEFAULT_VARIANTS,
    finetune_epochs: Annotated[int, typer.Option(help="Fine-tuning after pruning.")] = 4,
    distill_epochs: Annotated[int, typer.Option(help="Student training epochs.")] = 15,
    calibration: Annotated[int, typer.Option(help="Images calibrating INT8.")] = 300,
    tflite: Annotated[
        bool | None, typer.Option(help="Also build TFLite files (default: when installed).")
    ] = None,
    latency: Annotated[bool, typer.Option(help="Measure latency per backend.")] = True,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Quantise, prune and distil a model; report accuracy, size and latency against float."""
    from converters.errors import ConverterError  # noqa: PLC0415
    from converters.fit import TrainConfig  # noqa: PLC0415
    from converters.pipeline import CompressOptions  # noqa: PLC0415

    names = [v.strip() for v in variants.split(",") if v.strip()]
    try:
        options = CompressOptions(
            finetune=TrainConfig(epochs=finetune_epochs, lr=3e-3),
            distill=TrainConfig(epochs=distill_epochs, lr=5e-3, batch_size=32),
            calibration_images=calibration,
            tflite=tflite,
            latency=latency,
        )
    except ConverterError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from exc
    with _fleet(home) as fleet, console.status("compressing") as status:

        def done(name: str, metrics: VariantMetrics) -> None:
            status.update(f"compressing: {name} done, accuracy {metrics.accuracy:.3f}")

        built = fleet.models.compress(model, names, options=options, on_variant=done)
        if built:
            variants_made = [{"id": v.id, "name": v.name} for v in built]
            target = f"model/{built[0].model_id}"
            audited(fleet, "models.compress", target, after={"variants": variants_made})
    if not built:
        console.print("nothing new to build")
        return
    console.print(variants_table(built))


@app.command("convert")
def convert(
    model: Annotated[str, typer.Argument(help="Model id or name.")],
    target: Annotated[
        str,
        typer.Option(help="onnx-cpu, onnx-cuda, onnx-tensorrt, onnx-cann, openvino, tflite, om."),
    ],
    variant: Annotated[str, typer.Option(help="Which variant to convert.")] = "float",
    samples: Annotated[int, typer.Option(help="Test images the check compares on.")] = 8,
    engine: Annotated[
        bool | None,
        typer.Option(help="onnx-tensorrt: build a TensorRT engine (default: when trtexec exists)."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Also copy the files into this folder.")] = None,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Convert a variant for a device target; the outputs must match the source within tolerance."""
    with _fleet(home) as fleet:
        factory = fleet.models
        with console.status(f"converting {model}/{variant} for {target}"):
            artifact = factory.convert(
                model, target, variant=variant, samples=samples, engine=engine
            )
        names = [f.name for f in artifact.files]
        made = {"variant_id": artifact.variant_id, "target": artifact.target, "files": names}
        audited(fleet, "models.convert", f"artifact/{artifact.id}", after=made)
        if out is not None:
            for f in artifact.files:
                factory.export_blob(f.sha256, out / f.name)
    files = ", ".join(f"{f.name} ({_kb(f.size)})" for f in artifact.files)
    console.print(
        f"artefact {artifact.id} [bold]{target}[/]: {files}; checked with {artifact.checked_with}: "
        f"max diff {artifact.max_abs_diff:.2e} <= {artifact.tolerance:.2e}"
    )
    for note in artifact.notes:
        console.print(f"  note: {note}")


@app.command("import")
def import_model(
    path: Annotated[Path, typer.Argument(help="An EdgeSkill .pt model file or an .onnx file.")],
    name: Annotated[str, typer.Option(help="Name of the model on the hub.")],
    dataset_id: Annotated[
        int | None, typer.Option(help="Data set version its metrics are measured on.")
    ] = None,
    image_size: Annotated[int, typer.Option(help="Side of the model's input images.")] = 8,
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Register a model trained elsewhere, after checking that it loads and runs."""
    with _fleet(home) as fleet:
        record = fleet.models.import_model(
            path, name=name, dataset_id=dataset_id, image_size=image_size
        )
        made = {
            "name": record.name,
            "arch": record.arch,
            "dataset_id": record.dataset_id,
            "onnx_sha256": record.onnx_sha256,
        }
        audited(fleet, "models.import", f"model/{record.id}", after=made)
    console.print(f"model {record.id} [bold]{record.name}[/] ({record.arch}) registered")


@app.command("link")
def link(
    skill: Annotated[str, typer.Argument(help="The pushed skill's name.")],
    version: Annotated[str, typer.Argument(help="Its version.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Link a pushed skill version to the model artefacts its bundle ships (by sha256)."""
    with _fleet(home) as fleet:
        linked = fleet.models.link_skill_version(skill, version)
        found = [v.project for v in fleet.skills.list(skill) if v.version == version]
        audited(
            fleet,
            "models.link",
            f"skill/{skill}/{version}",
            after={"artifacts": [a.id for a in linked]},
            project=found[0] if found else None,
        )
    console.print(f"{skill} {version} ships {len(linked)} registered artefact(s)")


@app.command("sample-stream")
def sample_stream(
    model: Annotated[str, typer.Argument(help="Model id or name.")],
    out: Annotated[
        Path, typer.Option(help="The .npz file to write (x, y), for `agent run --source`.")
    ] = Path("stream.npz"),
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Write the model's held-out test images, labelled, as a stream a device can replay.

    Examples:
      edgeskill model sample-stream 1 --home hub --out digits-stream.npz
      edgeskill agent run ... --source digits-stream.npz --source-loop
    """
    from edgeskill._common import write_holdout_stream  # noqa: PLC0415

    with _factory(home) as factory:
        try:
            count = write_holdout_stream(factory, model, out)
        except OSError as exc:
            print_error(f"cannot write {out}: {exc.strerror or exc}")
            raise typer.Exit(2) from exc
    console.print(f"wrote {out}: {count} held-out images with their labels")


# -- listing -------------------------------------------------------------------


@app.command("ls")
def ls(home: HomeOpt = DEFAULT_HOME) -> None:
    """List models with their data set, job, variants and targets."""
    table = Table(
        "id", "name", "arch", "data set", "job", "test acc", "ONNX", "variants", "targets"
    )
    with _factory(home) as factory:
        for model in factory.tables.list_models():
            lineage = factory.lineage(model.id)
            dataset = lineage.dataset
            job = lineage.job
            table.add_row(
                str(model.id),
                model.name,
                model.arch,
                f"{dataset.name} v{dataset.version}" if dataset else "-",
                f"#{job.id} {job.status}" if job else "imported",
                f"{model.test_accuracy:.3f}" if model.test_accuracy is not None else "-",
                _kb(model.onnx_size),
                ", ".join(v.name for v in lineage.variants) or "-",
                ", ".join(sorted({a.target for a in lineage.artifacts})) or "-",
            )
    console.print(table)


@app.command("jobs")
def jobs(home: HomeOpt = DEFAULT_HOME) -> None:
    """List training jobs and their state."""
    table = Table(
        "job", "model", "arch", "data set", "status", "epochs", "last val acc", "ran on", "error"
    )
    with _factory(home) as factory:
        for listed in factory.tables.list_jobs():
            job = factory.jobs.refresh(listed.id)
            epochs = factory.tables.job_epochs(job.id)
            last = f"{epochs[-1].val_accuracy:.3f}" if epochs else "-"
            ran_on = ",".join(dict.fromkeys(r.backend for r in factory.jobs.runs(job.id)))
            table.add_row(
                str(job.id), job.model_name, job.arch, str(job.dataset_id), job.status,
                f"{len(epochs)}/{job.epochs}", last, ran_on or "-", (job.error or "")[:80],
            )  # fmt: skip
    console.print(table)


@app.command("show")
def show(
    model: Annotated[str, typer.Argument(help="Model id or name.")],
    home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Show a model's lineage, training curve, variants with their metrics, and artefacts."""
    with _factory(home) as factory:
        lineage = factory.lineage(model)
    console.print(lineage_tree(lineage))
    if lineage.epochs:
        curve = Table("epoch", "train loss", "val acc", "seconds", title="training")
        for e in lineage.epochs:
            curve.add_row(
                str(e.epoch), f"{e.train_loss:.4f}", f"{e.val_accuracy:.3f}", f"{e.seconds:.2f}"
            )
        console.print(curve)
    if lineage.variants:
        console.print(variants_table(lineage.variants))
    if lineage.artifacts:
        console.print(artifacts_table(lineage))


def lineage_tree(lineage: Lineage) -> Tree:
    """The lineage as a tree: data set → job → model → variants → artefacts → skills."""
    model, dataset, job = lineage.model, lineage.dataset, lineage.job
    if dataset is not None:
        root = Tree(
            f"data set [bold]{dataset.name}[/] v{dataset.version} ({dataset.kind}, "
            f"{dataset.samples} images, {dataset.content_hash[:19]})"
        )
    else:
        root = Tree("no data set (imported model)")
    node = root
    if job is not None:
        resumed = f", resumed from epoch {job.resumed_from_epoch}" if job.resumed_from_epoch else ""
        node = root.add(
            f"job #{job.id} {job.status}, {len(lineage.epochs)}/{job.epochs} epochs{resumed}"
        )
    accuracy = f"{model.test_accuracy:.3f}" if model.test_accuracy is not None else "-"
    node = node.add(
        f"model #{model.id} [bold]{model.name}[/] ({model.arch}, test acc {accuracy}, "
        f"ONNX {_kb(model.onnx_size)}, sha256 {model.onnx_sha256[:12]})"
    )
    for variant in lineage.variants:
        m = variant.metrics
        bar = "[green]meets bar[/]" if m.meets_bar else "[red]misses bar[/]"
        branch = node.add(
            f"variant #{variant.id} {variant.name}: acc {m.accuracy:.3f} "
            f"({m.accuracy_loss_pt:+.2f} pt), {m.size_ratio:.1f}x smaller, {bar}"
        )
        for artifact in (a for a in lineage.artifacts if a.variant_id == variant.id):
            leaf = branch.add(
                f"{artifact.target} #{artifact.id}: {artifact.files[0].name}, "
                f"diff {artifact.max_abs_diff:.1e} <= {artifact.tolerance:.1e}"
            )
            for skill, version in artifact.skills:
                leaf.add(f"skill {skill} {version}")
    return root


def variants_table(variants: Sequence[VariantRecord]) -> Table:
    """Accuracy, size and latency of each variant against its float model."""
    present = [b for b in BACKENDS if any(b in v.metrics.latency_ms for v in variants)]
    table = Table("id", "variant", "accuracy", "loss (pt)", "size", "size ratio", title="variants")
    for backend in present:
        table.add_column(f"{backend} ms (speed-up)")
    table.add_column("bar")
    for v in variants:
        m = v.metrics
        cells = [
            f"{m.latency_ms[b]:.3f} ({m.latency_ratio.get(b, 1.0):.2f}x)"
            if b in m.latency_ms
            else "-"
            for b in present
        ]
        table.add_row(
            str(v.id), v.name, f"{m.accuracy:.4f}", f"{m.accuracy_loss_pt:+.2f}",
            _kb(m.size_bytes), f"{m.size_ratio:.2f}x", *cells,
            "[green]yes[/]" if m.meets_bar else "[red]no[/]",
        )  # fmt: skip
    return table


def artifacts_table(lineage: Lineage) -> Table:
    """Per-target artefacts with their conversion checks and the skills that ship them."""
    names = {v.id: v.name for v in lineage.variants}
    table = Table(
        "id", "variant", "target", "files", "max diff", "tolerance", "checked with", "skills",
        title="artefacts",
    )  # fmt: skip
    artifact: ArtifactRecord
    for artifact in lineage.artifacts:
        table.add_row(
            str(artifact.id), names.get(artifact.variant_id, "?"), artifact.target,
            ", ".join(f.name for f in artifact.files), f"{artifact.max_abs_diff:.2e}",
            f"{artifact.tolerance:.2e}", artifact.checked_with,
            ", ".join(f"{s} {v}" for s, v in artifact.skills) or "-",
        )  # fmt: skip
    return table
