"""The hub's gRPC server: an adapter from the ``Hub`` service to :class:`HubCore`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from cloud.desired_watch import DesiredWatch
from cloud.errors import TransportError
from cloud.hubcore import HubCore
from protos import MAX_ENVELOPE_BYTES, pb
from protos import edgeskill_pb2_grpc as pb_grpc
from protos.envelope import validate_envelope
from protos.errors import ProtocolError

log = logging.getLogger(__name__)

_REGISTER_TIMEOUT_S = 10.0
_MAX_PEM_BYTES = 1024 * 1024
_DONE = object()


@dataclass(frozen=True)
class ServerTls:
    """PEM material for serving mutual TLS: the hub's certificate and the CA devices present."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes

    @classmethod
    def from_files(cls, cert: Path, key: Path, client_ca: Path) -> ServerTls:
        """Read the three PEM files.

        Raises:
            TransportError: a file is missing, unreadable, empty or too large.
        """
        return cls(_read_pem(cert), _read_pem(key), _read_pem(client_ca))


def _read_pem(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            data = fh.read(_MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise TransportError(f"cannot read TLS file {path}: {exc}") from exc
    if not data.strip() or len(data) > _MAX_PEM_BYTES:
        raise TransportError(f"TLS file {path} is empty or larger than {_MAX_PEM_BYTES} bytes")
    return data


def peer_common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The subject CN of the client certificate the peer presented, if any."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None


class HubServicer(pb_grpc.HubServicer):
    """Serves device control streams and fetches.

    With ``bind_identity`` (set when serving mTLS), a connection may speak only
    for the device named in its client certificate.
    """

    def __init__(
        self, core: HubCore, push_interval_s: float = 0.5, *, bind_identity: bool = False
    ) -> None:
        self.core = core
        self.watch = DesiredWatch(core.store, push_interval_s)
        self.bind_identity = bind_identity

    async def _refuse_impostor(self, device_id: str, context: grpc.aio.ServicerContext) -> bool:
        """Abort the call when mTLS binds the peer to another device; True when aborted."""
        if not self.bind_identity:
            return False
        cn = peer_common_name(context)
        if cn == device_id:
            return False
        self.core.drop("identity-mismatch")
        log.warning("refused device id %r from a peer whose certificate names %r", device_id, cn)
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"this client certificate may not act as device {device_id!r}",
        )
        return True

    async def Connect(
        self, request_iterator: AsyncIterator[pb.Envelope], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Envelope]:
        """One device's control stream: register first, then anything."""
        try:
            first = await asyncio.wait_for(anext(request_iterator), _REGISTER_TIMEOUT_S)
            validate_envelope(first)
            if await self._refuse_impostor(first.device_id, context):
                return
            replies = await self.core.register(first)
        except (TimeoutError, StopAsyncIteration):
            self.core.drop("no-register")
            return
        except ProtocolError as exc:
            self.core.drop("bad-register")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        device_id = first.device_id
        outbox: asyncio.Queue[object] = asyncio.Queue()
        for env in replies:
            outbox.put_nowait(env)
        last_gen = replies[-1].desired.generation
        tasks = [
            asyncio.create_task(self._read(device_id, request_iterator, outbox)),
            asyncio.create_task(self._push_desired(device_id, last_gen, outbox)),
        ]
        try:
            while (item := await outbox.get()) is not _DONE:
                assert isinstance(item, pb.Envelope)
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.core.disconnected(device_id)

    async def _read(
        self, device_id: str, requests: AsyncIterator[pb.Envelope], outbox: asyncio.Queue[object]
    ) -> None:
        try:
            async for env in requests:
                try:
                    validate_envelope(env)
                    for reply in await self.core.handle(device_id, env):
                        outbox.put_nowait(reply)
                except ProtocolError as exc:
                    self.core.drop("bad-message")
                    log.warning("dropped a message from %s: %s", device_id, exc)
        except grpc.aio.AioRpcError:
            pass  # the device went away; the finally below ends the stream
        finally:
            outbox.put_nowait(_DONE)

    async def _push_desired(
        self, device_id: str, last_gen: int, outbox: asyncio.Queue[object]
    ) -> None:
        changed = self.watch.subscribe(device_id)
        try:
            while True:
                # The timeout is a safety net: a change is normally seen through the watch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 30.0)
                changed.clear()
                env = await self.core.desired(device_id)
                if env.desired.generation != last_gen:
                    outbox.put_nowait(env)
                    last_gen = env.desired.generation
        finally:
            self.watch.unsubscribe(device_id, changed)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchChunk]:
        """Stream one repository file in chunks."""
        if await self._refuse_impostor(request.device_id, context):
            return
        try:
            size, chunks = await asyncio.to_thread(
                self.core.open_fetch, request.path, request.offset, request.max_bytes
            )
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no such file: {request.path}")
            return
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        offset = request.offset
        with contextlib.closing(chunks):
            while (data := await asyncio.to_thread(next, chunks, None)) is not None:
                offset += len(data)
                yield pb.FetchChunk(
                    offset=offset - len(data), data=data, total_size=size, last=offset >= size
                )

    async def InferTail(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferResponse:
        """Split inference is not served by this hub yet."""
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "split inference is not enabled on this hub"
        )
        raise AssertionError("unreachable")


def server_options() -> list[tuple[str, int]]:
    """Message caps and keepalive policy for the hub's server."""
    return [
        ("grpc.max_receive_message_length", MAX_ENVELOPE_BYTES + 1024),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.max_concurrent_streams", 10_000),
    ]


async def start_grpc_server(
    core: HubCore, bind: str = "127.0.0.1:7443", tls: ServerTls | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start serving ``core`` on ``bind`` (port 0 picks a free one).

    With ``tls`` the server speaks mutual TLS only: a client must present a
    certificate signed by ``tls.client_ca``, and may act only as the device
    its certificate names.

    Returns:
        The running server and the port it listens on.

    Raises:
        RuntimeError: the address could not be bound.
    """
    server = grpc.aio.server(options=server_options())
    pb_grpc.add_HubServicer_to_server(HubServicer(core, bind_identity=tls is not None), server)
    if tls is None:
        port = server.add_insecure_port(bind)
    else:
        creds = grpc.ssl_server_credentials(
            [(tls.private_key, tls.cert_chain)],
            root_certificates=tls.client_ca,
            require_client_auth=True,
        )
        port = server.add_secure_port(bind, creds)
    if port == 0:
        raise RuntimeError(f"could not bind {bind}")
    await server.start()
    return server, port
