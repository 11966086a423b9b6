"""The agent's own command line: ``python -m edge_agent run``, without a CLI framework.

A device runs the agent for months; everything the process imports stays resident.
``edgeskill agent run`` goes through Typer, which brings Click, Rich and Pydantic (it
coerces every option with a Pydantic adapter) and every other ``edgeskill`` command's
module: about 15 MB of an idle agent's memory that parsing twenty options does not
need. The firmware images start the agent here; ``edgeskill agent run`` takes the same
options (a test keeps the two lists equal) and shares :func:`run_command`. On a first
boot their launcher runs ``enroll`` (the same options) before ``run``: it makes the
device's identity with the claim token and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from edge_agent import eventloop
from edge_agent.config import AgentConfig
from edge_agent.errors import AgentError, TransportError
from edge_agent.tuf_imports import skip_http_fetcher
from skills.errors import SkillError

__all__ = [
    "NATIVE_QUIET_ENV",
    "QUIET_LIBRARIES",
    "main",
    "parser",
    "quiet_native_logs",
    "run_command",
    "run_until_signal",
    "setup_logging",
]

#: Libraries whose INFO lines say nothing to an operator (alembic alone prints a line per
#: migration check at every start); they log at WARNING and above unless --verbose.
QUIET_LIBRARIES = (
    "absl",
    "ai_edge_litert",
    "alembic",
    "asyncio",
    "filelock",
    "grpc",
    "httpcore",
    "httpx",
    "onnxruntime",
    "openvino",
    "paho",
    "PIL",
    "sqlalchemy",
    "tensorflow",
    "tflite",
    "torch",
    "urllib3",
)
#: Native libraries read these from the environment once, when they are first loaded.
NATIVE_QUIET_ENV = {
    "GRPC_VERBOSITY": "ERROR",
    "TF_CPP_MIN_LOG_LEVEL": "2",  # LiteRT's (absl) logging: warnings and errors only
}
INSECURE_BANNER = (
    "WARNING: INSECURE MODE. No TLS and no device identities: anyone who "
    "reaches this port can act as any device. Use it only on a closed test network."
)


def quiet_native_logs(verbose: bool) -> None:
    """Keep native libraries' INFO output off the console unless ``verbose``.

    Call it before those libraries are imported; a value already in the
    environment wins, so a person can still turn one of them up.
    """
    if verbose:
        return
    for name, value in NATIVE_QUIET_ENV.items():
        os.environ.setdefault(name, value)


def setup_logging(verbose: bool) -> None:
    """Log our INFO lines (every line with ``verbose``); libraries' only from WARNING up."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)


