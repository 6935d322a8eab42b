"""HTTP plumbing shared by the emulated nsqd and nsqlookupd.

:class:`HttpServerConnection` is a sans-IO HTTP/1.1 server connection (h11 in the server
role): bytes in, bytes out, keep-alive and ``Connection: close`` handled.  Responses are
built the way Go's ``net/http`` writes them, so header order matches a real server: the
handler's headers sorted by name, then ``Date``, ``Content-Length``, a sniffed
``Content-Type``, and ``Connection: close`` when the connection ends.

Both servers answer a request the same way: :class:`Request` parses it, :func:`route` finds
the handler for its path and method (or answers 404/405), :func:`answer` runs the handler
and turns its result, or the :class:`HttpError` it raises, into the response.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import h11

from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

from ._util import GoValueError, go_json, parse_query

__all__ = [
    "HttpResponse",
    "HttpServerConnection",
    "HttpHandler",
    "HttpError",
    "Request",
    "Responder",
    "answer",
    "go_response",
    "respond_v1",
    "respond_plain",
    "route",
    "topic_channel_args",
    "REASONS",
]

T = TypeVar("T")

#: Go's ``http.StatusText`` for the statuses the emulators use
REASONS = {
    100: "Continue",
    200: "OK",
    301: "Moved Permanently",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

_BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)


class HttpResponse(NamedTuple):
    """``(status, headers, body)``; ``headers`` are in wire order (without ``Connection``)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


#: ``(method, target, headers, body, now) -> HttpResponse``
HttpHandler = Callable[[str, str, Sequence[tuple[str, str]], bytes, float], HttpResponse]


def _sniff(body: bytes) -> str:
    """A reduced ``http.DetectContentType``: text or binary."""
    for b in body[:512]:
        if b < 0x20 and b not in (0x09, 0x0A, 0x0C, 0x0D, 0x1B):
            return "application/octet-stream"
    return "text/plain; charset=utf-8"


def go_response(
    status: int, header_map: dict[str, str], body: bytes, date: str | None
) -> HttpResponse:
    headers = sorted(header_map.items())
    if date is not None:
        headers.append(("Date", date))
    headers.append(("Content-Length", str(len(body))))
    if "Content-Type" not in header_map and body:
        headers.append(("Content-Type", _sniff(body)))
    return HttpResponse(status, headers, body)


def respond_v1(
    status: int, data: Any, date: str | None, extra: dict[str, str] | None = None
) -> HttpResponse:
    """nsq's ``http_api.RespondV1``: strings and bytes as is, other data as JSON, errors as
    ``{"message": ...}``; always ``X-Nsq-Content-Type: nsq; version=1.0``."""
    header_map = dict(extra or {})
    is_json = False
    if status == 200:
        if isinstance(data, str):
            body = data.encode("utf-8")
        elif isinstance(data, bytes):
            body = data
        elif data is None:
            body = b""
        else:
            is_json = True
            body = go_json(data)
    else:
        is_json = True
        body = go_json({"message": str(data)})
    if is_json:
        header_map["Content-Type"] = "application/json; charset=utf-8"
    header_map["X-Nsq-Content-Type"] = "nsq; version=1.0"
    return go_response(status, header_map, body, date)


def respond_plain(status: int, text: str, date: str | None) -> HttpResponse:
    """nsq's ``http_api.PlainText`` decorator."""
    return go_response(status, {}, text.encode("utf-8"), date)


#: ``(status, data, date) -> HttpResponse``: how a server writes a handler's result
Responder = Callable[[int, Any, str | None], HttpResponse]


