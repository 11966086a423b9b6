"""Fixtures of the console tests: the API's world (world.py) and the browser rig (rig.py)."""

from tests.console.rig import browser, page, playwright, rig
from tests.console.world import client, console_template, world

__all__ = ["browser", "client", "console_template", "page", "playwright", "rig", "world"]
