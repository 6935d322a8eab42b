"""The executor reader's view of the cluster, on the driver (``read_mode`` ``executors``):
which nsqd have the topic (the options' addresses, lookupd's ``/lookup``) and how many
messages wait on the channel there (nsqd's ``/stats``, read by ``_planning``)."""

from __future__ import annotations

import logging
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from nsq_proto import parse_lookup_response

from ._options import SourceOptions
from ._planning import (
    connect_timeout,
    mean_body_size,
    source_key,
    topic_channel,
    topic_entries,
    waiting,
)

__all__ = ["HTTP_TIMEOUT", "Planner"]

log = logging.getLogger("nsq_spark")

#: seconds an HTTP request to nsqd or lookupd may take
HTTP_TIMEOUT = 10.0


def _http(
    address: str, path: str, *, post: bool = False, tls: Callable[[], ssl.SSLContext] | None = None
) -> tuple[int, bytes]:
    """``address``: ``host:port`` or ``http://host:port`` (HTTP), or ``https://host:port``
    (HTTPS with the context ``tls`` makes)."""
    secure = address.startswith("https://")
    context = tls() if secure and tls is not None else None
    url = address if secure else f"http://{address.removeprefix('http://')}"
    request = urllib.request.Request(
        f"{url}{path}",
        data=b"" if post else None,
        method="POST" if post else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT, context=context) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _query(**params: str) -> str:
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


class Planner:
    """What the driver knows: which nsqd have the topic, and how many messages wait."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.started = time.monotonic()
        self.answered = False
        self.last_error: str | None = None
        #: what the planner reads, by key (:attr:`Part.source`): an nsqd's TCP address, with
        #: an NSQ partition on the partitioned server
        self.sources: dict[str, tuple[str, int | None]] = {}
        #: source -> the mean body size of the messages there (where nsqd's stats tell: the
        #: channel's ``depth_size`` / ``depth``, or the topic's ``message_bytes`` /
        #: ``message_count``)
        self.sizes: dict[str, float] = {}
        #: source -> the channel's counters at the last stats, where nsqd tells them:
        #: (messages that reached the channel, its backlog: ready, in flight and deferred);
        #: a channel the planner creates counts the topic's messages as reached already
        self.counters: dict[str, tuple[int, int]] = {}
        self._context: ssl.SSLContext | None = None

    def _tls(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = self.options.connection.https_context()
        return self._context

    def nodes(self) -> dict[str, str]:
        """TCP address -> HTTP address of every nsqd to read."""
        o = self.options
        c = o.connection
        nodes = dict(zip(c.nsqd_tcp_addresses, o.nsqd_http_addresses, strict=True))
        for lookupd in c.lookupd_http_addresses:
            try:
                status, body = _http(lookupd, "/lookup?" + _query(topic=o.topic))
                result = parse_lookup_response(status, body)
            except (OSError, ValueError) as exc:
                self.last_error = f"lookupd {lookupd}: {exc}"
                log.warning("the nsq source could not ask lookupd %s: %s", lookupd, exc)
                continue
            self.answered = True
            for peer in result.producers:
                nodes.setdefault(peer.key, f"{peer.broadcast_address}:{peer.http_port}")
        return nodes

    def depths(self) -> dict[str, int]:
        """Source (see :attr:`sources`) -> messages waiting on the channel there (ready, not
        in flight or deferred)."""
        o = self.options
        depths: dict[str, int] = {}
        for tcp, http in self.nodes().items():
            try:
                found = self._depths(http)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.last_error = f"nsqd: {http}: {exc}"
                log.warning("the nsq source could not ask nsqd %s for its stats: %s", http, exc)
                continue
            self.answered = True
            for partition, depth, size, counters in found:
                if o.partitions is not None and partition not in o.partitions:
                    continue
                key = source_key(tcp, partition)
                self.sources[key] = (tcp, partition)
                depths[key] = depth
                if size is not None:
                    self.sizes[key] = size
                if counters is not None:
                    self.counters[key] = counters
                else:
                    self.counters.pop(key, None)
        if not self.answered and time.monotonic() - self.started > o.connect_timeout:
            c = o.connection
            where = [
                f"nsqd {t} (HTTP {h})"
                for t, h in zip(c.nsqd_tcp_addresses, o.nsqd_http_addresses, strict=True)
            ]
            where += [f"lookupd {a}" for a in c.lookupd_http_addresses]
            causes = [self.last_error] if self.last_error else []
            raise connect_timeout(o, where, causes)
        return depths

    def _depths(
        self, http: str
    ) -> list[tuple[int | None, int, float | None, tuple[int, int] | None]]:
        """For each place of the topic on the nsqd at ``http`` (one, or each partition it
        leads on the partitioned server): its partition, the messages waiting on the channel,
        their mean body size and the channel's counters (see :attr:`counters`) if known."""
        found = []
        for topic in self._topic_stats(http):
            partitioned = "topic_partition" in topic
            if partitioned and topic.get("is_leader") is False:
                continue  # a replica: its leader is read
            partition = int(topic["topic_partition"]) if partitioned else None
            channel = topic_channel(topic, self.options.channel)
            if channel is not None:
                found.append((partition, *waiting(topic, channel, partitioned)))
                continue
            # a topic without our channel: create it, as a consumer's SUB would, so that
            # messages are kept for it from now on
            self._create_channel(http, partition)
            if partitioned or topic.get("channels"):
                # it starts empty (the partitioned server's at the end of the topic); what
                # reached the topic so far never reaches it
                arrived = topic.get("message_count") if partitioned else 0
                counters = (arrived, 0) if isinstance(arrived, int) else None
                found.append((partition, 0, mean_body_size(topic, None), counters))
                continue
            # nsqd hands a topic's first channel what the topic holds (in the background):
            # those messages count as there now
            after = [t for t in self._topic_stats(http) if "topic_partition" not in t]
            channel = topic_channel(after[0], self.options.channel) if after else None
            depth = int(channel["depth"]) if channel is not None else 0
            depth = max(int(topic.get("depth", 0)), depth)
            found.append((None, depth, mean_body_size(topic, None), (depth, depth)))
        return found

    def _create_channel(self, http: str, partition: int | None) -> None:
        o = self.options
        where: dict[str, Any] = {"topic": o.topic, "channel": o.channel}
        if partition is not None:
            where["partition"] = partition
        status, _ = _http(http, "/channel/create?" + _query(**where), post=True, tls=self._tls)
        if status != 200:
            raise ValueError(f"/channel/create answered {status}")

    def _topic_stats(self, http: str) -> list[dict[str, Any]]:
        """The topic's entries in nsqd's stats: one, or one per partition it holds."""
        o = self.options
        # (not filtered by channel: nsqd then leaves out a topic without that channel)
        query = _query(format="json", topic=o.topic, include_clients="false")
        status, body = _http(http, "/stats?" + query, tls=self._tls)
        return topic_entries(status, body, o.topic)
