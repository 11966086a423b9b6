"""The device profile's ONNX Runtime providers reach the skill's own process.

A real hub serves in this process (insecure gRPC on loopback) and deploys a skill
whose control code opens its ONNX model in ``setup``; a real agent built by
:func:`edge_agent.wiring.build_agent` under a profile that lists a provider other
than the CPU installs it and starts it in its sandboxed control process. The
child reports, when ready, which provider its session runs on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from cloud.hub import Hub
from cloud.service import FleetService
from edge_agent.config import AgentConfig
from edge_agent.profile import CPU_PROVIDER, session_providers
from edge_agent.wiring import build_agent
from tests.edge_agent.test_agent_drift import serving
from tests.fakes.fake_launcher import PROFILE
from tests.support import async_wait_until, free_port
from tests.support.skillkit import VariantFile, build_skill
from tests.support.tiny_models import digits_like_onnx

TIMEOUT_S = 60.0

SKILL_TOML = """
[skill]
name = "opener"
version = "1.0.0"
entrypoint = "opener:Opener"

[resources]
memory_mb = 1024
startup_timeout_s = 30.0
"""

SKILL_CODE = """
from skills.sdk import Skill


class Opener(Skill):
    def setup(self, ctx):
        self._model = ctx.model("classifier")  # opened now: the ready report names it

    def process(self, item):
        return {"label": 0}
"""


def _non_cpu_provider() -> str:
    ort = pytest.importorskip("onnxruntime")
    others = [p for p in ort.get_available_providers() if p != CPU_PROVIDER]
    if not others:
        pytest.skip("this ONNX Runtime has only the CPU provider")
    return str(others[0])


def _bundle(tmp_path: Path) -> Path:
    src = tmp_path / "opener-src"
    (src / "control").mkdir(parents=True)
    (src / "skill.toml").write_text(SKILL_TOML)
    (src / "control" / "opener.py").write_text(SKILL_CODE)
    model = digits_like_onnx(tmp_path / "m" / "classifier.onnx")
    return build_skill(src, "1.0.0", [VariantFile("onnx-cpu", "fp32", model)], tmp_path / "dist")


def test_the_skill_opens_its_sessions_with_the_profiles_providers(tmp_path: Path) -> None:
    import onnxruntime as ort  # noqa: PLC0415 - only after _non_cpu_provider skipped without it

    other = _non_cpu_provider()
    profile = dataclasses.replace(PROFILE, targets=("onnx-cpu",), providers=(other, CPU_PROVIDER))
    expected = session_providers("onnx-cpu", profile.providers, ort.get_available_providers())
    assert expected[0] == other  # the CPU alone would not tell the two apart

    hub = Hub.init(tmp_path / "hub", grpc_bind=f"127.0.0.1:{free_port()}", insecure=True)
    fleet = FleetService(hub)
    fleet.skills.publish(_bundle(tmp_path))
    fleet.groups.create("cameras", "kind=camera")
    fleet.deployments.create("opener", "1.0.0", "cameras")
    config = AgentConfig(
        hub_url=f"grpc://{hub.config.grpc_bind}",
        device_id="cam-1",
        state_dir=tmp_path / "agent",
        labels={"kind": "camera"},
        trusted_root=tmp_path / "hub" / "trust" / "metadata" / "root.json",
        reconcile_interval_s=0.5,
        insecure=True,
    )
    agent = build_agent(config, profile)  # the real launcher, as `agent run` wires it
    reported: dict[str, str] = {}

    async def main() -> None:
        async with serving(hub):
            stop = asyncio.Event()
            running = asyncio.create_task(agent.run(stop))
            try:
                await async_wait_until(
                    lambda: "opener" in agent.reconciler.running(), TIMEOUT_S, "opener to run"
                )
                reported.update(agent.reconciler.running()["opener"].models)
            finally:
                stop.set()
                await running

    try:
        asyncio.run(main())
    finally:
        hub.close()
    assert reported == {"classifier": f"onnx-cpu/fp32 on onnxruntime/{expected[0]}"}
