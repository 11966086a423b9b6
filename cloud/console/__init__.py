"""The hub's web console: a REST API (FastAPI, OpenAPI) over the fleet service, and pages.

:func:`create_app` builds the app over an open :class:`~cloud.service.FleetService`;
:func:`~cloud.console.server.start_console` serves it inside the hub's event loop.
"""

from cloud.console.app import API_PREFIX, create_app

__all__ = ["API_PREFIX", "create_app"]
