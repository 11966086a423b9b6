"""The device's hardware profile: what board it is, and which model targets it can run.

A pure core (:func:`profile_for`: a board name and the set of runnable targets in, a
profile out) and a thin shell (:func:`detect_profile`) that reads the machine: CPU
architecture, ``/proc/device-tree/model``, the Ascend and NVIDIA driver footprints,
the execution providers of the installed ONNX Runtime, and whether OpenVINO and
LiteRT import.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import RuntimeBackendError

__all__ = [
    "PROFILES",
    "TARGET_PROVIDERS",
    "Board",
    "DeviceProfile",
    "available_targets",
    "detect_board",
    "detect_profile",
    "profile_for",
    "providers_for",
]

_MAX_PROC_READ = 64 * 1024


@dataclass(frozen=True)
class DeviceProfile:
    """What this device is and which model targets it can run.

    Attributes:
        arch: CPU architecture (``x86_64``, ``aarch64``, ...).
        accelerator: ``cpu``, ``cuda`` or ``ascend``.
        board: A board name from :data:`PROFILES`.
        targets: Model targets this device can run, best first.
        cpu_count: CPUs this process may use.
        memory_bytes: Physical memory, 0 if unknown.
        precisions: Model precisions this device prefers, best first (small CPUs
            prefer ``int8``; accelerators with fast float paths prefer ``fp16``/``fp32``).
    """

    arch: str
    accelerator: str
    board: str
    targets: tuple[str, ...]
    cpu_count: int
    memory_bytes: int
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Board:
    """One known kind of device.

    Attributes:
        arch: Its usual CPU architecture.
        accelerator: ``cpu``, ``cuda`` or ``ascend``.
        targets: Model targets it can run when their runtimes are installed, best first.
        precisions: Model precisions it prefers, best first.
    """

    arch: str
    accelerator: str
    targets: tuple[str, ...]
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")


_ASCEND_TARGETS = ("om", "onnx-cann", "onnx-cpu")
_ARM_TARGETS = ("tflite", "onnx-cpu")
_INT8_FIRST = ("int8", "fp16", "fp32")

PROFILES: dict[str, Board] = {
    "x86-cpu": Board("x86_64", "cpu", ("onnx-cpu", "openvino")),
    "x86-cuda": Board("x86_64", "cuda", ("onnx-tensorrt", "onnx-cuda", "onnx-cpu")),
    "jetson": Board("aarch64", "cuda", ("onnx-tensorrt", "onnx-cuda", "onnx-cpu", "tflite")),
    # An Atlas 300I inference card (Ascend 310) in a server, and the Atlas 200 DK board.
    "ascend-310": Board("x86_64", "ascend", _ASCEND_TARGETS),
    "atlas-200": Board("aarch64", "ascend", _ASCEND_TARGETS),
    # Small ARM cores gain most from INT8 (smaller, faster, within a point of accuracy).
    "arm-cpu": Board("aarch64", "cpu", _ARM_TARGETS, _INT8_FIRST),
    "rpi": Board("aarch64", "cpu", _ARM_TARGETS, _INT8_FIRST),
}
"""Known boards by name."""

TARGET_PROVIDERS: dict[str, tuple[str, ...]] = {
    "onnx-cpu": ("CPUExecutionProvider",),
    "onnx-cuda": ("CUDAExecutionProvider", "CPUExecutionProvider"),
    "onnx-tensorrt": ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    "onnx-cann": ("CANNExecutionProvider", "CPUExecutionProvider"),
    "om": (),
    "tflite": (),
    "openvino": (),
}
"""ONNX Runtime execution providers per target, the target's own first, then fallbacks.

