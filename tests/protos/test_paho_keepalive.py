"""PahoLoop's keepalive: paho's bookkeeping runs when a ping falls due, against the test broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from protos.paho_loop import LeanClient, PahoLoop
from tests.support.services import mqtt_host_port


async def _connected(keepalive: int, misc_interval_s: float) -> tuple[LeanClient, PahoLoop]:
    host, port = mqtt_host_port()
    client = LeanClient(
        CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:12]}", protocol=mqtt.MQTTv5
    )
    io = PahoLoop(client, f"{host}:{port}", misc_interval_s=misc_interval_s)
    connected = asyncio.get_running_loop().create_future()
    client.on_connect = lambda *_a: connected.done() or connected.set_result(None)
    await io.connect(lambda: client.connect(host, port, keepalive), 10.0)
    io.watch()
    await asyncio.wait_for(connected, 10)
    return client, io


def _counted(client: LeanClient, method: str) -> list[int]:
    """Count the calls of one of paho's packet methods on ``client``: a one-item list."""
    calls = [0]
    real = getattr(client, method)

    def counting() -> mqtt.MQTTErrorCode:
        calls[0] += 1
        result: mqtt.MQTTErrorCode = real()
        return result

    setattr(client, method, counting)
    return calls


async def _close(client: LeanClient, io: PahoLoop) -> None:
    client.disconnect()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(io.closed.wait(), 5)
    io.close()


def test_a_quiet_client_pings_when_due_though_its_longest_wait_is_far_longer() -> None:
    """Keepalive 2 s, bookkeeping at least every 60 s: the broker (which drops a client
    silent for 1.5 keepalives) keeps it, because each ping goes when it is due."""

    async def main() -> tuple[int, bool, float]:
        client, io = await _connected(keepalive=2, misc_interval_s=60.0)
        answered = _counted(client, "_handle_pingresp")
        first_wait = io.misc_wait_s()
        async with asyncio.timeout(20):
            while answered[0] < 3 and not io.closed.is_set():
                await asyncio.sleep(0.05)
        closed = io.closed.is_set()
        await _close(client, io)
        return answered[0], closed, first_wait

    answered, closed, first_wait = asyncio.run(main())
    assert not closed
    assert answered >= 3
    assert 1.0 <= first_wait <= 2.6  # the next ping's due time and its grace, not the 60 s cap


@pytest.mark.parametrize("every_s", [1.0, 2.2])
def test_a_client_that_publishes_as_often_as_its_keepalive_sends_no_ping(every_s: float) -> None:
    """Keepalive 2 s and a publish every second, or every 2.2 s as an agent's heartbeat
    on a busy loop goes a little after its keepalive's ping fell due: no ping goes (each
    publish counts as the client's traffic), and the broker keeps the client (it waits
    one and a half keepalives)."""

    async def main() -> tuple[int, int, bool]:
        client, io = await _connected(keepalive=2, misc_interval_s=60.0)
        pings = _counted(client, "_send_pingreq")
        acked = 0
        for _ in range(4):
            await asyncio.sleep(every_s)
            info = client.publish("t/keepalive/heartbeat", b"beat", qos=1)
            async with asyncio.timeout(10):
                while not info.is_published() and not io.closed.is_set():
                    await asyncio.sleep(0.01)
            acked += info.is_published()
        closed = io.closed.is_set()
        await _close(client, io)
        return pings[0], acked, closed

    pings, acked, closed = asyncio.run(main())
    assert not closed and acked == 4
    assert pings == 0


def test_the_wait_is_capped_and_never_shorter_than_pahos_own_step() -> None:
    async def main() -> tuple[float, float, float]:
        client, io = await _connected(keepalive=600, misc_interval_s=5.0)
        capped = io.misc_wait_s()
        with client._msgtime_mutex:  # silent for longer than the keepalive: overdue
            client._last_bytes_received -= 800  # past the ping's due time and its grace
        overdue = io.misc_wait_s()
        with client._msgtime_mutex:
            client._last_bytes_received += 800 - 747.5
        soon = io.misc_wait_s()
        await _close(client, io)
        return capped, overdue, soon

    capped, overdue, soon = asyncio.run(main())
    assert capped == 5.0
    assert overdue == 1.0
    assert 1.0 < soon < 5.0
