"""``infer_tail`` end to end: the agent's transports against the hub's servers.

The hub runs in process (a real SQLite store and TUF repository, the
``splitter`` skill published and deployed) behind a real gRPC server and,
for MQTT, the real broker of the test services; devices are the agent's own
transports. Every test runs over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from cloud.grpc_server import start_grpc_server
from cloud.hub import Hub
from cloud.hubcore import HubCore, running
from cloud.mqtt_client import clear_retained
from cloud.mqtt_server import MqttServerSettings, start_mqtt_server
from cloud.tail_batching import BatchSettings
from cloud.tail_serving import TailServer, TailSettings
from edge_agent.errors import InferRefusedError, TransportError
from edge_agent.transport.base import AgentTransport
from edge_agent.transport.grpc import GrpcAgentTransport
from edge_agent.transport.mqtt import MqttAgentTransport
from protos import kind_of, make_envelope, pb
from tests.fakes.split_hub import chain_model, reference
from tests.support.services import mqtt_url
from tests.support.split_skill import (
    GROUP,
    SplitSkill,
    build_split_skill,
    head,
    outputs,
    publish,
    request,
    run_full,
)
from tests.support.tiny_models import digits_like_onnx

X = np.random.default_rng(7).normal(size=(1, 16)).astype(np.float32)
IMAGE = np.random.default_rng(8).normal(size=(1, 1, 8, 8)).astype(np.float32)
TIMEOUT_S = 10.0


@pytest.fixture(params=["grpc", pytest.param("mqtt", marks=pytest.mark.mqtt)])
def transport(request: pytest.FixtureRequest) -> str:
    return cast(str, request.param)


@pytest.fixture
def url() -> Iterator[str]:
    value = mqtt_url(f"es-test/{uuid.uuid4().hex[:12]}", session_expiry=30, keepalive=5)
    yield value
    clear_retained(value)


@pytest.fixture(scope="module")
def skill(tmp_path_factory: pytest.TempPathFactory) -> SplitSkill:
    work = tmp_path_factory.mktemp("splitter")
    net = work / "chain.onnx"
    net.write_bytes(chain_model())
    return build_split_skill(work, net, big=digits_like_onnx(work / "big.onnx", input_name="image"))


@pytest.fixture
def hub(tmp_path: Path, skill: SplitSkill) -> Iterator[Hub]:
    opened = Hub.init(tmp_path / "hub")
    opened.store.create_group(GROUP, "kind=camera")
    publish(opened, skill)
    yield opened
    opened.close()


@contextlib.asynccontextmanager
async def serving(
    transport: str, hub: Hub, url: str, batching: BatchSettings | None = None
) -> AsyncIterator[tuple[HubCore, Callable[[str], AgentTransport]]]:
    """Serve the hub over ``transport``; yield its core and a maker of device transports."""
    core = hub.core()
    core.tails = TailServer(
        hub.trust, core.tail_target, TailSettings(batching=batching or BatchSettings())
    )
    async with running(core), contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(core.close)
        if transport == "grpc":
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            stack.push_async_callback(server.stop, None)

            def make(device: str) -> AgentTransport:
                return GrpcAgentTransport(f"127.0.0.1:{port}", device)
        else:
            mqtt_server = await start_mqtt_server(core, url, MqttServerSettings(settle_s=0.1))
            stack.push_async_callback(mqtt_server.stop)

            def make(device: str) -> AgentTransport:
                return MqttAgentTransport(url, device)

        yield core, make


@contextlib.asynccontextmanager
async def device(
    make: Callable[[str], AgentTransport], device_id: str, kind: str = "camera"
) -> AsyncIterator[AgentTransport]:
    """A connected, registered device (its welcome received)."""
    t = make(device_id)
    await t.connect(make_envelope(device_id, register=pb.Register(labels={"kind": kind})))
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while kind_of(await t.receive()) != "welcome":
                pass
        yield t
    finally:
        await t.close()


def test_tails_over_the_wire_match_the_full_model(
    transport: str, hub: Hub, url: str, skill: SplitSkill
) -> None:
    async def main() -> None:
        async with serving(transport, hub, url) as (_, make), device(make, "cam-1") as cam:
            for cut in skill.plan.cuts:
                for codec, tolerance in (("fp32", 1e-5), ("fp16", 2e-2), ("int8", 0.2)):
                    sent = head(skill, cut.name, {"x": X})
                    ask = request(
                        skill, cut.name, sent, request_id=f"{cut.name}-{codec}", codec=codec
                    )
                    got = await cam.infer_tail(ask, TIMEOUT_S)
                    assert got.request_id == ask.request_id
                    np.testing.assert_allclose(
                        outputs(got)["logits"], reference(X), rtol=tolerance, atol=tolerance
                    )
            ask = request(skill, "joint", {"image": IMAGE}, model="big", request_id="joint")
            joint = await cam.infer_tail(ask, TIMEOUT_S)
            assert skill.big is not None
            want = run_full(skill.big, {"image": IMAGE})["scores"]
            np.testing.assert_allclose(outputs(joint)["scores"], want, rtol=1e-6)

    asyncio.run(main())


def test_refusals_arrive_as_refusals_with_their_code(
    transport: str, hub: Hub, url: str, skill: SplitSkill
) -> None:
    async def main() -> None:
        async with (
            serving(transport, hub, url) as (_, make),
            device(make, "gw-1", kind="gateway") as gateway,
            device(make, "cam-1") as cam,
        ):
            with pytest.raises(InferRefusedError, match="not deployed") as refused:
                await gateway.infer_tail(request(skill, "input", {"x": X}), TIMEOUT_S)
            assert refused.value.code == "permission-denied"
            with pytest.raises(InferRefusedError) as refused:
                await cam.infer_tail(
                    request(skill, "nowhere", {"x": X}, request_id="r2"), TIMEOUT_S
                )
            assert refused.value.code == "not-found"
            bad = request(skill, "input", {"x": np.zeros((1, 3), np.float32)}, request_id="r3")
            with pytest.raises(InferRefusedError) as refused:
                await cam.infer_tail(bad, TIMEOUT_S)
            assert refused.value.code == "invalid-argument"
            huge = request(
                skill, "input", {"x": np.zeros((1, 300_000), np.float32)}, request_id="r4"
            )
            with pytest.raises(InferRefusedError, match="cap"):
                await cam.infer_tail(huge, TIMEOUT_S)  # refused before it is sent

    asyncio.run(main())


def test_a_ping_is_answered_empty_without_a_model_and_a_ping_with_tensors_is_refused(
    transport: str, hub: Hub, url: str, skill: SplitSkill
) -> None:
    async def main() -> None:
        async with serving(transport, hub, url) as (core, make), device(make, "cam-1") as cam:
            got = await cam.infer_tail(request(skill, "ping", {}, request_id="p1"), TIMEOUT_S)
            assert got.request_id == "p1" and not got.outputs and got.hub_ms == 0.0
            assert core.tails.counts["ping"] == 1
            assert core.tails.batcher.passes == 0  # no tail ran, none was loaded
            loaded = request(skill, "ping", {"x": X}, request_id="p2")
            with pytest.raises(InferRefusedError, match="no tensors") as refused:
                await cam.infer_tail(loaded, TIMEOUT_S)
            assert refused.value.code == "invalid-argument"

    asyncio.run(main())


def test_a_slow_hub_is_a_link_failure_not_a_refusal(
    transport: str, hub: Hub, url: str, skill: SplitSkill
) -> None:
    async def main() -> None:
        slow = BatchSettings(max_wait_ms=1000.0)
        async with serving(transport, hub, url, slow) as (core, make), device(make, "cam-1") as cam:
            ask = request(skill, "input", {"x": X}, deadline_ms=60_000)
            with pytest.raises(TransportError) as failed:
                await cam.infer_tail(ask, 0.2)
            assert not isinstance(failed.value, InferRefusedError)
            # The resend (same request id) is answered by the run already under way.
            again = await cam.infer_tail(ask, TIMEOUT_S)
            np.testing.assert_allclose(outputs(again)["logits"], reference(X), rtol=1e-5, atol=1e-5)
            assert core.tails.batcher.passes == 1

    asyncio.run(main())


def test_devices_on_the_wire_share_batches(
    transport: str, hub: Hub, url: str, skill: SplitSkill
) -> None:
    names = [f"cam-{i}" for i in range(6)]
    rng = np.random.default_rng(9)
    inputs = {n: rng.normal(size=(1, 16)).astype(np.float32) for n in names}

    async def main() -> None:
        batching = BatchSettings(max_wait_ms=100.0, max_batch=16)
        async with serving(transport, hub, url, batching) as (core, make):
            async with contextlib.AsyncExitStack() as stack:
                cams = [await stack.enter_async_context(device(make, n)) for n in names]
                answers = await asyncio.gather(
                    *(
                        cam.infer_tail(request(skill, "input", {"x": inputs[n]}), TIMEOUT_S)
                        for n, cam in zip(names, cams, strict=True)
                    )
                )
            for n, answer in zip(names, answers, strict=True):
                np.testing.assert_allclose(
                    outputs(answer)["logits"], reference(inputs[n]), rtol=1e-5, atol=1e-5
                )
            assert sum(core.tails.batcher.batch_sizes.values()) < len(names)
            assert core.tails.batcher.passes == sum(core.tails.batcher.batch_sizes.values())

    asyncio.run(main())
