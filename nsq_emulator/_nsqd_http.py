"""nsqd's HTTP API (v1.3.0 routes, status codes, bodies and headers)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from nsq_proto.wire import is_valid_topic_name

from ._http import (
    HttpError,
    HttpResponse,
    Request,
    answer,
    go_response,
    route,
    topic_channel_args,
)
from ._options import NsqdOptions
from ._protocol import NsqdConnection
from ._store import Channel, StoredMessage, Topic
from ._util import http_date, parse_start_position, rfc3339

__all__ = ["HttpNode", "handle_request", "stats_object"]

_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
_E2E = {"count": 0, "percentiles": None}
_MEMORY = {
    "heap_objects": 3420,
    "heap_idle_bytes": 2269184,
    "heap_in_use_bytes": 1433600,
    "heap_released_bytes": 2269184,
    "gc_pause_usec_100": 0,
    "gc_pause_usec_99": 0,
    "gc_pause_usec_95": 0,
    "next_gc_bytes": 4194304,
    "gc_total_runs": 0,
}


class HttpNode(Protocol):
    """What nsqd's HTTP API needs of the node it answers for."""

    @property
    def options(self) -> NsqdOptions: ...

    @property
    def started_at(self) -> float: ...

    @property
    def topics(self) -> Mapping[tuple[str, int], Topic]: ...

    @property
    def connections(self) -> Sequence[NsqdConnection]: ...

    def http_topic(self, name: str, now: float, partition: int = ...) -> Topic:
        """The topic a publish or ``/topic/create`` names (raises :class:`HttpError`)."""

    def http_existing_topic(self, name: str, partition: int = ...) -> Topic | None: ...

    def unix_time(self, now: float) -> float:
        """The Unix time (s) that ``now`` stands for."""

    def new_message(self, topic: Topic, body: bytes, now: float) -> StoredMessage: ...

    def put(self, topic: Topic, msg: StoredMessage, now: float) -> None: ...

    def get_channel(self, topic: Topic, name: str, now: float) -> Channel: ...

    def remove_topic(self, topic: Topic) -> None: ...

    def remove_channel(self, channel: Channel) -> None: ...

    def dirty_channel(self, channel: Channel) -> None: ...

    def is_leader(self, name: str, partition: int) -> bool: ...

    def set_channel_offset(self, channel: Channel, start: tuple[str, int]) -> str | None: ...


Handler = Callable[[HttpNode, Request, float], Any]


def _unix(nsqd: HttpNode, now: float) -> float:
    return nsqd.unix_time(now)


def handle_request(
    nsqd: HttpNode,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    now: float,
    *,
    dated: bool,
    tls: bool,
) -> HttpResponse:
    """Answer one request on nsqd's HTTP (or, with ``tls``, HTTPS) port at ``now``; with
    ``dated`` the response has a ``Date`` header for ``now``."""
    date = http_date(_unix(nsqd, now)) if dated else None
    opts = nsqd.options
    if opts.tls_required and not tls:
        return _tls_required(opts.https_port, date)
    req = Request(method, target, headers, body)
    found = route(_ROUTES, req, date)
    if isinstance(found, HttpResponse):
        return found
    func, plain = found
    return answer(lambda: func(nsqd, req, now), plain, date)


def _tls_required(https_port: int, date: str | None) -> HttpResponse:
    text = f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'
    return go_response(
        403,
        {
            "Content-Type": "application/json; charset=utf-8",
            "X-Nsq-Content-Type": "nsq; version=1.0",
        },
        text.encode(),
        date,
    )


def _topic_from_query(
    nsqd: HttpNode, req: Request, now: float
) -> tuple[dict[str, list[str]], Topic]:
    params = req.query()
    names = params.get("topic")
    if names is None:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(names[0]):
        raise HttpError(400, "INVALID_TOPIC")
    partition = -1
    if nsqd.options.partitioned and params.get("partition"):
        try:
            partition = int(params["partition"][0])
        except ValueError:
            raise HttpError(400, "INVALID_ARG_TOPIC_PARTITION") from None
    return params, nsqd.http_topic(names[0], now, partition)