class HttpError(Exception):
    """``http_api.Err{code, text}``: a handler's error answer."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class Request:
    """One HTTP request as the servers' handlers read it: method, path, query, headers."""

    def __init__(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> None:
        self.method = method.upper()
        path, _, query = target.partition("?")
        self.path = path
        self.raw_query = query
        self.headers = headers
        self.body = body
        length = self.header("content-length")
        try:
            self.content_length = int(length) if length is not None else -1
        except ValueError:
            self.content_length = -1

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def query(self) -> dict[str, list[str]]:
        try:
            return parse_query(self.raw_query)
        except GoValueError:
            raise HttpError(400, "INVALID_REQUEST") from None

    def get(self, key: str) -> str | None:
        values = self.query().get(key)
        return values[0] if values else None


def topic_channel_args(req: Request) -> tuple[str, str]:
    """The ``topic`` and ``channel`` query arguments, checked as nsqd and nsqlookupd do."""
    topic = req.get("topic")
    if topic is None:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        raise HttpError(400, "INVALID_ARG_TOPIC")
    channel = req.get("channel")
    if channel is None:
        raise HttpError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        raise HttpError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


def route(
    routes: Mapping[str, Mapping[str, T]], req: Request, date: str | None
) -> T | HttpResponse:
    """The route entry (path -> method -> entry) for ``req``, or the ``404`` (unknown path)
    or ``405`` (method not allowed) response, as httprouter answers."""
    methods = routes.get(req.path)
    if methods is None:
        return respond_v1(404, "NOT_FOUND", date)
    entry = methods.get(req.method)
    if entry is None:
        allowed = ", ".join(sorted({*methods, "OPTIONS"}))
        return respond_v1(405, "METHOD_NOT_ALLOWED", date, {"Allow": allowed})
    return entry


def answer(
    call: Callable[[], Any], plain: bool, date: str | None, respond: Responder = respond_v1
) -> HttpResponse:
    """Run a handler: its result (or the :class:`HttpError` it raised) as plain text for a
    ``plain`` route, else as ``respond`` writes it."""
    try:
        data = call()
    except HttpError as err:
        if plain:
            return respond_plain(err.status, err.text, date)
        return respond(err.status, err.text, date)
    if plain:
        return respond_plain(200, str(data), date)
    return respond(200, data, date)


class HttpServerConnection:
    """One HTTP/1.1 connection in the server role, answering with ``handler``.

    ``receive_data(data, now)`` (``b""`` at EOF), ``data_to_send()``, and :attr:`closed`
    (close the socket once everything is sent).
    """

    def __init__(self, handler: HttpHandler, now: float) -> None:
        self._handler = handler
        self._h11 = h11.Connection(h11.SERVER)
        self._out = bytearray()
        self._closed = False
        self._request: h11.Request | None = None
        self._body = bytearray()
        self.requests_served = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes, now: float) -> None:
        if self._closed:
            return
        try:
            self._h11.receive_data(data)
        except RuntimeError:
            self._closed = True
            return
        self._process(now)

    def _process(self, now: float) -> None:
        conn = self._h11
        while not self._closed:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                self._out += _BAD_REQUEST
                self._closed = True
                return
            if event is h11.NEED_DATA:
                if conn.their_state is h11.CLOSED:
                    self._closed = True
                return
            if event is h11.PAUSED:
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                    continue
                self._closed = conn.our_state in (h11.MUST_CLOSE, h11.CLOSED)
                return
            if isinstance(event, h11.Request):
                self._request = event
                self._body.clear()
                if conn.client_is_waiting_for_100_continue:
                    self._out += conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            elif isinstance(event, h11.Data):
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self._respond(now)
            elif isinstance(event, h11.ConnectionClosed):
                self._closed = True
                return

    def _respond(self, now: float) -> None:
        request = self._request
        assert request is not None
        headers = [
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw_items()
        ]
        resp = self._handler(
            request.method.decode("ascii"),
            request.target.decode("latin-1"),
            headers,
            bytes(self._body),
            now,
        )
        self.requests_served += 1
        conn = self._h11
        self._out += conn.send(
            h11.Response(
                status_code=resp.status,
                headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers],
                reason=REASONS.get(resp.status, "").encode("ascii"),
            )
        )
        if resp.body and request.method != b"HEAD":
            self._out += conn.send(h11.Data(data=resp.body))
        self._out += conn.send(h11.EndOfMessage())
        if conn.our_state is h11.MUST_CLOSE:
            self._closed = True
        elif conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
