"""A hub home with the ``digits`` skill recorded and a ``cameras`` group, for transport tests."""

from __future__ import annotations

from pathlib import Path

from cloud.hub import Hub


def hub_with_digits(home: Path, *, deployed: bool = False) -> Hub:
    """Init a hub at ``home`` knowing ``digits 1.0.0`` (a stand-in bundle) and group ``cameras``.

    With ``deployed``, the version is also deployed to the group.
    """
    hub = Hub.init(home)
    hub.store.add_skill_version(
        "digits",
        "1.0.0",
        target_name="digits/d.skill",
        sha256="a" * 64,
        size=1,
        manifest="",
        now_ms=1,
    )
    hub.store.create_group("cameras", "kind=camera")
    if deployed:
        hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=2)
    return hub
