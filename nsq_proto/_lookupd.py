"""nsqlookupd over HTTP: request bytes, response parsing, and hostile-JSON validation.

Sans-IO: :func:`build_lookup_request` and :func:`build_listlookup_request` return the bytes to
write, :class:`HttpResponseParser` turns the bytes read back into a :class:`ParsedHttpResponse`, and
:func:`parse_lookup_response` / :func:`parse_listlookup_response` turn its status and body into
typed results.  Three answer shapes are accepted:

* the bare v1 object of nsqlookupd >= 1.0 (``{"channels": [...], "producers": [...]}``);
* the legacy envelope ``{"status_code", "status_txt", "data"}`` of old nsqlookupd, and of the
  partitioned server when no ``Accept`` header is sent;
* the partitioned additions: ``partitions`` (partition id -> peer), ``meta``, and ``producers``
  or ``partitions`` set to ``null``.

Every malformed answer raises :class:`LookupdError` and nothing else: a lookupd is a remote peer,
and its JSON is checked key by key before anything is trusted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final
from urllib.parse import quote, urlencode

import h11

from ._config import DEFAULT_USER_AGENT
from ._errors import LocalProtocolError, LookupdError
from ._names import check_topic

__all__ = [
    "ACCEPT_V1",
    "DEFAULT_USER_AGENT",
    "DEFAULT_MAX_BODY_SIZE",
    "MAX_PRODUCERS",
    "MAX_CHANNELS",
    "MAX_PARTITIONS",
    "MAX_LOOKUPD_NODES",
    "Peer",
    "TopicMeta",
    "LookupResult",
    "LookupdNode",
    "ParsedHttpResponse",
    "HttpResponseParser",
    "build_lookup_request",
    "build_listlookup_request",
    "parse_lookup_response",
    "parse_listlookup_response",
    "union_producers",
    "partition_addresses",
    "feed_lookup_response",
    "feed_listlookup_response",
]

#: asks nsqlookupd for the bare v1 body and real HTTP status codes (both servers honour it)
ACCEPT_V1: Final = "application/vnd.nsq; version=1.0"
#: largest response body :class:`HttpResponseParser` and the parsers accept by default
DEFAULT_MAX_BODY_SIZE: Final = 4 * 1024 * 1024

#: limits above which an answer is treated as hostile rather than merely large
MAX_PRODUCERS: Final = 10_000
MAX_CHANNELS: Final = 10_000
MAX_PARTITIONS: Final = 10_000
MAX_LOOKUPD_NODES: Final = 10_000

_MAX_INT32: Final = 2**31 - 1
_MAX_HOST_LENGTH: Final = 255
#: longest integer literal accepted in a body; longer ones are never legitimate and big-int
#: conversion is not linear, so they are refused before Python converts them
_MAX_INT_LITERAL: Final = 40
#: deepest nesting of arrays and objects accepted in a body (real answers nest a few levels;
#: below the recursion limit of every supported Python, so that each refuses the same bodies).
#: Checked before parsing: the json module's own limit (a RecursionError) depends on the
#: Python version, and from 3.13 on it lets thousands of levels through
_MAX_JSON_DEPTH: Final = 512
_JSON_STRING_RE: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET_RE: Final = re.compile(r"[\[\]{}]")
_TOPIC_NOT_FOUND: Final = "TOPIC_NOT_FOUND"
_PORT_STRING_RE: Final = re.compile(r"[0-9]{1,5}\Z")
_PARTITION_ID_RE: Final = re.compile(r"(?:0|[1-9][0-9]{0,9})\Z")


# --------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """One nsqd as nsqlookupd reports it (an entry of ``producers`` or of ``partitions``)."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str
    version: str
    #: partitioned server only: ``<ip>:<rpc port>:<tcp port>:<node id>``, ``""`` outside a
    #: cluster; None when the key is absent (standard nsqlookupd)
    distributed_id: str | None = None

    @property
    def address(self) -> tuple[str, int]:
        """Where to open the TCP connection: ``(broadcast_address, tcp_port)``."""
        return (self.broadcast_address, self.tcp_port)

    @property
    def key(self) -> str:
        """``broadcast_address:tcp_port``, the client guide's identity for the union of answers."""
        return f"{self.broadcast_address}:{self.tcp_port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicMeta:
    """The ``meta`` object of a partitioned lookup (sent when ``metainfo`` is asked for)."""

    partition_num: int
    replica: int
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False


