"""Regenerate the protobuf and gRPC Python code from ``edgeskill.proto``.

Run ``python -m protos.generate``; ``--check`` exits 1 when the checked-in
code differs from what the current proto file produces.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "edgeskill.proto"
OUTPUTS = ("edgeskill_pb2.py", "edgeskill_pb2.pyi", "edgeskill_pb2_grpc.py")


def _fix_imports(text: str) -> str:
    # grpc_tools writes a top-level import; our package is `protos`.
    return text.replace("import edgeskill_pb2 as", "from protos import edgeskill_pb2 as")


def generate(out_dir: Path) -> dict[str, str]:
    """Generate the code into ``out_dir`` and return file name -> text.

    Raises:
        RuntimeError: protoc failed.
    """
    from grpc_tools import protoc  # noqa: PLC0415 - a dev-only dependency

    args = [
        "protoc",
        f"-I{HERE}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(HERE / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + PROTO)
    return {name: _fix_imports((out_dir / name).read_text()) for name in OUTPUTS}


def main(argv: list[str] | None = None) -> int:
    """Write or check the generated code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
    stale = [
        n for n, text in fresh.items() if not (HERE / n).exists() or (HERE / n).read_text() != text
    ]
    if opts.check:
        for name in stale:
            sys.stderr.write(f"stale generated file: protos/{name}\n")
        return 1 if stale else 0
    for name in stale:
        (HERE / name).write_text(fresh[name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
