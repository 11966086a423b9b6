"""Console benchmark: the console's read side over 10,000 devices and a month of telemetry.

Run: ``python tests/bench/bench_console.py [--devices 10000] [--days 30] [--per-day 4]``
(``--db sqlite`` or ``--db postgresql`` for one database; both by default).

For each database (a SQLite file, and a fresh schema in PostgreSQL's ``test``
database: ``EDGESKILL_TEST_PG`` or ``postgresql://postgres@127.0.0.1:5432/test``)
it fills a hub's store in bulk: devices with labels, profiles (four boards)
and reported states, mixed presence, a tenth in a second project, groups, an
all-at-once deployment and a staged (canary) one, and a month of telemetry.
One window per device and skill every 6 hours by default (``--per-day 4``:
1.8 M windows for 10,000 devices of 1.5 skills each; one an hour would be
10.8 M, too slow to generate on a 2-core machine). Daily usage, which the
usage report reads, has one row per device, skill and day whatever the rate.
It folds the month into daily usage (timed), then serves the store with the
real console app (``cloud.console.app``) under uvicorn in a separate process
and times HTTP requests from this one:

* ``list``: ``GET /devices`` with a label, a skill version and presence (first page of 50);
* ``detail``: ``GET /devices/{id}`` of a random device;
* ``rollout``: ``GET /deployments/{id}`` of the staged deployment (a group of 1,000 devices);
* ``usage``: ``GET /usage`` for the whole month, per device, skill and version;
* ``overview``: ``GET /fleet/overview`` (presence per group, versions in the field, alerts).

Each is also timed through the service layer in this process, and as the raw
SQL of the same query (the baseline); the table gives p50/p99 of each and the
HTTP p99 over the SQL p99. Goal: HTTP p99 under 100 ms. Results go to
``tests/bench/results/console.json`` (one row per database and query; a rerun
replaces its own rows).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

if str(Path(__file__).resolve().parents[2]) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RESULTS = Path(__file__).parent / "results" / "console.json"
GOAL_P99_MS = 100.0
DAY_MS = 86_400_000
BOARDS = ("rpi4", "jetson-nano", "coral-dev", "x86")
#: The moment the fleet is looked at (a fixed UTC midnight plus 12 h, so a month is 30 whole days).
NOW_MS = 20_100 * DAY_MS + 12 * 3_600_000
console = Console()


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _timed(fn: Callable[[], object], n: int, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), _pct(samples, 0.99)


# ----------------------------------------------------------------------------- filling


def _device(i: int) -> str:
    return f"dev-{i:05d}"


def _skills_json(i: int) -> str:
    from dataclasses import asdict  # noqa: PLC0415

    from cloud.store import SkillStatusRecord  # noqa: PLC0415

    skills = [SkillStatusRecord("detector", "2.0.0" if i % 3 else "1.0.0", "running")]
    if i % 2 == 0:
        state = "failed" if i % 97 == 0 else "running"
        skills.append(
            SkillStatusRecord("plates", "0.3.0", state, error="" if state == "running" else "oom")
        )
    return json.dumps([asdict(s) for s in skills], sort_keys=True)


def _skills_of(i: int) -> list[tuple[str, str]]:
    skills = [("detector", "2.0.0" if i % 3 else "1.0.0")]
    if i % 2 == 0:
        skills.append(("plates", "0.3.0"))
    return skills


def _device_rows(
    n: int, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    devices, labels, reports = [], [], []
    for i in range(n):
        kind = rng.random()
        if kind < 0.7:  # online
            seen, connected = NOW_MS - rng.randrange(0, 9000), True
        elif kind < 0.8:  # stale: quiet, never said goodbye
            seen, connected = NOW_MS - rng.randrange(60_000, 3 * DAY_MS), True
        else:
            seen, connected = NOW_MS - rng.randrange(60_000, 20 * DAY_MS), False
        profile = json.dumps(
            {"board": BOARDS[i % 4], "ram_mb": 1024 * (1 + i % 4)},
            sort_keys=True,
            separators=(",", ":"),
        )
        devices.append({
            "device_id": _device(i), "profile": profile, "last_seen_ms": seen, "online": connected,
            "heartbeat_ms": 5000, "project": "acme" if i % 10 == 9 else "default",
        })  # fmt: skip
        for key, value in (("site", f"s{i % 50:02d}"), ("kind", "camera" if i % 4 else "gate"),
                           ("tier", f"t{i % 10}")):  # fmt: skip
            labels.append({"device_id": _device(i), "key": key, "value": value})
        reports.append(
            {
                "device_id": _device(i),
                "generation": 1,
                "skills": _skills_json(i),
                "reported_ms": seen,
            }
        )
    return devices, labels, reports


_TELEMETRY_COLUMNS = (
    "msg_id", "device_id", "skill", "version", "inferences", "labelled", "correct",
    "latency_p50_ms", "latency_p99_ms", "latency_p95_ms", "errors", "window_start_ms",
    "window_end_ms", "dropped_messages", "metrics", "received_ms",
)  # fmt: skip


def _telemetry_chunks(
    n: int, days: int, per_day: int, chunk: int
) -> Iterator[list[tuple[Any, ...]]]:
    """Windows in time order (as they arrive), ``chunk`` rows at a time."""
    step = DAY_MS // per_day
    start = (NOW_MS // DAY_MS - days) * DAY_MS
    rows: list[tuple[Any, ...]] = []
    for slot in range(days * per_day):
        end = start + (slot + 1) * step
        for i in range(n):
            for skill, version in _skills_of(i):
                inf = 500 + (i * 7 + slot * 13) % 1000
                rows.append((
                    f"m{slot}-{i}-{skill}", _device(i), skill, version, inf, inf // 10, inf // 11,
                    12.5, 40.0, 30.0, 0, end - step, end, 0, "{}", end + 500,
                ))  # fmt: skip
                if len(rows) >= chunk:
                    yield rows
                    rows = []
    if rows:
        yield rows


def _insert_telemetry(engine: Any, rows: list[tuple[Any, ...]]) -> None:
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cols = ", ".join(_TELEMETRY_COLUMNS)
        if engine.dialect.name == "sqlite":
            marks = ", ".join("?" * len(_TELEMETRY_COLUMNS))
            # the store's engine runs the driver in autocommit: one transaction, not one a row
            cur.execute("BEGIN")
            cur.executemany(f"INSERT INTO telemetry ({cols}) VALUES ({marks})", rows)
        else:
            import io  # noqa: PLC0415

            buf = io.StringIO()
            for row in rows:
                buf.write("\t".join(str(v) for v in row) + "\n")
            buf.seek(0)
            cur.copy_expert(f"COPY telemetry ({cols}) FROM STDIN", buf)
        raw.commit()
    finally:
        raw.close()


def fill(fleet: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Fill the fleet's store; what the timed requests need (ids, deployment)."""
    from cloud.rollout.plan import plan_from_dict  # noqa: PLC0415
    from cloud.store.schema import device_labels, devices, reported_states  # noqa: PLC0415

    store = fleet._hub.store
    rng = random.Random(7)
    n = args.devices
    dev_rows, label_rows, report_rows = _device_rows(n, rng)
    per_skill = sum(len(_skills_of(i)) for i in range(n))
    total_windows = per_skill * args.days * args.per_day
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("devices", total=n)
        with store.engine.begin() as conn:
            for k in range(0, n, 2000):
                conn.execute(devices.insert(), dev_rows[k : k + 2000])
                conn.execute(device_labels.insert(), label_rows[3 * k : 3 * (k + 2000)])
                conn.execute(reported_states.insert(), report_rows[k : k + 2000])
                progress.advance(task, min(2000, n - k))
        task = progress.add_task("telemetry windows", total=total_windows)
        for rows in _telemetry_chunks(n, args.days, args.per_day, 20_000):
            _insert_telemetry(store.engine, rows)
            progress.advance(task, len(rows))
    for skill, version in (("detector", "1.0.0"), ("detector", "2.0.0"), ("plates", "0.3.0")):
        store.add_skill_version(
            skill, version, target_name=f"{skill}-{version}.skill", sha256="a" * 64, size=1,
            manifest="[skill]", now_ms=NOW_MS - DAY_MS,
        )  # fmt: skip
    fleet.groups.create("cameras", "kind=camera")
    fleet.groups.create("tier-3", "tier=t3")
    store.create_deployment("detector", "2.0.0", "cameras", now_ms=NOW_MS - DAY_MS)
    plan = plan_from_dict({"strategy": "canary", "canary": 50})
    staged = store.create_deployment(
        "plates", "0.3.0", "tier-3", plan=plan, now_ms=NOW_MS - 3600_000
    )
    started = time.perf_counter()
    folded = fleet_metering(store).fold()
    fold_s = time.perf_counter() - started
    console.print(f"  {n} devices, {total_windows:,} windows; folded {folded:,} in {fold_s:.1f} s")
    return {"deployment": staged.id, "windows": total_windows, "fold_s": fold_s, "folded": folded}


