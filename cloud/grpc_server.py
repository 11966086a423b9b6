"""The hub's gRPC server: bytes in, envelopes out, everything else in the device session.

Requests reach the servicer undecoded, so the session decodes them with the
same checks and drop reasons as the MQTT server; replies are encoded here. A
``Connect`` stream is one :class:`~cloud.session.DeviceSession`: register
first, then any message, with desired-state changes pushed from the core's
shared notifier. Telemetry in the name of the stream's device goes to the bulk
path (:mod:`cloud.telemetry_ingest`), shared by all streams: stored in a group
commit with what other streams sent in the same turn, and acknowledged with one
ack per stream and group; everything else, and telemetry the session refuses,
goes through the session one message at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial

import grpc
import grpc.aio

from cloud.endpoints import bind_failure
from cloud.enrolment import Enrolled, Enroller, EnrolmentError
from cloud.errors import (
    FetchRefusedError,
    HubError,
    IdentityMismatchError,
    SessionRefusedError,
    StoreError,
    ValidationError,
)
from cloud.fetch_serving import next_chunk
from cloud.grpc_tls import RevocationList, ServerTls, peer_common_name, peer_serial
from cloud.hubcore import HubCore, fetch_error_code
from cloud.session import DeviceSession, DropReason
from cloud.tail_serving import TailRefusedError
from cloud.telemetry_ingest import IngestStream, TelemetryIngest, ack_envelopes
from protos import decode_envelope, pb
from protos.errors import ProtocolError
from protos.fetch import GRPC_STATUS_NAMES
from protos.limits import MAX_ENVELOPE_BYTES
from protos.topics import INFER_ERROR_CODES

__all__ = [
    "HubServicer",
    "RevocationList",
    "ServerTls",
    "hub_handler",
    "peer_common_name",
    "server_options",
    "start_grpc_server",
]

log = logging.getLogger(__name__)

_REGISTER_TIMEOUT_S = 10.0
#: Bigger messages end the stream inside gRPC; smaller ones over the envelope cap
#: are dropped and counted by the session, and the stream goes on.
_MAX_RECEIVE_BYTES = 1024 * 1024
_SERVICE = pb.DESCRIPTOR.services_by_name["Hub"].full_name
_DONE = object()
#: Telemetry messages of all streams taken and not yet answered; streams wait beyond it.
MAX_TELEMETRY = 20_000
#: Telemetry messages of one stream taken and not yet answered; it waits beyond it.
MAX_STREAM_TELEMETRY = 256


class HubServicer:
    """Serves device control streams and fetches.

    With ``bind_identity`` (set when serving mTLS), every call but ``Enroll``
    needs a client certificate that is not revoked, and may speak only for
    the device it names. Refusals are counted in ``core.dropped``.
    """

    def __init__(
        self,
        core: HubCore,
        *,
        bind_identity: bool = False,
        enroller: Enroller | None = None,
        revocations: RevocationList | None = None,
        max_telemetry: int = MAX_TELEMETRY,
        max_stream_telemetry: int = MAX_STREAM_TELEMETRY,
    ) -> None:
        self.core = core
        self.bind_identity = bind_identity
        self.enroller = enroller
        self.revocations = revocations
        self.telemetry = TelemetryIngest(core, None, max_telemetry)
        self.max_stream_telemetry = max_stream_telemetry

    async def _identity(self, context: grpc.aio.ServicerContext) -> str | None:
        """The certificate's device (None without mTLS); aborts the call when there is none.

        Raises:
            grpc.aio.AbortError: no certificate, or a revoked one.
        """
        if not self.bind_identity:
            return None
        device = peer_common_name(context)
        serial = peer_serial(context)
        if not device or serial is None:
            self.core.dropped[DropReason.NO_CERTIFICATE] += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a device certificate is needed")
        if self.revocations is not None and self.revocations.revoked(serial or 0):
            self.core.dropped[DropReason.REVOKED_CERTIFICATE] += 1
            log.warning("refused a revoked certificate of %r (serial %s)", device, serial)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "this certificate is revoked")
        return device

    async def _session(self, context: grpc.aio.ServicerContext) -> DeviceSession:
        device = await self._identity(context)
        if device is None:
            return self.core.session()
        return self.core.session(device, bound=True)

    async def Connect(
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Envelope]:
        """One device's control stream: register first, then anything."""
        session = await self._session(context)
        try:
            async with asyncio.timeout(_REGISTER_TIMEOUT_S):
                first = await anext(request_iterator)
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
        stream = IngestStream(partial(_queue_acks, outbox), self.max_stream_telemetry)
        tasks = [
            asyncio.create_task(self._read(session, stream, request_iterator, outbox)),
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
        self,
        session: DeviceSession,
        stream: IngestStream,
        requests: AsyncIterator[bytes],
        outbox: asyncio.Queue[object],
    ) -> None:
        try:
            async for payload in requests:
                try:
                    env = _own_telemetry(session, payload)
                    if env is not None:
                        if not self.telemetry.offer(stream, env.device_id, env):
                            await self.telemetry.put(stream, env.device_id, env)  # pushes back
                        continue
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
            req, size, chunks = await (await self._session(context)).fetch(request)
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
            while offset < size and (data := await next_chunk(chunks)) is not None:
                offset += len(data)
                yield pb.FetchChunk(
                    offset=offset - len(data), data=data, total_size=size, last=offset >= size
                )

    async def InferTail(
        self, request: pb.InferRequest, context: grpc.aio.ServicerContext
    ) -> pb.InferResponse:
        """Run the tail of a split model (or a joint pair's big model) for the calling device.

        The device is the certificate's (the request's ``device_id`` only without TLS);
        a refusal is the status its wire code names (:data:`INFER_ERROR_CODES`), and the
        call's own deadline bounds the work.
        """
        session = await self._session(context)
        remaining = context.time_remaining()
        try:
            return await session.infer(request, deadline_s=remaining)
        except TailRefusedError as exc:
            status = getattr(grpc.StatusCode, INFER_ERROR_CODES[exc.code])
            await context.abort(status, exc.message)
        raise AssertionError("unreachable")  # abort raises

    async def Enroll(
        self, request: pb.EnrollRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollResponse:
        """Enrol a device with a claim token and a CSR (server TLS is enough)."""
        enroller = await self._enroller(context)
        return await self._enrolled(
            context, lambda: enroller.enroll(request.claim_token, request.csr_pem)
        )

    async def Renew(
        self, request: pb.RenewRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollResponse:
        """A new certificate for the device the current one names (mTLS)."""
        enroller = await self._enroller(context)
        device = await self._identity(context)
        if device is None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "renewal needs mutual TLS")
        return await self._enrolled(context, lambda: enroller.renew(str(device), request.csr_pem))

    async def _enroller(self, context: grpc.aio.ServicerContext) -> Enroller:
        if self.enroller is None or not self.bind_identity:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this hub does not enrol devices (no TLS)"
            )
        assert self.enroller is not None
        return self.enroller

    async def _enrolled(
        self, context: grpc.aio.ServicerContext, call: Callable[[], Enrolled]
    ) -> pb.EnrollResponse:
        try:
            done = await asyncio.to_thread(call)
        except EnrolmentError as exc:
            self.core.dropped[f"enrolment-{exc.reason}"] += 1
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{exc.reason}: {exc}")
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except HubError:
            log.exception("enrolment failed")
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the hub cannot enrol you now")
        log.info("issued a certificate to %s (until %d)", done.device_id, done.not_after_ms)
        return pb.EnrollResponse(
            certificate_pem=done.certificate_pem,
            ca_pem=done.ca_pem,
            director_public_pem=done.director_public_pem,
            not_after_ms=done.not_after_ms,
            labels=done.labels,
        )


