"""The device's hardware profile: what board it is, and which model targets it can run.

A pure core and a thin shell. :func:`board_from_facts` (what the system exposes in, a
board name out) and :func:`profile_for` (a board and what is installed in, a profile out)
do no I/O; :func:`read_facts` reads a system tree under a root folder (``/`` on a device,
a fabricated tree in tests): ``/proc/device-tree/model``, ``/proc/cpuinfo``, ``/dev``
(``davinci*``, ``nvidia*``), the Ascend and NVIDIA tools (``npu-smi``, ``nvidia-smi``,
``tegrastats``) and ``/etc/nv_tegra_release``. :func:`detect_profile` ties them to the
installed runtimes (ONNX Runtime's providers, and whether OpenVINO, LiteRT and ACL import).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from edge_agent.errors import RuntimeBackendError

__all__ = [
    "CPU_PROVIDER",
    "PROFILES",
    "TARGET_PROVIDERS",
    "Board",
    "DeviceProfile",
    "SystemFacts",
    "available_targets",
    "board_from_facts",
    "detect_board",
    "detect_profile",
    "ort_providers",
    "profile_for",
    "providers_for",
    "read_facts",
    "session_providers",
]

_MAX_PROC_READ = 256 * 1024
CPU_PROVIDER = "CPUExecutionProvider"
_TRT = "TensorrtExecutionProvider"
_CUDA = "CUDAExecutionProvider"
_CANN = "CANNExecutionProvider"
_OPENVINO_EP = "OpenVINOExecutionProvider"


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
        providers: ONNX Runtime execution providers to try, best first, only those the
            installed ONNX Runtime has; always ends with the CPU provider.
        cpu_features: The CPU flags that matter for inference (``avx2``, ``avx512_vnni``,
            ``amx_tile``, ``asimd``, ``asimddp``, ``sve``...), as detected.
    """

    arch: str
    accelerator: str
    board: str
    targets: tuple[str, ...]
    cpu_count: int
    memory_bytes: int
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    providers: tuple[str, ...] = (CPU_PROVIDER,)
    cpu_features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Board:
    """One known kind of device.

    Attributes:
        arch: Its usual CPU architecture.
        accelerator: ``cpu``, ``cuda`` or ``ascend``.
        targets: Model targets it can run when their runtimes are installed, best first.
        precisions: Model precisions it prefers, best first.
        providers: ONNX Runtime execution providers to try, best first.
    """

    arch: str
    accelerator: str
    targets: tuple[str, ...]
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    providers: tuple[str, ...] = (CPU_PROVIDER,)


_ASCEND_TARGETS = ("om", "onnx-cann", "onnx-cpu")
_ARM_TARGETS = ("tflite", "onnx-cpu")
_JETSON_TARGETS = ("onnx-tensorrt", "onnx-cuda", "onnx-cpu", "tflite")
_INT8_FIRST = ("int8", "fp16", "fp32")
_GPU_PROVIDERS = (_TRT, _CUDA, CPU_PROVIDER)
_ASCEND_PROVIDERS = (_CANN, CPU_PROVIDER)

PROFILES: dict[str, Board] = {
    # The four device targets the firmware images are built for.
    # Small ARM cores gain most from INT8 (smaller, faster, within a point of accuracy).
    "arm64-cpu": Board("aarch64", "cpu", _ARM_TARGETS, _INT8_FIRST),
    "jetson": Board("aarch64", "cuda", _JETSON_TARGETS, providers=_GPU_PROVIDERS),
    # Atlas 200/500 edge boards (aarch64); an Atlas 300I card in an x86 server keeps its arch.
    "ascend310": Board("aarch64", "ascend", _ASCEND_TARGETS, providers=_ASCEND_PROVIDERS),
    # OpenVINO first on Intel gateways; ONNX Runtime's OpenVINO provider when installed.
    "x86-gateway": Board(
        "x86_64", "cpu", ("openvino", "onnx-cpu"), providers=(_OPENVINO_EP, CPU_PROVIDER)
    ),
    # Generic and older names (the simulator's board mix and the hub's records use them).
    "x86-cpu": Board("x86_64", "cpu", ("onnx-cpu", "openvino")),
    "x86-cuda": Board(
        "x86_64", "cuda", ("onnx-tensorrt", "onnx-cuda", "onnx-cpu"), providers=_GPU_PROVIDERS
    ),
    "ascend-310": Board("x86_64", "ascend", _ASCEND_TARGETS, providers=_ASCEND_PROVIDERS),
    "atlas-200": Board("aarch64", "ascend", _ASCEND_TARGETS, providers=_ASCEND_PROVIDERS),
    "arm-cpu": Board("aarch64", "cpu", _ARM_TARGETS, _INT8_FIRST),
    "rpi": Board("aarch64", "cpu", _ARM_TARGETS, _INT8_FIRST),
}
"""Known boards by name."""

