"""The agent's settings, in one frozen dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.drift_samples import SampleCaps
from edge_agent.sandbox.policy import OwnerLimits


@dataclass(frozen=True)
class AgentConfig:
    """Everything one agent process needs to know.

    Attributes:
        hub_url: ``grpc://host:port``, ``grpcs://host:port`` (TLS) or ``mqtt://host:port``.
        device_id: this device's id, unique in the fleet.
        state_dir: the one folder the agent keeps its state in.
        labels: labels the device registers with (``kind=camera``).
        board: a board name from the profile table, instead of detection.
        trusted_root: the hub's TUF ``root.json``, needed on the first start only
            (the agent keeps it, and follows root rotations, in its state folder);
            without one, and none kept from an earlier start, the agent refuses to start.
        source: a replay file (``.npz`` with ``x`` and optionally ``y``) fed to every running
            skill, or an input :mod:`edge_agent.adapters` reads (images, a folder, WAV, text,
            an inputs ``.toml`` naming one per skill).
        source_rate_hz: items per second the source feeds, per skill.
        source_loop: replay the source forever instead of once per skill version.
        telemetry_window_s: how often inference counters are sent up.
        reconcile_interval_s: a full reconcile runs at least this often.
        max_backoff_s: longest wait between reconnect attempts.
        tls_ca: PEM CA the hub's certificate must chain to (``grpcs://``; default system roots).
        tls_cert: PEM client certificate naming this device, for hubs that require mTLS.
        tls_key: the client certificate's PEM private key.
        metrics_bind: ``HOST:PORT`` to serve Prometheus metrics on (``None``: no endpoint).
        insecure: plain ``grpc://``/``mqtt://`` without a device identity, and plain
            (unsigned) desired states accepted; for closed test networks only.
        director_key: the director's public key (PEM) for setups without enrolment;
            by default the one enrolment keeps in ``<state_dir>/identity/director.pub``.
        claim_token: the operator's claim token, used on the first start to enrol.
        enroll_url: ``grpcs://HOST:PORT`` of the hub's enrolment port; by default the
            ``grpcs://`` hub's port plus one.
        renew_check_s: how often the agent checks whether its certificate needs renewing.
        metadata_refresh_s: how often the agent refreshes its TUF metadata while nothing is
            deployed, so that a frozen or replaying hub is noticed and reported; counted
            from the chain's last verification, a download's included.
        skill_limits: the device owner's caps for every skill; manifests can only lower them.
        drift_sample_caps: the device owner's caps on the drift samples of each skill
            version per telemetry window (``max_count=0``: none leave this device); a
            deployment's ``drift.samples*`` config can only ask less.
    """

    hub_url: str
    device_id: str
    state_dir: Path
    labels: Mapping[str, str] = field(default_factory=dict)
    board: str | None = None
    trusted_root: Path | None = None
    source: Path | None = None
    source_rate_hz: float = 200.0
    source_loop: bool = False
    telemetry_window_s: float = 2.0
    reconcile_interval_s: float = 5.0
    max_backoff_s: float = 5.0
    ack_timeout_s: float = 10.0
    max_bundle_bytes: int = 512 * 1024 * 1024
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    metrics_bind: str | None = None
    insecure: bool = False
    director_key: Path | None = None
    claim_token: str | None = None
    enroll_url: str | None = None
    renew_check_s: float = 3600.0
    metadata_refresh_s: float = 300.0
    skill_limits: OwnerLimits = field(default_factory=OwnerLimits)
    drift_sample_caps: SampleCaps = field(default_factory=SampleCaps)
