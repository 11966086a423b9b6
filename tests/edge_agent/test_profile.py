"""Tests for the device hardware profile (detection runs against this real machine)."""

import importlib.util
import os
import platform
import subprocess
import sys

import onnxruntime
import pytest

from edge_agent.errors import RuntimeBackendError
from edge_agent.profile import (
    PROFILES,
    TARGET_PROVIDERS,
    available_targets,
    detect_board,
    detect_profile,
    profile_for,
    providers_for,
)

ORT_PROVIDERS = set(onnxruntime.get_available_providers())


@pytest.mark.skipif(platform.machine() != "x86_64", reason="checks an x86_64 machine")
def test_detection_here_is_x86_64_with_onnx_cpu_first() -> None:
    profile = detect_profile()
    assert profile.arch == "x86_64"
    assert profile.board in {"x86-cpu", "x86-cuda"}
    assert profile.board == detect_board()
    if "CUDAExecutionProvider" not in ORT_PROVIDERS:
        assert profile.targets[0] == "onnx-cpu"
        assert "onnx-cuda" not in profile.targets
    assert profile.cpu_count == len(os.sched_getaffinity(0))
    assert 256 * 2**20 < profile.memory_bytes < 2**50


def test_available_targets_reflect_installed_runtimes() -> None:
    found = available_targets()
    assert "onnx-cpu" in found  # onnxruntime is a core dependency
    assert ("onnx-cuda" in found) == ("CUDAExecutionProvider" in ORT_PROVIDERS)
    assert ("onnx-cann" in found) == ("CANNExecutionProvider" in ORT_PROVIDERS)
    assert ("openvino" in found) == (importlib.util.find_spec("openvino") is not None)


def test_override_selects_the_table_entry() -> None:
    profile = detect_profile("jetson")
    assert (profile.board, profile.arch, profile.accelerator) == ("jetson", "aarch64", "cuda")
    expected = tuple(t for t in PROFILES["jetson"].targets if t in available_targets())
    assert profile.targets == expected
    assert profile.cpu_count >= 1


def test_override_of_a_board_without_its_runtimes_drops_those_targets() -> None:
    if {"CANNExecutionProvider", "TensorrtExecutionProvider"} & ORT_PROVIDERS:
        pytest.skip("this machine has an accelerated ONNX Runtime")
    ascend = detect_profile("ascend-310")
    assert ascend.accelerator == "ascend"
    assert "onnx-cann" not in ascend.targets
    assert "om" not in ascend.targets  # no Ascend ACL (`acl`) here
    assert ascend.targets == ("onnx-cpu",)
    x86_cuda = detect_profile("x86-cuda")
    assert x86_cuda.targets == ("onnx-cpu",)


def test_profile_for_keeps_table_order_and_only_available_targets() -> None:
    jetson = profile_for("jetson", {"tflite", "onnx-cpu", "onnx-cuda", "openvino"})
    assert jetson.targets == ("onnx-cuda", "onnx-cpu", "tflite")
    assert profile_for("rpi", {"onnx-cpu"}).targets == ("onnx-cpu",)
    assert profile_for("atlas-200", set()).targets == ()
    full = profile_for("x86-cpu", set(TARGET_PROVIDERS), cpu_count=4, memory_bytes=8 << 30)
    assert full.targets == ("onnx-cpu", "openvino")
    assert (full.cpu_count, full.memory_bytes) == (4, 8 << 30)


def test_unknown_board_is_refused() -> None:
    with pytest.raises(RuntimeBackendError, match="unknown board"):
        detect_profile("toaster")
    with pytest.raises(RuntimeBackendError, match="unknown board"):
        profile_for("toaster", {"onnx-cpu"})


def test_providers_for_mapping() -> None:
    assert providers_for("onnx-cpu") == ["CPUExecutionProvider"]
    assert providers_for("onnx-cuda")[0] == "CUDAExecutionProvider"
    assert providers_for("onnx-tensorrt")[0] == "TensorrtExecutionProvider"
    assert providers_for("onnx-cann")[0] == "CANNExecutionProvider"
    for target in ("onnx-cuda", "onnx-tensorrt", "onnx-cann"):
        assert providers_for(target)[-1] == "CPUExecutionProvider"
    for target in ("om", "tflite", "openvino"):
        assert providers_for(target) == []
    providers_for("onnx-cpu").append("junk")
    assert providers_for("onnx-cpu") == ["CPUExecutionProvider"]
    with pytest.raises(RuntimeBackendError, match="unknown model target"):
        providers_for("onnx-quantum")


def test_every_board_names_known_targets() -> None:
    assert {"x86-cpu", "x86-cuda", "jetson", "ascend-310", "atlas-200", "arm-cpu", "rpi"} <= set(
        PROFILES
    )
    for board in PROFILES.values():
        assert set(board.targets) <= set(TARGET_PROVIDERS)


def test_profile_modules_pull_no_heavy_dependencies() -> None:
    code = (
        "import sys\n"
        "import edge_agent.installs, edge_agent.outbox, edge_agent.profile as p\n"
        "p.detect_profile()\n"
        "bad = {'torch', 'fastapi', 'sqlalchemy', 'cloud', 'converters'} & set(sys.modules)\n"
        "print(sorted(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