TARGET_PROVIDERS: dict[str, tuple[str, ...]] = {
    "onnx-cpu": (CPU_PROVIDER,),
    "onnx-cuda": (_CUDA, CPU_PROVIDER),
    "onnx-tensorrt": (_TRT, _CUDA, CPU_PROVIDER),
    "onnx-cann": (_CANN, CPU_PROVIDER),
    "om": (),
    "tflite": (),
    "openvino": (),
}
"""ONNX Runtime execution providers per target, the target's own first, then fallbacks.

Targets run by another runtime (``om``: Ascend ACL, ``tflite``: LiteRT, ``openvino``) have none.
"""

# The module that must import for a target that ONNX Runtime does not run.
_TARGET_MODULES = {"om": "acl", "tflite": "ai_edge_litert.interpreter", "openvino": "openvino"}
# tflite-runtime (older ARM images: numpy 1.x, Python <= 3.11) has the same interpreter API.
_TFLITE_FALLBACK = "tflite_runtime.interpreter"

# CPU flags worth recording: x86 SIMD and int8 dot products, ARM NEON, dot product, SVE.
_INTERESTING_FLAGS = {
    "x86_64": frozenset(
        {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "f16c", "fma"}
    ),
    "aarch64": frozenset({"asimd", "asimddp", "asimdhp", "fphp", "sve", "sve2", "i8mm", "bf16"}),
}
_ANY_FLAG = frozenset().union(*_INTERESTING_FLAGS.values())
# Where the tools are looked for under a fabricated root (and, on a device, on PATH too).
_TOOL_DIRS = (
    "usr/local/bin",
    "usr/bin",
    "bin",
    "usr/sbin",
    "usr/local/Ascend/driver/tools",
    "usr/local/sbin",
)


@dataclass(frozen=True)
class SystemFacts:
    """What a system exposes about its hardware, read once by :func:`read_facts`.

    Attributes:
        arch: CPU architecture (``x86_64``, ``aarch64``, ...).
        model: ``/proc/device-tree/model``, lower case (``""`` on most x86 machines).
        cpu_flags: The flags (x86) or features (ARM) line of ``/proc/cpuinfo``.
        tools: Which of ``npu-smi``, ``nvidia-smi`` and ``tegrastats`` are installed.
        davinci: Whether ``/dev/davinci*`` (the Ascend NPU's device nodes) exist.
        nvidia_dev: Whether ``/dev/nvidia0`` or ``/dev/nvhost-*`` (a Tegra GPU) exist.
        tegra_release: Whether ``/etc/nv_tegra_release`` (NVIDIA L4T) exists.
        ascend_home: Whether ``/usr/local/Ascend`` (the CANN install) exists.
    """

    arch: str
    model: str = ""
    cpu_flags: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()
    davinci: bool = False
    nvidia_dev: bool = False
    tegra_release: bool = False
    ascend_home: bool = False


def board_from_facts(facts: SystemFacts) -> str:
    """Which board of :data:`PROFILES` a system is, from what it exposes (pure).

    Jetson wins over everything (L4T, ``tegrastats`` or a Jetson device-tree model), then
    an Ascend NPU (its device nodes, ``npu-smi`` or the CANN folder), then a Raspberry Pi,
    then a discrete NVIDIA GPU; otherwise the CPU decides: an x86 with AVX2 is a gateway
    (OpenVINO's fast CPU paths), aarch64 is ``arm64-cpu``.
    """
    x86 = facts.arch == "x86_64"
    if "jetson" in facts.model or facts.tegra_release or "tegrastats" in facts.tools:
        return "jetson"
    if facts.davinci or "npu-smi" in facts.tools or facts.ascend_home:
        return "ascend310"
    if "raspberry pi" in facts.model:
        return "rpi"
    if "nvidia-smi" in facts.tools or facts.nvidia_dev:
        return "x86-cuda" if x86 else "jetson"
    if x86:
        return "x86-gateway" if "avx2" in facts.cpu_flags else "x86-cpu"
    return "arm64-cpu" if facts.arch == "aarch64" else "arm-cpu"


