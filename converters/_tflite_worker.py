"""Child process of :func:`converters.tflite.export_tflite`:
``python -m converters._tflite_worker <work folder> <out.tflite>``.

Exit codes: 0 done, 3 ``litert-torch`` missing, 1 conversion failed (reason on stderr).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

MISSING_EXIT_CODE = 3


def main(argv: list[str]) -> int:
    """Convert ``<work>/model.pt`` with ``<work>/sample.npy`` into ``out``."""
    work, out = Path(argv[0]), Path(argv[1])
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink):
            import litert_torch  # noqa: PLC0415
    except ImportError as exc:
        sys.stderr.write(f"{exc}\n")
        return MISSING_EXIT_CODE
    # The parent wrote this file moments ago into its own private folder.
    model = torch.load(work / "model.pt", weights_only=False)
    sample = torch.from_numpy(np.load(work / "sample.npy"))
    try:
        with contextlib.redirect_stdout(sink), torch.no_grad():
            litert_torch.convert(model.eval(), (sample,)).export(str(out))
    except Exception as exc:  # the converter raises many unrelated types
        sys.stderr.write(f"{type(exc).__name__}: {exc}".replace("\n", " ") + "\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
