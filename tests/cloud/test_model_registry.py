"""The model registry and factory: lineage records, blobs, data set versions, compression,
conversion, and that bad input (corrupt or unsupported models included) records nothing.

Every test that touches the store runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.models import (
    JOB_FAILED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    ArtifactDraft,
    ArtifactFile,
    BlobError,
    BlobStore,
    EpochRecord,
    FactoryError,
    ModelDraft,
    ModelFactory,
    ModelTables,
    VariantDraft,
    VariantMetrics,
)
from cloud.models.bundles import package_skill
from cloud.store import Store, open_store
from converters.digits import load_digits_data, train_digits
from converters.models import save_model
from converters.pipeline import CompressOptions
from skills.bundle import read_manifest
from skills.manifest import Manifest, ModelVariant
from skills.model_check import check_bundle as check_bundle_models
from tests.support.skillkit import LIBRARY

HASH = "sha256:" + "ab" * 32
SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def metrics(accuracy: float = 0.95, loss_pt: float = 0.2, ratio: float = 3.0) -> VariantMetrics:
    return VariantMetrics(
        accuracy=accuracy, float_accuracy=accuracy + loss_pt / 100, accuracy_loss_pt=loss_pt,
        agreement=0.99, size_bytes=100, float_size_bytes=300, size_ratio=ratio, gzip_bytes=90,
        latency_ms={"onnxruntime": 0.02}, meets_bar=loss_pt <= 1.0,
    )  # fmt: skip


def count_rows(registry: ModelTables) -> tuple[int, int, int]:
    models = registry.list_models()
    variants = sum(len(registry.variants_of(m.id)) for m in models)
    artifacts = sum(len(registry.lineage(m.id).artifacts) for m in models)
    return len(models), variants, artifacts


def blob_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


# registry records


def test_dataset_versions_are_content_addressed(store: Store) -> None:
    registry = ModelTables(store.engine)
    first = registry.add_dataset(
        "parts", kind="folder", location="datasets/x", content_hash=HASH,
        classes=("bolt", "nut"), samples=20, now_ms=1,
    )  # fmt: skip
    again = registry.add_dataset(
        "parts", kind="folder", location="datasets/x", content_hash=HASH,
        classes=("bolt", "nut"), samples=20, now_ms=2,
    )  # fmt: skip
    assert again == first and first.version == 1
    second = registry.add_dataset(
        "parts", kind="folder", location="datasets/y", content_hash="sha256:" + "cd" * 32,
        classes=("bolt", "nut", "washer"), samples=30, now_ms=3,
    )  # fmt: skip
    assert second.version == 2 and second.classes == ("bolt", "nut", "washer")
    for bad in (
        {"content_hash": "md5:123"},
        {"kind": "url"},
        {"location": "../etc"},
        {"classes": ()},
        {"samples": 0},
    ):
        args = {
            "kind": "folder", "location": "datasets/z", "content_hash": "sha256:" + "ef" * 32,
            "classes": ("a", "b"), "samples": 5, "now_ms": 4, **bad,
        }  # fmt: skip
        with pytest.raises(ValidationError):
            registry.add_dataset("parts", **args)  # type: ignore[arg-type]
    assert [d.version for d in registry.list_datasets()] == [1, 2]


def test_job_lifecycle_and_model_lineage(store: Store) -> None:
    registry = ModelTables(store.engine)
    dataset = registry.add_dataset(
        "digits", kind="builtin", location="digits", content_hash=HASH,
        classes=tuple("0123456789"), samples=1797, now_ms=1,
    )  # fmt: skip
    job = registry.create_job(dataset.id, arch="digits-cnn", spec={"arch": "digits-cnn"},
                              epochs=3, now_ms=2)  # fmt: skip
    assert job.status == "queued" and job.model_name == f"digits-cnn-{job.id}"
    with pytest.raises(NotFoundError):
        registry.create_job(999, arch="digits-cnn", spec={}, epochs=3, now_ms=2)
    with pytest.raises(ConflictError, match="taken"):
        registry.create_job(dataset.id, arch="digits-cnn", spec={}, epochs=3, now_ms=2,
                            model_name=job.model_name)  # fmt: skip

    registry.mark_running(job.id, pid=123, now_ms=3)
    one = [EpochRecord(1, 1.5, 0.7, 0.1)]
    registry.replace_epochs(job.id, one)
    failed = registry.fail_job(job.id, "killed", now_ms=4)
    assert (failed.status, failed.error) == (JOB_FAILED, "killed")
    with pytest.raises(ValidationError, match="twice"):
        registry.replace_epochs(job.id, one + one)
    assert registry.job_epochs(job.id) == one  # the bad call changed nothing

    assert registry.mark_running(job.id, pid=124, now_ms=5).status == JOB_RUNNING
    epochs = [*one, EpochRecord(2, 0.5, 0.9, 0.1), EpochRecord(3, 0.3, 0.95, 0.1)]
    draft = ModelDraft(name="ignored", arch="digits-cnn", onnx_sha256=SHA_A, onnx_size=10,
                       image_size=8, weights_sha256=SHA_B, test_accuracy=0.95)  # fmt: skip
    with pytest.raises(ValidationError):
        registry.finish_job(job.id, replace(draft, test_accuracy=float("nan")), epochs=epochs,
                            resumed_from_epoch=1, now_ms=6)  # fmt: skip
    assert registry.get_job(job.id).status == JOB_RUNNING and registry.list_models() == []
    model = registry.finish_job(job.id, draft, epochs=epochs, resumed_from_epoch=1, now_ms=6)
    assert (model.name, model.job_id, model.dataset_id) == (job.model_name, job.id, dataset.id)
    done = registry.get_job(job.id)
    assert (done.status, done.resumed_from_epoch) == (JOB_SUCCEEDED, 1)
    for again in (
        lambda: registry.mark_running(job.id, pid=1, now_ms=7),
        lambda: registry.fail_job(job.id, "late", now_ms=7),
        lambda: registry.finish_job(job.id, draft, epochs=epochs, resumed_from_epoch=0, now_ms=7),
    ):
        with pytest.raises(ConflictError):
            again()
    lineage = registry.lineage(model.name)
    assert lineage.dataset == dataset and lineage.job == done
    assert [e.epoch for e in lineage.epochs] == [1, 2, 3]


def test_variants_and_artifacts_are_all_or_nothing(store: Store) -> None:
    registry = ModelTables(store.engine)
    model = registry.add_model(
        ModelDraft(name="m", arch="onnx", onnx_sha256=SHA_A, onnx_size=300, image_size=8),
        now_ms=1,
    )
    good = VariantDraft("float", False, SHA_A, 300, metrics(loss_pt=0.0, ratio=1.0))
    bad = VariantDraft("int8", True, "not-a-hash", 100, metrics())
    with pytest.raises(ValidationError):
        registry.add_variants(model.id, [good, bad], now_ms=2)
    assert registry.variants_of(model.id) == []
    float_v, int8_v = registry.add_variants(
        model.id, [good, replace(bad, onnx_sha256=SHA_B)], now_ms=2
    )
    assert int8_v.metrics == metrics() and int8_v.quantized
    with pytest.raises(ConflictError, match="int8"):
        registry.add_variants(model.id, [replace(bad, onnx_sha256=SHA_C)], now_ms=3)

    files = (ArtifactFile("m.xml", SHA_B, 5), ArtifactFile("m.bin", SHA_C, 7))
    draft = ArtifactDraft("openvino", files, 1e-6, 1e-4, "openvino", ("precision: f32",))
    for broken in (
        replace(draft, target="coreml"),
        replace(draft, max_abs_diff=0.5),  # a failed check is never recorded
        replace(draft, files=()),
        replace(draft, files=(ArtifactFile("../x", SHA_B, 5),)),
    ):
        with pytest.raises(ValidationError):
            registry.add_artifact(int8_v.id, broken, now_ms=4)
    assert registry.artifacts_of(int8_v.id) == []
    artifact = registry.add_artifact(int8_v.id, draft, now_ms=4)
    assert artifact.sha256 == SHA_B and artifact.files == files
    with pytest.raises(ConflictError):
        registry.add_artifact(int8_v.id, draft, now_ms=5)
    with pytest.raises(NotFoundError):
        registry.add_artifact(9999, draft, now_ms=5)
    assert registry.lineage(model.id).variants == (float_v, int8_v)


def test_skill_versions_link_to_the_artifacts_they_ship(store: Store) -> None:
    registry = ModelTables(store.engine)
    model = registry.add_model(
        ModelDraft(name="m", arch="onnx", onnx_sha256=SHA_A, onnx_size=3, image_size=8), now_ms=1
    )
    (variant,) = registry.add_variants(
        model.id, [VariantDraft("float", False, SHA_A, 3, metrics())], now_ms=2
    )
    artifact = registry.add_artifact(
        variant.id,
        ArtifactDraft("onnx-cpu", (ArtifactFile("m.onnx", SHA_A, 3),), 0.0, 1e-4, "onnxruntime"),
        now_ms=3,
    )
    with pytest.raises(NotFoundError):
        registry.link_skill_version("digits", "1.0.0")
    shipped = ModelVariant(model="classifier", target="onnx-cpu", path="models/c.onnx",
                           sha256=SHA_A, size=3)  # fmt: skip
    other = replace(shipped, target="tflite", path="models/c.tflite", sha256=SHA_C)
    manifest = Manifest(name="digits", version="1.0.0", entrypoint="main:Skill",
                        models=(shipped, other))  # fmt: skip
    store.add_skill_version(
        "digits", "1.0.0", target_name="digits/digits-1.0.0.skill", sha256=SHA_B, size=10,
        manifest=manifest.to_toml(), now_ms=4,
    )  # fmt: skip
    linked = registry.link_skill_version("digits", "1.0.0")
    assert [a.id for a in linked] == [artifact.id]
    assert registry.link_skill_version("digits", "1.0.0") == linked  # idempotent
    assert registry.get_artifact(artifact.id).skills == (("digits", "1.0.0"),)


# blobs


def test_blob_store_is_content_addressed_and_detects_corruption(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs", max_bytes=1000)
    source = tmp_path / "model.onnx"
    source.write_bytes(b"weights" * 10)
    sha, size = blobs.put_file(source)
    assert size == 70 and blobs.path(sha) == tmp_path / "blobs" / "sha256" / sha[:2] / sha[2:]
    assert blobs.put_file(source) == (sha, size) and len(blob_files(tmp_path / "blobs")) == 1
    assert blobs.export(sha, tmp_path / "out" / "copy").read_bytes() == source.read_bytes()
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(BlobError, match="cap"):
        blobs.put_file(big)
    with pytest.raises(BlobError):
        blobs.path("../../etc/passwd")
    blobs.path(sha).chmod(0o644)
    blobs.path(sha).write_bytes(b"tampered")
    with pytest.raises(BlobError, match="corrupt"):
        blobs.export(sha, tmp_path / "out" / "again")
    assert not (tmp_path / "out" / "again").exists()
    assert len(blob_files(tmp_path / "blobs")) == 1  # no temporary files left behind


# data set folders


def write_folder(root: Path, classes: dict[str, int]) -> Path:
    rng = np.random.default_rng(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 255, (12, 12), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_folder_datasets_are_snapshotted_and_bad_ones_record_nothing(
    store: Store, tmp_path: Path
) -> None:
    factory = ModelFactory(tmp_path / "home", store)
    folder = write_folder(tmp_path / "parts", {"bolt": 6, "nut": 6})
    first = factory.add_folder_dataset(folder)
    assert (first.name, first.version, first.classes, first.samples) == (
        "parts", 1, ("bolt", "nut"), 12
    )  # fmt: skip
    snapshot = tmp_path / "home" / first.location
    assert sorted(p.name for p in snapshot.iterdir()) == ["bolt", "nut"]
    assert factory.add_folder_dataset(folder) == first
    (folder / "nut" / "0.png").unlink()
    assert factory.add_folder_dataset(folder).version == 2
    assert (snapshot / "nut" / "0.png").exists()  # version 1 is immutable

    (folder / "bolt" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(FactoryError, match=r"broken\.png"):
        factory.add_folder_dataset(folder)
    (folder / "bolt" / "broken.png").unlink()
    (folder / "stray.txt").write_text("loose file")
    with pytest.raises(FactoryError, match="stray"):
        factory.add_folder_dataset(folder)
    with pytest.raises(ValidationError):
        factory.add_folder_dataset(write_folder(tmp_path / "bad name!", {"a": 2, "b": 2}))
    assert len(factory.tables.list_datasets()) == 2
    leftovers = [p.name for p in (tmp_path / "home" / "datasets").iterdir()]
    assert len(leftovers) == 2 and not any(n.startswith(".") for n in leftovers)


# factory: import, compress, convert


@pytest.fixture(scope="module")
def digits_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = train_digits(load_digits_data(0), epochs=4, seed=0)
    return save_model(model, tmp_path_factory.mktemp("weights") / "digits.pt")


def test_compress_and_convert_record_checked_variants(
    store: Store, tmp_path: Path, digits_weights: Path
) -> None:
    factory = ModelFactory(tmp_path / "home", store)
    dataset = factory.add_builtin_dataset("digits")
    model = factory.import_model(digits_weights, name="digits", dataset_id=dataset.id)
    assert model.arch == "digits-cnn" and model.test_accuracy is not None
    assert model.test_accuracy > 0.85

    with pytest.raises(ValidationError, match="unknown variants"):
        factory.compress(model.id, ["int4"])
    options = CompressOptions(tflite=False, calibration_images=200)
    seen: list[str] = []
    float_v, int8_v = factory.compress(
        model.name, ["int8"], options=options, on_variant=lambda n, _m: seen.append(n)
    )
    assert seen == ["float", "int8"] and float_v.weights_sha256 == model.weights_sha256
    assert int8_v.quantized and int8_v.metrics.meets_bar and int8_v.metrics.size_ratio > 2.5
    assert "onnxruntime" in int8_v.metrics.latency_ms
    assert factory.blobs.verify(int8_v.onnx_sha256).stat().st_size == int8_v.onnx_size
    with pytest.raises(ConflictError, match="int8"):
        factory.compress(model.id, ["int8"], options=options)

    ov = factory.convert(model.id, "openvino")
    assert [f.name.rsplit(".", 1)[1] for f in ov.files] == ["xml", "bin"]
    assert ov.max_abs_diff <= ov.tolerance <= 1e-4 and ov.checked_with == "openvino"
    onnx_int8 = factory.convert(model.id, "onnx-cpu", variant="int8")
    assert onnx_int8.sha256 == int8_v.onnx_sha256  # the ONNX target ships the variant as is
    assert factory.convert(model.id, "openvino") == ov
    lineage = factory.lineage(model.id)
    assert {(a.variant_id, a.target) for a in lineage.artifacts} == {
        (float_v.id, "openvino"), (int8_v.id, "onnx-cpu")
    }  # fmt: skip

    # Both artefacts packaged as a skill: the OpenVINO IR ships its weights file beside
    # the .xml, and every variant loads and runs in its runtime before it could be signed.
    bundle = package_skill(factory, LIBRARY / "digits", "1.0.0", [ov, onnx_int8], tmp_path / "d")
    assert {v.target for v in check_bundle_models(bundle, unchecked_targets=())} == set()
    names = {v.path for v in read_manifest(bundle).models}
    assert any(n.endswith(".xml") for n in names)


def test_corrupt_or_unsupported_models_fail_clearly_and_record_nothing(
    store: Store, tmp_path: Path, digits_weights: Path
) -> None:
    factory = ModelFactory(tmp_path / "home", store)
    dataset = factory.add_builtin_dataset("digits")
    corrupt_pt = tmp_path / "corrupt.pt"
    corrupt_pt.write_bytes(digits_weights.read_bytes()[:2000])
    corrupt_onnx = tmp_path / "corrupt.onnx"
    corrupt_onnx.write_bytes(b"\x08\x07garbage" * 50)
    unsupported = tmp_path / "model.h5"
    unsupported.write_bytes(b"HDF")
    for path, message in (
        (corrupt_pt, "corrupt"),
        (corrupt_onnx, "not a valid ONNX"),
        (unsupported, "unsupported model format"),
        (tmp_path / "missing.onnx", "cannot read"),
    ):
        with pytest.raises(FactoryError, match=message):
            factory.import_model(path, name="bad", dataset_id=dataset.id)
    assert count_rows(factory.tables) == (0, 0, 0)
    assert blob_files(tmp_path / "home" / "blobs") == []


def test_damaged_blobs_and_missing_tools_record_nothing(
    tmp_path: Path, digits_weights: Path
) -> None:
    # Same code path on both databases (covered above); SQLite keeps this one fast.
    with open_store(f"sqlite:///{tmp_path / 'hub.db'}") as store:
        damaged_blobs_and_missing_tools(ModelFactory(tmp_path / "home", store), digits_weights)


def damaged_blobs_and_missing_tools(factory: ModelFactory, digits_weights: Path) -> None:
    dataset = factory.add_builtin_dataset("digits")
    model = factory.import_model(digits_weights, name="digits", dataset_id=dataset.id)
    assert model.weights_sha256 is not None
    weights = factory.blobs.path(model.weights_sha256)
    original = weights.read_bytes()
    weights.write_bytes(original[:-100])  # a blob damaged on disk
    with pytest.raises(BlobError, match="corrupt"):
        factory.compress(model.id, ["int8"], options=CompressOptions(tflite=False))
    with pytest.raises(BlobError, match="corrupt"):
        factory.convert(model.id, "onnx-cpu")
    assert count_rows(factory.tables) == (1, 0, 0)
    weights.write_bytes(original)

    plain_onnx = factory.export_blob(model.onnx_sha256, factory.home / "export" / "plain.onnx")
    plain = factory.import_model(plain_onnx, name="plain")  # no data set: random check inputs
    assert (plain.arch, plain.weights_sha256, plain.test_accuracy) == ("onnx", None, None)
    ov = factory.convert(plain.id, "openvino")
    assert ov.max_abs_diff <= ov.tolerance
    assert count_rows(factory.tables) == (2, 1, 1)

    with pytest.raises(FactoryError, match="atc"):  # no CANN toolkit here
        factory.convert(model.id, "om")
    with pytest.raises(ValidationError, match="unknown target"):
        factory.convert(model.id, "coreml")
    assert count_rows(factory.tables) == (2, 2, 1)  # only the float variant om started from
