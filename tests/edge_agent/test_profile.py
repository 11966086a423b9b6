"""Device profiles: detection from fabricated system trees, variant choice and provider order.

Detection reads a root folder, so each board is proven on a tree built in the test
(``/proc``, ``/dev``, ``/etc``, the vendors' tools), never by mocking; one test also
runs it on this real machine.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import onnxruntime
import pytest

from edge_agent.errors import RuntimeBackendError
from edge_agent.profile import (
    CPU_PROVIDER,
    PROFILES,
    TARGET_PROVIDERS,
    available_targets,
    board_from_facts,
    detect_board,
    detect_profile,
    profile_for,
    providers_for,
    read_facts,
    session_providers,
)
from edge_agent.runtime import OnnxRuntimeBackend, select_variant
from edge_agent.runtime.backends import Backend
from skills.manifest import ModelVariant

ORT_PROVIDERS = set(onnxruntime.get_available_providers())
TRT, CUDA, CANN, OV_EP = (
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "CANNExecutionProvider",
    "OpenVINOExecutionProvider",
)
ALL_PROVIDERS = {TRT, CUDA, CANN, OV_EP, CPU_PROVIDER}
X86_CPUINFO = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) i5\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma f16c avx512f avx512_vnni\n\n"
)
OLD_X86_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 sse4_2\n"
ARM_CPUINFO = (
    "processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm aes crc32 asimddp\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd08\n"
)


def fake_root(
    tmp_path: Path,
    cpuinfo: str,
    *,
    model: str | None = None,
    dev: tuple[str, ...] = (),
    tools: tuple[str, ...] = (),
    files: tuple[str, ...] = (),
) -> Path:
    """A system tree: /proc/cpuinfo, a device-tree model, /dev nodes, tools and files."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(cpuinfo)
    (root / "proc" / "meminfo").write_text("MemTotal:        8011008 kB\n")
    (root / "dev").mkdir()
    if model is not None:
        (root / "proc" / "device-tree").mkdir()
        (root / "proc" / "device-tree" / "model").write_bytes(model.encode() + b"\x00")
    for node in dev:
        (root / "dev" / node).touch()
    for tool in tools:
        path = root / tool
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x\n")
    return root


# -- detection from fabricated trees --------------------------------------------


def test_jetson_is_detected_from_its_device_tree_model(tmp_path: Path) -> None:
    root = fake_root(tmp_path, ARM_CPUINFO, model="NVIDIA Jetson Orin Nano Developer Kit")
    facts = read_facts(root)
    assert (facts.arch, facts.model) == ("aarch64", "nvidia jetson orin nano developer kit")
    assert detect_board(root=root) == "jetson"


@pytest.mark.parametrize(
    ("tools", "files"),
    [(("usr/bin/tegrastats",), ()), ((), ("etc/nv_tegra_release",))],
    ids=["tegrastats", "l4t-release"],
)
def test_jetson_is_detected_from_l4t_without_a_model(
    tmp_path: Path, tools: tuple[str, ...], files: tuple[str, ...]
) -> None:
    root = fake_root(tmp_path, ARM_CPUINFO, tools=tools, files=files, dev=("nvhost-gpu",))
    assert detect_board(root=root) == "jetson"


@pytest.mark.parametrize(
    ("dev", "tools"),
    [
        (("davinci0", "davinci_manager"), ()),
        ((), ("usr/local/Ascend/driver/tools/npu-smi",)),
        ((), ("usr/local/bin/npu-smi",)),
    ],
    ids=["davinci-nodes", "npu-smi-in-driver", "npu-smi-on-path"],
)
def test_ascend_310_is_detected_from_its_npu(
    tmp_path: Path, dev: tuple[str, ...], tools: tuple[str, ...]
) -> None:
    root = fake_root(tmp_path, ARM_CPUINFO, model="Atlas 200 DK", dev=dev, tools=tools)
    assert detect_board(root=root) == "ascend310"
    # An Atlas 300I card in an x86 server is the same NPU; the profile keeps the real arch.
    x86 = fake_root(tmp_path / "x86", X86_CPUINFO, dev=dev, tools=tools)
    assert detect_board(root=x86) == "ascend310"
    assert read_facts(x86).arch == "x86_64"


def test_davinci_manager_alone_is_not_an_npu(tmp_path: Path) -> None:
    root = fake_root(tmp_path, ARM_CPUINFO, dev=("davinci_manager",))
    assert detect_board(root=root) == "arm64-cpu"


def test_x86_gateway_needs_avx2_and_an_old_x86_is_generic(tmp_path: Path) -> None:
    gateway = fake_root(tmp_path / "a", X86_CPUINFO)
    facts = read_facts(gateway)
    assert facts.arch == "x86_64" and {"avx2", "avx512_vnni"} <= facts.cpu_flags
    assert detect_board(root=gateway) == "x86-gateway"
    assert detect_board(root=fake_root(tmp_path / "b", OLD_X86_CPUINFO)) == "x86-cpu"


