"""Labels and selectors."""

from __future__ import annotations

import pytest

from cloud.errors import ValidationError
from cloud.selectors import (
    MAX_LABELS,
    check_labels,
    format_selector,
    matches,
    parse_labels,
    parse_selector,
)


def test_parse_labels_reads_key_value_items() -> None:
    assert parse_labels(["kind=camera", "site=plant-3", "hw/board=rk3588_v1.2"]) == {
        "kind": "camera",
        "site": "plant-3",
        "hw/board": "rk3588_v1.2",
    }
    assert parse_labels([]) == {}


@pytest.mark.parametrize(
    "item",
    [
        "kind",  # no '='
        "=camera",  # empty key
        "kind=",  # empty value
        "ki nd=camera",
        "kind=cam era",
        "kind=camera,site=x",  # a comma is not a value character
        "kind=caméra",
        "k" * 64 + "=v",
        "k=" + "v" * 64,
    ],
)
def test_parse_labels_refuses_malformed_items(item: str) -> None:
    with pytest.raises(ValidationError):
        parse_labels([item])


def test_parse_labels_accepts_the_longest_key_and_value() -> None:
    assert parse_labels(["k" * 63 + "=" + "v" * 63]) == {"k" * 63: "v" * 63}


def test_parse_labels_refuses_a_repeated_key_and_too_many_labels() -> None:
    with pytest.raises(ValidationError, match="twice"):
        parse_labels(["kind=camera", "kind=gateway"])
    with pytest.raises(ValidationError, match="too many"):
        parse_labels(f"k{i}=v" for i in range(MAX_LABELS + 1))


def test_parse_selector_empty_selects_everything() -> None:
    assert parse_selector("") == {}
    assert parse_selector("   ") == {}
    assert matches(parse_selector(""), {})
    assert matches(parse_selector(""), {"kind": "camera"})


def test_parse_selector_tolerates_spaces_and_refuses_junk() -> None:
    assert parse_selector(" kind=camera , site=plant-3 ") == {"kind": "camera", "site": "plant-3"}
    for bad in ("kind=camera,", "kind=camera,,site=x", "kind", "kind=a,kind=b", "x" * 10_000):
        with pytest.raises(ValidationError):
            parse_selector(bad)


def test_matches_needs_every_label_with_the_same_value() -> None:
    selector = {"kind": "camera", "site": "plant-3"}
    assert matches(selector, {"kind": "camera", "site": "plant-3", "extra": "yes"})
    assert not matches(selector, {"kind": "camera"})
    assert not matches(selector, {"kind": "camera", "site": "plant-4"})
    assert not matches(selector, {"kind": "Camera", "site": "plant-3"})


def test_format_selector_is_canonical_and_round_trips() -> None:
    assert format_selector({"site": "plant-3", "kind": "camera"}) == "kind=camera,site=plant-3"
    assert format_selector({}) == ""
    text = format_selector({"b": "2", "a": "1"})
    assert parse_selector(text) == {"a": "1", "b": "2"}


def test_check_labels_validates_a_mapping() -> None:
    assert check_labels({"kind": "camera"}) == {"kind": "camera"}
    with pytest.raises(ValidationError):
        check_labels({"kind": "a b"})
    with pytest.raises(ValidationError):
        check_labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
