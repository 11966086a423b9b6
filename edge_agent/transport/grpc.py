"""The agent's gRPC transport: one bidirectional ``Connect`` stream plus ``Fetch`` calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio

from edge_agent.errors import InferRefusedError, TransportError
from edge_agent.transport.base import AgentTransport, FetchAborted, FetchLimits
from protos import MAX_ENVELOPE_BYTES, pb
from protos import edgeskill_pb2_grpc as pb_grpc
from protos.envelope import validate_envelope
from protos.errors import ProtocolError
from protos.fetch import GRPC_STATUS_NAMES, FetchErrorCode
from protos.pem import read_pem
from protos.topics import INFER_ERROR_CODES, INFER_REFUSALS
from skills.codec_limits import MAX_INFER_BYTES

_CHUNK_CAP = 4 * 1024 * 1024
_CLOSE = object()
#: Refusals asking again would not change: this device may not, or the hub said so for good.
_REFUSALS = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        *(getattr(grpc.StatusCode, GRPC_STATUS_NAMES[c]) for c in FetchErrorCode if c.final),
    }
)
#: The statuses of a refused inference request, and the wire code each stands for.
_INFER_REFUSALS = {
    getattr(grpc.StatusCode, INFER_ERROR_CODES[code]): code for code in INFER_REFUSALS
} | {grpc.StatusCode.UNAUTHENTICATED: "permission-denied"}


def tls_credentials(
    *, ca: Path | None = None, cert: Path | None = None, key: Path | None = None
) -> grpc.ChannelCredentials:
    """TLS credentials for a ``grpcs://`` hub, read from PEM files before connecting.

    Args:
        ca: the CA the hub's certificate must chain to; default the system's roots.
        cert: this device's client certificate (mTLS); needs ``key``.
        key: the client certificate's private key; needs ``cert``.

    Raises:
        TransportError: only one of ``cert`` and ``key`` is given, or a file is
            missing, unreadable, empty or too large.
    """
    if (cert is None) != (key is None):
        raise TransportError("a client certificate needs both --cert and --key")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca) if ca is not None else None,
        private_key=read_pem(key) if key is not None else None,
        certificate_chain=read_pem(cert) if cert is not None else None,
    )


def channel_options() -> list[tuple[str, int]]:
    """Message caps and keepalive settings shared by every agent channel."""
    return [
        ("grpc.max_receive_message_length", max(MAX_ENVELOPE_BYTES, _CHUNK_CAP) + 1024),
        ("grpc.max_send_message_length", max(MAX_ENVELOPE_BYTES, MAX_INFER_BYTES) + 1024),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class GrpcAgentTransport(AgentTransport):
    """Talks to ``grpc://host:port``; TLS (``grpcs://``) when credentials are given."""

    def __init__(
        self,
        target: str,
        device_id: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        connect_timeout_s: float = 10.0,
        fetch_limits: FetchLimits | None = None,
    ) -> None:
        self.url = f"{'grpc' if credentials is None else 'grpcs'}://{target}"
        self._target = target
        self._device_id = device_id
        self._credentials = credentials
        self._connect_timeout_s = connect_timeout_s
        self.fetch_limits = fetch_limits
        self._channel: grpc.aio.Channel | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._outgoing: asyncio.Queue[object] = asyncio.Queue(maxsize=1000)

    async def connect(self, register: pb.Envelope) -> None:
        """Open the channel and the control stream, sending ``register`` first.

        Raises:
            TransportError: the hub did not answer within the connect timeout.
        """
        opts = channel_options()
        if self._credentials is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=opts)
        else:
            self._channel = grpc.aio.secure_channel(self._target, self._credentials, options=opts)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await self._channel.channel_ready()
        except TimeoutError as exc:
            await self.close()
            raise TransportError(
                f"hub at {self.url} did not answer in {self._connect_timeout_s} s"
            ) from exc
        stub = pb_grpc.HubStub(self._channel)
        self._outgoing.put_nowait(register)
        self._call = stub.Connect(self._requests())

    async def _requests(self) -> AsyncIterator[pb.Envelope]:
        while True:
            item = await self._outgoing.get()
            if item is _CLOSE:
                return
            assert isinstance(item, pb.Envelope)
            yield item

    async def send(self, env: pb.Envelope) -> None:
        """Queue one envelope on the control stream.

        Raises:
            TransportError: not connected, or the stream has ended.
        """
        if self._call is None or self._call.done():
            raise TransportError("not connected to the hub")
        await self._outgoing.put(env)

    async def receive(self) -> pb.Envelope:
        """Next envelope from the hub.

        Raises:
            TransportError: the stream ended or failed, or the hub sent garbage.
        """
        if self._call is None:
            raise TransportError("not connected to the hub")
        try:
            env = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise TransportError(
                f"control stream failed: {exc.code().name} {exc.details()}"
            ) from exc
        if env is grpc.aio.EOF:
            raise TransportError("the hub closed the control stream")
        try:
            validate_envelope(env)
        except ProtocolError as exc:
            raise TransportError(f"bad message from the hub: {exc}") from exc
        return env

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        if self._channel is None:
            raise TransportError("not connected to the hub")
        stub = pb_grpc.HubStub(self._channel)
        req = pb.FetchRequest(
            device_id=self._device_id, path=path, offset=offset, max_bytes=max_bytes
        )
        call = stub.Fetch(req)
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(path) from exc
            if exc.code() in _REFUSALS:
                # Asking again would only be refused again.
                raise FetchAborted(
                    f"fetch of {path} refused: {exc.code().name} {exc.details()}"
                ) from exc
            raise TransportError(
                f"fetch of {path} failed: {exc.code().name} {exc.details()}"
            ) from exc
        finally:
            call.cancel()

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """Run a tail on the hub with one ``InferTail`` call, its deadline ``timeout_s``.

        The request carries this device's id for hubs serving without TLS (which
        have no other way to know it); a hub serving mutual TLS ignores it and names
        the device by its certificate.

        Raises:
            InferRefusedError: The hub refused (NOT_FOUND, PERMISSION_DENIED,
                INVALID_ARGUMENT, RESOURCE_EXHAUSTED), or the request is over the cap.
            TransportError: Not connected, the call failed or passed its deadline, or
                the answer is over the cap.
        """
        if self._channel is None:
            raise TransportError("not connected to the hub")
        sent = pb.InferRequest()
        sent.CopyFrom(request)
        sent.device_id = self._device_id
        if sent.ByteSize() > MAX_INFER_BYTES:
            raise InferRefusedError(
                f"an inference request of {sent.ByteSize()} bytes is over the "
                f"{MAX_INFER_BYTES} byte cap",
                "invalid-argument",
            )
        stub = pb_grpc.HubStub(self._channel)
        try:
            async with asyncio.timeout(timeout_s + 1.0):  # gRPC's own deadline comes first
                response: pb.InferResponse = await stub.InferTail(sent, timeout=timeout_s)
        except TimeoutError as exc:
            raise TransportError(f"no inference answer in {timeout_s:g} s") from exc
        except grpc.aio.AioRpcError as exc:
            code = _INFER_REFUSALS.get(exc.code())
            detail = f"{exc.code().name} {exc.details()}"
            if code is not None:
                raise InferRefusedError(str(exc.details() or exc.code().name), code) from exc
            raise TransportError(f"inference call failed: {detail}") from exc
        if response.ByteSize() > MAX_INFER_BYTES:
            raise TransportError(f"an inference answer over the {MAX_INFER_BYTES} byte cap")
        return response

    async def close(self) -> None:
        """End the control stream and close the channel."""
        if self._call is not None and not self._call.done():
            self._outgoing.put_nowait(_CLOSE)
            self._call.cancel()
        self._call = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
