"""Skill bundles from the model factory ship the model's drift reference.

The built-in digits skill, packaged from a factory model with a data set, gets
``drift/reference.json``: the model's answers on its held-out digits, which
parses as the agent parses it and passes the hub's publish check. A model
without a data set, or a source with a reference of its own, is packaged as
it is. Runs on SQLite only: nothing here depends on the database.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cloud.models import FactoryError, ModelFactory
from cloud.models.bundles import package_skill
from cloud.models.references import BRIGHTNESS, classifier_reference
from cloud.store import Store, open_store
from converters.digits import load_digits_data, train_digits
from converters.models import save_model
from skills.bundle import install_bundle, read_manifest
from skills.drift_reference import build_reference
from skills.drift_spec import DriftSpec, read_reference, write_reference
from skills.model_check import check_bundle
from tests.support.skillkit import LIBRARY


@pytest.fixture(scope="module")
def digits_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = train_digits(load_digits_data(0), epochs=3, seed=0)
    return save_model(model, tmp_path_factory.mktemp("weights") / "digits.pt")


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[ModelFactory]:
    store: Store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        yield ModelFactory(tmp_path / "home", store)
    finally:
        store.close()


def test_the_digits_bundle_ships_the_models_reference_on_its_held_out_digits(
    factory: ModelFactory, digits_weights: Path, tmp_path: Path
) -> None:
    dataset = factory.add_builtin_dataset("digits")
    model = factory.import_model(digits_weights, name="digits", dataset_id=dataset.id)
    artifact = factory.convert(model.id, "onnx-cpu")
    bundle = package_skill(factory, LIBRARY / "digits", "1.0.0", [artifact], tmp_path / "d")

    manifest = read_manifest(bundle)
    assert manifest.drift == DriftSpec("drift/reference.json", (BRIGHTNESS,))
    assert check_bundle(bundle) == ()  # the hub's publish check: models run, reference parses
    installed = tmp_path / "installed"
    install_bundle(bundle, installed)
    reference = read_reference(installed, manifest.drift)  # as a device reads it
    data = load_digits_data(0)
    held_out = len(data.val) + len(data.test)
    weights = reference.class_weights()
    assert set(weights) <= {str(c) for c in range(10)} and len(weights) >= 9
    assert sum(weights.values()) == held_out
    assert reference.input(BRIGHTNESS).n == held_out
    assert reference.input(BRIGHTNESS).points[0] >= 0.0
    assert reference.confidence.edges[-1] <= 1.0 + 1e-6 and reference.confidence.bins >= 5
    assert factory.drift_reference(model.id) == reference  # the factory's, unchanged
    assert not (LIBRARY / "digits" / "drift").exists()  # the source folder is left alone


def test_a_model_without_a_data_set_ships_no_reference(
    factory: ModelFactory, digits_weights: Path, tmp_path: Path
) -> None:
    model = factory.import_model(digits_weights, name="digits")
    assert factory.drift_reference(model.id) is None
    artifact = factory.convert(model.id, "onnx-cpu")
    bundle = package_skill(factory, LIBRARY / "digits", "1.0.0", [artifact], tmp_path / "d")
    assert read_manifest(bundle).drift is None
    check_bundle(bundle)  # still a valid bundle


def test_a_source_with_its_own_reference_keeps_it(
    factory: ModelFactory, digits_weights: Path, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    shutil.copytree(LIBRARY / "digits", source, ignore=shutil.ignore_patterns("__pycache__"))
    own = build_reference(["1", "7"], [0.9, 0.6])
    spec = write_reference(source, own, "stats/own.json")
    text = (source / "skill.toml").read_text()
    (source / "skill.toml").write_text(text + '\n[drift]\nreference = "stats/own.json"\n')
    dataset = factory.add_builtin_dataset("digits")
    model = factory.import_model(digits_weights, name="digits", dataset_id=dataset.id)
    artifact = factory.convert(model.id, "onnx-cpu")
    bundle = package_skill(factory, source, "1.0.0", [artifact], tmp_path / "d")
    assert read_manifest(bundle).drift == spec
    installed = tmp_path / "installed"
    install_bundle(bundle, installed)
    assert read_reference(installed, spec) == own
    assert not (installed / "drift").exists()


def test_a_reference_needs_images_and_a_model_that_runs(tmp_path: Path) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    images = np.zeros((4, 1, 8, 8), dtype=np.float32)
    with pytest.raises(FactoryError, match="cannot run the model"):
        classifier_reference(broken, images)
    with pytest.raises(FactoryError, match="images"):
        classifier_reference(broken, images[:0])
    with pytest.raises(FactoryError, match="images"):
        classifier_reference(broken, images[0])


def test_a_published_versions_lineage_reads_back_to_its_data_set(
    digits_weights: Path, tmp_path: Path
) -> None:
    store: Store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        factory = ModelFactory(tmp_path / "home", store)
        dataset = factory.add_builtin_dataset("digits")
        model = factory.import_model(digits_weights, name="digits", dataset_id=dataset.id)
        artifact = factory.convert(model.id, "onnx-cpu")
        bundle = package_skill(factory, LIBRARY / "digits", "1.1.0", [artifact], tmp_path / "d")
        for version, manifest in (("1.0.0", ""), ("1.1.0", read_manifest(bundle).to_toml())):
            store.add_skill_version(
                "digits", version, target_name=f"digits/{version}.skill", sha256="a" * 64,
                size=1, manifest=manifest, now_ms=1,
            )  # fmt: skip
        factory.link_skill_version("digits", "1.1.0")  # as publishing does
        assert store.skill_lineage("other") == []
        (step,) = store.skill_lineage("digits")  # 1.0.0 ships no factory model
        assert (step.version, step.artifact_id, step.target) == ("1.1.0", artifact.id, "onnx-cpu")
        assert (step.model, step.model_id, step.dataset) == ("digits", model.id, "digits")
        assert step.dataset_version == dataset.version and step.variant == "float"
    finally:
        store.close()