def read_facts(root: Path = Path("/"), *, arch: str | None = None) -> SystemFacts:
    """Read the hardware facts of the system under ``root``.

    Args:
        root: The system's root folder; a fabricated tree in tests.
        arch: The CPU architecture; by default this machine's for ``/``, and the one
            ``/proc/cpuinfo`` implies for any other root.
    """
    cpuinfo = _read_text(root / "proc" / "cpuinfo")
    real = root.resolve() == Path("/")
    arch = arch or (_machine() if real else _arch_from_cpuinfo(cpuinfo))
    dev = root / "dev"
    tools = frozenset(
        t for t in ("npu-smi", "nvidia-smi", "tegrastats") if _tool_exists(root, t, real)
    )
    return SystemFacts(
        arch=arch,
        model=_read_text(root / "proc" / "device-tree" / "model").lower(),
        cpu_flags=_cpu_flags(cpuinfo),
        tools=tools,
        davinci=any(dev.glob("davinci[0-9]*")),
        nvidia_dev=(dev / "nvidia0").exists() or any(dev.glob("nvhost-*")),
        tegra_release=(root / "etc" / "nv_tegra_release").is_file(),
        ascend_home=(root / "usr" / "local" / "Ascend").is_dir(),
    )


def detect_board(arch: str | None = None, *, root: Path = Path("/")) -> str:
    """Guess which board of :data:`PROFILES` the system under ``root`` is.

    Args:
        arch: The CPU architecture, by default the system's.
        root: The system's root folder; a fabricated tree in tests.
    """
    return board_from_facts(read_facts(root, arch=arch))