def _own_telemetry(session: DeviceSession, payload: bytes) -> pb.Envelope | None:
    """The payload's envelope if it is telemetry of the session's device, else None.

    None leaves the payload to :meth:`DeviceSession.receive`, which decodes it with
    the same checks and counts what it refuses (oversized, malformed, spoofed).
    """
    if len(payload) > MAX_ENVELOPE_BYTES:
        return None
    try:
        env = decode_envelope(payload)
    except ProtocolError:
        return None
    if env.WhichOneof("body") != "telemetry" or env.device_id != session.device_id:
        return None
    return env


def _queue_acks(outbox: asyncio.Queue[object], device: str, ids: list[str]) -> None:
    for env in ack_envelopes(device, ids):
        outbox.put_nowait(env)


def hub_handler(servicer: HubServicer) -> grpc.GenericRpcHandler:
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
            "Enroll": grpc.unary_unary_rpc_method_handler(
                servicer.Enroll,
                request_deserializer=pb.EnrollRequest.FromString,
                response_serializer=pb.EnrollResponse.SerializeToString,
            ),
            "Renew": grpc.unary_unary_rpc_method_handler(
                servicer.Renew,
                request_deserializer=pb.RenewRequest.FromString,
                response_serializer=pb.EnrollResponse.SerializeToString,
            ),
        },
    )