def _empty_partitions() -> Mapping[int, Peer]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupResult:
    """A parsed ``/lookup`` answer.  An unknown topic gives an empty result, not an error."""

    producers: tuple[Peer, ...] = ()
    channels: tuple[str, ...] = ()
    #: partitioned server only: partition id -> the nsqd leading that partition (read-only)
    partitions: Mapping[int, Peer] = field(default_factory=_empty_partitions, hash=False)
    #: partitioned server only, and only when ``metainfo`` was asked for
    meta: TopicMeta | None = None
    #: False when lookupd answered ``TOPIC_NOT_FOUND`` (no nsqd has had the topic yet)
    topic_found: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupdNode:
    """One entry of ``/listlookup``'s ``lookupdnodes`` (partitioned cluster)."""

    node_ip: str
    http_port: int
    tcp_port: int | None = None
    rpc_port: int | None = None
    #: ``<NodeIP>:<RpcPort>:<TcpPort>:nsqlookup``
    id: str = ""

    @property
    def http_address(self) -> tuple[str, int]:
        """The HTTP address to query: ``(NodeIP, HttpPort)``."""
        return (self.node_ip, self.http_port)


@dataclass(frozen=True, slots=True)
class ParsedHttpResponse:
    """A complete HTTP response.  Header names are lower-cased (h11's normal form)."""

    status: int
    headers: list[tuple[bytes, bytes]] = field(hash=False)
    body: bytes


# --------------------------------------------------------------------------------------------
# requests


def _check_host(host: str) -> str:
    if not isinstance(host, str) or not _is_host(host):
        raise LocalProtocolError(f"host {host!r} is not a valid host name or address")
    return host


def _check_port(port: int) -> int:
    if type(port) is not int or not 1 <= port <= 65535:
        raise LocalProtocolError(f"port {port!r} is not in 1..65535")
    return port


