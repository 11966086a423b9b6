"""Training jobs on both job backends: a local worker process and a task on a real Ray cluster.

The cluster is a real one on this machine (``ray start --head --num-cpus=1 --block``
as a child process, started once for the module and stopped by its pid); the
test process joins it by address, as a hub would. The same job (digits, same
seed, one torch thread) gives the same model on both backends, a job cancelled
on one backend resumes from its checkpoint on the other, and without ``ray``
installed the ray backend is refused with an error naming the extra.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cloud.hub import Hub
from cloud.models import (
    JOB_FAILED,
    JOB_SUCCEEDED,
    EpochRecord,
    JobError,
    JobRecord,
    ModelFactory,
)
from cloud.models.job_backends import JobBackend, LocalProcessBackend, backend_named
from cloud.models.ray_jobs import RayBackend
from converters.fit import load_checkpoint_metrics
from edgeskill.cli_model import app
from tests.support import free_port, wait_until

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="the optional 'ray' extra is not installed")
RAY_START_S = 60.0


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A one-CPU Ray cluster on this machine, for the whole module; yields its GCS address.

    Token authentication is on, with a token of its own in the environment of the
    head and of this process (the driver): never ``~/.ray/auth_token``, whose mere
    presence turns token authentication on for every later ``ray start`` here.
    """
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "token")
        env.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
        env.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
        env.delenv("RAY_ADDRESS", raising=False)
        yield from _ray_head(tmp_path_factory)


