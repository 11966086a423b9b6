"""The hub's gRPC server: bytes in, envelopes out, everything else in the device session.

Requests reach the servicer undecoded, so the session decodes them with the
same checks and drop reasons as the MQTT server; replies are encoded here. A
``Connect`` stream is one :class:`~cloud.session.DeviceSession`: register
first, then any message, with desired-state changes pushed from the core's
shared notifier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from cloud.errors import (
    FetchRefusedError,
    IdentityMismatchError,
    SessionRefusedError,
    StoreError,
)
from cloud.hubcore import HubCore, fetch_error_code
from cloud.session import DeviceSession, DropReason
from protos import pb
from protos.fetch import GRPC_STATUS_NAMES
from protos.limits import MAX_ENVELOPE_BYTES
from protos.pem import read_pem

__all__ = ["HubServicer", "ServerTls", "server_options", "start_grpc_server"]

log = logging.getLogger(__name__)

_REGISTER_TIMEOUT_S = 10.0
#: Bigger messages end the stream inside gRPC; smaller ones over the envelope cap
#: are dropped and counted by the session, and the stream goes on.
_MAX_RECEIVE_BYTES = 1024 * 1024
_SERVICE = pb.DESCRIPTOR.services_by_name["Hub"].full_name
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
        return cls(read_pem(cert), read_pem(key), read_pem(client_ca))


def peer_common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The subject CN of the client certificate the peer presented, if any."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None


class HubServicer:
    """Serves device control streams and fetches.

    With ``bind_identity`` (set when serving mTLS), a connection may speak only
    for the device named in its client certificate.
    """

    def __init__(self, core: HubCore, *, bind_identity: bool = False) -> None:
        self.core = core
        self.bind_identity = bind_identity

    def _session(self, context: grpc.aio.ServicerContext) -> DeviceSession:
        if not self.bind_identity:
            return self.core.session()
        return self.core.session(peer_common_name(context) or "", bound=True)

    async def Connect(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Envelope]:
        """One device's control stream: register first, then anything."""
        session = self._session(context)
        try:
            first = await asyncio.wait_for(anext(request_iterator), _REGISTER_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration, grpc.aio.AioRpcError):
            self.core.drop(DropReason.NO_REGISTER)
            return
        try:
            replies = await session.open(first)
        except IdentityMismatchError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            return
        except SessionRefusedError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        except StoreError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the hub cannot serve you now")
            return
        outbox: asyncio.Queue[object] = asyncio.Queue()
        for env in replies:
            outbox.put_nowait(env)
        tasks = [
            asyncio.create_task(self._read(session, request_iterator, outbox)),
            asyncio.create_task(self._push_desired(session, outbox)),
        ]
        try:
            while (item := await outbox.get()) is not _DONE:
                assert isinstance(item, pb.Envelope)
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close()

    async def _read(
        self, session: DeviceSession, requests: AsyncIterator[bytes], outbox: asyncio.Queue[object]
    ) -> None:
        try:
            async for payload in requests:
                try:
                    replies = await session.receive(payload)
                except Exception:  # one bad message must not end the device's stream
                    session.drop(DropReason.INTERNAL_ERROR)
                    log.exception("message from %s not handled", session.device_id)
                    continue
                for reply in replies:
                    outbox.put_nowait(reply)
        except grpc.aio.AioRpcError:
            pass  # the device went away; the finally below ends the stream
        finally:
            outbox.put_nowait(_DONE)

    @staticmethod
    async def _push_desired(session: DeviceSession, outbox: asyncio.Queue[object]) -> None:
        async for env in session.desired_updates():
            outbox.put_nowait(env)

    async def Fetch(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.FetchChunk]:
        """Stream one repository file in chunks."""
        try:
            req, size, chunks = await self._session(context).fetch(request)
        except IdentityMismatchError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            return
        except (FileNotFoundError, FetchRefusedError) as exc:
            status = getattr(grpc.StatusCode, GRPC_STATUS_NAMES[fetch_error_code(exc)])
            await context.abort(status, str(exc))
            return
        except StoreError:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the hub cannot serve you now")
            return
        offset = req.offset
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


def _handler(servicer: HubServicer) -> grpc.GenericRpcHandler:
    """The ``Hub`` service with undecoded requests for ``Connect`` and ``Fetch``."""
    return grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "Connect": grpc.stream_stream_rpc_method_handler(
                servicer.Connect, response_serializer=pb.Envelope.SerializeToString
            ),
            "Fetch": grpc.unary_stream_rpc_method_handler(
                servicer.Fetch, response_serializer=pb.FetchChunk.SerializeToString
            ),
            "InferTail": grpc.unary_unary_rpc_method_handler(
                servicer.InferTail,
                request_deserializer=pb.InferRequest.FromString,
                response_serializer=pb.InferResponse.SerializeToString,
            ),
        },
    )


def server_options() -> list[tuple[str, int]]:
    """Message caps and keepalive policy for the hub's server."""
    return [
        ("grpc.max_receive_message_length", max(_MAX_RECEIVE_BYTES, MAX_ENVELOPE_BYTES + 1024)),
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
    its certificate names. Desired-state changes reach streams only while the
    core's loops run (the hub's control-loop host, or :func:`cloud.hubcore.running`).

    Returns:
        The running server and the port it listens on.

    Raises:
        RuntimeError: the address could not be bound.
    """
    server = grpc.aio.server(options=server_options())
    server.add_generic_rpc_handlers((_handler(HubServicer(core, bind_identity=tls is not None)),))
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
