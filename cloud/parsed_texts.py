"""The last few values parsed from stored text, kept by the text itself.

A rollout's state and its admitted map are megabytes and hundreds of kilobytes
of JSON at 10,000 devices, read back pass after pass (and the admitted map on
every desired-state write) while unchanged. A parsed value is immutable, so the
same text may hand back the same value: looking a text up costs a hash of it,
parsing it again tens of times that.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ParsedTexts"]

T = TypeVar("T")


class ParsedTexts(Generic[T]):
    """Values ``parse`` made of the last ``size`` texts read or kept (a failed parse is not kept).

    Thread-safe: the leader's pass and the API's requests read the same texts.
    ``parse`` must return a value nobody changes.
    """

    def __init__(self, parse: Callable[[str], T], size: int) -> None:
        self._parse = parse
        self._size = size
        self._values: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> T:
        """The value of ``text``, parsed now only if it is not kept.

        Raises:
            Whatever ``parse`` raises; nothing is kept then.
        """
        with self._lock:
            if text in self._values:
                self._values.move_to_end(text)
                return self._values[text]
        value = self._parse(text)
        self.keep(text, value)
        return value

    def keep(self, text: str, value: T) -> None:
        """Keep ``value`` as the parse of ``text`` (the writer of a text knows its value)."""
        with self._lock:
            self._values[text] = value
            self._values.move_to_end(text)
            while len(self._values) > self._size:
                self._values.popitem(last=False)