def _ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    argv = [
        str(ray_bin), "start", "--head", "--block", "--num-cpus=1", "--disable-usage-stats",
        "--include-dashboard=false", f"--port={port}", f"--dashboard-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--min-worker-port=0", "--max-worker-port=0",  # the kernel's: clear of free_port's
        f"--temp-dir={tmp_path_factory.mktemp('ray')}",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("ray-log") / "ray-start.log"
    with log.open("wb") as out:
        head = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(
            lambda: "Ray runtime started" in log.read_text() or head.poll() is not None,
            RAY_START_S,
            "the Ray head to start",
        )
        assert head.poll() is None, log.read_text()
        yield f"127.0.0.1:{port}"
    finally:
        import ray  # noqa: PLC0415

        ray.shutdown()
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@pytest.fixture(scope="module")
def ray_backend(ray_address: str) -> JobBackend:
    """The ray backend on the module's cluster, the way the CLI makes it."""
    backend = backend_named("ray", ray_address=ray_address)
    assert isinstance(backend, RayBackend)
    backend.connect()
    return backend


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[ModelFactory]:
    """A factory on a SQLite hub home every worker on this machine can open."""
    hub = Hub.init(tmp_path / "hub")
    try:
        yield ModelFactory.for_hub(hub)
    finally:
        hub.close()


@needs_ray
def test_the_same_job_trains_the_same_model_on_both_backends(
    factory: ModelFactory, ray_backend: JobBackend
) -> None:
    dataset = factory.add_builtin_dataset("digits")
    backends = [LocalProcessBackend(), ray_backend]
    jobs = [
        factory.submit_training(dataset.id, epochs=2, lr=5e-3, seed=3, model_name=f"d-{b.name}")
        for b in backends
    ]
    # Both at once, one torch thread each: they share the cores, not their answers.
    runs = [factory.jobs.start(j.id, backend=b) for j, b in zip(jobs, backends, strict=True)]
    results = []
    for job, backend, run in zip(jobs, backends, runs, strict=True):
        seen: list[int] = []

        def progress(epochs: Sequence[EpochRecord], seen: list[int] = seen) -> None:
            seen.append(len(epochs))

        done = factory.jobs.wait(job.id, run, on_progress=progress)
        assert done.status == JOB_SUCCEEDED, done.error
        assert seen[-1] == 2
        ran = factory.jobs.runs(job.id)
        assert [r.backend for r in ran] == [backend.name]
        assert ran[0].pid == done.pid and ran[0].pid != os.getpid()
        model = factory.tables.get_model(done.model_name)
        epochs = [
            (e.epoch, e.train_loss, e.val_accuracy) for e in factory.tables.job_epochs(job.id)
        ]
        results.append((epochs, model.test_accuracy, model.weights_sha256, model.onnx_sha256))
    # Same code, seed, data split and one torch thread: the runs are bit-identical.
    local, ray = results
    assert ray == local
    assert local[1] is not None and local[1] > 0.5


def _wait_for_epochs(factory: ModelFactory, job_id: int, count: int) -> None:
    wait_until(
        lambda: len(factory.tables.job_epochs(job_id)) >= count,
        90,
        f"the worker to record {count} epoch(s)",
        interval_s=0.05,
    )


@needs_ray
@pytest.mark.parametrize(("first", "then"), [("ray", "local"), ("local", "ray")])
def test_a_cancelled_job_resumes_from_its_checkpoint_on_the_other_backend(
    factory: ModelFactory, ray_backend: JobBackend, ray_address: str, first: str, then: str
) -> None:
    backends = {"local": LocalProcessBackend(), "ray": ray_backend}
    dataset = factory.add_builtin_dataset("digits")
    job = factory.submit_training(dataset.id, epochs=3, lr=5e-3, batch_size=32)
    run = factory.jobs.start(job.id, pause_s=30.0, backend=backends[first])  # stays in epoch 2
    _wait_for_epochs(factory, job.id, 1)
    assert factory.jobs.is_alive(job.id)
    with pytest.raises(JobError, match=f"running on {first}"):
        factory.jobs.start(job.id, backend=backends[then])

    cancelled = factory.jobs.cancel(job.id, run)
    assert cancelled.status == JOB_FAILED and cancelled.error is not None
    expected = "Ray task was cancelled" if first == "ray" else "killed by SIGTERM"
    assert expected in cancelled.error and "resume" in cancelled.error
    assert not factory.jobs.is_alive(job.id)
    checkpoint = factory.jobs.workdir(job.id) / "checkpoint.pt"
    assert [m.epoch for m in load_checkpoint_metrics(checkpoint)] == [1]

    if then == "ray":  # the way people do it: `edgeskill model train --resume`
        resumed = _resume_with_the_cli(factory.home, job.id, ray_address)
    else:
        resumed, _ = factory.train(job.id, backend=backends[then])
    assert resumed.status == JOB_SUCCEEDED, resumed.error
    assert resumed.resumed_from_epoch == 1
    assert [e.epoch for e in factory.tables.job_epochs(job.id)] == [1, 2, 3]
    assert factory.tables.get_model(resumed.model_name).job_id == job.id
    assert [r.backend for r in factory.jobs.runs(job.id)] == [first, then]


def _resume_with_the_cli(home: Path, job_id: int, ray_address: str) -> JobRecord:
    runner = CliRunner()
    args = ["--resume", str(job_id), "--backend", "ray", "--ray-address", ray_address]
    result = runner.invoke(app, ["train", *args, "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert f"job {job_id} succeeded, resumed from epoch 1" in result.output
    listed = runner.invoke(app, ["jobs", "--home", str(home)])
    assert listed.exit_code == 0 and "local,ray" in listed.output, listed.output
    hub = Hub.open(home)
    try:
        return ModelFactory.for_hub(hub).tables.get_job(job_id)
    finally:
        hub.close()


def test_without_ray_the_ray_backend_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(JobError, match=r"'ray' extra \(pip install 'edgeskill\[ray\]'\)"):
        backend_named("ray", ray_address="auto")
    result = CliRunner().invoke(app, ["train", "--backend", "ray", "--home", str(tmp_path)])
    assert result.exit_code == 2 and "edgeskill[ray]" in result.output, result.output
    assert not (tmp_path / "hub.toml").exists()


def test_a_bad_backend_choice_is_refused_before_anything_runs(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["train", "--backend", "spark", "--home", str(tmp_path)])
    assert result.exit_code == 2 and "must be one of local, ray" in result.output, result.output
    assert not (tmp_path / "hub.toml").exists()