def _host_header(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _build_get(host: str, port: int, target: str, user_agent: str) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    headers = [
        ("Host", _host_header(_check_host(host), _check_port(port))),
        ("User-Agent", user_agent),
        ("Accept", ACCEPT_V1),
        ("Connection", "close"),
    ]
    try:
        data = conn.send(h11.Request(method="GET", target=target, headers=headers))
        end = conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise LocalProtocolError(f"cannot build the lookupd request: {exc}") from exc
    assert data is not None and end is not None
    return data + end


def build_post_request(
    host: str,
    port: int,
    path: str,
    query: Mapping[str, str | int],
    body: bytes,
    user_agent: str = DEFAULT_USER_AGENT,
) -> bytes:
    """The bytes of ``POST path?query`` with ``body`` (nsqd's HTTP API)."""
    target = path + "?" + urlencode(list(query.items()), safe="", quote_via=quote)
    conn = h11.Connection(h11.CLIENT)
    headers = [
        ("Host", _host_header(_check_host(host), _check_port(port))),
        ("User-Agent", user_agent),
        ("Accept", ACCEPT_V1),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    try:
        head = conn.send(h11.Request(method="POST", target=target, headers=headers))
        data = conn.send(h11.Data(data=body)) if body else b""
        end = conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise LocalProtocolError(f"cannot build the nsqd request: {exc}") from exc
    assert head is not None and data is not None and end is not None
    return head + data + end


def build_lookup_request(
    host: str,
    port: int,
    topic: str,
    *,
    access: str | None = None,
    metainfo: bool = False,
    partition: int | None = None,
    user_agent: str = DEFAULT_USER_AGENT,
) -> bytes:
    """The bytes of ``GET /lookup?topic=...`` for the lookupd at ``host:port``.

    ``access`` (``"r"`` or ``"w"``), ``metainfo`` and ``partition`` are the partitioned
    server's parameters; standard nsqlookupd ignores them.  Raises :class:`LocalProtocolError`
    (:class:`InvalidName` for the topic) when an argument cannot be sent.
    """
    params = [("topic", check_topic(topic))]
    if access is not None:
        if access not in ("r", "w"):
            raise LocalProtocolError(f"access must be 'r' or 'w', not {access!r}")
        params.append(("access", access))
    if metainfo:
        params.append(("metainfo", "true"))
    if partition is not None:
        if type(partition) is not int or not 0 <= partition <= _MAX_INT32:
            raise LocalProtocolError(f"partition {partition!r} is not a non-negative int32")
        params.append(("partition", str(partition)))
    target = "/lookup?" + urlencode(params, safe="", quote_via=quote)
    return _build_get(host, port, target, user_agent)


def build_listlookup_request(
    host: str, port: int, *, user_agent: str = DEFAULT_USER_AGENT
) -> bytes:
    """The bytes of ``GET /listlookup`` (partitioned cluster: list every lookupd)."""
    return _build_get(host, port, "/listlookup", user_agent)


# --------------------------------------------------------------------------------------------
# HTTP responses


class HttpResponseParser:
    """Incremental HTTP/1.1 response reader on top of an h11 client connection.

    Feed bytes in any chunking with :meth:`receive_data` (``b""`` means the peer closed);
    it returns the :class:`ParsedHttpResponse` once, when the response is complete, and None
    before and after.  Malformed HTTP, a body above ``max_body_size`` and a close before the
    end raise :class:`LookupdError`; after that every call raises the same error.
    """

    __slots__ = (
        "_body",
        "_conn",
        "_error",
        "_headers",
        "_max_body_size",
        "_received",
        "_response",
        "_status",
    )

    def __init__(self, *, max_body_size: int = DEFAULT_MAX_BODY_SIZE) -> None:
        if max_body_size < 0:
            raise ValueError("max_body_size must not be negative")
        self._conn = h11.Connection(h11.CLIENT)
        # h11 reads a response only after a request went out: play the GET we sent, so the
        # state machine (1xx handling, body framing) matches the real exchange.
        self._conn.send(h11.Request(method="GET", target="/", headers=[("Host", "lookupd")]))
        self._conn.send(h11.EndOfMessage())
        self._max_body_size = max_body_size
        self._status: int | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body = bytearray()
        self._response: ParsedHttpResponse | None = None
        self._error: LookupdError | None = None
        self._received = 0

    @property
    def response(self) -> ParsedHttpResponse | None:
        """The complete response, once it has arrived."""
        return self._response

    def receive_data(self, data: bytes) -> ParsedHttpResponse | None:
        if self._error is not None:
            raise self._error
        if self._response is not None:
            return None  # anything after the response (``Connection: close``) is ignored
        self._received += len(data)
        try:
            self._conn.receive_data(data)
            return self._next_response()
        except h11.ProtocolError as exc:
            if data:
                message = f"malformed HTTP response: {exc}"
            elif self._received:
                message = f"the connection closed before the end of the HTTP response ({exc})"
            else:
                message = "the connection closed before an HTTP response arrived"
            self._error = LookupdError(message)
            raise self._error from exc
        except LookupdError as exc:
            self._error = exc
            raise

    def _next_response(self) -> ParsedHttpResponse | None:
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return None
            if isinstance(event, h11.Response):
                self._start(event)
            elif isinstance(event, h11.Data):
                if len(self._body) + len(event.data) > self._max_body_size:
                    raise LookupdError(
                        f"HTTP response body is above the limit of {self._max_body_size} bytes"
                    )
                self._body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert self._status is not None
                self._response = ParsedHttpResponse(self._status, self._headers, bytes(self._body))
                self._body = bytearray()
                return self._response
            elif isinstance(event, h11.ConnectionClosed):
                # h11 reports an early close as an error; this guards the loop regardless
                raise LookupdError("the connection closed before an HTTP response arrived")
            # InformationalResponse (1xx): skipped, the final response follows

    def _start(self, event: h11.Response) -> None:
        self._status = event.status_code
        self._headers = [(name, value) for name, value in event.headers]
        for name, value in self._headers:
            if name == b"content-length" and int(value) > self._max_body_size:
                raise LookupdError(
                    f"HTTP response body of {int(value)} bytes is above the limit of "
                    f"{self._max_body_size} bytes"
                )


# --------------------------------------------------------------------------------------------
# JSON helpers: every check raises LookupdError with the path of the offending value


def _is_host(text: str) -> bool:
    return (
        0 < len(text) <= _MAX_HOST_LENGTH
        and text.isprintable()
        and not any(c.isspace() for c in text)
    )


def _show(value: object) -> str:
    """A short, safe description of a JSON value for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        text = repr(value[:40])
        return f"the string {text}{'...' if len(value) > 40 else ''}"
    text = repr(value)
    return f"the number {text[:40]}{'...' if len(text) > 40 else ''}"


def _parse_int(literal: str) -> int:
    if len(literal) > _MAX_INT_LITERAL:
        raise ValueError(f"integer literal of {len(literal)} characters")
    return int(literal)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _check_size(body: bytes, what: str) -> None:
    if len(body) > DEFAULT_MAX_BODY_SIZE:
        raise LookupdError(
            f"{what}: body of {len(body)} bytes is above the limit of {DEFAULT_MAX_BODY_SIZE}"
        )


def _decode_json(body: bytes, what: str) -> object:
    _check_size(body, what)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LookupdError(f"{what}: body is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if _too_deep(text):
        raise LookupdError(f"{what}: body is not valid JSON (nested too deeply)")
    try:
        value: object = json.loads(text, parse_int=_parse_int, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise LookupdError(f"{what}: body is not valid JSON (nested too deeply)") from exc
    except ValueError as exc:
        raise LookupdError(f"{what}: body is not valid JSON ({exc})") from exc
    return value


def _too_deep(text: str) -> bool:
    """Arrays and objects nest deeper than ``_MAX_JSON_DEPTH`` (brackets in strings aside)."""
    depth = 0
    for bracket in _JSON_BRACKET_RE.findall(_JSON_STRING_RE.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > _MAX_JSON_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _error_text(body: bytes) -> str | None:
    """The error text of a non-200 answer: ``message``, ``status_txt``, or short plain text."""
    try:
        doc = _decode_json(body, "error body")
    except LookupdError:
        try:
            text = body[:200].decode("utf-8").strip()
        except UnicodeDecodeError:
            return None
        return text[:80] if text and text.isprintable() else None
    if isinstance(doc, dict):
        for key in ("message", "status_txt"):
            value = doc.get(key)
            if isinstance(value, str):
                return value[:200]
    return None


def _object(value: object, path: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise LookupdError(f"{path} must be a JSON object, got {_show(value)}")
    return value


def _array(value: object, path: str, limit: int) -> list[object]:
    """A JSON array, or ``[]`` for null."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise LookupdError(f"{path} must be an array or null, got {_show(value)}")
    if len(value) > limit:
        raise LookupdError(f"{path} has {len(value)} entries, more than the limit of {limit}")
    return value


def _required(obj: dict[str, object], key: str, path: str) -> object:
    if key not in obj:
        raise LookupdError(f"{path} has no {key!r} key")
    return obj[key]


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise LookupdError(f"{path} must be a string, got {_show(value)}")
    return value


def _host(value: object, path: str) -> str:
    text = _str(value, path)
    if not _is_host(text):
        raise LookupdError(f"{path} is not a usable host name or address: {_show(text)}")
    return text


def _int(value: object, path: str, low: int, high: int) -> int:
    if type(value) is not int:
        raise LookupdError(f"{path} must be an integer, got {_show(value)}")
    if not low <= value <= high:
        raise LookupdError(f"{path} is {_show(value)}, outside {low}..{high}")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise LookupdError(f"{path} must be true or false, got {_show(value)}")
    return value


def _port_string(value: object, path: str) -> int:
    text = _str(value, path)
    if _PORT_STRING_RE.match(text) is None or not 1 <= int(text) <= 65535:
        raise LookupdError(f"{path} is not a port number: {_show(text)}")
    return int(text)


def _envelope(doc: object, what: str) -> tuple[int, str, object]:
    """``(status_code, status_txt, data)``; a bare (v1) document is ``(200, "OK", doc)``."""
    if not isinstance(doc, dict) or "status_code" not in doc:
        return 200, "OK", doc
    code = _int(doc["status_code"], f"{what} status_code", 0, 999)
    text = _str(doc.get("status_txt", ""), f"{what} status_txt")
    if code != 200:
        return code, text, None
    return code, text, _required(doc, "data", f"{what} envelope")


# --------------------------------------------------------------------------------------------
# /lookup


def _producer(value: object, path: str) -> Peer:
    obj = _object(value, path)
    distributed_id = obj.get("distributed_id")
    return Peer(
        broadcast_address=_host(
            _required(obj, "broadcast_address", path), f"{path}.broadcast_address"
        ),
        tcp_port=_int(_required(obj, "tcp_port", path), f"{path}.tcp_port", 1, 65535),
        http_port=_int(_required(obj, "http_port", path), f"{path}.http_port", 0, 65535),
        hostname=_str(_required(obj, "hostname", path), f"{path}.hostname"),
        version=_str(_required(obj, "version", path), f"{path}.version"),
        distributed_id=(
            None if distributed_id is None else _str(distributed_id, f"{path}.distributed_id")
        ),
    )


def _partitions(value: object) -> Mapping[int, Peer]:
    if value is None:
        return _empty_partitions()
    obj = _object(value, "lookup partitions")
    if len(obj) > MAX_PARTITIONS:
        raise LookupdError(
            f"lookup partitions has {len(obj)} entries, more than the limit of {MAX_PARTITIONS}"
        )
    partitions: dict[int, Peer] = {}
    for key, peer in obj.items():
        if _PARTITION_ID_RE.match(key) is None or int(key) > _MAX_INT32:
            raise LookupdError(f"lookup partitions has a key that is not a partition id: {key!r}")
        partitions[int(key)] = _producer(peer, f"lookup partitions[{key}]")
    return MappingProxyType(partitions)


def _meta(value: object) -> TopicMeta | None:
    if value is None:
        return None
    obj = _object(value, "lookup meta")
    flags: dict[str, bool] = {}
    for key in ("extend_support", "ordered", "multi_part", "disable_channel_auto_create"):
        if key in obj:
            flags[key] = _bool(obj[key], f"lookup meta.{key}")
    return TopicMeta(
        partition_num=_int(
            _required(obj, "partition_num", "lookup meta"),
            "lookup meta.partition_num",
            0,
            _MAX_INT32,
        ),
        replica=_int(
            _required(obj, "replica", "lookup meta"), "lookup meta.replica", 0, _MAX_INT32
        ),
        **flags,
    )


def parse_lookup_response(status: int, body: bytes) -> LookupResult:
    """Parse the status and body of a ``/lookup`` answer.

    ``TOPIC_NOT_FOUND`` (v1: 404 ``{"message": ...}``; legacy: the envelope's ``status_txt``)
    gives an empty :class:`LookupResult`.  Every other error status and every malformed body
    raises :class:`LookupdError`.
    """
    _check_size(body, "lookup response")
    if status != 200:
        text = _error_text(body)
        if status in (404, 500) and text == _TOPIC_NOT_FOUND:
            return LookupResult(topic_found=False)
        detail = f": {text}" if text else ""
        raise LookupdError(f"lookup failed with HTTP {status}{detail}")
    if not body.strip():
        raise LookupdError("lookup response: empty body")
    code, text, data = _envelope(_decode_json(body, "lookup response"), "lookup response")
    if code != 200:
        if text == _TOPIC_NOT_FOUND:
            return LookupResult(topic_found=False)
        raise LookupdError(f"lookup failed with status_code {code}: {text}")
    obj = _object(data, "lookup data")
    producers = _array(
        _required(obj, "producers", "lookup data"), "lookup producers", MAX_PRODUCERS
    )
    channels = _array(obj.get("channels"), "lookup channels", MAX_CHANNELS)
    return LookupResult(
        producers=tuple(
            _producer(peer, f"lookup producers[{i}]") for i, peer in enumerate(producers)
        ),
        channels=tuple(_str(name, f"lookup channels[{i}]") for i, name in enumerate(channels)),
        partitions=_partitions(obj.get("partitions")),
        meta=_meta(obj.get("meta")),
    )


# --------------------------------------------------------------------------------------------
# /listlookup


def _lookupd_node(value: object, path: str) -> LookupdNode:
    obj = _object(value, path)
    tcp_port = obj.get("TcpPort")
    rpc_port = obj.get("RpcPort")
    return LookupdNode(
        node_ip=_host(_required(obj, "NodeIP", path), f"{path}.NodeIP"),
        http_port=_port_string(_required(obj, "HttpPort", path), f"{path}.HttpPort"),
        tcp_port=None if tcp_port is None else _port_string(tcp_port, f"{path}.TcpPort"),
        rpc_port=None if rpc_port is None else _port_string(rpc_port, f"{path}.RpcPort"),
        id=_str(obj.get("ID", ""), f"{path}.ID"),
    )


def parse_listlookup_response(status: int, body: bytes) -> tuple[LookupdNode, ...]:
    """Parse a ``/listlookup`` answer into its ``lookupdnodes`` (``lookupdleader`` is ignored).

    404 (a server without ``/listlookup``), an empty body and ``data: null`` (no cluster
    coordinator) give ``()``.  Other error statuses and malformed bodies raise
    :class:`LookupdError`.
    """
    _check_size(body, "listlookup response")
    if status == 404:
        return ()
    if status != 200:
        text = _error_text(body)
        detail = f": {text}" if text else ""
        raise LookupdError(f"listlookup failed with HTTP {status}{detail}")
    if not body.strip():
        return ()
    code, text, data = _envelope(_decode_json(body, "listlookup response"), "listlookup response")
    if code != 200:
        raise LookupdError(f"listlookup failed with status_code {code}: {text}")
    if data is None:
        return ()
    obj = _object(data, "listlookup data")
    nodes = _array(
        _required(obj, "lookupdnodes", "listlookup data"),
        "listlookup lookupdnodes",
        MAX_LOOKUPD_NODES,
    )
    return tuple(
        _lookupd_node(node, f"listlookup lookupdnodes[{i}]") for i, node in enumerate(nodes)
    )


# --------------------------------------------------------------------------------------------
# combining answers from several lookupds


def union_producers(results: Iterable[LookupResult]) -> dict[str, Peer]:
    """The union of every answer's producers, keyed by ``broadcast_address:tcp_port``.

    nsqlookupd instances do not share data, so a client polls all of them and connects to
    the union (the client guide's rule).  When two answers list the same key, the first wins.
    """
    union: dict[str, Peer] = {}
    for result in results:
        for producer in result.producers:
            union.setdefault(producer.key, producer)
    return union


def partition_addresses(results: Iterable[LookupResult]) -> dict[int, tuple[str, int]]:
    """Partitioned server: partition id -> ``(broadcast_address, tcp_port)`` of its nsqd.

    Merged over several answers; when two answers disagree about a partition, the first wins.
    """
    addresses: dict[int, tuple[str, int]] = {}
    for result in results:
        for partition, peer in result.partitions.items():
            addresses.setdefault(partition, peer.address)
    return addresses


def feed_lookup_response(parser: HttpResponseParser, data: bytes) -> LookupResult | None:
    """Feed one read of a ``/lookup`` response (``b""`` at EOF): the parsed answer once it is
    complete, None while more is expected; :class:`LookupdError` for anything unusable."""
    response = _feed(parser, data)
    return None if response is None else parse_lookup_response(response.status, response.body)


def feed_listlookup_response(
    parser: HttpResponseParser, data: bytes
) -> tuple[LookupdNode, ...] | None:
    """The same for a ``/listlookup`` response."""
    response = _feed(parser, data)
    if response is None:
        return None
    return parse_listlookup_response(response.status, response.body)


def _feed(parser: HttpResponseParser, data: bytes) -> ParsedHttpResponse | None:
    response = parser.receive_data(data)
    if response is None and not data:
        raise LookupdError("lookupd closed the connection before a full response")
    return response
