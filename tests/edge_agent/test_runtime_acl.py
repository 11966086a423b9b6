"""The pyACL backend against a fake ``acl`` module (tests/fakes/fake_acl.py).

pyACL needs an Ascend NPU and CANN; these tests check the backend's use of the API as
the pyACL reference documents it, not the hardware. The real module is not installed
here, which the last test relies on.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge_agent.errors import RuntimeBackendError
from edge_agent.runtime import acl_session
from edge_agent.runtime.acl import AclBackend, AclModel, AclSession
from edge_agent.runtime.selection import backend_for
from tests.fakes.fake_acl import ACL_DEVICE, ACL_ERROR_BAD_ALLOC, FakeAcl, write_model

X = {"name": "x", "dims": [2, 3], "type": 0}  # float32
Y = {"name": "y", "dims": [2, 3], "type": 0}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAcl:
    fake = FakeAcl()
    monkeypatch.setitem(sys.modules, "acl", fake)
    return fake


@pytest.fixture
def session() -> Iterator[AclSession]:
    session = AclSession(device_id=0)
    yield session
    session.shutdown()


@pytest.fixture
def backend(fake: FakeAcl, session: AclSession) -> AclBackend:
    return AclBackend(session)


@pytest.fixture
def affine(tmp_path: Path) -> Path:
    return write_model(tmp_path / "affine.om", [X], [Y])


def load(backend: AclBackend, path: Path) -> AclModel:
    model = backend.load(path, "om", name="affine")
    assert isinstance(model, AclModel)
    return model


def test_loads_and_runs_y_equals_2x_plus_1(fake: FakeAcl, backend: AclBackend, affine: Path):
    assert backend.available()
    assert backend.serves("om") and not backend.serves("onnx-cpu")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with load(backend, affine) as model:
        out = model.run({"x": x})
        assert list(out) == ["y"]
        assert out["y"].dtype == np.float32 and out["y"].shape == (2, 3)
        np.testing.assert_array_equal(out["y"], x * 2 + 1)
        np.testing.assert_array_equal(model.run({"x": x + 1})["y"], (x + 1) * 2 + 1)
        assert (model.backend, model.target, model.provider) == ("acl", "om", "ascend:0")
    assert fake.leaks() == {}
    assert fake.calls["acl.rt.malloc"] == 2  # one buffer per tensor, at load; runs allocate none


def test_names_shapes_and_dtypes_come_from_the_model_description(
    fake: FakeAcl, backend: AclBackend, tmp_path: Path
):
    inputs = [
        {"name": "image", "dims": [1, 4], "type": 1},
        {"name": "mask", "dims": [4], "type": 4},
    ]
    outputs = [
        {"name": "logits", "dims": [1, 4], "type": 0},
        {"name": "ids", "dims": [1, 4], "type": 9},
    ]
    with load(backend, write_model(tmp_path / "two.om", inputs, outputs)) as model:
        assert model.input_names == ("image", "mask")
        assert model.output_names == ("logits", "ids")
        assert [(s.shape, s.dtype, s.nbytes) for s in model.inputs] == [
            ((1, 4), np.dtype(np.float16), 8),
            ((4,), np.dtype(np.uint8), 4),
        ]
        out = model.run({"image": np.full((1, 4), 1.5, np.float16), "mask": np.ones(4, np.uint8)})
        assert out["logits"].dtype == np.float32 and out["ids"].dtype == np.int64
        np.testing.assert_array_equal(out["logits"], np.full((1, 4), 4.0))
        np.testing.assert_array_equal(out["ids"], np.full((1, 4), 4))


def test_safe_dtype_casts_are_made_and_unsafe_ones_refused(
    fake: FakeAcl, backend: AclBackend, affine: Path
):
    with load(backend, affine) as model:
        ints = np.arange(6, dtype=np.uint8).reshape(2, 3)  # uint8 -> float32 is exact
        np.testing.assert_array_equal(model.run({"x": ints})["y"], ints * 2.0 + 1)
        fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
        np.testing.assert_array_equal(model.run({"x": fortran})["y"], fortran * 2 + 1)
        with pytest.raises(RuntimeBackendError, match=r"'x' takes float32; float64 does not cast"):
            model.run({"x": np.zeros((2, 3))})


@pytest.mark.parametrize(
    ("feeds", "message"),
    [
        ({"x": np.zeros((3, 2), np.float32)}, r"input 'x' takes shape \[2, 3\], got \[3, 2\]"),
        ({"x": np.zeros((2, 3), np.int64)}, r"int64 does not cast to it safely"),
        ({}, r"takes inputs \['x'\], got \[\]"),
        ({"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)}, r"got \['x', 'z'\]"),
    ],
)
def test_a_wrong_feed_is_refused_and_leaves_nothing_behind(
    fake: FakeAcl,
    backend: AclBackend,
    affine: Path,
    feeds: dict[str, np.ndarray],
    message: str,
):
    model = load(backend, affine)
    allocated = dict(fake.device_memory)
    with pytest.raises(RuntimeBackendError, match=message):
        model.run(feeds)
    assert fake.device_memory == allocated and fake.host_memory == {}
    assert fake.calls["acl.mdl.execute"] == 0
    model.close()
    assert fake.leaks() == {}


@pytest.mark.parametrize(
    "call",
    ["acl.rt.memcpy", "acl.mdl.execute", "acl.rt.malloc_host", "acl.rt.set_context"],
)
def test_a_failing_call_while_running_is_named_with_its_code(
    fake: FakeAcl, backend: AclBackend, affine: Path, call: str
):
    with load(backend, affine) as model:
        fake.fail(call, 507011, times=1)
        with pytest.raises(RuntimeBackendError, match=rf"{call}.* failed with ACL error 507011"):
            model.run({"x": np.zeros((2, 3), np.float32)})
        assert fake.host_memory == {}
    assert fake.leaks() == {}


@pytest.mark.parametrize(
    ("call", "after"),
    [
        ("acl.init", 0),
        ("acl.rt.set_device", 0),
        ("acl.rt.create_context", 0),
        ("acl.mdl.load_from_file", 0),
        ("acl.mdl.get_desc", 0),
        ("acl.mdl.get_output_dims", 0),
        ("acl.rt.malloc", 1),  # the output's buffer, after the input's
        ("acl.mdl.add_dataset_buffer", 1),
    ],
)
def test_a_failing_call_while_loading_is_named_and_everything_is_freed(
    fake: FakeAcl, backend: AclBackend, affine: Path, call: str, after: int
):
    fake.fail(call, ACL_ERROR_BAD_ALLOC, after=after)
    with pytest.raises(RuntimeBackendError, match=rf"affine.om: {call}.* ACL error 200000"):
        backend.load(affine, "om")
    assert fake.leaks() == {}


def test_null_handles_and_unreadable_models_are_errors(
    fake: FakeAcl, backend: AclBackend, affine: Path, tmp_path: Path
):
    fake.fail("acl.create_data_buffer")
    with pytest.raises(RuntimeBackendError, match=r"acl.create_data_buffer returned a null"):
        backend.load(affine, "om")
    assert fake.leaks() == {}
    with pytest.raises(RuntimeBackendError, match=r"acl.mdl.load_from_file failed with ACL error"):
        backend.load(tmp_path / "missing.om", "om")
    assert fake.leaks() == {}


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ({"name": "x", "dims": [-1, 3], "type": 0}, r"dynamic dims \[-1, 3\]"),
        ({"name": "x", "dims": [2, 3], "type": 13}, r"ACL data type 13, not supported"),
        ({"name": "x", "dims": [2, 3], "type": 4, "size": 9}, r"make 6 bytes, but .* has 9"),
    ],
)
def test_inputs_this_backend_cannot_feed_are_refused_at_load(
    fake: FakeAcl, backend: AclBackend, tmp_path: Path, tensor: dict[str, object], message: str
):
    with pytest.raises(RuntimeBackendError, match=message):
        backend.load(write_model(tmp_path / "odd.om", [tensor], [Y]), "om")
    assert fake.leaks() == {}


def test_failures_while_closing_are_all_reported(fake: FakeAcl, backend: AclBackend, affine: Path):
    model = load(backend, affine)
    fake.fail("acl.mdl.unload", 100011)
    fake.fail("acl.rt.free", 100000)
    with pytest.raises(RuntimeBackendError) as caught:
        model.close()
    assert "acl.mdl.unload failed with ACL error 100011" in str(caught.value)
    assert str(caught.value).count("acl.rt.free failed") == 2  # both buffers were tried
    assert model.closed
    model.close()  # once is enough
    with pytest.raises(RuntimeBackendError, match="closed"):
        model.run({"x": np.zeros((2, 3), np.float32)})
    assert set(fake.leaks()) == {"device memory", "models"}  # what the failures kept


def test_garbage_collection_unloads(fake: FakeAcl, backend: AclBackend, affine: Path):
    model = load(backend, affine)
    assert fake.models
    del model
    gc.collect()
    assert fake.leaks() == {}


def test_init_once_device_and_context_counted(
    fake: FakeAcl, backend: AclBackend, affine: Path, session: AclSession
):
    first, second = load(backend, affine), load(backend, affine)
    assert len(fake.contexts) == 1 and fake.devices == {0}
    first.close()
    assert len(fake.contexts) == 1  # the second model still uses it
    second.close()
    assert fake.leaks() == {}  # the last one out reset the device
    load(backend, affine).close()  # the device opens again; pyACL is not initialised again
    assert fake.calls["acl.init"] == 1 and fake.calls["acl.rt.set_device"] == 2
    still_open = load(backend, affine)
    session.shutdown()  # at exit: close what is open, then finalize
    assert still_open.closed and fake.leaks() == {}
    assert fake.calls["acl.finalize"] == 1 and not fake.initialised


def test_someone_elses_init_is_not_finalized(fake: FakeAcl, backend: AclBackend, affine: Path):
    assert fake.init() == 0  # another library in this process initialised pyACL first
    load(backend, affine).close()
    backend.session.shutdown()
    assert fake.calls["acl.finalize"] == 0 and fake.initialised


def test_runs_from_another_thread_bind_the_context_first(
    fake: FakeAcl, backend: AclBackend, affine: Path
):
    model = load(backend, affine)
    results: list[np.ndarray] = []
    worker = threading.Thread(
        target=lambda: results.append(model.run({"x": np.ones((2, 3), np.float32)})["y"])
    )
    worker.start()
    worker.join()
    np.testing.assert_array_equal(results[0], np.full((2, 3), 3.0))
    context = next(iter(fake.contexts))
    assert fake.executed[-1][1] == context
    model.close()


@pytest.mark.parametrize(
    ("run_mode", "legacy"), [(ACL_DEVICE, False), (1, True), (ACL_DEVICE, True)]
)
def test_board_run_mode_and_older_cann_util(
    monkeypatch: pytest.MonkeyPatch, session: AclSession, affine: Path, run_mode: int, legacy: bool
):
    fake = FakeAcl(run_mode, legacy_util=legacy)
    monkeypatch.setitem(sys.modules, "acl", fake)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with load(AclBackend(session), affine) as model:
        np.testing.assert_array_equal(model.run({"x": x})["y"], x * 2 + 1)
    assert fake.leaks() == {}
    assert fake.calls["acl.rt.malloc_host"] == (0 if legacy else 1)


def test_device_id_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ASCEND_DEVICE_ID", "3")
    assert AclSession().device_id == 3
    monkeypatch.delenv("ASCEND_DEVICE_ID")
    assert AclSession().device_id == 0
    monkeypatch.setenv("ASCEND_DEVICE_ID", "npu0")
    with pytest.raises(RuntimeBackendError, match="ASCEND_DEVICE_ID must be a device number"):
        AclSession()


def test_the_default_session_is_shared(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(acl_session, "_shared", None)
    assert AclBackend().session is AclBackend().session


@pytest.mark.skipif(importlib.util.find_spec("acl") is not None, reason="pyACL is installed")
def test_unavailable_without_pyacl():
    backend = AclBackend()
    assert not backend.available()
    assert backend_for("om", [backend]) is None
    with pytest.raises(RuntimeBackendError, match="backend acl is not installed"):
        backend.load(Path("model.om"), "om")


def test_the_ascend_profile_runs_its_om_variant_through_acl_and_onnx_without_it(
    fake: FakeAcl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime facade's default backends: `om` first on an Ascend board, ONNX without ACL."""
    from edge_agent.profile import PROFILES  # noqa: PLC0415
    from edge_agent.runtime import Runtime  # noqa: PLC0415
    from tests.edge_agent.test_runtime import skill_with, variant  # noqa: PLC0415

    skill_dir, manifest = skill_with(tmp_path, "onnx-cpu")
    om = write_model(tmp_path / "models" / "classifier-om-fp32.om", [X], [Y])
    variants = (variant("om", "models/classifier-om-fp32.om", om.read_bytes()), *manifest.models)
    manifest = dataclasses.replace(manifest, models=variants)
    targets = PROFILES["ascend310"].targets
    monkeypatch.setattr(acl_session, "_shared", None)  # this test's own process session
    with_acl = Runtime(skill_dir, manifest, targets).model("classifier")
    assert isinstance(with_acl, AclModel) and (with_acl.target, with_acl.provider) == (
        "om",
        "ascend:0",
    )
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(with_acl.run({"x": x})["y"], x * 2 + 1)
    with_acl.close()
    assert fake.leaks() == {}
    monkeypatch.setitem(sys.modules, "acl", None)  # a board without CANN: the import fails
    without = Runtime(skill_dir, manifest, targets).model("classifier")
    assert (without.backend, without.target) == ("onnxruntime", "onnx-cpu")
