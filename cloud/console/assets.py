"""Where the console's third-party browser assets are: npm's folder, installed at set-up.

The console's own pages (``static/``) are committed; the libraries they use
(uPlot) are not. ``make setup`` installs them with ``npm ci`` from
``web/package-lock.json`` into ``web/node_modules``, and the REST app serves
that folder under ``/assets/``: nothing is fetched from a CDN while the console
runs. ``EDGESKILL_CONSOLE_ASSETS`` names another folder laid out the same way
(a packaged install, or a test).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["ASSETS_ENV", "STATIC_ROOT", "WEB_ROOT", "asset_root"]

#: The environment variable that overrides where the assets are.
ASSETS_ENV: Final = "EDGESKILL_CONSOLE_ASSETS"
#: The console's own pages, scripts and styles.
STATIC_ROOT: Final = Path(__file__).resolve().parent / "static"
#: The npm project (package.json and its lock) of the third-party assets.
WEB_ROOT: Final = Path(__file__).resolve().parent / "web"


def asset_root() -> Path | None:
    """The folder served under ``/assets/``, or None when the assets are not installed.

    ``$EDGESKILL_CONSOLE_ASSETS`` when set (and a folder), else ``web/node_modules``
    when ``npm ci`` has filled it. The pages still load without it; only the plots
    say that their library is missing.
    """
    override = os.environ.get(ASSETS_ENV)
    candidate = Path(override) if override else WEB_ROOT / "node_modules"
    return candidate.resolve() if candidate.is_dir() else None