def server_options() -> list[tuple[str, int]]:
    """Message caps, keepalive policy and exclusive ports for the hub's server."""
    return [
        # gRPC shares a port between processes by default (SO_REUSEPORT on Linux):
        # a second hub on the same address would take half the connections.
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max(_MAX_RECEIVE_BYTES, MAX_ENVELOPE_BYTES + 1024)),
        ("grpc.max_send_message_length", 8 * 1024 * 1024),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.max_concurrent_streams", 10_000),
    ]


async def start_grpc_server(
    core: HubCore,
    bind: str = "127.0.0.1:7443",
    tls: ServerTls | None = None,
    *,
    enroller: Enroller | None = None,
    enroll_bind: str | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start serving ``core`` on ``bind`` (port 0 picks a free one).

    With ``tls`` the port speaks mutual TLS only: a client must present a
    certificate signed by ``tls.client_ca`` and not revoked by ``tls.crl``, and
    may act only as the device its certificate names. gRPC's Python server
    cannot ask for a client certificate without requiring one, so devices
    that have none yet enrol on a second, server-TLS-only port,
    ``enroll_bind``, where every call but ``Enroll`` is refused. Desired-state
    changes reach streams only while the core's loops run (the hub's
    control-loop host, or :func:`cloud.hubcore.running`).

    Returns:
        The running server and the port it listens on (the mTLS one).

    Raises:
        TransportError: an address could not be bound (in use, not of this
            machine); each port is this server's alone.
    """
    revocations = None
    if tls is not None and tls.crl is not None:
        revocations = RevocationList(tls.crl, tls.client_ca)
    servicer = HubServicer(
        core, bind_identity=tls is not None, enroller=enroller, revocations=revocations
    )
    server = grpc.aio.server(options=server_options())
    server.add_generic_rpc_handlers((hub_handler(servicer),))
    if tls is None:
        port = _add_port(server, bind, None)
    else:
        pair = [(tls.private_key, tls.cert_chain)]
        creds = grpc.ssl_server_credentials(
            pair, root_certificates=tls.client_ca, require_client_auth=True
        )
        port = _add_port(server, bind, creds)
        if enroll_bind and enroller:
            _add_port(server, enroll_bind, grpc.ssl_server_credentials(pair))
    await server.start()
    return server, port


def _add_port(server: grpc.aio.Server, bind: str, creds: grpc.ServerCredentials | None) -> int:
    """Bind ``bind`` on ``server`` (TLS with ``creds``); the port it got.

    Raises:
        TransportError: the address could not be bound, and why.
    """
    try:
        port = (
            server.add_insecure_port(bind) if creds is None else server.add_secure_port(bind, creds)
        )
    except RuntimeError as exc:  # gRPC says only that it failed; probe for the reason
        raise bind_failure(bind) from exc
    if port == 0:  # older gRPC reported a failed bind this way
        raise bind_failure(bind)
    return port
