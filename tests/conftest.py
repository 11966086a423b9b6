"""Settings every test process shares, made before any project module is imported.

The CLI's rich consoles fix their width when they are made, from ``COLUMNS``;
one width for the whole run keeps tables from wrapping differently depending
on which test happened to import the CLI first (or on which worker it ran).
"""

from __future__ import annotations

import os

os.environ["COLUMNS"] = "120"
