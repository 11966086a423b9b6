"""The agent's side of enrolment: the files it keeps, reuse, renewal timing and refusals."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509

from cloud.pki import CertificateAuthority
from edge_agent.config import AgentConfig
from edge_agent.enrolment import (
    EnrolmentRefusedError,
    enroll,
    enroll_url_for,
    load_identity,
    renewal_due,
)
from edge_agent.errors import AgentError
from edge_agent.wiring import ensure_identity, run_agent
from tests.security.test_identity_attacks import identity_hub


def test_enrolment_keeps_a_private_key_and_the_hubs_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            me = await hub.enrol("cam-1")
            assert load_identity(tmp_path / "cam-1") == me
            assert stat.S_IMODE(me.key.stat().st_mode) == 0o600
            assert b"PRIVATE KEY" not in me.cert.read_bytes() + me.director.read_bytes()
            assert me.ca.read_bytes() == hub.ca.read_bytes()
            assert not renewal_due(me.certificate())

    asyncio.run(scenario())


def test_a_lost_answer_is_retried_with_the_same_key(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            token = hub.enroller.create_claim({"kind": "camera"}, uses=2)
            first = await enroll(hub.enroll_url, hub.ca, token, "cam-1", tmp_path / "cam-1")
            key = first.key.read_bytes()
            first.cert.unlink()  # as if the answer never arrived
            again = await enroll(hub.enroll_url, hub.ca, token, "cam-1", tmp_path / "cam-1")
            assert again.key.read_bytes() == key

    asyncio.run(scenario())


def test_a_hub_with_another_ca_is_not_trusted(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            rogue = CertificateAuthority.open_or_create(tmp_path / "rogue")
            token = hub.enroller.create_claim({"kind": "camera"})
            with pytest.raises(AgentError, match="UNAVAILABLE"):
                await enroll(hub.enroll_url, rogue.cert_path, token, "cam-1", tmp_path / "a")
            with pytest.raises(EnrolmentRefusedError, match="unknown-token"):
                await enroll(hub.enroll_url, hub.ca, "nope", "cam-1", tmp_path / "b")

    asyncio.run(scenario())


def test_ensure_identity_enrols_once_then_reuses(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            config = AgentConfig(
                hub_url=hub.url,
                device_id="cam-1",
                state_dir=tmp_path / "agent",
                tls_ca=hub.ca,
                claim_token=hub.enroller.create_claim({"kind": "camera"}),
                enroll_url=hub.enroll_url,
            )
            made = await ensure_identity(config)
            assert made is not None
            serial = made.certificate().serial_number
            kept = await ensure_identity(dataclasses.replace(config, claim_token=None))
            assert kept is not None and kept.certificate().serial_number == serial
            other = dataclasses.replace(config, device_id="cam-2")
            with pytest.raises(AgentError, match="not for cam-2"):
                await ensure_identity(other)

    asyncio.run(scenario())


def test_plain_urls_need_insecure(tmp_path: Path) -> None:
    for url in ("grpc://127.0.0.1:9", "mqtt://127.0.0.1:9/x"):
        config = AgentConfig(hub_url=url, device_id="cam-1", state_dir=tmp_path)
        with pytest.raises(AgentError, match="is not authenticated"):
            asyncio.run(run_agent(config, asyncio.Event()))


def test_renewal_is_due_with_a_third_of_the_lifetime_left(tmp_path: Path) -> None:
    ca = CertificateAuthority.open_or_create(tmp_path / "ca")
    cert = x509.load_pem_x509_certificate(ca.issue("cam-1", tmp_path, "cam-1").cert.read_bytes())
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    third = (end - start) / 3
    assert not renewal_due(cert, end - third - datetime.timedelta(seconds=1))
    assert renewal_due(cert, end - third + datetime.timedelta(seconds=1))


def test_the_enrolment_port_sits_next_to_a_grpcs_hub() -> None:
    assert enroll_url_for("grpcs://hub.example:7443") == "grpcs://hub.example:7444"
    assert enroll_url_for("grpcs://hub.example") == "grpcs://hub.example:7444"
    assert enroll_url_for("mqtts://hub.example:8883/x") is None
