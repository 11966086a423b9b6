"""Wires a real agent: its outbox, installs, TUF client, skill launcher and transport.

``edgeskill agent run`` calls :func:`build_agent`; a fleet simulator or a test
calls it too, swapping the parts it wants to fake (the launcher, the
transport) and keeping the rest real.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cryptography.x509.oid import NameOID

from edge_agent.agent import Agent, HubLink, TransportFactory
from edge_agent.config import AgentConfig
from edge_agent.enrolment import (
    EnrolmentRefusedError,
    Identity,
    enroll,
    enroll_url_for,
    load_identity,
    renew,
    renewal_due,
)
from edge_agent.errors import AgentError
from edge_agent.installs import InstallStore
from edge_agent.outbox import Outbox
from edge_agent.profile import DeviceProfile, detect_profile
from edge_agent.sandbox.launcher import SkillLauncher, make_launcher
from edge_agent.startup_checks import (
    TRUST_DIR,
    check_config,
    check_run_config,
)
from edge_agent.state_lock import hold_state_folder
from edge_agent.transport import open_transport
from skills.trust import TrustClient

if TYPE_CHECKING:
    from edge_agent.adapters import Source

__all__ = ["build_agent", "run_agent", "transport_factory"]

log = logging.getLogger(__name__)

INSECURE_WARNING = (
    "INSECURE MODE: no device identity, plain transport, unsigned desired states accepted. "
    "Anyone on the network can command this device. Use this only on a closed test network."
)


def transport_factory(config: AgentConfig) -> TransportFactory:
    """How the agent opens a session: the transport ``config.hub_url`` names, with its TLS files.

    The files are read at each new session, so a renewed certificate is used from
    the next reconnection on.
    """
    return functools.partial(
        open_transport,
        config.hub_url,
        config.device_id,
        ca=config.tls_ca,
        cert=config.tls_cert,
        key=config.tls_key,
    )


async def run_agent(config: AgentConfig, stop: asyncio.Event) -> None:
    """Run a real agent until ``stop``, holding its state folder for its lifetime.

    The settings are checked first (:func:`~edge_agent.startup_checks.check_run_config`):
    a refused start creates nothing. See :func:`_run_agent`.

    Raises:
        SettingsError: a setting cannot be used (an :class:`AgentError`; one line).
        AgentError: another agent runs on the state folder, or what
            :func:`_run_agent` raises.
    """
    check_run_config(config)
    with hold_state_folder(config.state_dir):
        await _run_agent(config, stop)


async def _run_agent(config: AgentConfig, stop: asyncio.Event) -> None:
    """Run a real agent until ``stop``: enrol or renew first, then renew while it runs.

    Unless ``config.insecure``, the hub URL is ``grpcs://`` or ``mqtts://`` (as
    :func:`run_agent` checked) and the device needs an identity: the one kept in its
    state folder, one made now with ``config.claim_token``, or certificate files
    given in ``config``.

    Raises:
        AgentError: no identity and no way to make one, a refused enrolment, or
            what :func:`build_agent` raises.
    """
    if config.insecure:
        log.warning(INSECURE_WARNING)
        await build_agent(config).run(stop)
        return
    identity = await ensure_identity(config)
    if identity is not None and config.tls_cert is None:
        config = dataclasses.replace(
            config,
            tls_ca=identity.ca,
            tls_cert=identity.cert,
            tls_key=identity.key,
            director_key=config.director_key or identity.director,
        )
    agent = build_agent(config)
    renewing = asyncio.create_task(_renew_forever(config, identity)) if identity else None
    try:
        await agent.run(stop)
    finally:
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing


async def ensure_identity(config: AgentConfig) -> Identity | None:
    """The device's identity: kept, renewed when due, or made with the claim token.

    Returns None when certificate files are given in ``config`` instead.

    Raises:
        AgentError: no identity and no claim token (or no hub CA), a kept
            certificate for another device, or a failed enrolment.
    """
    identity = load_identity(config.state_dir)
    if identity is None:
        if config.tls_cert is not None:
            return None
        if not config.claim_token or config.tls_ca is None:
            raise AgentError(
                "this device is not enrolled: pass --claim-token and --hub-ca "
                "(or --cert/--key, or --insecure)"
            )
        token, url = config.claim_token, _enroll_url(config)
        return await enroll(url, config.tls_ca, token, config.device_id, config.state_dir)
    names = identity.certificate().subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [config.device_id]:
        raise AgentError(f"the identity in {identity.folder} is not for {config.device_id}")
    await _renew_if_due(config, identity)
    return identity


def _enroll_url(config: AgentConfig) -> str:
    url = config.enroll_url or enroll_url_for(config.hub_url)
    if url is None:
        raise AgentError("pass --enroll-url grpcs://HUB:PORT (the hub's enrolment port)")
    return url


def _renew_url(config: AgentConfig) -> str:
    """Renewal needs mutual TLS: the hub's gRPC port (the enrolment port minus one)."""
    if urlsplit(config.hub_url).scheme == "grpcs":
        return config.hub_url
    parts = urlsplit(_enroll_url(config))
    return f"grpcs://{parts.hostname}:{(parts.port or 7444) - 1}"


