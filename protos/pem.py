"""Reading PEM files for TLS, with a size cap, for the hub's server and the agent's client."""

from __future__ import annotations

from pathlib import Path

from protos.errors import TransportError

__all__ = ["MAX_PEM_BYTES", "read_pem"]

#: A certificate chain or key file is far smaller than this.
MAX_PEM_BYTES = 1024 * 1024


def read_pem(path: Path, max_bytes: int = MAX_PEM_BYTES) -> bytes:
    """Read one PEM file for TLS.

    Args:
        path: the certificate, chain or private key file.
        max_bytes: the largest file accepted.

    Returns:
        The file's bytes.

    Raises:
        TransportError: the file is missing, unreadable, empty or larger than ``max_bytes``.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise TransportError(f"cannot read TLS file {path}: {exc}") from exc
    if not data.strip() or len(data) > max_bytes:
        raise TransportError(f"TLS file {path} is empty or larger than {max_bytes} bytes")
    return data
