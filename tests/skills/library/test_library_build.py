"""Every library skill builds into a bundle from its installed packages; every model runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.models.library import LIBRARY, build_library_skill, library_skills
from skills.bundle import install_bundle, verify_tree

EXPECTED = ["face-detect", "keyword-spot", "ocr", "text-embed", "voice-activity"]


def test_the_library_declares_its_models_in_sources() -> None:
    assert library_skills() == EXPECTED
    for name in EXPECTED:
        assert not (LIBRARY / name / "models").exists()  # never committed


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_each_skill_builds_installs_and_verifies(tmp_path: Path, name: str) -> None:
    bundle = build_library_skill(LIBRARY / name, tmp_path / "dist", version="1.0.1")
    assert bundle.name == f"{name}-1.0.1.skill"
    installed = install_bundle(bundle, tmp_path / "installed")
    assert installed.models and all(v.sha256 and v.size for v in installed.models)
    assert verify_tree(tmp_path / "installed").name == name
    assert (tmp_path / "installed" / "sources.toml").is_file()  # provenance ships along
