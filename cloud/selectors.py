"""Device labels and label selectors (pure, no I/O).

A device carries labels such as ``kind=camera`` and ``site=plant-3``. A group
is a selector over those labels, written ``kind=camera,site=plant-3``: a
device matches when it has every listed label with exactly that value. The
empty selector matches every device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from cloud.errors import ValidationError

__all__ = [
    "MAX_LABELS",
    "MAX_LABEL_KEY_LEN",
    "MAX_LABEL_VALUE_LEN",
    "Labels",
    "check_labels",
    "format_selector",
    "matches",
    "parse_labels",
    "parse_selector",
]

Labels = Mapping[str, str]

MAX_LABEL_KEY_LEN = 63
MAX_LABEL_VALUE_LEN = 63
MAX_LABELS = 64
# A selector can name at most every label a device may carry, so the same cap bounds its text.
_MAX_SELECTOR_TEXT = MAX_LABELS * (MAX_LABEL_KEY_LEN + MAX_LABEL_VALUE_LEN + 2)

_KEY_RE = re.compile(rf"[A-Za-z0-9._/-]{{1,{MAX_LABEL_KEY_LEN}}}")
_VALUE_RE = re.compile(rf"[A-Za-z0-9._/-]{{1,{MAX_LABEL_VALUE_LEN}}}")


def _check_pair(key: object, value: object) -> None:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValidationError(
            f"bad label key {key!r}: use 1-{MAX_LABEL_KEY_LEN} characters of [A-Za-z0-9._/-]"
        )
    if not isinstance(value, str) or not _VALUE_RE.fullmatch(value):
        raise ValidationError(
            f"bad value {value!r} for label {key!r}: "
            f"use 1-{MAX_LABEL_VALUE_LEN} characters of [A-Za-z0-9._/-]"
        )


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Validate a label mapping, such as the labels a device reports.

    Args:
        labels: Label keys to values.

    Returns:
        A plain dict copy of the labels.

    Raises:
        ValidationError: A key or value is malformed or too long, or there are
            more than ``MAX_LABELS`` labels.
    """
    if len(labels) > MAX_LABELS:
        raise ValidationError(f"too many labels: {len(labels)} > {MAX_LABELS}")
    for key, value in labels.items():
        _check_pair(key, value)
    return dict(labels)


def _split_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.strip().partition("=")
    if not sep:
        raise ValidationError(f"bad label {item!r}: expected key=value")
    key, value = key.strip(), value.strip()
    _check_pair(key, value)
    return key, value


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    """Parse ``key=value`` items, as given on a command line, into labels.

    Args:
        items: Strings such as ``"kind=camera"``.

    Returns:
        The labels as a dict.

    Raises:
        ValidationError: An item is not ``key=value``, a key or value is
            malformed, a key repeats, or there are too many labels.
    """
    labels: dict[str, str] = {}
    for item in items:
        if len(labels) >= MAX_LABELS:
            raise ValidationError(f"too many labels: more than {MAX_LABELS}")
        key, value = _split_pair(item)
        if key in labels:
            raise ValidationError(f"label {key!r} given twice")
        labels[key] = value
    return labels


def parse_selector(text: str) -> dict[str, str]:
    """Parse a selector such as ``"kind=camera,site=plant-3"``.

    Spaces around items are ignored. The empty (or blank) selector selects
    every device and parses to ``{}``.

    Args:
        text: The selector text.

    Returns:
        The required labels.

    Raises:
        ValidationError: The text is too long or an item is malformed or
            repeated.
    """
    if len(text) > _MAX_SELECTOR_TEXT:
        raise ValidationError(f"selector too long: {len(text)} > {_MAX_SELECTOR_TEXT} characters")
    if not text.strip():
        return {}
    return parse_labels(text.split(","))


def format_selector(selector: Mapping[str, str]) -> str:
    """Write a selector in its canonical text form (keys sorted).

    Args:
        selector: The required labels.

    Returns:
        Text that :func:`parse_selector` reads back to the same mapping.

    Raises:
        ValidationError: The selector holds a malformed key or value.
    """
    check_labels(selector)
    return ",".join(f"{key}={selector[key]}" for key in sorted(selector))


def matches(selector: Mapping[str, str], labels: Labels) -> bool:
    """Tell whether a device with ``labels`` is selected by ``selector``.

    Args:
        selector: The required labels; empty selects everything.
        labels: The device's labels.

    Returns:
        True when every required label is present with the same value.
    """
    return all(labels.get(key) == value for key, value in selector.items())
