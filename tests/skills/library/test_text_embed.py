"""The ``text-embed`` skill: MiniLM built into ONNX, on sentence-transformers' own example.

The corpus and queries are the semantic-search example of the sentence-transformers
documentation (sbert.net, "Semantic Search"), whose published answers this model
gives: each query's nearest corpus sentence is its paraphrase, and paraphrases
are closer than unrelated sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.skills.library.conftest import Harness

CORPUS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "A cheetah is running behind its prey.",
]
#: Each query and the corpus sentence the documentation finds first.
QUERIES = {
    "A man is eating pasta.": "A man is eating food.",
    "Someone in a gorilla costume is playing a set of drums.": "A monkey is playing drums.",
    "A cheetah chases prey on across a field.": "A cheetah is running behind its prey.",
}


@pytest.fixture(scope="module")
def embed(library_skill: Callable[[str], Harness]) -> Harness:
    return library_skill("text-embed")


def test_each_query_finds_its_paraphrase_first(embed: Harness) -> None:
    skill = embed.skill()
    corpus = np.asarray(skill.process({"texts": CORPUS})["embeddings"])
    queries = np.asarray(skill.process({"texts": list(QUERIES)})["embeddings"])
    scores = queries @ corpus.T
    for row, best in zip(scores, QUERIES.values(), strict=True):
        assert CORPUS[int(row.argmax())] == best
        paraphrase = row[CORPUS.index(best)]
        unrelated = np.delete(row, CORPUS.index(best))
        assert paraphrase > unrelated.max() + 0.1  # a clear margin, not a tie


def test_embeddings_are_unit_vectors_and_batching_does_not_change_them(embed: Harness) -> None:
    skill = embed.skill()
    one = np.asarray(skill.process({"text": CORPUS[2]})["embedding"])
    batch = np.asarray(skill.process({"texts": CORPUS[:4]})["embeddings"])  # padded batch
    assert one.shape == (384,) and np.linalg.norm(one) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(batch[2], one, atol=1e-5)


def test_long_text_is_truncated_to_max_tokens(embed: Harness) -> None:
    result = embed.skill({"max_tokens": "16"}).process({"text": " ".join(CORPUS)})
    assert result["tokens"] == [16]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({}, "no 'text'"),
        ({"text": 3}, "string"),
        ({"texts": []}, "1..64"),
        ({"texts": ["a"] * 65}, "1..64"),
    ],
)
def test_bad_items_fail(embed: Harness, item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        embed.skill().process(item)


def test_drift_fields_are_the_nearest_topic_and_the_token_count(embed: Harness) -> None:
    skill = embed.skill()
    expected = {
        "Heavy snow closed the mountain pass overnight.": "weather",
        "The striker scored a hat-trick in the cup final.": "sport",
        "The surgeon operated on her broken hip.": "health",
        "Whisk the eggs with sugar and flour.": "food",
    }
    for text, topic in expected.items():
        result = skill.process({"text": text})
        assert result["label"] == topic
        assert 0.5 < result["confidence"] <= 1.0
        assert result["summaries"] == {"tokens": float(result["tokens"][0])}
    batch = skill.process({"texts": list(expected)})
    assert batch["label"] == "weather"  # a batch's topic is its first text's
    assert batch["summaries"]["tokens"] == pytest.approx(np.mean(batch["tokens"]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[topics]\nonly = ['one topic']\n", "2 to 32 topics"),
        ("[topics]\na = ['x']\nb = []\n", "'b' needs 1 to 16 example sentences"),
        ("[topics]\na = ['x']\nb = [3]\n", "'b' needs 1 to 16"),
        ("topics = 'x'", "needs a \\[topics\\] table"),
        ("[topics", "cannot read"),
        ("x" * 70_000, "over 65536 bytes"),
    ],
)
def test_a_malformed_topics_file_fails_setup(
    embed: Harness, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "topics.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        embed.module().read_topics(path)