def _existing_topic(nsqd: HttpNode, req: Request) -> tuple[Topic, str]:
    topic_name, channel_name = topic_channel_args(req)
    partition = -1
    if nsqd.options.partitioned and req.get("partition"):
        try:
            partition = int(req.get("partition") or "")
        except ValueError:
            raise HttpError(400, "INVALID_ARG_TOPIC_PARTITION") from None
    topic = nsqd.http_existing_topic(topic_name, partition)
    if topic is None:
        raise HttpError(404, "TOPIC_NOT_FOUND")
    return topic, channel_name


def _ping(nsqd: HttpNode, req: Request, now: float) -> str:
    return "OK"


def _info(nsqd: HttpNode, req: Request, now: float) -> dict[str, Any]:
    o = nsqd.options
    return {
        "version": o.server_version,
        "broadcast_address": o.broadcast_address,
        "hostname": o.hostname,
        "http_port": o.http_port,
        "tcp_port": o.tcp_port,
        "start_time": int(_unix(nsqd, nsqd.started_at)),
        "max_heartbeat_interval": round(o.max_heartbeat_interval * 1e9),
        "max_output_buffer_size": o.max_output_buffer_size,
        "max_output_buffer_timeout": round(o.max_output_buffer_timeout * 1e9),
        "max_deflate_level": o.max_deflate_level,
    }


def _pub(nsqd: HttpNode, req: Request, now: float) -> str:
    o = nsqd.options
    if req.content_length > o.max_msg_size:
        raise HttpError(413, "MSG_TOO_BIG")
    body = req.body[: o.max_msg_size + 1]
    if len(body) == o.max_msg_size + 1:
        raise HttpError(413, "MSG_TOO_BIG")
    if not body:
        raise HttpError(400, "MSG_EMPTY")
    params, topic = _topic_from_query(nsqd, req, now)
    deferred = 0.0
    if "defer" in params:
        text = params["defer"][0]
        try:
            ms = int(text, 10)
        except ValueError:
            raise HttpError(400, "INVALID_DEFER") from None
        if text.strip() != text or "_" in text or not -(1 << 63) <= ms < (1 << 63):
            raise HttpError(400, "INVALID_DEFER")
        if ms < 0 or ms > round(o.max_req_timeout * 1000):
            raise HttpError(400, "INVALID_DEFER")
        deferred = ms / 1000.0
    msg = nsqd.new_message(topic, body, now)
    msg.deferred = deferred
    nsqd.put(topic, msg, now)
    return "OK"


def _mpub(nsqd: HttpNode, req: Request, now: float) -> str:
    o = nsqd.options
    if req.content_length > o.max_body_size:
        raise HttpError(413, "BODY_TOO_BIG")
    params, topic = _topic_from_query(nsqd, req, now)
    binary = False
    if "binary" in params:
        binary = _BOOL_PARAMS.get(params["binary"][0], True)
    bodies: list[bytes] = []
    if binary:
        bodies = _read_binary_mpub(req.body, o.max_msg_size, o.max_body_size)
    else:
        read_max = o.max_body_size + 1
        data = req.body[:read_max]
        total = 0
        pos = 0
        while True:
            end = data.find(b"\n", pos)
            block = data[pos:] if end < 0 else data[pos : end + 1]
            pos = len(data) if end < 0 else end + 1
            total += len(block)
            if total == read_max:
                raise HttpError(413, "BODY_TOO_BIG")
            if block.endswith(b"\n"):
                block = block[:-1]
            if block:
                if len(block) > o.max_msg_size:
                    raise HttpError(413, "MSG_TOO_BIG")
                bodies.append(block)
            if end < 0:
                break
    messages = [nsqd.new_message(topic, b, now) for b in bodies]
    for msg in messages:
        nsqd.put(topic, msg, now)
    return "OK"


