"""Trust client benchmark: the cost of one ``fetch_target`` (and ``refresh``) with nothing new.

Run: ``python tests/bench/bench_trust_client.py [--calls 200] [--targets 50]``

A hub repository in a temporary folder holds ``--targets`` signed targets of
64 KiB; the client's fetch function reads straight from it (no network). Every
case first fetches the target once, so each timed call finds it cached and only
the metadata work and the private copy are left:

* ``cold``: a new :class:`~skills.trust.TrustClient` on the same state folder per
  call, so nothing verified earlier in the process is reused (what every call
  cost before the client kept its verified metadata between refreshes);
* ``warm``: one client for all calls, as an agent has;
* ``warm, new timestamp``: one client, the hub publishing a new timestamp
  before each call (outside the timed part), so every refresh has work to do.

Each row gives wall-clock ms and CPU ms per call, and ``cold / warm``; it
prints a table and writes ``tests/bench/results/trust_client.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from skills.trust import TrustClient, TrustRepository
from tests.fakes.hub_fetch import HubFetch

RESULTS = Path(__file__).parent / "results" / "trust_client.json"
NAME = "bench/skill-0.skill"
console = Console()


def _hub(folder: Path, targets: int) -> TrustRepository:
    repo = TrustRepository.init(folder / "hub")
    source = folder / "src"
    for i in range(targets):
        source.write_bytes(i.to_bytes(4, "big") * (16 * 1024))
        repo.add_target(f"bench/skill-{i}.skill", source)
    return repo


def _time(calls: int, one: Callable[[], object], before: Callable[[], object]) -> dict[str, float]:
    wall = cpu = 0.0
    for _ in range(calls):
        before()
        w0, c0 = time.perf_counter(), time.process_time()
        one()
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
    return {"ms_per_call": 1000 * wall / calls, "cpu_ms_per_call": 1000 * cpu / calls}


def _cases(folder: Path, repo: TrustRepository, calls: int) -> dict[str, dict[str, float]]:
    state = folder / "agent"
    fetch = HubFetch(repo)
    warm = TrustClient(state, fetch, repo.root_json())
    warm.fetch_target(NAME)

    def nothing() -> None:
        fetch.calls.clear()

    return {
        "fetch_target cold": _time(
            calls, lambda: TrustClient(state, fetch).fetch_target(NAME), nothing
        ),
        "fetch_target warm": _time(calls, lambda: warm.fetch_target(NAME), nothing),
        "refresh cold": _time(calls, lambda: TrustClient(state, fetch).refresh(), nothing),
        "refresh warm": _time(calls, warm.refresh, nothing),
        "fetch_target warm, new timestamp": _time(
            calls, lambda: warm.fetch_target(NAME), repo.refresh_timestamp
        ),
    }


def main() -> None:
    """Run the cases, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--targets", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = _cases(folder, _hub(folder, args.targets), args.calls)
    table = Table(title=f"TrustClient, {args.calls} calls, {args.targets} targets listed")
    for column in ("case", "ms/call", "CPU ms/call", "cold / this (CPU)"):
        table.add_column(column)
    for case, row in rows.items():
        cold = rows[f"{case.split()[0]} cold"]["cpu_ms_per_call"]
        table.add_row(
            case,
            f"{row['ms_per_call']:.3f}",
            f"{row['cpu_ms_per_call']:.3f}",
            f"{cold / row['cpu_ms_per_call']:.1f}",
        )
    console.print(table)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"calls": args.calls, "targets": args.targets, **rows}, indent=2))


if __name__ == "__main__":
    main()