async def _renew_if_due(config: AgentConfig, identity: Identity) -> None:
    if not renewal_due(identity.certificate()):
        return
    try:
        await renew(_renew_url(config), identity, config.device_id)
    except EnrolmentRefusedError as exc:
        log.error("the hub refused to renew this device's certificate: %s", exc)
    except AgentError as exc:
        log.warning("certificate renewal failed; trying again later: %s", exc)


async def _renew_forever(config: AgentConfig, identity: Identity) -> None:
    while True:
        await asyncio.sleep(config.renew_check_s)
        try:
            await _renew_if_due(config, identity)
        except AgentError as exc:  # an unreadable certificate: say so, keep running
            log.warning("cannot check the certificate for renewal: %s", exc)


def build_agent(
    config: AgentConfig,
    profile: DeviceProfile | None = None,
    *,
    launcher: SkillLauncher | None = None,
    transports: TransportFactory | None = None,
    source: Source | None = None,
) -> Agent:
    """Build an agent from its settings, with the real parts unless others are given.

    The settings are checked first (:func:`~edge_agent.startup_checks.check_config`),
    then the state folder is created; the outbox, installs and TUF client live in it.

    Args:
        config: The agent's settings.
        profile: The device's profile; detected (or taken from ``config.board``) by default.
        launcher: Starts skills; sandboxed control processes by default.
        transports: Opens sessions with the hub; the transport of ``config.hub_url`` by default.
        source: Inputs already read, shared by many agents in one process (the
            simulator); ``config.source`` is read by default.

    Raises:
        SettingsError: a setting cannot be used, or no trusted root was given and
            none is kept from an earlier start (an :class:`AgentError`; one line).
        AgentError: the state folder or source cannot be read, or the outbox cannot
            be opened.
    """
    root = check_config(config)
    profile = profile or detect_profile(config.board)
    state = config.state_dir
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AgentError(f"cannot create the state folder {state}: {exc}") from exc
    link = HubLink(config.max_bundle_bytes)
    trust = TrustClient(
        state / TRUST_DIR, link.fetch, trusted_root=root, fetch_many=link.fetch_many
    )
    if source is None and config.source is not None:
        from edge_agent.adapters import load_input  # noqa: PLC0415 - numpy: only with a source

        source = load_input(config.source)
    installs = InstallStore(state / "installs")
    launcher = launcher or make_launcher(
        profile.targets,
        profile.precisions,
        state / "logs",
        state_dir=state,
        owner=config.skill_limits,
        confine=False if config.insecure else None,
        providers=profile.providers,
    )
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
        refresh_metadata=trust.refresh,
        metadata_age=trust.verified_age_s,
        offer_metadata=trust.offer,
    )
