"""The fleet service refuses what a person got wrong, once for every front end, and changes nothing.

Config pairs, group selectors and the models of a bundle are checked in the
service layer, so the CLI and a REST API refuse the same mistakes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.errors import ValidationError
from cloud.service import FleetService
from cloud.store import Store, open_store
from skills.bundle import build_bundle
from tests.support.tiny_models import digits_like_onnx, skill_source


@pytest.fixture
def service(store_url: str, tmp_path: Path) -> Iterator[FleetService]:
    """A fresh hub home on each database, opened as a CLI command opens it."""
    FleetService.init(tmp_path / "hub", store_url=store_url).close()
    opened = FleetService.open(tmp_path / "hub")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def devices_store(store_url: str) -> Iterator[Store]:
    """The same database, opened as the hub's servers open it (devices register there)."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


def _trust_files(home: Path) -> dict[str, str]:
    """Every file of the hub's TUF repository, by path, with its digest."""
    root = home / "trust"
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _bundle(tmp_path: Path, name: str, models: dict[str, bytes], **kw: str) -> Path:
    return build_bundle(skill_source(tmp_path / name, models, **kw), tmp_path / f"dist-{name}")


def _good_onnx(tmp_path: Path) -> bytes:
    return digits_like_onnx(tmp_path / "good.onnx").read_bytes()


def test_config_pairs_are_checked_before_anything_is_stored(
    service: FleetService, devices_store: Store, tmp_path: Path
) -> None:
    devices_store.register_device("cam-1", {"kind": "camera"}, {}, now_ms=1)
    service.skills.publish(_bundle(tmp_path, "tiny", {"m.onnx": _good_onnx(tmp_path)}))
    service.groups.create("cams", "kind=camera")
    for bad, named in (("notkv", "'notkv'"), ("a:b", "'a:b'"), (["a=1", "b"], "'b'")):
        with pytest.raises(ValidationError, match=f"bad config pair {named}: expected key=value"):
            service.deployments.create("tiny", "1.0.0", "cams", config=bad)
    with pytest.raises(ValidationError, match="bad config key 'a:b'"):
        service.deployments.create("tiny", "1.0.0", "cams", config={"a:b": "1"})
    assert service.deployments.list() == []
    assert service.devices.get("cam-1").desired_generation == 0

    made = service.deployments.create("tiny", "1.0.0", "cams", config=["t=0.5,mode=fast", "x=1"])
    assert made.config == {"t": "0.5", "mode": "fast", "x": "1"}
    assert service.deployments.list()[0].config == made.config


def test_an_empty_selector_needs_all_devices(service: FleetService) -> None:
    for blank in ("", "  "):
        with pytest.raises(ValidationError, match="would select every device"):
            service.groups.create("everyone", blank)
    with pytest.raises(ValidationError, match="takes no selector, got 'kind=camera'"):
        service.groups.create("everyone", "kind=camera", all_devices=True)
    assert service.groups.list() == []

    everyone = service.groups.create("everyone", "", all_devices=True)
    assert (everyone.name, everyone.selector) == ("everyone", "")
    assert service.groups.create("cams", "kind=camera").selector == "kind=camera"


def test_a_bundle_with_a_junk_model_is_neither_signed_nor_recorded(
    service: FleetService, tmp_path: Path
) -> None:
    before = _trust_files(service.home)
    junk = _bundle(tmp_path, "junk", {"m.onnx": os.urandom(3000)})
    with pytest.raises(ValidationError) as caught:
        service.skills.publish(junk)
    assert str(caught.value).startswith(
        "cannot publish tiny-1.0.0.skill: models/m.onnx (target onnx-cpu) does not load in "
        "ONNX Runtime: "
    )
    assert _trust_files(service.home) == before
    assert service.skills.list() == []


def test_a_bundle_with_one_truncated_variant_is_refused_whole(
    service: FleetService, tmp_path: Path
) -> None:
    good = _good_onnx(tmp_path)
    before = _trust_files(service.home)
    mixed = _bundle(tmp_path, "mixed", {"a.onnx": good, "b.onnx": good[: len(good) // 2]})
    with pytest.raises(ValidationError, match=r"models/b\.onnx \(target onnx-cpu\) does not load"):
        service.skills.publish(mixed)
    assert _trust_files(service.home) == before
    assert service.skills.list() == []


def test_a_target_the_hub_cannot_run_is_signed_only_when_asked(
    service: FleetService, tmp_path: Path
) -> None:
    before = _trust_files(service.home)
    om = _bundle(tmp_path, "om", {"m.om": os.urandom(500)}, target="om")
    with pytest.raises(ValidationError, match="pass --unchecked-target om to sign it unchecked"):
        service.skills.publish(om)
    with pytest.raises(ValidationError, match="unknown target 'ommm'"):
        service.skills.publish(om, unchecked_targets=["ommm"])
    assert _trust_files(service.home) == before

    published = service.skills.publish(om, unchecked_targets=["om"])
    assert published.version.target_name == "tiny/tiny-1.0.0.skill"
    assert [v.version for v in service.skills.list()] == ["1.0.0"]
