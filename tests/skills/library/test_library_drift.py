"""The audio and text skills' drift references tell a shifted stream from a like one.

Each skill is built as the hub builds it (its reference computed by running it,
through the agent's skill runtime, on the lines its ``sources.toml`` gives), and
its answers on new inputs feed the agent's own :class:`DriftMonitor` against that
reference. Inputs like the reference's (other sentences, the same quiet room)
stay under the hub's PSI threshold with unremarkable KS p-values; a shifted
stream (the same speech under loud machine noise; log lines instead of
sentences) is flagged by the statistics that should catch it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from cloud.drift.policy import DriftPolicy
from cloud.models.library import LIBRARY, build_library_skill
from cloud.models.speech import write_speech
from edge_agent.adapters import AudioStream
from edge_agent.drift import DriftMonitor, DriftSummary
from edge_agent.media import read_wav
from edgeskill.skill_runner import reference_runner
from skills.bundle import install_bundle
from skills.drift_spec import read_reference
from tests.skills.library.conftest import Harness

pytestmark = pytest.mark.slow

#: The hub's default: a device drifts when a PSI of its window is over this.
PSI = DriftPolicy().psi_threshold

#: Said neither in the references nor in each other's streams.
OTHER_LINES = [
    "The parcel arrived a day early.",
    "Could you send me the figures by Friday?",
    "Okay nabu, set a timer for ten minutes.",
    "The lift on the third floor is out of order.",
    "Lunch will be served in the main hall.",
    "Remember to lock the back door tonight.",
    "The bus was late again this morning.",
    "We will start the inspection after the break.",
]


def _built(name: str, tmp: Path) -> tuple[Harness, DriftMonitor]:
    """The skill as a device installs it, and a monitor over its shipped reference."""
    bundle = build_library_skill(LIBRARY / name, tmp / "dist", runner=reference_runner)
    manifest = install_bundle(bundle, tmp / "installed")
    assert manifest.drift is not None
    reference = read_reference(tmp / "installed", manifest.drift)
    monitor = DriftMonitor(name, manifest.version, reference, window_size=10_000)
    return Harness(tmp / "installed", manifest), monitor


def _summary(monitor: DriftMonitor, results: Iterable[Mapping[str, Any]]) -> DriftSummary:
    for i, result in enumerate(results):
        monitor.observe(
            result["label"], result["confidence"], at=float(i), inputs=result["summaries"]
        )
    summary = monitor.flush()
    assert summary is not None
    return summary


def _audio_results(skill: Any, wav: Path) -> list[Mapping[str, Any]]:
    stream = AudioStream(read_wav(wav))
    return [skill.process(stream.item(i)[0]) for i in range(len(stream))]


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Other sentences in the same quiet room, and the same ones beside a machine."""
    folder = tmp_path_factory.mktemp("streams")
    write_speech(OTHER_LINES, folder / "quiet.wav")
    write_speech(OTHER_LINES, folder / "loud.wav", noise_dbfs=-25.0)
    return {"quiet": folder / "quiet.wav", "loud": folder / "loud.wav"}


@pytest.mark.parametrize("name", ["voice-activity", "keyword-spot"])
def test_the_audio_references_flag_a_loud_room_and_not_a_like_one(
    name: str, streams: dict[str, Path], tmp_path: Path
) -> None:
    harness, _ = _built(name, tmp_path)
    like = _summary(
        _built(name, tmp_path / "a")[1], _audio_results(harness.skill(), streams["quiet"])
    )
    loud = _summary(
        _built(name, tmp_path / "b")[1], _audio_results(harness.skill(), streams["loud"])
    )
    (like_level,), (loud_level,) = like.inputs, loud.inputs
    assert like_level.name == loud_level.name == "level_db"
    assert like_level.pvalue > 0.01 and like.class_mix_psi < PSI
    assert loud_level.pvalue < 1e-3  # its pauses (a quarter of it) are 35 dB louder
    assert loud_level.statistic > like_level.statistic + 0.2


def test_the_text_reference_flags_log_lines_and_not_everyday_sentences(tmp_path: Path) -> None:
    harness, monitor = _built("text-embed", tmp_path)
    skill = harness.skill()
    everyday = [
        "It is going to be windy on the hills tomorrow.",
        "The doctor said my blood test results are normal.",
        "My phone will not connect to the office wifi.",
        "The rent goes up by five percent in January.",
        "They scored twice in the first ten minutes.",
        "Slice the tomatoes and add a little olive oil.",
        "The coach to the airport was full.",
        "Please switch off the lamp in the bedroom.",
    ] * 2
    logs = [
        f"2026-12-04T18:{m:02d}:07Z ERROR sensor-{m} i2c read failed errno=121 retry={m % 3}"
        for m in range(16)
    ]
    like = _summary(monitor, (skill.process({"text": t}) for t in everyday))
    shifted = _summary(monitor, (skill.process({"text": t}) for t in logs))
    assert like.class_mix_psi < PSI < shifted.class_mix_psi
    (like_tokens,), (log_tokens,) = like.inputs, shifted.inputs
    assert like_tokens.pvalue > 0.01 and log_tokens.pvalue < 1e-6  # log lines are longer