def test_x86_with_an_nvidia_gpu_is_x86_cuda(tmp_path: Path) -> None:
    root = fake_root(tmp_path, X86_CPUINFO, dev=("nvidia0",), tools=("usr/bin/nvidia-smi",))
    assert detect_board(root=root) == "x86-cuda"


def test_plain_arm_boards(tmp_path: Path) -> None:
    pi = fake_root(tmp_path / "pi", ARM_CPUINFO, model="Raspberry Pi 4 Model B Rev 1.4")
    assert detect_board(root=pi) == "rpi"
    board = fake_root(tmp_path / "rk", ARM_CPUINFO, model="Radxa ROCK 5B")
    assert detect_board(root=board) == "arm64-cpu"
    assert {"asimd", "asimddp"} <= read_facts(board).cpu_flags


def test_detect_profile_on_a_fabricated_tree_keeps_its_arch_and_flags(tmp_path: Path) -> None:
    root = fake_root(tmp_path, ARM_CPUINFO, model="NVIDIA Jetson AGX Orin")
    profile = detect_profile(root=root)
    assert (profile.board, profile.arch, profile.accelerator) == ("jetson", "aarch64", "cuda")
    assert profile.memory_bytes == 8011008 * 1024
    assert "asimddp" in profile.cpu_features
    assert profile.providers[-1] == CPU_PROVIDER
    assert set(profile.providers) <= ORT_PROVIDERS  # only what this ONNX Runtime has


def test_facts_to_board_is_pure_and_ordered() -> None:
    from edge_agent.profile import SystemFacts  # noqa: PLC0415

    # A Jetson also has NVIDIA device nodes: Jetson wins over x86-cuda/jetson guessing.
    tegra = SystemFacts("aarch64", model="nvidia jetson xavier nx", nvidia_dev=True)
    assert board_from_facts(tegra) == "jetson"
    assert board_from_facts(SystemFacts("aarch64", nvidia_dev=True)) == "jetson"
    assert board_from_facts(SystemFacts("riscv64")) == "arm-cpu"


# -- detection on this machine -------------------------------------------------


@pytest.mark.skipif(platform.machine() != "x86_64", reason="checks an x86_64 machine")
def test_detection_here_is_x86_64() -> None:
    profile = detect_profile()
    assert profile.arch == "x86_64"
    assert profile.board in {"x86-gateway", "x86-cpu", "x86-cuda"}
    assert profile.board == detect_board()
    if "CUDAExecutionProvider" not in ORT_PROVIDERS:
        assert "onnx-cuda" not in profile.targets
        assert profile.providers[0] == CPU_PROVIDER or profile.providers[0] in ORT_PROVIDERS
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
    ascend = detect_profile("ascend310")
    assert ascend.accelerator == "ascend"
    assert ascend.targets == ("onnx-cpu",)  # no CANN provider, no Ascend ACL (`acl`)
    assert ascend.providers == (CPU_PROVIDER,)
    assert detect_profile("x86-cuda").targets == ("onnx-cpu",)


def test_unknown_board_is_refused() -> None:
    with pytest.raises(RuntimeBackendError, match="unknown board"):
        detect_profile("toaster")
    with pytest.raises(RuntimeBackendError, match="unknown board"):
        profile_for("toaster", {"onnx-cpu"})


# -- every profile: variant order, precision and providers ----------------------

#: What each device target prefers, everything installed: targets, precisions, providers.
EXPECTED = {
    "arm64-cpu": (("tflite", "onnx-cpu"), ("int8", "fp16", "fp32"), (CPU_PROVIDER,)),
    "jetson": (
        ("onnx-tensorrt", "onnx-cuda", "onnx-cpu", "tflite"),
        ("fp32", "fp16", "int8"),
        (TRT, CUDA, CPU_PROVIDER),
    ),
    "ascend310": (("om", "onnx-cann", "onnx-cpu"), ("fp32", "fp16", "int8"), (CANN, CPU_PROVIDER)),
    "x86-gateway": (("openvino", "onnx-cpu"), ("fp32", "fp16", "int8"), (OV_EP, CPU_PROVIDER)),
    "x86-cpu": (("onnx-cpu", "openvino"), ("fp32", "fp16", "int8"), (CPU_PROVIDER,)),
}


@pytest.mark.parametrize("board", sorted(EXPECTED))
def test_profile_order_with_everything_installed(board: str) -> None:
    targets, precisions, providers = EXPECTED[board]
    profile = profile_for(board, set(TARGET_PROVIDERS), ort_providers=ALL_PROVIDERS)
    assert (profile.targets, profile.precisions, profile.providers) == (
        targets,
        precisions,
        providers,
    )


