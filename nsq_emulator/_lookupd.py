"""The emulated nsqlookupd: a registration database fed by emulated nsqd, and its HTTP API.

Each :class:`Nsqd` registered with :meth:`Lookupd.register` pushes its topics and channels
as nsqd does over its lookupd connection (``REGISTER``/``UNREGISTER``); stopping the nsqd
drops its producer entries (the registrations themselves stay, as in nsqlookupd, so a topic
nobody produces any more still answers ``200`` with no producers).

The standard flavour answers like nsqlookupd v1.3.0: bare JSON bodies whatever ``Accept``
says, ``X-Nsq-Content-Type: nsq; version=1.0``, errors ``{"message": "..."}`` with their
status.  The partitioned flavour (see :class:`Cluster`) adds ``/lookup`` with ``access``,
``metainfo`` and ``partition``, ``/listlookup``, and the ``{"status_code", "status_txt",
"data"}`` envelope unless the request asks for ``application/vnd.nsq; version=1.0``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nsq_proto.wire import is_valid_topic_name

from ._http import (
    HttpError,
    HttpResponse,
    HttpServerConnection,
    Request,
    answer,
    go_response,
    respond_v1,
    route,
    topic_channel_args,
)
from ._nsqd import Nsqd
from ._options import FIXED_EPOCH, PARTITIONED_VERSION, STANDARD_VERSION
from ._util import go_json, http_date

__all__ = ["Coordinator", "Lookupd", "RegisteredNsqd"]

_Key = tuple[str, str, str]
#: path -> method -> (handler, plain text, version-negotiated)
_Routes = dict[str, dict[str, tuple[Any, bool, bool]]]


@dataclass(eq=False)
class RegisteredNsqd:
    """An nsqd as this nsqlookupd knows it: its lookupd connection, identify data and
    tombstones (nsqlookupd's ``Producer``).  Not :class:`nsq_proto.RegisteredNsqd`, which is an entry of
    a lookup's answer as a client parses it."""

    id: str
    nsqd: Nsqd
    remote_address: str
    tombstones: dict[str, float] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        o = self.nsqd.options
        return {
            "remote_address": self.remote_address,
            "hostname": o.hostname,
            "broadcast_address": o.broadcast_address,
            "tcp_port": o.tcp_port,
            "http_port": o.http_port,
            "version": o.server_version,
        }


class Coordinator(Protocol):
    """What a partitioned nsqlookupd asks the coordinator of its cluster."""

    @property
    def lookupds(self) -> Sequence[Lookupd]:
        """The cluster's nsqlookupd, the leader first."""

    @property
    def nodes(self) -> Sequence[Nsqd]: ...

    def has_topic(self, topic: str) -> bool: ...

    def topic_names(self) -> Iterable[str]: ...

    def topic_channels(self, topic: str) -> Iterable[str]:
        """The channels of every partition of ``topic`` (none if it is unknown)."""

    def create_topic(
        self,
        name: str,
        now: float,
        *,
        partitions: int = ...,
        replicas: int = ...,
        ordered: bool = ...,
        ext: bool = ...,
        disable_channel_auto_create: bool = ...,
    ) -> object: ...

    def create_channel(self, topic: str, channel: str, now: float) -> None: ...

    def lookup(self, lookupd: Lookupd, req: Request, topic: str, now: float) -> dict[str, Any]:
        """The ``/lookup`` answer (raises :class:`HttpError`)."""

    def node_info(self, node: Nsqd) -> dict[str, Any]:
        """What ``/nodes`` adds about ``node``."""

    def listlookup(self) -> dict[str, Any]:
        """The ``/listlookup`` answer."""


class Lookupd:
    """A sans-IO nsqlookupd.  Answer HTTP with :meth:`handle` or :meth:`http_connection`."""

    def __init__(
        self,
        *,
        broadcast_address: str = "127.0.0.1",
        hostname: str = "localhost",
        tcp_port: int = 4160,
        http_port: int = 4161,
        version: str | None = None,
        partitioned: bool = False,
        tombstone_lifetime: float = 45.0,
        wall_clock_offset: float | None = None,
        rpc_port: int = 4162,
    ) -> None:
        self.broadcast_address = broadcast_address
        self.hostname = hostname
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.rpc_port = rpc_port
        self.partitioned = partitioned
        self.version = version or (PARTITIONED_VERSION if partitioned else STANDARD_VERSION)
        self.tombstone_lifetime = tombstone_lifetime
        #: added to ``now`` to get the Unix time of HTTP dates; None: the host's wall clock
        #: (:meth:`set_wall_clock`), else :data:`FIXED_EPOCH`
        self.wall_clock_offset = wall_clock_offset
        self._fixed_offset = wall_clock_offset is not None
        #: the partitioned cluster this nsqlookupd answers for, if any
        self.cluster: Coordinator | None = None
        self.running = True
        #: HTTP requests answered (to check how hard clients poll)
        self.request_count = 0
        self._registrations: dict[_Key, dict[str, RegisteredNsqd]] = {}
        self._connected: dict[str, RegisteredNsqd] = {}
        self._by_nsqd: dict[int, RegisteredNsqd] = {}
        self._next_port = 40000
        self._now = 0.0

    def __repr__(self) -> str:
        return f"<Lookupd {self.broadcast_address}:{self.http_port} peers={len(self._connected)}>"

    # -- registration -----------------------------------------------------------------------------

    def set_wall_clock(self, unix_time: float, now: float) -> None:
        """The host's wall clock reads ``unix_time`` at ``now``: HTTP dates follow it, unless
        ``wall_clock_offset`` was given."""
        if not self._fixed_offset:
            self.wall_clock_offset = unix_time - now

    def register(self, nsqd: Nsqd, *, remote_address: str | None = None) -> RegisteredNsqd:
        """Connect ``nsqd`` to this lookupd: it registers now and on every change."""
        if id(nsqd) in self._by_nsqd:
            return self._by_nsqd[id(nsqd)]
        if remote_address is None:
            remote_address = f"{nsqd.options.broadcast_address}:{self._next_port}"
            self._next_port += 1
        registered = RegisteredNsqd(remote_address, nsqd, remote_address)
        self._by_nsqd[id(nsqd)] = registered
        if self not in nsqd.lookupds:
            nsqd.lookupds.append(self)
        if nsqd.running:
            self._connect(registered)
        return registered

    def unregister(self, nsqd: Nsqd) -> None:
        registered = self._by_nsqd.pop(id(nsqd), None)
        if registered is not None:
            self._disconnect(registered)
        if self in nsqd.lookupds:
            nsqd.lookupds.remove(self)

    def _connect(self, registered: RegisteredNsqd) -> None:
        self._connected[registered.id] = registered
        self._add(("client", "", ""), registered)
        for name, _partition in list(registered.nsqd.topics):
            self.nsqd_changed(registered.nsqd, name, None, True)
        for topic in list(registered.nsqd.topics.values()):
            for channel in topic.channels:
                self.nsqd_changed(registered.nsqd, topic.name, channel, True)

    def _disconnect(self, registered: RegisteredNsqd) -> None:
        self._connected.pop(registered.id, None)
        for producers in self._registrations.values():
            producers.pop(registered.id, None)
        if not self._registrations.get(("client", "", ""), True):
            del self._registrations[("client", "", "")]

    def nsqd_changed(self, nsqd: object, topic: str, channel: str | None, added: bool) -> None:
        """nsqd's REGISTER / UNREGISTER (called by the emulated nsqd)."""
        registered = self._by_nsqd.get(id(nsqd))
        if registered is None or registered.id not in self._connected:
            return
        if added:
            if channel is not None:
                self._add(("channel", topic, channel), registered)
            self._add(("topic", topic, ""), registered)
            return
        if channel is not None:
            key = ("channel", topic, channel)
            left = self._remove(key, registered)
            if left == 0 and channel.endswith("#ephemeral"):
                self._registrations.pop(key, None)
            return
        for key in [k for k in self._registrations if k[0] == "channel" and k[1] == topic]:
            self._remove(key, registered)
        key = ("topic", topic, "")
        removed = registered.id in self._registrations.get(key, {})
        left = self._remove(key, registered)
        if removed and left == 0 and topic.endswith("#ephemeral"):
            self._registrations.pop(key, None)

    def nsqd_stopped(self, nsqd: object) -> None:
        registered = self._by_nsqd.get(id(nsqd))
        if registered is not None:
            self._disconnect(registered)

    def nsqd_started(self, nsqd: object) -> None:
        registered = self._by_nsqd.get(id(nsqd))
        if registered is not None:
            self._connect(registered)

    def _add(self, key: _Key, registered: RegisteredNsqd) -> None:
        self._registrations.setdefault(key, {})[registered.id] = registered

    def _remove(self, key: _Key, registered: RegisteredNsqd) -> int:
        producers = self._registrations.get(key)
        if producers is None:
            return 0
        producers.pop(registered.id, None)
        return len(producers)

    # -- queries ----------------------------------------------------------------------------------

    def _tombstoned(self, registered: RegisteredNsqd, topic: str, now: float) -> bool:
        at = registered.tombstones.get(topic)
        return at is not None and now - at < self.tombstone_lifetime

    def topics(self) -> list[str]:
        names = {k[1] for k in self._registrations if k[0] == "topic"}
        if self.cluster is not None:
            names.update(self.cluster.topic_names())
        return sorted(names)

    def channels(self, topic: str) -> list[str]:
        names = {k[2] for k in self._registrations if k[0] == "channel" and k[1] == topic}
        if self.cluster is not None:
            names.update(self.cluster.topic_channels(topic))
        return sorted(names)

    def producers(self, topic: str, now: float | None = None) -> list[RegisteredNsqd]:
        """Active, not tombstoned producers of ``topic`` (``None`` if it is not registered)."""
        t = self._now if now is None else now
        found = self._registrations.get(("topic", topic, ""), {})
        return [p for p in found.values() if not self._tombstoned(p, topic, t)]

    def has_topic(self, topic: str) -> bool:
        return ("topic", topic, "") in self._registrations

    # -- HTTP -------------------------------------------------------------------------------------

    def handle(
        self,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        *,
        now: float | None = None,
    ) -> HttpResponse:
        """Answer one HTTP request on nsqlookupd's HTTP port."""
        if not self.running:
            raise ConnectionRefusedError("nsqlookupd is stopped")
        self.request_count += 1
        if now is not None:
            self._now = max(self._now, now)
        offset = FIXED_EPOCH if self.wall_clock_offset is None else self.wall_clock_offset
        date = None if now is None else http_date(offset + now)
        req = Request(method, target, headers, body)
        found = route(self._routes(), req, date)
        if isinstance(found, HttpResponse):
            return found
        func, plain, negotiate = found
        envelope = negotiate and not _accepts_v1(req)

        def respond(status: int, data: Any, date: str | None) -> HttpResponse:
            return self._respond(status, data, date, envelope)

        return answer(lambda: func(req, self._now), plain, date, respond)

    def _respond(
        self,
        status: int,
        data: Any,
        date: str | None,
        envelope: bool,
        extra: dict[str, str] | None = None,
    ) -> HttpResponse:
        if not envelope:
            return respond_v1(status, data, date, extra)
        # the pre-1.0 envelope the partitioned server still speaks without the Accept header
        if status == 200:
            wrapped = {"status_code": 200, "status_txt": "OK", "data": data}
            code = 200
        else:
            wrapped = {"status_code": 500, "status_txt": str(data), "data": None}
            code = 500
        header_map = dict(extra or {})
        header_map["Content-Type"] = "application/json; charset=utf-8"
        return go_response(code, header_map, go_json(wrapped), date)

    def http_connection(self, now: float) -> HttpServerConnection:
        """A sans-IO HTTP/1.1 server connection answering with :meth:`handle`."""

        def respond(
            method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, t: float
        ) -> HttpResponse:
            return self.handle(method, target, headers, body, now=t)

        return HttpServerConnection(respond, now)

    def _routes(self) -> _Routes:
        """path -> method -> (handler, plain text, version-negotiated)"""
        negotiate = self.partitioned
        routes: _Routes = {
            "/ping": {"GET": (self._ping, True, False)},
            "/info": {"GET": (self._info, False, negotiate)},
            "/lookup": {"GET": (self._lookup, False, negotiate)},
            "/topics": {"GET": (self._topics, False, negotiate)},
            "/channels": {"GET": (self._channels, False, negotiate)},
            "/nodes": {"GET": (self._nodes, False, negotiate)},
            "/topic/create": {"POST": (self._topic_create, False, False)},
            "/topic/delete": {"POST": (self._topic_delete, False, False)},
            "/channel/create": {"POST": (self._channel_create, False, False)},
            "/channel/delete": {"POST": (self._channel_delete, False, False)},
            "/topic/tombstone": {"POST": (self._tombstone, False, False)},
        }
        if self.partitioned:
            routes["/listlookup"] = {"GET": (self._listlookup, False, True)}
            routes["/topic/create"]["PUT"] = routes["/topic/create"]["POST"]
        return routes

    def _ping(self, req: Request, now: float) -> str:
        return "OK"

    def _info(self, req: Request, now: float) -> dict[str, Any]:
        return {"version": self.version}

    def _topics(self, req: Request, now: float) -> dict[str, Any]:
        return {"topics": self.topics()}

    def _channels(self, req: Request, now: float) -> dict[str, Any]:
        topic = req.get("topic")
        if topic is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        return {"channels": self.channels(topic)}

    def _lookup(self, req: Request, now: float) -> dict[str, Any]:
        topic = req.get("topic")
        if topic is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        if self.partitioned and self.cluster is not None:
            return self.cluster.lookup(self, req, topic, now)
        if not self.has_topic(topic):
            raise HttpError(404, "TOPIC_NOT_FOUND")
        return {
            "channels": self.channels(topic),
            "producers": [p.info() for p in self.producers(topic, now)],
        }

    def _nodes(self, req: Request, now: float) -> dict[str, Any]:
        nodes = []
        for registered in self._connected.values():
            topics = sorted(
                k[1]
                for k, producers in self._registrations.items()
                if k[0] == "topic" and registered.id in producers
            )
            info = registered.info()
            if self.partitioned and self.cluster is not None:
                info.update(self.cluster.node_info(registered.nsqd))
            info["tombstones"] = [self._tombstoned(registered, t, now) for t in topics]
            info["topics"] = topics
            nodes.append(info)
        return {"producers": nodes}

    def _topic_create(self, req: Request, now: float) -> None:
        topic = req.get("topic")
        if not topic:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HttpError(400, "INVALID_ARG_TOPIC")
        if self.partitioned:
            self._partitioned_topic_create(req, topic, now)
            return
        self._registrations.setdefault(("topic", topic, ""), {})

    def _partitioned_topic_create(self, req: Request, topic: str, now: float) -> None:
        """``/topic/create?topic=&partition_num=&replicator=`` on the coordinator leader."""

        def number(key: str, missing: str, invalid: str, low: int, high: int) -> int:
            text = req.get(key)
            if not text:
                raise HttpError(400, missing)
            try:
                value = int(text)
            except ValueError:
                raise HttpError(400, invalid) from None
            if not low <= value <= high:
                raise HttpError(400, invalid)
            return value

        partitions = number(
            "partition_num",
            "MISSING_ARG_TOPIC_PARTITION_NUM",
            "INVALID_ARG_TOPIC_PARTITION_NUM",
            1,
            1024,
        )
        replicas = number(
            "replicator", "MISSING_ARG_TOPIC_REPLICATOR", "INVALID_ARG_TOPIC_REPLICATOR", 1, 6
        )
        cluster = self.cluster
        if cluster is None:
            raise HttpError(500, "MISSING_COORDINATOR")
        if cluster.lookupds[0] is not self:
            raise HttpError(400, "E_FAILED_ON_NOT_LEADER")
        if cluster.has_topic(topic):
            raise HttpError(400, "already exist")
        if replicas > len(cluster.nodes):
            raise HttpError(400, "no enough data nodes")
        cluster.create_topic(
            topic,
            now,
            partitions=partitions,
            replicas=replicas,
            ordered=req.get("orderedmulti") == "true",
            ext=req.get("extend") == "true",
            disable_channel_auto_create=req.get("disable_channel_auto_create") == "true",
        )

    def _topic_delete(self, req: Request, now: float) -> None:
        topic = req.get("topic")
        if topic is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        for key in [
            k for k in self._registrations if k[0] in ("channel", "topic") and k[1] == topic
        ]:
            del self._registrations[key]

    def _channel_create(self, req: Request, now: float) -> None:
        topic, channel = topic_channel_args(req)
        if self.cluster is not None and self.cluster.has_topic(topic):
            self.cluster.create_channel(topic, channel, now)
            return
        self._registrations.setdefault(("channel", topic, channel), {})
        self._registrations.setdefault(("topic", topic, ""), {})

    def _channel_delete(self, req: Request, now: float) -> None:
        topic, channel = topic_channel_args(req)
        if self._registrations.pop(("channel", topic, channel), None) is None:
            raise HttpError(404, "CHANNEL_NOT_FOUND")

    def _tombstone(self, req: Request, now: float) -> None:
        topic = req.get("topic")
        if topic is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        node = req.get("node")
        if node is None:
            raise HttpError(400, "MISSING_ARG_NODE")
        for registered in self._registrations.get(("topic", topic, ""), {}).values():
            o = registered.nsqd.options
            if f"{o.broadcast_address}:{o.http_port}" == node:
                registered.tombstones[topic] = now

    def _listlookup(self, req: Request, now: float) -> Any:
        return None if self.cluster is None else self.cluster.listlookup()


def _accepts_v1(req: Request) -> bool:
    accept = req.header("accept")
    return accept is not None and accept.strip() == "application/vnd.nsq; version=1.0"
