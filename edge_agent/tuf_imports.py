"""Import python-tuf's client without its HTTP fetcher, in a process that never uses it.

``tuf.ngclient``'s package always imports ``tuf.ngclient.urllib3_fetcher``, and with it
urllib3, ``http.client``, ``email`` and ``importlib.metadata``: about 3.3 MB that stay
resident for the life of an agent (measured on x86_64, CPython 3.11), although the agent
fetches every TUF file over its own hub connection (:class:`skills.trust.TrustClient`
hands ngclient a fetcher of its own, always).

:func:`skip_http_fetcher`, called before ``tuf.ngclient`` is first imported, registers a
stand-in for that one module. Its ``Urllib3Fetcher`` refuses to be built, so a code
path that would fall back to fetching over HTTP, around the agent's authenticated
transport, fails loudly instead. The rest of ngclient (the updater and its verification
of every role) is python-tuf's own, unchanged.
"""

from __future__ import annotations

import sys
import types

__all__ = ["FETCHER_MODULE", "HttpFetcherDisabledError", "skip_http_fetcher"]

#: The python-tuf module the stand-in replaces.
FETCHER_MODULE = "tuf.ngclient.urllib3_fetcher"


class HttpFetcherDisabledError(RuntimeError):
    """Something asked python-tuf for its HTTP fetcher in an agent that has none."""


class _NoHttpFetcher:
    """Stands in for ``tuf.ngclient.Urllib3Fetcher``; cannot be built."""

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        raise HttpFetcherDisabledError(
            "this agent fetches TUF files only over its hub connection; "
            "pass TrustClient's fetcher to the updater (no HTTP fetcher is loaded)"
        )


def skip_http_fetcher() -> bool:
    """Let ``tuf.ngclient`` import without urllib3 in this process.

    Returns:
        True when the stand-in is in place (now or from an earlier call); False when
        ``tuf.ngclient`` or its HTTP fetcher was imported already, which is left as it is.
    """
    current = sys.modules.get(FETCHER_MODULE)
    if current is not None:
        return getattr(current, "Urllib3Fetcher", None) is _NoHttpFetcher
    if "tuf.ngclient" in sys.modules:
        return False
    stand_in = types.ModuleType(FETCHER_MODULE, _NoHttpFetcher.__doc__)
    stand_in.Urllib3Fetcher = _NoHttpFetcher  # type: ignore[attr-defined]
    sys.modules[FETCHER_MODULE] = stand_in
    return True
