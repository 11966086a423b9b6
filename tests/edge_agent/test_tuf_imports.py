"""The agent's python-tuf client without urllib3: it still verifies, and nothing falls back to HTTP.

Each case runs in a fresh interpreter: the stand-in is only installed before
``tuf.ngclient`` is first imported, and pytest's own process imported it long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_the_client_verifies_and_refuses_tampering_with_no_http_library_loaded(
    tmp_path: Path,
) -> None:
    found = _run(
        f"""
        import json, sys
        from pathlib import Path
        from edge_agent.tuf_imports import skip_http_fetcher
        installed = skip_http_fetcher()
        from skills.errors import TrustError
        from skills.trust import TrustClient, TrustRepository
        from tests.fakes.hub_fetch import HubFetch

        work = Path({str(tmp_path)!r})
        repo = TrustRepository.init(work / "hub")
        (work / "bundle").write_bytes(b"bundle bytes" * 100)
        ref = repo.add_target("digits/digits-1.0.0.skill", work / "bundle")
        fetch = HubFetch(repo)
        client = TrustClient(work / "agent", fetch, repo.root_json())
        got = client.fetch_target("digits/digits-1.0.0.skill").read_bytes()
        fetch.override[ref.path] = b"tampered" * 150
        try:
            TrustClient(work / "agent2", fetch, repo.root_json()).fetch_target(
                "digits/digits-1.0.0.skill"
            )
            refused = ""
        except TrustError as exc:
            refused = str(exc)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("urllib3", "http", "email"))
        print(json.dumps({{
            "installed": installed, "ok": got == b"bundle bytes" * 100,
            "refused": refused, "loaded": loaded,
            "email": [m for m in loaded if m.startswith(("email.message", "email.parser"))],
        }}))
        """
    )
    assert found["installed"] is True
    assert found["ok"] is True
    assert found["refused"], "a tampered bundle was accepted"
    loaded = found["loaded"]
    assert isinstance(loaded, list)
    assert not [m for m in loaded if m.split(".")[0] in ("urllib3", "http")], loaded
    assert found["email"] == []  # http.client's parser and messages never loaded


def test_an_updater_without_the_agents_fetcher_refuses_to_fetch_over_http(tmp_path: Path) -> None:
    found = _run(
        f"""
        import json
        from pathlib import Path
        from edge_agent.tuf_imports import HttpFetcherDisabledError, skip_http_fetcher
        skip_http_fetcher()
        from tuf.ngclient import Updater
        from skills.trust import TrustRepository

        work = Path({str(tmp_path)!r})
        repo = TrustRepository.init(work / "hub")
        (work / "md").mkdir()
        try:
            Updater(str(work / "md"), "https://hub.example/metadata/", bootstrap=repo.root_json())
            said = ""
        except HttpFetcherDisabledError as exc:
            said = str(exc)
        print(json.dumps({{"said": said}}))
        """
    )
    assert "only over its hub connection" in str(found["said"])


def test_nothing_changes_when_python_tuf_was_already_imported() -> None:
    found = _run(
        """
        import json, sys
        import tuf.ngclient
        real = sys.modules["tuf.ngclient.urllib3_fetcher"]
        from edge_agent.tuf_imports import skip_http_fetcher
        first, again = skip_http_fetcher(), skip_http_fetcher()
        print(json.dumps({
            "first": first, "again": again,
            "same": sys.modules["tuf.ngclient.urllib3_fetcher"] is real,
            "urllib3": "urllib3" in sys.modules,
        }))
        """
    )
    assert found == {"first": False, "again": False, "same": True, "urllib3": True}


def test_a_second_call_keeps_the_stand_in() -> None:
    found = _run(
        """
        import json
        from edge_agent.tuf_imports import skip_http_fetcher
        print(json.dumps({"calls": [skip_http_fetcher(), skip_http_fetcher()]}))
        """
    )
    assert found == {"calls": [True, True]}
