"""A deployment's skill config: ``key=value`` pairs as people type them (pure, no I/O).

On the command line config is given as ``--config k=v[,k=v]``, repeated for
more. Every pair must be well formed: a mistyped pair (``notkv``, ``a:b``,
an empty item between commas) is an error naming it, never silently dropped.
Keys and values are held to the wire's caps (:mod:`protos.limits`), and keys
to what both a skill manifest and the hub's store accept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from cloud.errors import ValidationError
from protos.limits import MAX_CONFIG_ENTRIES, MAX_CONFIG_VALUE_BYTES, MAX_NAME_CHARS

__all__ = ["ConfigInput", "check_config", "config_from", "parse_config"]

ConfigInput = Mapping[str, str] | str | Iterable[str] | None
"""A config as a mapping, one ``k=v[,k=v]`` text, or several such texts."""

_KEY_RE = re.compile(rf"[A-Za-z][A-Za-z0-9_.-]{{0,{MAX_NAME_CHARS - 1}}}")
_KEY_RULE = f"a letter, then up to {MAX_NAME_CHARS - 1} letters, digits, '_', '.' or '-'"
_FORM = "expected key=value (several as k=v,k=v)"


def _check_pair(key: object, value: object, pair: str) -> None:
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValidationError(f"bad config key {key!r} in {pair!r}: use {_KEY_RULE}")
    if not isinstance(value, str):
        raise ValidationError(f"bad config value for {key!r}: expected text")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_CONFIG_VALUE_BYTES:
        raise ValidationError(
            f"config value of {key!r} is over {MAX_CONFIG_VALUE_BYTES} bytes (in {pair[:40]!r}…)"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValidationError(f"config value of {key!r} holds a control character: {pair!r}")


def check_config(config: Mapping[str, str]) -> dict[str, str]:
    """Validate a config mapping.

    Args:
        config: Keys to values.

    Returns:
        A plain dict copy.

    Raises:
        ValidationError: More than ``MAX_CONFIG_ENTRIES`` entries, or a key or value
            breaks the rules above.
    """
    if len(config) > MAX_CONFIG_ENTRIES:
        raise ValidationError(f"config has {len(config)} entries; at most {MAX_CONFIG_ENTRIES}")
    for key, value in config.items():
        _check_pair(key, value, f"{key}={value}")
    return dict(config)


def parse_config(items: Iterable[str]) -> dict[str, str]:
    """Parse ``k=v[,k=v]`` texts, as given with repeated ``--config`` options.

    Spaces around keys and values are dropped. A value cannot hold a comma.

    Args:
        items: The texts, such as ``["threshold=0.5,mode=fast", "labels=on"]``.

    Returns:
        The config.

    Raises:
        ValidationError: A pair is not ``key=value``, a key is malformed or given
            twice, a value is too long or holds a control character, or there are
            too many pairs. The message names the pair.
    """
    config: dict[str, str] = {}
    for item in items:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValidationError(f"bad config pair {pair!r}: {_FORM}")
            key, value = key.strip(), value.strip()
            _check_pair(key, value, pair)
            if key in config:
                raise ValidationError(f"config key {key!r} given twice")
            config[key] = value
            if len(config) > MAX_CONFIG_ENTRIES:
                raise ValidationError(f"more than {MAX_CONFIG_ENTRIES} config pairs")
    return config


def config_from(config: ConfigInput) -> dict[str, str]:
    """A checked config from a mapping, one ``k=v[,k=v]`` text or several (``None``: empty).

    Raises:
        ValidationError: As :func:`check_config` and :func:`parse_config`.
    """
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return check_config(config)
    if isinstance(config, str):
        return parse_config([config])
    return parse_config(config)
