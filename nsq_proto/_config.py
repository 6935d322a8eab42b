"""Validated configuration: of one nsqd connection (what IDENTIFY asks for), and of the consumer
and producer cores built on it.

These stay plain Python dataclasses in the compiled (mypyc) build too: their checks look at the
type of each value given (``True`` is not a count), which compiled attributes would convert
first.  :class:`ConsumerConfig` and :class:`ProducerConfig` are re-exported by ``_consumer``
and ``_producer``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ._errors import ConfigError
from ._ext_filter import ExtFilter
from ._frames import DEFAULT_MAX_FRAME_SIZE
from ._partitioned import Hasher
from ._start_from import StartFrom
from ._version import __version__

__all__ = [
    "ConfigError",
    "ConnectionConfig",
    "ConsumerConfig",
    "ProducerConfig",
    "DEFAULT_USER_AGENT",
    "check_seconds",
    "parse_address",
    "parse_addresses",
    "parse_client_addresses",
]

#: the user agent of every connection and lookupd request unless ``user_agent`` says otherwise
DEFAULT_USER_AGENT = f"nsq-sansio/{__version__}"


def check_seconds(config: object, names: tuple[str, ...], *, positive: bool) -> None:
    """Each named field is a finite number of seconds, > 0 (``positive``) or >= 0."""
    for name in names:
        value = getattr(config, name)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
        if not ok:
            kind = "positive" if positive else "non-negative"
            raise ConfigError(f"{name} must be a {kind} number of seconds, not {value!r}")


def parse_address(address: str | tuple[str, int], *, http: bool = False) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) or a ``(host, port)`` pair, validated.

    ``http``: the address of an HTTP API (nsqlookupd's), which may also be written
    ``"http://host:port"``.  An nsqd TCP address takes no scheme."""
    if isinstance(address, tuple) and len(address) == 2:
        host, port = address
        if not isinstance(host, str) or "/" in host:
            raise ConfigError(f"address {address!r} is not a (host, port) pair")
    elif isinstance(address, str):
        text = address
        if http and text.lower().startswith("http://"):
            text = text[len("http://") :].removesuffix("/")
        if "/" in text:
            if http:
                raise ConfigError(
                    f"address {address!r} is not host:port or http://host:port "
                    "(no other scheme, no path)"
                )
            raise ConfigError(f"address {address!r} is not host:port (no scheme, no path)")
        host, sep, port_text = text.rpartition(":")
        if not sep or not port_text.isdigit():
            raise ConfigError(f"address {address!r} is not host:port (it needs a port number)")
        port = int(port_text)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    else:
        raise ConfigError(f'address {address!r} is not a "host:port" string')
    if not host:
        raise ConfigError(f"address {address!r} is not host:port (it needs a host)")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"address {address!r} is not host:port (the port must be 1..65535)")
    return host, port


def parse_addresses(
    name: str, addresses: Iterable[str | tuple[str, int]], *, http: bool = False
) -> list[tuple[str, int]]:
    """Every address of the option ``name`` (a list), validated by :func:`parse_address`; the
    :class:`ConfigError` names the option and the bad value."""
    if isinstance(addresses, str | bytes):
        raise ConfigError(
            f'{name} must be a list of "host:port" strings, not the string {addresses!r} '
            f"(write [{addresses!r}])"
        )
    try:
        return [parse_address(a, http=http) for a in addresses]
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    except TypeError:
        raise ConfigError(
            f'{name} must be a list of "host:port" strings, not {addresses!r}'
        ) from None


