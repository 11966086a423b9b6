"""Property tests of the published OpenAPI: whatever schemathesis sends, never a 5xx.

The hub is built when the module is collected (schemathesis makes its cases from
the schema before fixtures run) in a temporary folder removed at exit.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from cloud.console import create_app
from tests.console.world import _build

_HOME = Path(tempfile.mkdtemp(prefix="console-schemathesis-"))
_WORLD = _build(_HOME / "hub")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
atexit.register(_WORLD.fleet.close)
_AUTH = _WORLD.auth("hub-admin")

schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", create_app(_WORLD.fleet)).exclude(
    path="/api/v1/events/stream"
)  # an answer that never ends


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_input_makes_a_server_error(case: schemathesis.Case) -> None:
    response = case.call(headers=_AUTH)
    case.validate_response(response, checks=[not_a_server_error])