def providers_for(target: str) -> list[str]:
    """The ONNX Runtime execution providers a target needs, in order.

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


def session_providers(
    target: str, profile_providers: Sequence[str], present: Collection[str]
) -> list[str]:
    """The providers to open an ONNX Runtime session with for a variant of ``target`` (pure).

    The target's own providers come first (an ``onnx-cuda`` variant asks for CUDA), then
    the profile's (a plain ``onnx-cpu`` model on a Jetson is still worth TensorRT), keeping
    only those the installed ONNX Runtime has; the CPU provider is always last.

    Args:
        target: The variant's target.
        profile_providers: The device profile's providers, best first.
        present: ``onnxruntime.get_available_providers()``.

    Raises:
        RuntimeBackendError: The target is unknown.
    """
    wanted = [*providers_for(target), *profile_providers]
    ordered = [p for p in dict.fromkeys(wanted) if p in present and p != CPU_PROVIDER]
    return [*ordered, CPU_PROVIDER]


def profile_for(
    board: str,
    available: Collection[str],
    *,
    cpu_count: int = 1,
    memory_bytes: int = 0,
    ort_providers: Collection[str] = (CPU_PROVIDER,),
    cpu_features: Collection[str] = (),
) -> DeviceProfile:
    """The profile of a known board, keeping only what is installed (pure).

    Args:
        board: A board name from :data:`PROFILES`.
        available: Targets whose runtime is installed here.
        cpu_count: CPUs this process may use.
        memory_bytes: Physical memory.
        ort_providers: The installed ONNX Runtime's providers.
        cpu_features: Detected CPU flags worth recording.

    Raises:
        RuntimeBackendError: The board is unknown.
    """
    spec = PROFILES.get(board)
    if spec is None:
        raise RuntimeBackendError(f"unknown board {board!r}; known: {', '.join(PROFILES)}")
    targets = tuple(t for t in spec.targets if t in available)
    providers = tuple(p for p in spec.providers if p in ort_providers and p != CPU_PROVIDER)
    return DeviceProfile(
        spec.arch,
        spec.accelerator,
        board,
        targets,
        cpu_count,
        memory_bytes,
        spec.precisions,
        (*providers, CPU_PROVIDER),
        tuple(sorted(set(cpu_features) & _ANY_FLAG)),
    )


def detect_profile(override: str | None = None, *, root: Path = Path("/")) -> DeviceProfile:
    """Detect this device's profile, or take the board from ``override``.

    With an override (the agent's ``board`` setting), the board, architecture and
    accelerator come from :data:`PROFILES`; targets, providers, CPUs and memory are
    still this machine's.

    Args:
        override: A board name from :data:`PROFILES`, or ``None`` to detect.
        root: The system's root folder for detection; a fabricated tree in tests.

    Raises:
        RuntimeBackendError: ``override`` names an unknown board.
    """
    if override is not None and override not in PROFILES:
        raise RuntimeBackendError(f"unknown board {override!r}; known: {', '.join(PROFILES)}")
    facts = read_facts(root)
    board = override or board_from_facts(facts)
    profile = profile_for(
        board,
        available_targets(),
        cpu_count=_cpu_count(),
        memory_bytes=_memory_bytes(root),
        ort_providers=ort_providers(),
        # Under qemu-user /proc/cpuinfo is the host's: keep only the real arch's flags.
        cpu_features=facts.cpu_flags & _INTERESTING_FLAGS.get(facts.arch, frozenset()),
    )
    # A detected board keeps the system's real architecture (an Atlas 300I card in an
    # x86 server is profiled as "ascend310" for its targets, but it is x86_64).
    return profile if override is not None else dataclasses.replace(profile, arch=facts.arch)


def ort_providers() -> tuple[str, ...]:
    """The execution providers of the installed ONNX Runtime; none when it does not import."""
    return _runtime_probe()[0]


def available_targets() -> frozenset[str]:
    """Every target whose runtime is installed and usable here.

    The runtimes are imported in a child process, once per process: importing ONNX
    Runtime, OpenVINO and LiteRT into the agent would cost it about 45 MB of resident
    memory for libraries only its skills' processes use.
    """
    providers, modules = _runtime_probe()
    found = {t for t, wanted in TARGET_PROVIDERS.items() if wanted and wanted[0] in providers}
    found |= {t for t, module in _TARGET_MODULES.items() if module in modules}
    if _TFLITE_FALLBACK in modules:
        found.add("tflite")
    return frozenset(found)


_PROBE = """
import importlib, json, sys
found, providers = [], []
for name in sys.argv[1:]:
    try:
        module = importlib.import_module(name)
    except Exception:
        continue
    found.append(name)
    if name == "onnxruntime":
        providers = list(module.get_available_providers())
print(json.dumps({"providers": providers, "modules": found}))
"""
_PROBE_TIMEOUT_S = 120.0


@functools.cache
def _runtime_probe() -> tuple[tuple[str, ...], frozenset[str]]:
    """(ONNX Runtime providers, importable runtime modules), found in a child process.

    A broken install (a missing .so, an old glibc) counts as absent. If the child
    cannot run, the modules are tried here instead.
    """
    modules = ["onnxruntime", *_TARGET_MODULES.values(), _TFLITE_FALLBACK]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, *modules],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=True,
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        return tuple(answer["providers"]), frozenset(answer["modules"])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, KeyError):
        found = frozenset(m for m in modules if _imports(m))
        providers: tuple[str, ...] = ()
        if "onnxruntime" in found:
            providers = tuple(importlib.import_module("onnxruntime").get_available_providers())
        return providers, found


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install (missing .so, old glibc) counts as absent
        return False
    return True


def _tool_exists(root: Path, name: str, real: bool) -> bool:
    if any((root / d / name).is_file() for d in _TOOL_DIRS):
        return True
    return real and shutil.which(name) is not None


def _cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first ``flags`` (x86) or ``Features`` (ARM) line's words."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in {"flags", "features"}:
            return frozenset(value.split())
    return frozenset()


def _arch_from_cpuinfo(cpuinfo: str) -> str:
    """What ``/proc/cpuinfo`` implies: ARM kernels list ``CPU architecture: 8``."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "CPU architecture":
            return "aarch64" if value.strip().startswith("8") else "armv7l"
    return "x86_64" if "vendor_id" in cpuinfo else _machine()


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _memory_bytes(root: Path = Path("/")) -> int:
    for line in _read_text(root / "proc" / "meminfo").splitlines():
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