@pytest.mark.parametrize("board", sorted(EXPECTED))
def test_profile_falls_back_to_what_is_installed(board: str) -> None:
    profile = profile_for(board, {"onnx-cpu"}, ort_providers=[CPU_PROVIDER])
    assert profile.targets == ("onnx-cpu",)
    assert profile.providers == (CPU_PROVIDER,)
    # With no ONNX Runtime at all, the CPU provider is still the last resort named.
    assert profile_for(board, set(), ort_providers=()).providers == (CPU_PROVIDER,)


class Installed(Backend):
    """A backend that claims to be installed for the given targets (selection only)."""

    name = "fake"
    _module = "sys"

    def __init__(self, targets: frozenset[str]) -> None:
        super().__init__()
        self.targets = targets  # type: ignore[misc]

    def _load(self, library, path, target, name):  # type: ignore[no-untyped-def]
        raise AssertionError("never loaded")


def _variant(target: str, precision: str) -> ModelVariant:
    return ModelVariant(
        model="classifier", target=target, path=f"models/{target}-{precision}", precision=precision
    )


#: What the digits skill's bundle carries: every target, fp32 and int8 where both exist.
BUNDLE = [
    _variant("onnx-cpu", "fp32"),
    _variant("onnx-cpu", "int8"),
    _variant("openvino", "fp32"),
    _variant("tflite", "fp32"),
    _variant("tflite", "int8"),
    _variant("onnx-cuda", "fp32"),
    _variant("onnx-tensorrt", "fp16"),
    _variant("onnx-cann", "fp32"),
    _variant("om", "fp16"),
]
CHOICES = {
    # board: (everything installed, only the CPU ONNX Runtime installed)
    "arm64-cpu": (("tflite", "int8"), ("onnx-cpu", "int8")),
    "jetson": (("onnx-tensorrt", "fp16"), ("onnx-cpu", "fp32")),
    "ascend310": (("om", "fp16"), ("onnx-cpu", "fp32")),
    "x86-gateway": (("openvino", "fp32"), ("onnx-cpu", "fp32")),
    "x86-cpu": (("onnx-cpu", "fp32"), ("onnx-cpu", "fp32")),
}


@pytest.mark.parametrize("board", sorted(CHOICES))
def test_every_profile_picks_its_variant(board: str) -> None:
    full, cpu_only = CHOICES[board]
    everything = [Installed(frozenset(TARGET_PROVIDERS))]
    profile = profile_for(board, set(TARGET_PROVIDERS), ort_providers=ALL_PROVIDERS)
    chosen = select_variant(BUNDLE, profile.targets, everything, profile.precisions)
    assert (chosen.target, chosen.precision) == full
    bare = profile_for(board, {"onnx-cpu"})
    chosen = select_variant(BUNDLE, bare.targets, [OnnxRuntimeBackend()], bare.precisions)
    assert (chosen.target, chosen.precision) == cpu_only


@pytest.mark.parametrize(
    ("target", "profile", "present", "expected"),
    [
        ("onnx-cpu", (TRT, CUDA, CPU_PROVIDER), ALL_PROVIDERS, [TRT, CUDA, CPU_PROVIDER]),
        ("onnx-cuda", (TRT, CUDA, CPU_PROVIDER), ALL_PROVIDERS, [CUDA, TRT, CPU_PROVIDER]),
        ("onnx-tensorrt", (CPU_PROVIDER,), ALL_PROVIDERS, [TRT, CUDA, CPU_PROVIDER]),
        ("onnx-cann", (CANN, CPU_PROVIDER), {CPU_PROVIDER}, [CPU_PROVIDER]),
        ("onnx-cpu", (OV_EP, CPU_PROVIDER), {OV_EP, CPU_PROVIDER}, [OV_EP, CPU_PROVIDER]),
        ("onnx-tensorrt", (TRT, CUDA), {CUDA, CPU_PROVIDER}, [CUDA, CPU_PROVIDER]),
    ],
)
def test_session_providers_fall_back_to_what_is_present(
    target: str, profile: tuple[str, ...], present: set[str], expected: list[str]
) -> None:
    assert session_providers(target, profile, present) == expected


def test_providers_for_mapping() -> None:
    assert providers_for("onnx-cpu") == ["CPUExecutionProvider"]
    assert providers_for("onnx-tensorrt")[:2] == [TRT, CUDA]
    assert providers_for("onnx-cann")[0] == CANN
    for target in ("om", "tflite", "openvino"):
        assert providers_for(target) == []
    providers_for("onnx-cpu").append("junk")
    assert providers_for("onnx-cpu") == ["CPUExecutionProvider"]
    with pytest.raises(RuntimeBackendError, match="unknown model target"):
        providers_for("onnx-quantum")


def test_every_board_names_known_targets() -> None:
    assert {"arm64-cpu", "jetson", "ascend310", "x86-gateway", "x86-cpu", "arm-cpu"} <= set(
        PROFILES
    )
    for board in PROFILES.values():
        assert set(board.targets) <= set(TARGET_PROVIDERS)
        assert board.providers[-1] == CPU_PROVIDER


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
