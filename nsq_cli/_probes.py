"""The worker's HTTP endpoint (``--http-address``): ``/healthz``, ``/readyz`` and ``/metrics``.

Served on the worker's own event loop (asyncio or trio, through anyio), so that an answer to
``/healthz`` proves the loop runs. HTTP is parsed with h11, one request per connection
(``Connection: close``); a request head over :data:`MAX_HEAD` bytes, or a client that has not
sent its head within :data:`READ_TIMEOUT` seconds, is answered with an error or closed, so no
client holds the worker up.  ``/metrics`` is the Prometheus text exposition of
``prometheus_client`` (the ``metrics`` extra); without it, ``/metrics`` answers 501.

Only imported when ``--http-address`` is given.
"""

from __future__ import annotations

import contextlib
import http
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.abc
import h11

__all__ = ["MAX_CONNECTIONS", "MAX_HEAD", "MISSING_METRICS", "READ_TIMEOUT", "Probes", "listen"]

log = logging.getLogger("nsq.worker")

#: the largest request head read, in bytes (a larger one is answered 431 and closed)
MAX_HEAD = 16 * 1024
#: seconds a client has to send its request head, and to take the answer
READ_TIMEOUT = 10.0
#: connections served at once; one more is closed as soon as it is accepted (a flood of idle
#: clients holds no more than this many descriptors, each for READ_TIMEOUT at most)
MAX_CONNECTIONS = 64
#: seconds to wait before accepting again after an accept failed (out of descriptors)
_ACCEPT_PAUSE = 0.1
#: what a read of the socket asks for at most
_CHUNK = 4096

#: the text of /metrics without prometheus_client, and of the worker's start line
MISSING_METRICS = (
    '/metrics needs prometheus_client, which is not installed: pip install "nsq-sansio[metrics]"'
)

_TEXT = "text/plain; charset=utf-8"

#: the readiness of the worker: whether it is ready, and why (one line)
Readiness = Callable[[], "tuple[bool, str]"]
#: the metrics in the format an Accept header asks for: (body, content type)
Exposition = Callable[[str], "tuple[bytes, str]"]


async def listen(host: str, port: int) -> anyio.abc.Listener[anyio.abc.SocketStream]:
    """A TCP listener at ``host:port``; an :class:`OSError` when it cannot be bound."""
    return await anyio.create_tcp_listener(local_host=host, local_port=port)


@dataclass
class _Answer:
    status: int
    body: bytes
    content_type: str = _TEXT
    allow: str | None = None


class Probes:
    """Answers the probes from ``readiness`` and ``exposition`` (None without
    prometheus_client)."""

    def __init__(self, readiness: Readiness, exposition: Exposition | None) -> None:
        self.readiness = readiness
        self.exposition = exposition
        #: connections being served now
        self.open = 0

    async def serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        """Serve until cancelled, each connection in a task of its own, at most
        :data:`MAX_CONNECTIONS` at once.  An accept that fails (the process is out of
        descriptors) is logged, once until one succeeds again, and tried again shortly: it
        never ends the worker."""
        # the listeners of every address the host name gave (anyio's MultiListener), or this
        subs = getattr(listener, "listeners", None) or [listener]
        async with listener, anyio.create_task_group() as tg:
            for sub in subs:
                tg.start_soon(self._accept, sub, tg)

    async def _accept(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], tg: anyio.abc.TaskGroup
    ) -> None:
        failing = False
        accept = listener.accept  # type: ignore[attr-defined]
        while True:
            try:
                stream = await accept()
            except OSError as exc:
                if not failing:
                    log.warning("HTTP endpoint: accepting a connection failed: %s", exc)
                    failing = True
                await anyio.sleep(_ACCEPT_PAUSE)
                continue
            failing = False
            if self.open >= MAX_CONNECTIONS:
                await _close_now(stream)
                continue
            self.open += 1
            tg.start_soon(self._connection, stream)

    def answer(self, request: h11.Request) -> _Answer:
        method = request.method.decode("ascii", "replace")
        path = request.target.decode("ascii", "replace").partition("?")[0]
        if method not in ("GET", "HEAD"):
            return _Answer(
                405, f"method {method} is not allowed: GET or HEAD\n".encode(), allow="GET, HEAD"
            )
        if path == "/healthz":
            return _Answer(200, b"ok\n")
        if path == "/readyz":
            ready, why = self.readiness()
            return _Answer(200 if ready else 503, f"{why}\n".encode())
        if path == "/metrics":
            if self.exposition is None:
                return _Answer(501, f"{MISSING_METRICS}\n".encode())
            accept = ""
            for name, value in request.headers:
                if name == b"accept":
                    accept = value.decode("latin-1")
            body, content_type = self.exposition(accept)
            return _Answer(200, body, content_type)
        return _Answer(404, b"not found: /healthz, /readyz or /metrics\n")

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            await self._exchange(stream)
        except Exception:  # one connection's failure never ends the worker
            log.warning("HTTP connection failed", exc_info=True)
        finally:
            self.open -= 1

    async def _exchange(self, stream: anyio.abc.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        async with stream:
            answer: _Answer | None = None
            head: h11.Request | None = None
            with anyio.move_on_after(READ_TIMEOUT):
                try:
                    head = await _read_head(stream, conn)
                except h11.RemoteProtocolError as exc:
                    status = exc.error_status_hint
                    answer = _Answer(status, f"{http.HTTPStatus(status).phrase.lower()}\n".encode())
                except (anyio.BrokenResourceError, OSError):
                    return
            if head is not None:
                try:
                    answer = self.answer(head)
                except Exception:  # a bug in a probe: the worker goes on, the client is told
                    log.exception("answering %s", head.target.decode("ascii", "replace"))
                    answer = _Answer(500, b"internal error\n")
            if answer is None:  # closed, or silent for READ_TIMEOUT
                return
            with anyio.move_on_after(READ_TIMEOUT):
                try:
                    await stream.send(_response(conn, answer, head))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return


async def _close_now(stream: anyio.abc.SocketStream) -> None:
    with anyio.CancelScope(shield=True), contextlib.suppress(OSError, anyio.BrokenResourceError):
        await stream.aclose()


async def _read_head(stream: anyio.abc.SocketStream, conn: h11.Connection) -> h11.Request | None:
    """The request's head; None when the client closed first."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive(_CHUNK)
            except anyio.EndOfStream:
                data = b""
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            return event
        return None


def _response(conn: h11.Connection, answer: _Answer, head: h11.Request | None) -> bytes:
    headers = [
        ("Content-Type", answer.content_type),
        ("Content-Length", str(len(answer.body))),
        ("Connection", "close"),
        ("Cache-Control", "no-store"),
    ]
    if answer.allow is not None:
        headers.append(("Allow", answer.allow))
    reason = http.HTTPStatus(answer.status).phrase
    data = conn.send(h11.Response(status_code=answer.status, headers=headers, reason=reason))
    if head is None or head.method != b"HEAD":
        data = (data or b"") + (conn.send(h11.Data(data=answer.body)) or b"")
    return (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
