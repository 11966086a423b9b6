"""Training runs: options, checkpoints, resume after a crash and after SIGKILL of a job process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from converters.digits import DigitsCNN, DigitsData
from converters.errors import TrainingError
from converters.fit import TrainConfig, fit, load_checkpoint_metrics
from converters.models import load_model
from converters.onnx_export import onnx_accuracy
from converters.training import JobSpec, read_metrics, read_status, run_job, start_job
from tests.support import wait_until


class _Crash(Exception):
    pass


def test_options_are_validated() -> None:
    with pytest.raises(TrainingError):
        TrainConfig(epochs=0)
    with pytest.raises(TrainingError):
        TrainConfig(lr=float("nan"))
    with pytest.raises(TrainingError, match="unknown"):
        TrainConfig.from_dict({"epochs": 2, "sneaky": 1})
    with pytest.raises(TrainingError):
        JobSpec(arch="resnet")
    with pytest.raises(TrainingError, match="8x8"):
        JobSpec(arch="digits-cnn", image_size=32)
    spec = JobSpec(arch="digits-cnn", train=TrainConfig(epochs=2))
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_resume_after_crash_matches_an_uninterrupted_run(
    digits: DigitsData, tmp_path: Path
) -> None:
    config = TrainConfig(epochs=3, lr=5e-3, batch_size=64)
    torch.manual_seed(0)
    straight = DigitsCNN()
    fit(straight, digits, config)

    def crash_after_first(metrics: object) -> None:
        raise _Crash

    checkpoint = tmp_path / "ckpt.pt"
    with pytest.raises(_Crash):
        fit(DigitsCNN(), digits, config, checkpoint=checkpoint, on_epoch=crash_after_first)
    assert [m.epoch for m in load_checkpoint_metrics(checkpoint)] == [1]
    resumed = DigitsCNN()
    history = fit(resumed, digits, config, checkpoint=checkpoint)
    assert [m.epoch for m in history] == [1, 2, 3]
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(TrainingError, match="different options"):
        fit(DigitsCNN(), digits, TrainConfig(epochs=4), checkpoint=checkpoint)


def test_job_in_process_writes_its_folder(digits: DigitsData, tmp_path: Path) -> None:
    spec = JobSpec(arch="digits-cnn", train=TrainConfig(epochs=2, lr=5e-3, batch_size=32))
    seen: list[int] = []
    result = run_job(spec, tmp_path / "job", on_epoch=lambda m: seen.append(m.epoch))
    assert seen == [1, 2] and result.resumed_from_epoch == 0
    assert result.dataset_hash.startswith("sha256:")
    assert [m.epoch for m in read_metrics(tmp_path / "job")] == [1, 2]
    status = read_status(tmp_path / "job")
    assert status is not None and status.state == "completed"
    model = load_model(result.model_path)
    assert onnx_accuracy(result.onnx_path, digits.test) == pytest.approx(
        result.test_accuracy, abs=0.01
    )
    assert isinstance(model, DigitsCNN)
    again = run_job(spec, tmp_path / "job")  # a finished job is reported, not retrained
    assert again.metrics == result.metrics
    with pytest.raises(TrainingError, match="different job"):
        run_job(JobSpec(arch="digits-cnn"), tmp_path / "job")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    def written() -> bool:
        assert proc.poll() is None, (path.parent / "log.txt").read_text()
        return path.exists()

    wait_until(written, timeout, f"the job to write {path.name}", interval_s=0.05)


@pytest.mark.slow
def test_killed_job_process_resumes_from_last_checkpoint(tmp_path: Path) -> None:
    workdir = tmp_path / "job"
    spec = JobSpec(
        arch="digits-cnn", train=TrainConfig(epochs=3, lr=5e-3, batch_size=32), pause_s=2.0
    )
    proc = start_job(spec, workdir)
    _wait_for(workdir / "checkpoint.pt", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (workdir / "result.json").exists()
    done_at_kill = [m.epoch for m in load_checkpoint_metrics(workdir / "checkpoint.pt")]
    assert done_at_kill and done_at_kill[-1] < 3

    proc = start_job(replace(spec, pause_s=0.0), workdir)
    assert proc.wait(timeout=120) == 0, (workdir / "log.txt").read_text()
    result = json.loads((workdir / "result.json").read_text())
    assert result["resumed_from_epoch"] == done_at_kill[-1]
    assert [m.epoch for m in read_metrics(workdir)] == [1, 2, 3]
    status = read_status(workdir)
    assert status is not None and status.state == "completed"
    first = [m["train_loss"] for m in result["metrics"][: len(done_at_kill)]]
    assert np.allclose(
        first,
        [m.train_loss for m in load_checkpoint_metrics(workdir / "checkpoint.pt")][: len(first)],
    )