Targets run by another runtime (``om``: Ascend ACL, ``tflite``: LiteRT, ``openvino``) have none.
"""

# The module that must import for a target that ONNX Runtime does not run.
_TARGET_MODULES = {"om": "acl", "tflite": "ai_edge_litert.interpreter", "openvino": "openvino"}


def providers_for(target: str) -> list[str]:
    """The ONNX Runtime execution providers to ask for when running a target, in order.

    Args:
        target: A model target name, e.g. ``onnx-cuda``.

    Returns:
        The target's own provider first, then fallbacks; empty for non-ONNX Runtime targets.

    Raises:
        RuntimeBackendError: The target is unknown.
    """
    try:
        return list(TARGET_PROVIDERS[target])
    except KeyError:
        raise RuntimeBackendError(
            f"unknown model target {target!r}; known: {', '.join(TARGET_PROVIDERS)}"
        ) from None


def profile_for(
    board: str, available: Collection[str], *, cpu_count: int = 1, memory_bytes: int = 0
) -> DeviceProfile:
    """The profile of a known board, keeping only the targets whose runtime is available.

    Args:
        board: A board name from :data:`PROFILES`.
        available: Targets whose runtime is installed here.
        cpu_count: CPUs this process may use.
        memory_bytes: Physical memory.

    Raises:
        RuntimeBackendError: The board is unknown.
    """
    spec = PROFILES.get(board)
    if spec is None:
        raise RuntimeBackendError(f"unknown board {board!r}; known: {', '.join(PROFILES)}")
    targets = tuple(t for t in spec.targets if t in available)
    return DeviceProfile(
        spec.arch, spec.accelerator, board, targets, cpu_count, memory_bytes, spec.precisions
    )


def detect_profile(override: str | None = None) -> DeviceProfile:
    """Detect this device's profile, or take the board from ``override``.

    With an override, the board, architecture and accelerator come from :data:`PROFILES`
    (for demos and tests); targets, CPUs and memory are still this machine's.

    Args:
        override: A board name from :data:`PROFILES`, or ``None`` to detect.

    Raises:
        RuntimeBackendError: ``override`` names an unknown board.
    """
    if override is not None and override not in PROFILES:
        raise RuntimeBackendError(f"unknown board {override!r}; known: {', '.join(PROFILES)}")
    arch = _machine()
    board = override or detect_board(arch)
    profile = profile_for(
        board, available_targets(), cpu_count=_cpu_count(), memory_bytes=_memory_bytes()
    )
    # A detected board keeps this machine's real architecture (an ARM server with CUDA is
    # profiled as "jetson" for its targets, but it is not necessarily aarch64).
    return profile if override is not None else dataclasses.replace(profile, arch=arch)


def detect_board(arch: str | None = None) -> str:
    """Guess which board of :data:`PROFILES` this machine is, from what the system exposes.

    Args:
        arch: The CPU architecture, by default this machine's.
    """
    arch = arch or _machine()
    model = _read_text(Path("/proc/device-tree/model")).lower()
    x86 = arch == "x86_64"
    if "jetson" in model:
        return "jetson"
    if "raspberry pi" in model:
        return "rpi"
    if Path("/usr/local/Ascend").is_dir() or shutil.which("npu-smi"):
        return "ascend-310" if x86 else "atlas-200"
    if shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists():
        return "x86-cuda" if x86 else "jetson"
    return "x86-cpu" if x86 else "arm-cpu"


def available_targets() -> frozenset[str]:
    """Every target whose runtime is installed and usable here."""
    found: set[str] = set()
    try:
        ort = importlib.import_module("onnxruntime")
        providers = set(ort.get_available_providers())
    except Exception:  # any failure means ONNX Runtime is unusable here
        providers = set()
    for target, wanted in TARGET_PROVIDERS.items():
        if wanted and wanted[0] in providers:
            found.add(target)
    for target, module in _TARGET_MODULES.items():
        if _imports(module):
            found.add(target)
    return frozenset(found)


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install (missing .so, old glibc) counts as absent
        return False
    return True


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_bytes() -> int:
    for line in _read_text(Path("/proc/meminfo")).splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal":
            parts = value.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def _read_text(path: Path) -> str:
    """A small system file's text (device-tree strings end in NUL), or ``""`` if absent."""
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_PROC_READ)
    except OSError:
        return ""
    return raw.replace(b"\x00", b"").decode("utf-8", "replace").strip()
