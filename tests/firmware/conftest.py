"""Markers of the firmware tests (registered here: --strict-markers refuses unknown ones)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "qemu: builds the arm64 image and runs its agent under qemu user emulation "
        "(root, apt for qemu-user-static/debootstrap when missing; minutes)",
    )