def parse_client_addresses(
    nsqd_tcp_addresses: Iterable[str | tuple[str, int]],
    lookupd_http_addresses: Iterable[str | tuple[str, int]],
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The addresses of a consumer or a producer, validated (each by :func:`parse_addresses`,
    a lookupd's may be ``http://host:port``); one of the lists must not be empty."""
    nsqd = parse_addresses("nsqd_tcp_addresses", nsqd_tcp_addresses)
    lookupd = parse_addresses("lookupd_http_addresses", lookupd_http_addresses, http=True)
    if not nsqd and not lookupd:
        raise ConfigError("give nsqd_tcp_addresses or lookupd_http_addresses")
    return nsqd, lookupd


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionConfig:
    """Settings of one connection.  Durations are seconds (floats); ms only on the wire.

    Ranges follow nsqd v1.3.0 defaults, so a value nsqd would refuse with a fatal
    ``E_BAD_BODY`` fails here, at construction, instead.
    """

    client_id: str | None = None
    hostname: str | None = None
    user_agent: str | None = DEFAULT_USER_AGENT
    #: None disables heartbeats (nsqd then refuses SUB)
    heartbeat_interval: float | None = 30.0
    #: close the connection after this long without any byte from nsqd; None: two heartbeats
    read_timeout: float | None = None
    #: the handshake (IDENTIFY, TLS, compression, AUTH) must be over this long after the TCP
    #: connection is up: a frozen nsqd (SIGSTOP) accepts connections and then says nothing
    handshake_timeout: float = 10.0
    #: a write to nsqd (or lookupd) that takes longer than this fails the connection: the
    #: bytes of a stop's FINs and REQs are written even while the client is being cancelled,
    #: but not forever
    write_timeout: float = 10.0
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: float | None = None
    output_buffer_size: int | None = None
    #: None keeps nsqd's default, 0 disables output buffering timeouts (-1 on the wire)
    output_buffer_timeout: float | None = None
    auth_secret: bytes | None = None
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: partitioned extension: identify as able to read extended (JSON header) messages
    extend_support: bool = False
    desired_tag: str | None = None
    #: partitioned extension: the server delivers only the extended messages whose JSON
    #: header matches (the others are finished for the whole channel)
    ext_filter: ExtFilter | None = None
    #: extra IDENTIFY keys, sent after the known ones
    identify_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        hb = self.heartbeat_interval
        if hb is not None and not (1.0 <= hb <= 60.0):
            raise ConfigError(f"heartbeat_interval must be 1..60 s or None, not {hb!r}")
        rt = self.read_timeout
        if rt is not None and not (rt > 0 and math.isfinite(rt)):
            raise ConfigError(f"read_timeout must be a positive number of seconds, not {rt!r}")
        ht = self.handshake_timeout
        if isinstance(ht, bool) or not isinstance(ht, int | float) or not (0 < ht < math.inf):
            raise ConfigError(f"handshake_timeout must be a positive number of seconds, not {ht!r}")
        wt = self.write_timeout
        if isinstance(wt, bool) or not isinstance(wt, int | float) or not (0 < wt < math.inf):
            raise ConfigError(f"write_timeout must be a positive number of seconds, not {wt!r}")
        if rt is not None and hb is not None and rt <= hb:
            raise ConfigError("read_timeout must be longer than heartbeat_interval")
        if self.snappy and self.deflate:
            raise ConfigError("snappy and deflate are mutually exclusive")
        if not 1 <= self.deflate_level <= 9:
            raise ConfigError(f"deflate_level must be 1..9, not {self.deflate_level!r}")
        if not 0 <= self.sample_rate <= 99:
            raise ConfigError(f"sample_rate must be 0..99, not {self.sample_rate!r}")
        mt = self.msg_timeout
        if mt is not None and not (mt >= 1.0 and math.isfinite(mt)):
            raise ConfigError(f"msg_timeout must be at least 1 s, not {mt!r}")
        obs = self.output_buffer_size
        if obs is not None and not (obs == -1 or obs >= 64):
            raise ConfigError(f"output_buffer_size must be -1 or >= 64, not {obs!r}")
        obt = self.output_buffer_timeout
        if obt is not None and not (obt == 0 or 0.025 <= obt <= 30.0):
            raise ConfigError(f"output_buffer_timeout must be 0 or 0.025..30 s, not {obt!r}")
        if self.max_frame_size < 1024:
            raise ConfigError("max_frame_size must be at least 1024")
        if self.desired_tag is not None and len(self.desired_tag) > 100:
            raise ConfigError("desired_tag is at most 100 characters")
        if self.ext_filter is not None and not isinstance(self.ext_filter, ExtFilter):
            raise ConfigError(f"ext_filter must be an ExtFilter, not {self.ext_filter!r}")

    def connection_config(self, **changes: Any) -> ConnectionConfig:
        """Just the connection settings of this (consumer or producer) configuration."""
        values = {f.name: getattr(self, f.name) for f in fields(ConnectionConfig)}
        values.update(changes)
        return ConnectionConfig(**values)

    @property
    def effective_read_timeout(self) -> float | None:
        if self.read_timeout is not None:
            return self.read_timeout
        if self.heartbeat_interval is None:
            return None
        return 2.0 * self.heartbeat_interval

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON, keys in a stable order."""
        body: dict[str, Any] = {}
        if self.client_id is not None:
            body["client_id"] = self.client_id
        if self.hostname is not None:
            body["hostname"] = self.hostname
        hb = self.heartbeat_interval
        body["heartbeat_interval"] = -1 if hb is None else _ms(hb)
        body["feature_negotiation"] = True
        if self.user_agent is not None:
            body["user_agent"] = self.user_agent
        if self.tls_v1:
            body["tls_v1"] = True
        if self.snappy:
            body["snappy"] = True
        if self.deflate:
            body["deflate"] = True
            body["deflate_level"] = self.deflate_level
        if self.msg_timeout is not None:
            body["msg_timeout"] = _ms(self.msg_timeout)
        if self.sample_rate:
            body["sample_rate"] = self.sample_rate
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            obt = self.output_buffer_timeout
            body["output_buffer_timeout"] = -1 if obt == 0 else _ms(obt)
        if self.extend_support:
            body["extend_support"] = True
        if self.desired_tag is not None:
            body["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            body["ext_filter"] = self.ext_filter.to_json()
        body.update(self.identify_extra)
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig(ConnectionConfig):
    """Consumer settings: the connection settings plus go-nsq's consumer options (seconds)."""

    max_in_flight: int = 1
    #: 0: unlimited
    max_attempts: int = 5
    default_requeue_delay: float = 90.0
    max_requeue_delay: float = 900.0
    #: switch backoff off for latency-sensitive consumers
    backoff: bool = True
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    lookupd_poll_timeout: float = 60.0
    #: after losing a connection found through lookupd, ask lookupd again this soon (go-nsq
    #: asks at once); doubled while the nsqd stays away, up to lookupd_poll_interval, so a
    #: flapping nsqd cannot make the consumer ask more than once a this-long; the same
    #: schedule while no lookupd lists any nsqd for the topic (started before its topic)
    lookupd_recheck_delay: float = 1.0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    dial_timeout: float = 1.0
    #: reconnect delay for a fixed nsqd list: 8 s, 16 s, 32 s ... up to the maximum, jittered
    reconnect_delay: float = 8.0
    max_reconnect_delay: float = 30.0
    reconnect_jitter: float = 0.2
    #: a graceful stop requeues what the application has not answered after this long
    stop_timeout: float = 30.0
    #: FIN messages over max_attempts (else the application must answer them)
    finish_given_up: bool = True
    #: partitioned server: subscribe with SUB_ORDERED (one message in flight per partition)
    ordered: bool = False
    #: partitioned server: only these partitions (None: all)
    partitions: tuple[int, ...] | None = None
    #: partitioned server, behind lookupd: move the channel to this position (one for every
    #: partition, or partition -> position) when the consumer starts, before it subscribes
    start_from: StartFrom | Mapping[int, StartFrom] | None = None

    def __post_init__(self) -> None:
        super(ConsumerConfig, self).__post_init__()
        if isinstance(self.max_in_flight, bool) or not isinstance(self.max_in_flight, int):
            raise ConfigError("max_in_flight must be an int")
        if self.max_in_flight < 0:
            raise ConfigError(f"max_in_flight must be >= 0, not {self.max_in_flight}")
        if self.max_attempts < 0 or self.max_attempts > 65535:
            raise ConfigError(f"max_attempts must be 0..65535, not {self.max_attempts}")
        check_seconds(
            self,
            (
                "default_requeue_delay",
                "max_requeue_delay",
                "backoff_multiplier",
                "max_backoff_duration",
                "lookupd_poll_timeout",
                "low_rdy_idle_timeout",
                "low_rdy_timeout",
                "reconnect_delay",
                "max_reconnect_delay",
                "stop_timeout",
            ),
            positive=False,
        )
        check_seconds(
            self,
            (
                "lookupd_poll_interval",
                "lookupd_recheck_delay",
                "rdy_redistribute_interval",
                "dial_timeout",
            ),
            positive=True,
        )
        for name in ("lookupd_poll_jitter", "reconnect_jitter"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"{name} must be 0..1, not {value!r}")
        if self.partitions is not None and any(p < 0 for p in self.partitions):
            raise ConfigError("partitions must be non-negative")
        start = self.start_from
        if not (start is None or isinstance(start, StartFrom)) and (
            not isinstance(start, Mapping)
            or not all(
                type(p) is int and p >= 0 and isinstance(s, StartFrom) for p, s in start.items()
            )
        ):
            raise ConfigError(
                f"start_from must be a StartFrom or a mapping of partition to StartFrom, "
                f"not {start!r}"
            )

    def start_position(self, partition: int) -> StartFrom | None:
        """The ``start_from`` position of ``partition``, if any."""
        start = self.start_from
        if start is None or isinstance(start, StartFrom):
            return start
        return start.get(partition)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConfig(ConnectionConfig):
    """Producer settings: connection settings plus pooling, pipelining and retries."""

    #: connections per nsqd
    pool_size: int = 1
    #: unanswered requests per connection (pipelining); 1 = one at a time like go-nsq
    max_outstanding: int = 64
    #: single publishes waiting for the same topic and route go out as one MPUB of at most
    #: this many messages (1: each publish is its own command)
    max_coalesced_messages: int = 1000
    #: ...and of at most this many bytes of MPUB body (nsqd's ``--max-body-size`` default)
    max_coalesced_bytes: int = 5 * 1024 * 1024
    #: tries per request over connection losses and cluster errors (1 = never retry)
    max_publish_attempts: int = 3
    #: a request not acknowledged within this long fails with PublishTimeout
    publish_timeout: float = 30.0
    dial_timeout: float = 1.0
    reconnect_delay: float = 1.0
    max_reconnect_delay: float = 60.0
    reconnect_jitter: float = 0.2
    lookupd_poll_timeout: float = 10.0
    #: re-lookup partitioned topics this often
    lookupd_poll_interval: float = 60.0
    #: maps a sharding key to a non-negative int; the partition is that value modulo the
    #: topic's partition count.  None: MurmurHash3 x86 32-bit, seed 0 (what go-nsq users
    #: configure); give another to place keys as another client does
    hasher: Hasher | None = None

    def __post_init__(self) -> None:
        super(ProducerConfig, self).__post_init__()
        for name in (
            "pool_size",
            "max_outstanding",
            "max_publish_attempts",
            "max_coalesced_messages",
            "max_coalesced_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, not {value!r}")
        check_seconds(
            self,
            (
                "publish_timeout",
                "dial_timeout",
                "reconnect_delay",
                "max_reconnect_delay",
                "lookupd_poll_timeout",
                "lookupd_poll_interval",
            ),
            positive=True,
        )
        if not 0 <= self.reconnect_jitter <= 1:
            raise ConfigError("reconnect_jitter must be 0..1")
        if self.hasher is not None and not callable(self.hasher):
            raise ConfigError(f"hasher must be a function of the key bytes, not {self.hasher!r}")
