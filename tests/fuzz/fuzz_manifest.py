"""atheris harness: ``skill.toml`` text gives a manifest or a ManifestError, nothing else."""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from skills.errors import ManifestError
    from skills.manifest import Manifest


def one_input(data: bytes) -> None:
    """Parse ``data`` as a manifest; an accepted one must round-trip through TOML."""
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    try:
        manifest = Manifest.from_toml(text)
    except ManifestError:
        return
    if Manifest.from_toml(manifest.to_toml()) != manifest:
        raise AssertionError("an accepted manifest does not round-trip")


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