def fleet_metering(store: Any) -> Any:
    from cloud.service.metering import MeteringService  # noqa: PLC0415

    return MeteringService(store)


# ----------------------------------------------------------------------------- targets

LIST_QUERY = {
    "label": "site=s07",
    "skill": "detector",
    "version": "2.0.0",
    "presence": "online",
    "limit": "50",
}


def _raw_sql(dialect: str) -> dict[str, str | tuple[str, ...]]:
    """The baseline: each request's query written out by hand."""
    if dialect == "sqlite":
        has_skill = (
            "EXISTS (SELECT 1 FROM reported_states r, json_each(r.skills) e"
            " WHERE r.device_id = d.device_id AND json_extract(e.value, '$.name') = :skill"
            " AND json_extract(e.value, '$.version') = :version)"
        )
    else:
        has_skill = (
            "EXISTS (SELECT 1 FROM reported_states r WHERE r.device_id = d.device_id"
            " AND CAST(r.skills AS JSONB) @> CAST(:pattern AS JSONB))"
        )
    where = (
        "d.project = 'default' AND EXISTS (SELECT 1 FROM device_labels l"
        " WHERE l.device_id = d.device_id AND l.key = 'site' AND l.value = 's07')"
        " AND d.online AND d.last_seen_ms >= :fresh AND " + has_skill
    )
    if dialect == "sqlite":
        versions = (
            "SELECT json_extract(e.value, '$.name'), json_extract(e.value, '$.version'), count(*)"
            " FROM reported_states r JOIN devices d ON d.device_id = r.device_id,"
            " json_each(r.skills) e"
            " WHERE d.project = 'default' GROUP BY 1, 2"
        )
    else:
        versions = (
            "SELECT e.value ->> 'name', e.value ->> 'version', count(*) FROM reported_states r"
            " JOIN devices d ON d.device_id = r.device_id,"
            " jsonb_array_elements(CAST(r.skills AS JSONB)) e"
            " WHERE d.project = 'default' GROUP BY 1, 2"
        )
    per_group = (
        "SELECT d.online AND d.last_seen_ms >= :fresh, d.online, count(*) FROM devices d"
        " WHERE d.project = 'default' AND EXISTS (SELECT 1 FROM device_labels l"
        " WHERE l.device_id = d.device_id AND l.key = :key AND l.value = :value) GROUP BY 1, 2"
    )
    return {
        "overview": (versions, per_group),
        "list": (
            f"SELECT (SELECT count(*) FROM devices d WHERE {where}) AS total, d.*, r.skills"
            " FROM devices d LEFT JOIN reported_states r ON r.device_id = d.device_id"
            f" WHERE {where} ORDER BY d.device_id LIMIT 51"
        ),
        "detail": (
            "SELECT d.*, r.skills, s.skills AS desired,"
            " (SELECT count(*) FROM device_labels l WHERE l.device_id = d.device_id),"
            " (SELECT max(id) FROM hub_events e WHERE e.device_id = d.device_id),"
            " (SELECT max(t.id) FROM telemetry t"
            "  WHERE t.device_id = d.device_id AND t.skill = 'detector')"
            " FROM devices d LEFT JOIN reported_states r ON r.device_id = d.device_id"
            " LEFT JOIN desired_states s ON s.device_id = d.device_id WHERE d.device_id = :device"
        ),
        "rollout": (
            "SELECT d.device_id, d.last_seen_ms, d.online, r.skills FROM devices d"
            " LEFT JOIN reported_states r ON r.device_id = d.device_id"
            " WHERE d.project = 'default' AND EXISTS (SELECT 1 FROM device_labels l"
            " WHERE l.device_id = d.device_id AND l.key = 'tier' AND l.value = 't3')"
        ),
        "usage": (
            "SELECT project, device_id, skill, version, sum(inferences), sum(windows)"
            " FROM usage_daily WHERE project = 'default' AND day >= :first AND day <= :last"
            " GROUP BY project, device_id, skill, version"
            " ORDER BY project, device_id, skill, version"
        ),
    }


