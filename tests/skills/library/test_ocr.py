"""The ``ocr`` skill: PP-OCRv6 on scikit-image's ``page`` (a photographed book page).

The page's text, read off the photo by eye, is below; the skill must read its
lines in order, nearly every word exactly. Photos without text give no
confident line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
import skimage.data

from tests.skills.library.conftest import Harness

PAGE = """\
Region-based segmentation
Let us first determine markers of the coins and the
background. These markers are pixels that we can label
unambiguously as either object or background. Here,
the markers are found at the two extreme parts of the
histogram of grey values:
>>> markers = np.zeros_like(coins)"""


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z_]+", text.lower())


@pytest.fixture(scope="module")
def ocr(library_skill: Callable[[str], Harness]) -> Harness:
    return library_skill("ocr")


@pytest.fixture(scope="module")
def page(ocr: Harness) -> Mapping[str, Any]:
    return ocr.skill().process({"image": skimage.data.page()})


def test_the_dictionary_comes_from_the_models_metadata(ocr: Harness) -> None:
    keys = ocr.module().read_keys(ocr.root / "control" / "ocr_keys.txt")
    assert keys[0] == "" and keys[-1] == " " and len(keys) == 18710  # the recogniser's classes
    assert keys[1:4] == ["!", '"', "#"] and "a" in keys and "中" in keys


def test_the_pages_lines_are_read_in_order(page: Mapping[str, Any]) -> None:
    expected = PAGE.splitlines()
    lines = [line["text"] for line in page["lines"]]
    assert len(lines) == len(expected)
    assert lines[:6] == expected[:6]  # the prose, character for character
    assert _words(lines[6]) == _words(expected[6])  # the code line, without its prompt
    tops = [line["box"][1] for line in page["lines"]]
    assert tops == sorted(tops)
    assert page["text"] == "\n".join(lines) and page["label"] == "text"
    assert min(line["score"] for line in page["lines"]) > 0.9


def test_nearly_every_word_is_read_at_a_smaller_detector_size(ocr: Harness) -> None:
    result = ocr.skill({"det_side": "320"}).process({"image": skimage.data.page()})
    read = _words(result["text"])
    expected = _words(PAGE)
    assert sum(word in read for word in expected) / len(expected) > 0.9


def test_a_photo_without_text_gives_none(ocr: Harness) -> None:
    result = ocr.skill().process({"image": skimage.data.astronaut()})
    assert result["lines"] == [] and result["label"] == "none"


def test_texture_gives_no_confident_line(ocr: Harness) -> None:
    # The detector fires on the coffee cup's rim; what the recogniser makes of the
    # blob ("8" at ~0.70) stays far below every line of the page (> 0.9).
    lines = ocr.skill().process({"image": skimage.data.coffee()})["lines"]
    assert all(line["score"] < 0.8 and len(line["text"]) <= 2 for line in lines)


def test_db_regions_join_touching_runs(ocr: Harness) -> None:
    mask = np.zeros((6, 10), bool)
    mask[1, 1:4] = mask[2, 4:6] = True  # touching diagonally: one region
    mask[4, 8] = True
    rows, starts, ends, roots = ocr.module().label_regions(mask)
    assert list(zip(rows, starts, ends, strict=True)) == [(1, 1, 3), (2, 4, 5), (4, 8, 8)]
    assert roots[0] == roots[1] != roots[2]


def test_ctc_merges_repeats_and_drops_blanks(ocr: Harness) -> None:
    keys = ["", "a", "b", " "]
    columns = [1, 1, 0, 1, 2, 2, 3, 2]  # a a _ a b b ␣ b
    probs = np.eye(4)[columns] * 0.9
    assert ocr.module().ctc_decode(probs, keys) == ("aab b", pytest.approx(0.9))


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'image'"),
        ({"image": np.zeros((4, 4), np.uint8)}, "outside"),
        ({"image": np.zeros((9, 9, 3), np.int16)}, "uint8"),
    ],
)
def test_bad_images_fail_the_item(ocr: Harness, item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ocr.skill().process(item)