def _read_binary_mpub(data: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """``readMPUB`` over an HTTP body; errors are 413 with the code minus ``E_``."""
    pos = 0

    def read_len(code: str) -> int:
        nonlocal pos
        if len(data) - pos < 4:
            raise HttpError(413, code)
        value = int.from_bytes(data[pos : pos + 4], "big", signed=True)
        pos += 4
        return value

    count = read_len("BAD_BODY")
    if count <= 0 or count > (max_body - 4) // 5:
        raise HttpError(413, "BAD_BODY")
    out = []
    for _ in range(count):
        size = read_len("BAD_MESSAGE")
        if size <= 0 or size > max_msg or len(data) - pos < size:
            raise HttpError(413, "BAD_MESSAGE")
        out.append(data[pos : pos + size])
        pos += size
    return out


def _topic_create(nsqd: HttpNode, req: Request, now: float) -> None:
    _topic_from_query(nsqd, req, now)


def _topic_arg(req: Request) -> str:
    topic = req.get("topic")
    if topic is None:
        raise HttpError(400, "MISSING_ARG_TOPIC")
    return topic


def _topic_empty(nsqd: HttpNode, req: Request, now: float) -> None:
    name = _topic_arg(req)
    if not is_valid_topic_name(name):
        raise HttpError(400, "INVALID_TOPIC")
    topic = nsqd.http_existing_topic(name)
    if topic is None:
        raise HttpError(404, "TOPIC_NOT_FOUND")
    topic.queue.clear()


def _topic_delete(nsqd: HttpNode, req: Request, now: float) -> None:
    topic = nsqd.http_existing_topic(_topic_arg(req))
    if topic is None:
        raise HttpError(404, "TOPIC_NOT_FOUND")
    nsqd.remove_topic(topic)


def _topic_pause(nsqd: HttpNode, req: Request, now: float) -> None:
    topic = nsqd.http_existing_topic(_topic_arg(req))
    if topic is None:
        raise HttpError(404, "TOPIC_NOT_FOUND")
    topic.paused = "unpause" not in req.path
    topic.release(now)
    for channel in topic.channels.values():
        nsqd.dirty_channel(channel)


def _existing_channel(nsqd: HttpNode, req: Request) -> Channel:
    topic, channel_name = _existing_topic(nsqd, req)
    channel = topic.channels.get(channel_name)
    if channel is None:
        raise HttpError(404, "CHANNEL_NOT_FOUND")
    return channel


def _channel_create(nsqd: HttpNode, req: Request, now: float) -> None:
    topic, channel_name = _existing_topic(nsqd, req)
    nsqd.get_channel(topic, channel_name, now)


def _channel_setoffset(nsqd: HttpNode, req: Request, now: float) -> None:
    """The partitioned server's ``/channel/setoffset``: the body is a start position; it is
    applied whoever else consumes the channel."""
    if not nsqd.options.partitioned:
        raise HttpError(404, "NOT_FOUND")
    channel = _existing_channel(nsqd, req)
    if not req.body:
        raise HttpError(406, "MSG_EMPTY")
    try:
        start = parse_start_position(req.body)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None
    if not nsqd.is_leader(channel.topic.name, channel.topic.partition):
        raise HttpError(400, "E_FAILED_ON_NOT_LEADER")
    problem = nsqd.set_channel_offset(channel, start)
    if problem is not None:
        raise HttpError(500, problem)


def _channel_empty(nsqd: HttpNode, req: Request, now: float) -> None:
    channel = _existing_channel(nsqd, req)
    for client in channel.clients.values():
        client_conn: NsqdConnection = client  # type: ignore[assignment]
        client_conn.in_flight_count = 0
    channel.empty()


def _channel_delete(nsqd: HttpNode, req: Request, now: float) -> None:
    nsqd.remove_channel(_existing_channel(nsqd, req))


def _channel_pause(nsqd: HttpNode, req: Request, now: float) -> None:
    channel = _existing_channel(nsqd, req)
    channel.paused = "unpause" not in req.path
    nsqd.dirty_channel(channel)


def _stats(nsqd: HttpNode, req: Request, now: float) -> Any:
    params = req.query()

    def get(key: str) -> str:
        values = params.get(key)
        return values[0] if values else ""

    include_clients = _BOOL_PARAMS.get(get("include_clients"), True)
    include_mem = _BOOL_PARAMS.get(get("include_mem"), True)
    obj = stats_object(nsqd, get("topic"), get("channel"), include_clients, include_mem)
    if get("format") == "json":
        return obj
    return _stats_text(nsqd, obj, now).encode()


def _client_json(conn: NsqdConnection, topic_filter: str, wall: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "client_id": conn.client_id,
        "hostname": conn.hostname,
        "version": "V2",
        "remote_address": conn.remote_address,
        "state": int(conn.state),
        "ready_count": conn.ready_count,
        "in_flight_count": conn.in_flight_count,
        "message_count": conn.message_count,
        "finish_count": conn.finish_count,
        "requeue_count": conn.requeue_count,
        "connect_ts": int(wall + conn.connected_at),
        "sample_rate": conn.sample_rate,
        "deflate": conn.deflate,
        "snappy": conn.snappy,
        "user_agent": conn.user_agent,
    }
    if conn.has_authorizations():
        state = conn.auth_state
        assert state is not None
        out["authed"] = True
        if state.identity:
            out["auth_identity"] = state.identity
        if state.identity_url:
            out["auth_identity_url"] = state.identity_url
    pub_counts = []
    for topic, count in conn.pub_counts.items():
        if topic_filter and topic != topic_filter:
            continue
        pub_counts.append({"topic": topic, "count": count})
        break
    if pub_counts:
        out["pub_counts"] = pub_counts
    out.update(
        {
            "tls": conn.tls,
            "tls_cipher_suite": "TLS_AES_128_GCM_SHA256" if conn.tls else "",
            "tls_version": "TLS1.3" if conn.tls else "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": conn.tls,
        }
    )
    return out


def stats_object(
    nsqd: HttpNode, topic_filter: str, channel_filter: str, include_clients: bool, include_mem: bool
) -> dict[str, Any]:
    wall = nsqd.unix_time(0.0)
    mem_size = nsqd.options.mem_queue_size
    topics_json: list[dict[str, Any]] | None
    topics = sorted(nsqd.topics.values(), key=lambda t: (t.name, t.partition))
    if topic_filter:
        topics = [t for t in topics if t.name == topic_filter]
    if topic_filter and not topics:
        topics_json = None
    else:
        topics_json = []
        for t in topics:
            channels = sorted(t.channels.values(), key=lambda c: c.name)
            if channel_filter:
                channels = [c for c in channels if c.name == channel_filter]
                if not channels:
                    continue
            channels_json = []
            for c in channels:
                clients = None
                if include_clients:
                    clients = [
                        _client_json(conn, topic_filter, wall)  # type: ignore[arg-type]
                        for conn in c.clients.values()
                    ]
                depth, message_count = c.depth, c.message_count
                extra: dict[str, Any] = {}
                if t.partition >= 0:
                    # the partitioned server's channel is a reader of the topic's queue: its
                    # depth counts every unconfirmed message (in flight and deferred too), with
                    # their bytes, and its message count is the topic's
                    unconfirmed = [
                        *c.queue,
                        *(f.message for f in c.in_flight.values()),
                        *(d[0] for d in c.deferred.values()),
                    ]
                    depth, message_count = len(unconfirmed), t.message_count
                    extra["depth_size"] = sum(len(m.body) for m in unconfirmed)
                channels_json.append(
                    {
                        "channel_name": c.name,
                        "depth": depth,
                        **extra,
                        "backend_depth": max(0, depth - mem_size),
                        "in_flight_count": len(c.in_flight),
                        "deferred_count": len(c.deferred),
                        "message_count": message_count,
                        "requeue_count": c.requeue_count,
                        "timeout_count": c.timeout_count,
                        "client_count": len(c.clients),
                        "clients": clients,
                        "paused": c.paused,
                        "e2e_processing_latency": dict(_E2E),
                    }
                )
            entry: dict[str, Any] = {"topic_name": t.name}
            if t.partition >= 0:
                entry["topic_partition"] = str(t.partition)
                entry["is_leader"] = nsqd.is_leader(t.name, t.partition)
            entry.update(
                {
                    "channels": channels_json,
                    "depth": t.depth,
                    "backend_depth": max(0, t.depth - mem_size),
                    "message_count": t.message_count,
                }
            )
            if t.partition < 0:  # (the partitioned server does not tell)
                entry["message_bytes"] = t.message_bytes
            entry["paused"] = t.paused
            entry["e2e_processing_latency"] = dict(_E2E)
            topics_json.append(entry)
    producers: list[dict[str, Any]] | None = None
    if include_clients and not (topic_filter and topics_json is None):
        found = [
            _client_json(conn, topic_filter, wall) for conn in nsqd.connections if conn.pub_counts
        ]
        producers = found or None
    obj: dict[str, Any] = {
        "version": nsqd.options.server_version,
        "health": "OK",
        "start_time": int(wall + nsqd.started_at),
        "topics": topics_json,
    }
    if include_mem:
        obj["memory"] = dict(_MEMORY)
    obj["producers"] = producers
    return obj


def _stats_text(nsqd: HttpNode, obj: dict[str, Any], now: float) -> str:
    wall = nsqd.unix_time(0.0)
    lines = [
        f"nsqd v{nsqd.options.server_version} (emulated)",
        f"start_time {rfc3339(wall + nsqd.started_at)}",
        f"uptime {max(0.0, now - nsqd.started_at):.0f}s",
        "",
        "Health: OK",
    ]
    if "memory" in obj:
        lines += ["", "Memory:"]
        lines += [f"   {k:<25}\t{v}" for k, v in obj["memory"].items()]
    topics = obj["topics"] or []
    lines.append("")
    if not topics:
        lines.append("Topics: None")
    else:
        lines.append("Topics:")
    for t in topics:
        lines.append(
            f"   [{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: {t['backend_depth']:<5} "
            f"msgs: {t['message_count']:<8} e2e%: "
        )
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            lines.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} "
                f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} e2e%: "
            )
            for cl in c["clients"] or []:
                lines.append(
                    f"        [V2 {cl['hostname']} {cl['user_agent']}] state: {cl['state']} "
                    f"inflt: {cl['in_flight_count']:<4} rdy: {cl['ready_count']:<4} "
                    f"fin: {cl['finish_count']:<8} re-q: {cl['requeue_count']:<8} "
                    f"msgs: {cl['message_count']:<8}"
                )
    producers = obj["producers"] or []
    lines.append("")
    if not producers:
        lines.append("Producers: None")
    else:
        lines.append("Producers:")
        for p in producers:
            lines.append(f"   [V2 {p['hostname']} {p['user_agent']}] msgs: {p.get('pub_counts')}")
    return "\n".join(lines) + "\n"


_ROUTES: dict[str, dict[str, tuple[Handler, bool]]] = {
    "/ping": {"GET": (_ping, True)},
    "/info": {"GET": (_info, False)},
    "/pub": {"POST": (_pub, False)},
    "/mpub": {"POST": (_mpub, False)},
    "/stats": {"GET": (_stats, False)},
    "/topic/create": {"POST": (_topic_create, False)},
    "/topic/delete": {"POST": (_topic_delete, False)},
    "/topic/empty": {"POST": (_topic_empty, False)},
    "/topic/pause": {"POST": (_topic_pause, False)},
    "/topic/unpause": {"POST": (_topic_pause, False)},
    "/channel/create": {"POST": (_channel_create, False)},
    "/channel/delete": {"POST": (_channel_delete, False)},
    "/channel/empty": {"POST": (_channel_empty, False)},
    "/channel/setoffset": {"POST": (_channel_setoffset, False)},
    "/channel/pause": {"POST": (_channel_pause, False)},
    "/channel/unpause": {"POST": (_channel_pause, False)},
}