def _sql_targets(engine: Any, rng: random.Random, n: int) -> dict[str, Callable[[], object]]:
    from sqlalchemy import text  # noqa: PLC0415

    queries = _raw_sql(engine.dialect.name)
    base = {
        "fresh": NOW_MS - 10_000, "skill": "detector", "version": "2.0.0",
        "pattern": json.dumps([{"name": "detector", "version": "2.0.0"}]),
        "first": NOW_MS // DAY_MS - 30, "last": NOW_MS // DAY_MS,
    }  # fmt: skip

    def run(name: str) -> Callable[[], object]:
        query = queries[name]
        statements = [text(q) for q in ((query,) if isinstance(query, str) else query)]

        def once() -> object:
            params = {**base, "device": _device(rng.randrange(n) // 10 * 10)}
            groups = [{"key": "kind", "value": "camera"}, {"key": "tier", "value": "t3"}]
            with engine.connect() as conn:
                for sql in statements:
                    wanted = set(sql.compile().params)
                    for extra in groups if "key" in wanted else [{}]:
                        given = {**params, **extra}
                        conn.execute(sql, {k: v for k, v in given.items() if k in wanted}).all()
            return None

        return once

    return {name: run(name) for name in queries}


def _service_targets(
    fleet: Any, deployment: int, rng: random.Random, n: int
) -> dict[str, Callable[[], object]]:
    from cloud.service.search import DeviceSearch  # noqa: PLC0415

    store = fleet._hub.store
    search = DeviceSearch(store, clock=lambda: NOW_MS)
    metering = fleet_metering(store)
    return {
        "list": lambda: search.search(
            "default",
            labels="site=s07",
            skill="detector",
            version="2.0.0",
            presence="online",
            limit=50,
        ),
        "detail": lambda: fleet.devices.show(_device(rng.randrange(n) // 10 * 10)),
        "rollout": lambda: fleet.deployments.status(deployment),
        "usage": lambda: metering.usage("default", NOW_MS - 30 * DAY_MS, NOW_MS),
        "overview": lambda: search.overview("default"),
    }


def _http_targets(
    base: str, token: str, deployment: int, rng: random.Random, n: int
) -> tuple[Any, dict[str, Callable[[], object]]]:
    """The HTTP requests, one function each (the only place that knows the REST API)."""
    import httpx  # noqa: PLC0415

    client = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )

    def get(path: str, params: dict[str, str] | None = None) -> object:
        reply = client.get(path, params=params)
        reply.raise_for_status()
        return reply.content

    month = {"since": str(NOW_MS - 30 * DAY_MS), "until": str(NOW_MS)}
    return client, {
        "list": lambda: get("/devices", LIST_QUERY),
        "detail": lambda: get(f"/devices/{_device(rng.randrange(n) // 10 * 10)}"),
        "rollout": lambda: get(f"/deployments/{deployment}"),
        "usage": lambda: get("/usage", month),
        "overview": lambda: get("/fleet/overview"),
    }


# ----------------------------------------------------------------------------- the server


def serve(home: str, port: int) -> None:
    """Serve the console over the hub at ``home`` (the child process)."""
    import uvicorn  # noqa: PLC0415

    from cloud.console.app import create_app  # noqa: PLC0415
    from cloud.service import FleetService  # noqa: PLC0415

    with FleetService.open(Path(home)) as fleet:
        app = create_app(fleet, clock=lambda: NOW_MS)
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(home: Path) -> Iterator[str]:
    import httpx  # noqa: PLC0415

    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(home), "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{base}/api/v1/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise SystemExit("the console server exited at start") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def store_url(db: str, work: Path) -> Iterator[str]:
    if db == "sqlite":
        yield f"sqlite:///{work / 'hub.db'}"
        return
    from sqlalchemy import create_engine, text  # noqa: PLC0415
    from sqlalchemy.engine import make_url  # noqa: PLC0415

    from tests.support.services import postgres_urls  # noqa: PLC0415

    base = postgres_urls()[0]
    schema = f"bench_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield (
            make_url(base)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


def run_db(db: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from sqlalchemy import text  # noqa: PLC0415

    from cloud.service import FleetService  # noqa: PLC0415

    console.print(f"[bold]{db}[/bold]: filling")
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="es-bench-console-") as tmp,
        store_url(db, Path(tmp)) as url,
    ):
        home = Path(tmp) / "hub"
        with FleetService.init(home, url, insecure=True) as fleet:
            facts = fill(fleet, args)
            if db == "postgresql":
                with fleet._hub.store.engine.connect() as conn:
                    conn.execute(text("ANALYZE"))
                    conn.commit()
            _view, token = fleet.tokens.create("bench", "admin", "default")
            rng = random.Random(11)
            sql = {
                k: _timed(f, args.samples)
                for k, f in _sql_targets(fleet._hub.store.engine, rng, args.devices).items()
            }
            service = {
                k: _timed(f, args.samples)
                for k, f in _service_targets(fleet, facts["deployment"], rng, args.devices).items()
            }
        with server(home) as base:
            client, targets = _http_targets(base, token, facts["deployment"], rng, args.devices)
            with client:
                http = {k: _timed(f, args.samples, warmup=5) for k, f in targets.items()}
    for name in ("list", "detail", "rollout", "usage", "overview"):
        rows.append({
            "db": db, "query": name, "devices": args.devices, "windows": facts["windows"],
            "fold_s": round(facts["fold_s"], 2), "samples": args.samples,
            "sql_p50_ms": round(sql[name][0], 2), "sql_p99_ms": round(sql[name][1], 2),
            "service_p50_ms": round(service[name][0], 2),
            "service_p99_ms": round(service[name][1], 2),
            "http_p50_ms": round(http[name][0], 2), "http_p99_ms": round(http[name][1], 2),
            "p99_vs_sql": round(http[name][1] / max(sql[name][1], 1e-3), 1),
            "goal_met": http[name][1] < GOAL_P99_MS,
        })  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"console reads (p50 / p99 ms; goal: HTTP p99 < {GOAL_P99_MS:.0f} ms)")
    for col in ("db", "query", "raw SQL", "service", "HTTP", "HTTP p99 / SQL p99", "goal"):
        table.add_column(col, justify="left" if col in ("db", "query") else "right")
    for r in rows:
        table.add_row(
            r["db"], r["query"], f"{r['sql_p50_ms']:.1f} / {r['sql_p99_ms']:.1f}",
            f"{r['service_p50_ms']:.1f} / {r['service_p99_ms']:.1f}",
            f"{r['http_p50_ms']:.1f} / {r['http_p99_ms']:.1f}", f"{r['p99_vs_sql']:.1f}x",
            "[green]met[/green]" if r["goal_met"] else "[red]missed[/red]",
        )  # fmt: skip
    console.print(table)


def save(rows: list[dict[str, Any]]) -> None:
    old = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else []
    mine = {(r["db"], r["query"], r["devices"]) for r in rows}
    kept = [r for r in old if (r["db"], r["query"], r["devices"]) not in mine]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(kept + rows, indent=2) + "\n", encoding="utf-8")
    console.print(f"wrote {RESULTS}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument(
        "--per-day", type=int, default=4, help="telemetry windows per device and skill a day"
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    os.environ.setdefault("EDGESKILL_LOG", "warning")
    rows = []
    for db in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        rows += run_db(db, args)
    report(rows)
    if not args.no_save:
        save(rows)


if __name__ == "__main__":
    main()
