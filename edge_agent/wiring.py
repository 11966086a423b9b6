"""Wires a real agent: its outbox, installs, TUF client, skill launcher and transport.

``edgeskill agent run`` calls :func:`build_agent`; a fleet simulator or a test
calls it too, swapping the parts it wants to fake (the launcher, the
transport) and keeping the rest real.
"""

from __future__ import annotations

import functools
from pathlib import Path

from edge_agent.agent import Agent, HubLink, TransportFactory
from edge_agent.config import AgentConfig
from edge_agent.errors import AgentError
from edge_agent.installs import InstallStore
from edge_agent.outbox import Outbox
from edge_agent.profile import DeviceProfile, detect_profile
from edge_agent.sandbox.launcher import SkillLauncher, make_launcher
from edge_agent.transport import open_transport
from edge_agent.workload import ReplaySource
from skills.trust import TrustClient

__all__ = ["build_agent", "transport_factory"]

#: Largest trusted root file read from the command line.
MAX_ROOT_BYTES = 1024 * 1024


def transport_factory(config: AgentConfig) -> TransportFactory:
    """How the agent opens a session: the transport ``config.hub_url`` names, with its TLS files."""
    return functools.partial(
        open_transport,
        config.hub_url,
        config.device_id,
        ca=config.tls_ca,
        cert=config.tls_cert,
        key=config.tls_key,
    )


def build_agent(
    config: AgentConfig,
    profile: DeviceProfile | None = None,
    *,
    launcher: SkillLauncher | None = None,
    transports: TransportFactory | None = None,
) -> Agent:
    """Build an agent from its settings, with the real parts unless others are given.

    The state folder is created; the outbox, installs and TUF client live in it.

    Args:
        config: The agent's settings.
        profile: The device's profile; detected (or taken from ``config.board``) by default.
        launcher: Starts skills; sandboxed control processes by default.
        transports: Opens sessions with the hub; the transport of ``config.hub_url`` by default.

    Raises:
        AgentError: the state folder, trusted root or source cannot be read, or the
            outbox cannot be opened.
        SkillError: no trusted root was given and none is kept from an earlier start.
    """
    profile = profile or detect_profile(config.board)
    state = config.state_dir
    root = _read_root(config.trusted_root)
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AgentError(f"cannot create the state folder {state}: {exc}") from exc
    link = HubLink(config.max_bundle_bytes)
    trust = TrustClient(state / "trust", link.fetch, trusted_root=root)
    source = ReplaySource.load(config.source) if config.source is not None else None
    installs = InstallStore(state / "installs")
    launcher = launcher or make_launcher(profile.targets, profile.precisions, state / "logs")
    return Agent(
        config,
        profile=profile,
        outbox=Outbox(state / "outbox.db"),  # opened last: nothing after it can fail
        installs=installs,
        fetch_target=trust.fetch_target,
        launcher=launcher,
        transport_factory=transports or transport_factory(config),
        link=link,
        source=source,
    )


def _read_root(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_ROOT_BYTES + 1)
    except OSError as exc:
        raise AgentError(f"cannot read the trusted root {path}: {exc}") from exc
    if len(data) > MAX_ROOT_BYTES:
        raise AgentError(f"trusted root {path} is larger than {MAX_ROOT_BYTES} bytes")
    return data
