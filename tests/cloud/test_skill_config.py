"""Deployment config pairs: every pair well formed, or an error naming it."""

from __future__ import annotations

import pytest

from cloud.errors import ValidationError
from cloud.skill_config import check_config, config_from, parse_config
from protos.limits import MAX_CONFIG_ENTRIES, MAX_CONFIG_VALUE_BYTES


def test_pairs_from_one_or_several_options() -> None:
    assert parse_config(["threshold=0.5,mode=fast", "labels = on "]) == {
        "threshold": "0.5",
        "mode": "fast",
        "labels": "on",
    }
    assert parse_config([]) == {}
    assert parse_config(["url=http://x/?a=b"]) == {"url": "http://x/?a=b"}  # first '=' splits
    assert parse_config(["note="]) == {"note": ""}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["notkv"], "bad config pair 'notkv': expected key=value"),
        (["a:b"], "bad config pair 'a:b': expected key=value"),
        (["a=1,notkv"], "bad config pair 'notkv'"),
        (["a=1,"], "bad config pair ''"),
        ([""], "bad config pair ''"),
        (["=1"], "bad config key '' in '=1'"),
        (["1a=b"], "bad config key '1a' in '1a=b'"),
        (["a b=c"], "bad config key 'a b'"),
        (["a=1", "a=2"], "config key 'a' given twice"),
        (["a=x\ny"], "config value of 'a' holds a control character"),
        ([f"a={'v' * (MAX_CONFIG_VALUE_BYTES + 1)}"], f"over {MAX_CONFIG_VALUE_BYTES} bytes"),
        ([",".join(f"k{i}=v" for i in range(MAX_CONFIG_ENTRIES + 1))], "config pairs"),
    ],
)
def test_a_malformed_pair_is_an_error_naming_it(items: list[str], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_config(items)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_mapping_is_held_to_the_same_rules() -> None:
    assert check_config({"threshold": "0.5"}) == {"threshold": "0.5"}
    with pytest.raises(ValidationError, match="bad config key 'a:b'"):
        check_config({"a:b": "1"})
    with pytest.raises(ValidationError, match="expected text"):
        check_config({"a": 1})  # type: ignore[dict-item]


def test_config_from_takes_a_mapping_a_text_or_several() -> None:
    assert config_from(None) == {}
    assert config_from({"a": "1"}) == {"a": "1"}
    assert config_from("a=1,b=2") == {"a": "1", "b": "2"}
    assert config_from(["a=1", "b=2"]) == {"a": "1", "b": "2"}
    with pytest.raises(ValidationError, match="'notkv'"):
        config_from("notkv")