def run_until_signal(main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
    """Run ``main(stop)`` until SIGINT or SIGTERM sets ``stop``."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    eventloop.run(runner())


def run_command(config: AgentConfig, *, verbose: bool, on_error: Callable[[str], None]) -> int:
    """Check the settings, then run the agent until a signal; the exit status.

    Args:
        config: The agent's settings.
        verbose: Log debug lines, and the libraries' INFO lines too.
        on_error: Shows a refusal (one line) to the operator.

    Returns:
        0 after a signal stopped the agent; 2 when the settings, the hub or a skill
        refused it (said through ``on_error``).
    """
    skip_http_fetcher()  # before python-tuf's client is imported: no urllib3 (~3 MB)
    from edge_agent.startup_checks import check_run_config  # noqa: PLC0415 - after logging
    from edge_agent.wiring import run_agent  # noqa: PLC0415 - after quiet_native_logs

    setup_logging(verbose)
    try:
        check_run_config(config)  # before anything is written: a refused start creates nothing
        run_until_signal(lambda stop: run_agent(config, stop))
    except (AgentError, SkillError, TransportError) as exc:
        on_error(str(exc))
        return 2
    return 0


def enroll_command(config: AgentConfig, *, verbose: bool, on_error: Callable[[str], None]) -> int:
    """Make (or keep, renewing when due) the device's identity, then exit; the exit status.

    The firmware's launcher enrols in this short process before it starts the agent: the
    key generation, the CSR and the enrolment's TLS channel then leave nothing resident
    in the agent that runs for months (about 1 MB; ``tests/bench/bench_footprint.py``).
    The settings are checked as ``run`` checks them, and the state folder is held.

    Returns:
        0 when the device has its identity (said on stdout); 2 when the settings or the
        hub refused it (said through ``on_error``), with no identity written.
    """
    from edge_agent.enrolment import load_identity  # noqa: PLC0415 - after logging
    from edge_agent.startup_checks import check_run_config  # noqa: PLC0415
    from edge_agent.state_lock import hold_state_folder  # noqa: PLC0415
    from edge_agent.wiring import ensure_identity  # noqa: PLC0415

    setup_logging(verbose)
    try:
        if config.insecure:
            raise AgentError("--insecure runs without an identity: there is nothing to enrol")
        check_run_config(config)
        with hold_state_folder(config.state_dir):
            kept = load_identity(config.state_dir)
            identity = asyncio.run(ensure_identity(config))
    except (AgentError, SkillError, TransportError) as exc:
        on_error(str(exc))
        return 2
    if identity is None:
        sys.stdout.write(f"{config.device_id} uses the certificate files given; nothing to enrol\n")
    else:
        done = "is enrolled" if kept is not None else "enrolled"
        sys.stdout.write(f"{config.device_id} {done}: identity in {identity.folder}\n")
    return 0


def parser() -> argparse.ArgumentParser:
    """``run`` and ``enroll``; their options are ``edgeskill agent run``'s, by the same names."""
    top = argparse.ArgumentParser(prog="python -m edge_agent", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)
    options = argparse.ArgumentParser(add_help=False)
    add = options.add_argument
    add("--hub", required=True, help="grpc(s)://HOST:PORT or mqtt(s)://HOST:PORT/PREFIX")
    add("--device-id", required=True, help="This device's id, unique in the fleet.")
    add("--label", action="append", default=[], help="A label k=v; repeat for more.")
    add("--state-dir", type=Path, default=Path(".edgeskill/agent"), help="The agent's state.")
    add("--trusted-root", type=Path, help="The hub's TUF root.json.")
    add("--board", help="Board from the profile table instead of detection.")
    add("--source", type=Path, help="Replay file (.npz with x, y) to feed skills.")
    add("--source-loop", action=argparse.BooleanOptionalAction, default=False)
    add("--source-rate", type=float, default=200.0, help="Items per second per skill.")
    add("--telemetry-window", type=float, default=2.0, help="Seconds per telemetry window.")
    add("--ca", type=Path, help="grpcs://: CA (PEM) the hub's certificate chains to.")
    add("--cert", type=Path, help="grpcs://: this device's client certificate (PEM).")
    add("--key", type=Path, help="grpcs://: the client key (PEM).")
    add("--hub-ca", type=Path, help="The hub's CA (PEM), to enrol and to check the hub.")
    add("--claim-token", help="A claim token, to enrol on the first start.")
    add("--claim-token-file", type=Path, help="A file holding the claim token.")
    add("--enroll-url", help="grpcs://HOST:PORT where the hub enrols; default hub port + 1.")
    add("--director-key", type=Path, help="The director's public key, without enrolment.")
    add("--metrics-bind", help="Serve Prometheus metrics on HOST:PORT (default: off).")
    add("--insecure", action="store_true", help="DANGEROUS: no identity, plain transport.")
    add("--verbose", action=argparse.BooleanOptionalAction, default=False)
    commands.add_parser("run", parents=[options], help="Connect this device to a hub.")
    commands.add_parser(
        "enroll",
        parents=[options],
        help="Enrol with the claim token (or renew a kept identity when due), then exit.",
    )
    return top


def _error(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def _config(args: argparse.Namespace) -> AgentConfig:
    """The settings from parsed options.

    Raises:
        SettingsError: a label is not k=v, or the claim token file cannot be read.
    """
    from edge_agent.startup_checks import SettingsError, read_claim_token  # noqa: PLC0415

    labels = dict(item.split("=", 1) for item in args.label if "=" in item)
    if len(labels) != len(args.label):
        raise SettingsError("labels are k=v")
    token = args.claim_token
    if args.claim_token_file is not None:
        token = read_claim_token(args.claim_token_file)
    return AgentConfig(
        hub_url=args.hub,
        device_id=args.device_id,
        state_dir=args.state_dir,
        labels=labels,
        board=args.board,
        trusted_root=args.trusted_root,
        source=args.source,
        source_loop=args.source_loop,
        source_rate_hz=args.source_rate,
        telemetry_window_s=args.telemetry_window,
        tls_ca=args.ca or args.hub_ca,
        tls_cert=args.cert,
        tls_key=args.key,
        metrics_bind=args.metrics_bind,
        insecure=args.insecure,
        director_key=args.director_key,
        claim_token=token,
        enroll_url=args.enroll_url,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m edge_agent run|enroll ...``; the exit status (2: refused, as argparse)."""
    args = parser().parse_args(argv)
    quiet_native_logs(args.verbose)
    skip_http_fetcher()  # before _config's checks import python-tuf's client
    if args.insecure:
        sys.stdout.write(INSECURE_BANNER + "\n")
    try:
        config = _config(args)
    except AgentError as exc:
        _error(str(exc))
        return 2
    if args.command == "enroll":
        return enroll_command(config, verbose=args.verbose, on_error=_error)
    return run_command(config, verbose=args.verbose, on_error=_error)
