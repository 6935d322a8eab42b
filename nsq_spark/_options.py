"""The data source's options: Spark hands them over as strings; they are checked here, once, on
the driver, and turned into keyword arguments of ``nsq_anyio.Consumer`` / ``nsq_anyio.Producer``.

Option names are case-insensitive and underscores are optional: ``max_in_flight``,
``maxInFlight`` and ``MAXINFLIGHT`` are the same option.
"""

from __future__ import annotations

import difflib
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nsq_proto import ConfigError, StartFrom, parse_addresses
from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "OptionError",
    "ConnectionOptions",
    "SourceOptions",
    "SinkOptions",
    "parse_source_options",
    "parse_sink_options",
]


class OptionError(ValueError):
    """An option of the ``nsq`` data source is missing or malformed."""


# tracebacks name it where users import it from
OptionError.__module__ = "nsq_spark"


def _key(name: str) -> str:
    return name.replace("_", "").replace("-", "").lower()


class _Reader:
    """Typed access to the string options; remembers which were used."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._values: dict[str, tuple[str, str]] = {}
        for name, value in options.items():
            if value is None:
                continue
            self._values[_key(str(name))] = (str(name), str(value))
        self.used: set[str] = set()

    def raw(self, name: str) -> str | None:
        key = _key(name)
        self.used.add(key)
        found = self._values.get(key)
        return None if found is None else found[1].strip()

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name)
        return default if value is None or value == "" else value

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise OptionError(f"the nsq data source needs the option {name!r}")
        return value

    def integer(self, name: str, default: int, *, minimum: int = 0) -> int:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
        if number < minimum:
            raise OptionError(f"option {name!r} must be at least {minimum}, not {number}")
        return number

    def seconds(self, name: str, default: float | None, *, minimum: float = 0.0) -> float | None:
        value = self.text(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise OptionError(
                f"option {name!r} must be a number of seconds, not {value!r}"
            ) from None
        if not number >= minimum or number == float("inf"):
            raise OptionError(f"option {name!r} must be at least {minimum} s, not {value!r}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise OptionError(f"option {name!r} must be true or false, not {value!r}")

    def addresses(self, name: str) -> tuple[str, ...]:
        value = self.text(name)
        if value is None:
            return ()
        out = tuple(a.strip() for a in value.split(",") if a.strip())
        checked = out
        if name == "nsqd_http_addresses":  # the source's own requests: http:// or https://
            checked = tuple(a.removeprefix("https://").removeprefix("http://") for a in out)
        try:
            # the clients' own check: host:port; lookupd's may also be http://host:port
            parse_addresses(name, checked, http=name == "lookupd_http_addresses")
        except ConfigError as exc:
            raise OptionError(f"option {name!r}{str(exc).removeprefix(name)}") from None
        return out

    def topic(self, name: str = "topic", *, required: bool = True) -> str | None:
        value = self.required(name) if required else self.text(name)
        if value is not None and not is_valid_topic_name(value):
            raise OptionError(
                f"option {name!r}: {value!r} is not a topic name (1 to 64 of a-z A-Z 0-9 . _ -,"
                " optionally ending in #ephemeral)"
            )
        return value

    def channel(self, name: str = "channel") -> str:
        value = self.required(name)
        if not is_valid_channel_name(value):
            raise OptionError(
                f"option {name!r}: {value!r} is not a channel name (1 to 64 of a-z A-Z 0-9 . _"
                " -, optionally ending in #ephemeral)"
            )
        return value

    def unknown(self, known: Mapping[str, str]) -> list[str]:
        return sorted(name for key, (name, _) in self._values.items() if key not in known)


@dataclass(frozen=True)
class ConnectionOptions:
    """What every connection needs: where, TLS, compression, auth, identity."""

    nsqd_tcp_addresses: tuple[str, ...] = ()
    lookupd_http_addresses: tuple[str, ...] = ()
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    tls_verify: bool = True
    compression: str | None = None
    deflate_level: int = 6
    auth_secret: str | None = None
    client_id: str | None = None
    heartbeat_interval: float | None = None
    dial_timeout: float | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.https_context() if self.tls else None

    def https_context(self) -> ssl.SSLContext:
        """For the source's requests to an ``https://`` address: the CA, client certificate
        and verification of the TLS options (whether or not ``tls`` is on for TCP)."""
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.tls_cert_file is not None:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by ``nsq_anyio.Consumer`` and ``nsq_anyio.Producer``."""
        kwargs: dict[str, Any] = {}
        if self.nsqd_tcp_addresses:
            kwargs["nsqd_tcp_addresses"] = list(self.nsqd_tcp_addresses)
        if self.lookupd_http_addresses:
            kwargs["lookupd_http_addresses"] = list(self.lookupd_http_addresses)
        context = self.ssl_context()
        if context is not None:
            kwargs["tls"] = context
            if self.tls_hostname is not None:
                kwargs["tls_hostname"] = self.tls_hostname
        if self.compression == "snappy":
            kwargs["snappy"] = True
        elif self.compression == "deflate":
            kwargs["deflate"] = True
            kwargs["deflate_level"] = self.deflate_level
        if self.auth_secret is not None:
            kwargs["auth_secret"] = self.auth_secret
        if self.client_id is not None:
            kwargs["client_id"] = self.client_id
        if self.heartbeat_interval is not None:
            kwargs["heartbeat_interval"] = self.heartbeat_interval
        if self.dial_timeout is not None:
            kwargs["dial_timeout"] = self.dial_timeout
        return kwargs


_CONNECTION_KEYS = {
    _key(n): n
    for n in (
        "nsqd_tcp_addresses",
        "lookupd_http_addresses",
        "tls",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_hostname",
        "tls_verify",
        "compression",
        "deflate_level",
        "auth_secret",
        "client_id",
        "heartbeat_interval",
        "dial_timeout",
        # Spark's own: the generic "path" of load()/save(), checkpoints, and friends
        "path",
    )
}


def _connection(r: _Reader, *, lookupd_alone_ok: bool) -> ConnectionOptions:
    nsqd = r.addresses("nsqd_tcp_addresses")
    lookupd = r.addresses("lookupd_http_addresses")
    if not nsqd and not (lookupd and lookupd_alone_ok):
        raise OptionError(
            "give nsqd_tcp_addresses (comma-separated host:port)"
            + (" or lookupd_http_addresses" if lookupd_alone_ok else "")
        )
    compression = r.text("compression")
    if compression is not None:
        compression = compression.lower()
        if compression == "none":
            compression = None
        elif compression not in ("snappy", "deflate"):
            raise OptionError(
                f"option 'compression' is snappy, deflate or none, not {compression!r}"
            )
    deflate_level = r.integer("deflate_level", 6, minimum=1)
    if deflate_level > 9:
        raise OptionError("option 'deflate_level' is 1..9")
    tls = r.boolean("tls", False)
    ca_file = r.text("tls_ca_file")
    cert_file = r.text("tls_cert_file")
    if ca_file is not None or cert_file is not None:
        tls = True
    return ConnectionOptions(
        nsqd_tcp_addresses=nsqd,
        lookupd_http_addresses=lookupd,
        tls=tls,
        tls_ca_file=ca_file,
        tls_cert_file=cert_file,
        tls_key_file=r.text("tls_key_file"),
        tls_hostname=r.text("tls_hostname"),
        tls_verify=r.boolean("tls_verify", True),
        compression=compression,
        deflate_level=deflate_level,
        auth_secret=r.text("auth_secret"),
        client_id=r.text("client_id"),
        heartbeat_interval=r.seconds("heartbeat_interval", None, minimum=1.0),
        dial_timeout=r.seconds("dial_timeout", None, minimum=0.001),
    )


#: executors: the defaults of ``max_messages_per_trigger``, ``max_bytes_per_trigger``,
#: ``max_messages_per_partition`` and ``max_bytes_per_partition``
EXECUTOR_MESSAGES_PER_TRIGGER = 1_000_000
EXECUTOR_BYTES_PER_TRIGGER = 256 * 1024 * 1024
EXECUTOR_MESSAGES_PER_PARTITION = 100_000
EXECUTOR_BYTES_PER_PARTITION = 32 * 1024 * 1024
#: driver: the default of ``max_bytes_in_flight`` (a batch: half of it)
DRIVER_BYTES_IN_FLIGHT = 128 * 1024 * 1024


@dataclass(frozen=True)
class SourceOptions:
    topic: str
    channel: str
    connection: ConnectionOptions
    max_in_flight: int = 100_000
    max_messages_per_trigger: int = 50_000
    num_partitions: int = 1
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_attempts: int = 0
    available_now_idle_timeout: float = 2.0
    ordered: bool = False
    partitions: tuple[int, ...] | None = None
    reconnect_delay: float | None = None
    connect_timeout: float = 30.0
    #: connections per nsqd when ``max_in_flight`` is above nsqd's ``--max-rdy-count``
    max_connections_per_nsqd: int = 64
    #: partitioned NSQ: where a new query starts (not applied when it resumes from a
    #: checkpoint)
    start_from: StartFrom | Mapping[int, StartFrom] | None = None
    #: ``executors``: tasks consume on the executors, batches are staged and replayable;
    #: ``driver``: one reader on the driver holds the messages (at-least-once)
    read_mode: str = "executors"
    #: executors: nsqd's HTTP addresses, in the order of ``nsqd_tcp_addresses``
    nsqd_http_addresses: tuple[str, ...] = ()
    #: executors: where tasks stage the rows of a batch (a path or a ``pyarrow.fs`` URI)
    staging_location: str | None = None
    #: the largest micro-batch in bytes of message bodies
    max_bytes_per_trigger: int = EXECUTOR_BYTES_PER_TRIGGER
    #: driver: about the most bytes of message bodies the reader holds (it sizes RDY by the
    #: bodies it received)
    max_bytes_in_flight: int = DRIVER_BYTES_IN_FLIGHT
    #: executors: the most messages one task consumes (over several connections when it is
    #: above nsqd's ``--max-rdy-count``, up to ``max_connections_per_nsqd``)
    max_messages_per_partition: int = EXECUTOR_MESSAGES_PER_PARTITION
    #: executors: the most bytes of message bodies one task consumes
    max_bytes_per_partition: int = EXECUTOR_BYTES_PER_PARTITION
    #: executors: seconds a task waits for its next message before it ends with fewer
    task_idle_timeout: float = 1.0
    #: executors: seconds the ids of rows whose FIN nsqd did not confirm are kept, to know
    #: them when nsqd delivers them again
    redelivery_window: float = 86_400.0

    @property
    def touch_interval(self) -> float:
        return self.msg_timeout / 3.0

    def consumer_kwargs(self, *, fresh: bool = False) -> dict[str, Any]:
        """The consumer's options; ``fresh``: a new query (``start_from`` applies)."""
        kwargs = self.connection.client_kwargs()
        kwargs.update(
            max_in_flight=self.max_in_flight,
            msg_timeout=self.msg_timeout,
            max_attempts=self.max_attempts,
            # the source never requeues on its own: a failed batch is not a message failure
            backoff=False,
        )
        if self.ordered:
            kwargs["ordered"] = True
            kwargs["extend_support"] = True
        if self.partitions is not None:
            kwargs["partitions"] = self.partitions
        if self.reconnect_delay is not None:
            kwargs["reconnect_delay"] = self.reconnect_delay
        if fresh and self.start_from is not None:
            kwargs["start_from"] = self.start_from
        return kwargs


_SOURCE_KEYS = _CONNECTION_KEYS | {
    _key(n): n
    for n in (
        "topic",
        "channel",
        "max_in_flight",
        "max_messages_per_trigger",
        "num_partitions",
        "msg_timeout",
        "max_msg_timeout",
        "max_attempts",
        "available_now_idle_timeout",
        "ordered",
        "partitions",
        "reconnect_delay",
        "connect_timeout",
        "max_connections_per_nsqd",
        "start_from",
        "read_mode",
        "nsqd_http_addresses",
        "staging_location",
        "max_bytes_per_trigger",
        "max_bytes_in_flight",
        "max_messages_per_partition",
        "max_bytes_per_partition",
        "task_idle_timeout",
        "redelivery_window",
    )
}


def _start_from(text: str | None) -> StartFrom | dict[int, StartFrom] | None:
    """``end``, ``timestamp:<unix s>``, ``virtual_queue:<offset>``, ``msgcount:<n>``, or per
    partition ``0=end,1=msgcount:5``."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return StartFrom.parse(text)
        positions: dict[int, StartFrom] = {}
        for item in text.split(","):
            partition, sep, position = item.partition("=")
            if not sep or not partition.strip().isdigit():
                raise ConfigError(f"{item.strip()!r} is not <partition>=<position>")
            positions[int(partition)] = StartFrom.parse(position)
        return positions
    except ConfigError as exc:
        raise OptionError(
            f"option 'start_from' takes end, timestamp:<unix seconds>, virtual_queue:<offset>, "
            f"msgcount:<n>, or <partition>=<position>,...: {exc}"
        ) from None


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    r = _Reader(options)
    topic = r.topic()
    assert topic is not None
    channel = r.channel()
    connection = _connection(r, lookupd_alone_ok=True)
    max_in_flight = r.integer("max_in_flight", 100_000, minimum=1)
    msg_timeout = r.seconds("msg_timeout", 60.0, minimum=1.0)
    assert msg_timeout is not None
    max_msg_timeout = r.seconds("max_msg_timeout", 900.0, minimum=1.0)
    assert max_msg_timeout is not None
    idle = r.seconds("available_now_idle_timeout", 2.0, minimum=0.0)
    assert idle is not None
    connect_timeout = r.seconds("connect_timeout", 30.0, minimum=0.001)
    assert connect_timeout is not None
    read_mode = (r.text("read_mode") or "executors").lower()
    if read_mode not in ("executors", "driver"):
        raise OptionError(f"option 'read_mode' is executors or driver, not {read_mode!r}")
    # the driver holds what it reads (a window of max_in_flight, half of it a batch); the
    # executors hold a batch between them, bounded in bytes too: larger batches cost the
    # driver less per message
    per_trigger = r.integer(
        "max_messages_per_trigger",
        EXECUTOR_MESSAGES_PER_TRIGGER if read_mode == "executors" else max(1, max_in_flight // 2),
        minimum=1,
    )
    bytes_in_flight = r.text("max_bytes_in_flight")
    if bytes_in_flight is not None and read_mode == "executors":
        raise OptionError("option 'max_bytes_in_flight' needs read_mode 'driver'")
    max_bytes_in_flight = r.integer("max_bytes_in_flight", DRIVER_BYTES_IN_FLIGHT, minimum=1)
    task_idle_timeout = r.seconds("task_idle_timeout", 1.0, minimum=0.001)
    assert task_idle_timeout is not None
    redelivery_window = r.seconds("redelivery_window", 86_400.0, minimum=0.0)
    assert redelivery_window is not None
    partitions_text = r.text("partitions")
    partitions: tuple[int, ...] | None = None
    if partitions_text is not None:
        try:
            partitions = tuple(int(p) for p in partitions_text.split(",") if p.strip())
        except ValueError:
            raise OptionError(
                f"option 'partitions' is a comma-separated list of integers, not {partitions_text!r}"
            ) from None
        if any(p < 0 for p in partitions):
            raise OptionError("option 'partitions' takes non-negative partition numbers")
    parsed = SourceOptions(
        topic=topic,
        channel=channel,
        connection=connection,
        max_in_flight=max_in_flight,
        max_messages_per_trigger=per_trigger,
        num_partitions=r.integer("num_partitions", 1, minimum=1),
        msg_timeout=msg_timeout,
        max_msg_timeout=max_msg_timeout,
        max_attempts=r.integer("max_attempts", 0, minimum=0),
        available_now_idle_timeout=idle,
        ordered=r.boolean("ordered", False),
        partitions=partitions,
        reconnect_delay=r.seconds("reconnect_delay", None, minimum=0.0),
        connect_timeout=connect_timeout,
        max_connections_per_nsqd=r.integer("max_connections_per_nsqd", 64, minimum=1),
        start_from=_start_from(r.text("start_from")),
        read_mode=read_mode,
        nsqd_http_addresses=r.addresses("nsqd_http_addresses"),
        staging_location=r.text("staging_location"),
        max_bytes_per_trigger=r.integer(
            "max_bytes_per_trigger",
            EXECUTOR_BYTES_PER_TRIGGER
            if read_mode == "executors"
            else max(1, max_bytes_in_flight // 2),
            minimum=1,
        ),
        max_bytes_in_flight=max_bytes_in_flight,
        max_messages_per_partition=r.integer(
            "max_messages_per_partition", EXECUTOR_MESSAGES_PER_PARTITION, minimum=1
        ),
        max_bytes_per_partition=r.integer(
            "max_bytes_per_partition", EXECUTOR_BYTES_PER_PARTITION, minimum=1
        ),
        task_idle_timeout=task_idle_timeout,
        redelivery_window=redelivery_window,
    )
    if parsed.start_from is not None and not connection.lookupd_http_addresses:
        raise OptionError("option 'start_from' needs lookupd_http_addresses")
    unknown = r.unknown(_SOURCE_KEYS)
    if unknown:
        raise _unknown_options("source", unknown, _SOURCE_KEYS)
    if read_mode == "executors":
        _check_executor_mode(parsed)
    return parsed


def _check_executor_mode(o: SourceOptions) -> None:
    """What reading on the executors needs: nsqd's HTTP addresses (the driver asks nsqd's
    ``/stats`` how many messages wait) and a channel that outlives its connections."""
    c = o.connection
    if c.nsqd_tcp_addresses and len(o.nsqd_http_addresses) != len(c.nsqd_tcp_addresses):
        raise OptionError(
            "read_mode 'executors' with nsqd_tcp_addresses needs nsqd_http_addresses: nsqd's"
            " HTTP host:port, one for each TCP address and in the same order (or give"
            " lookupd_http_addresses, or read_mode 'driver')"
        )
    if o.channel.endswith("#ephemeral"):
        raise OptionError(
            "an #ephemeral channel ends when its last connection closes, between two tasks:"
            " read it with read_mode 'driver'"
        )
    for name, used in (("ordered", o.ordered), ("start_from", o.start_from is not None)):
        if used:
            raise OptionError(f"option {name!r} needs read_mode 'driver'")


@dataclass(frozen=True)
class SinkOptions:
    connection: ConnectionOptions
    topic: str | None = None
    batch_size: int = 500
    batch_bytes: int = 1024 * 1024
    max_outstanding: int = 8
    pool_size: int = 1
    publish_timeout: float = 30.0
    max_publish_attempts: int = 3

    def producer_key(self) -> tuple[Any, ...]:
        """What tells producers apart: sinks that differ only in topic or batching share one."""
        return (
            self.connection,
            self.max_outstanding,
            self.pool_size,
            self.publish_timeout,
            self.max_publish_attempts,
        )

    def producer_kwargs(self) -> dict[str, Any]:
        kwargs = self.connection.client_kwargs()
        kwargs.update(
            max_outstanding=self.max_outstanding,
            pool_size=self.pool_size,
            publish_timeout=self.publish_timeout,
            max_publish_attempts=self.max_publish_attempts,
        )
        return kwargs


_SINK_KEYS = _CONNECTION_KEYS | {
    _key(n): n
    for n in (
        "topic",
        "batch_size",
        "batch_bytes",
        "max_outstanding",
        "pool_size",
        "publish_timeout",
        "max_publish_attempts",
        "checkpoint_location",
    )
}


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    r = _Reader(options)
    publish_timeout = r.seconds("publish_timeout", 30.0, minimum=0.001)
    assert publish_timeout is not None
    parsed = SinkOptions(
        connection=_connection(r, lookupd_alone_ok=True),
        topic=r.topic(required=False),
        batch_size=r.integer("batch_size", 500, minimum=1),
        batch_bytes=r.integer("batch_bytes", 1024 * 1024, minimum=1),
        max_outstanding=r.integer("max_outstanding", 8, minimum=1),
        pool_size=r.integer("pool_size", 1, minimum=1),
        publish_timeout=publish_timeout,
        max_publish_attempts=r.integer("max_publish_attempts", 3, minimum=1),
    )
    unknown = r.unknown(_SINK_KEYS)
    if unknown:
        raise _unknown_options("sink", unknown, _SINK_KEYS)
    return parsed


def _unknown_options(kind: str, unknown: Iterable[str], known: Mapping[str, str]) -> OptionError:
    """The error for options the nsq ``kind`` does not have (``known``: each option's
    spelling-free key to its name), with the likely intended ones."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(_key(name), list(known), n=1)
        parts.append(f"{name} (did you mean {known[close[0]]}?)" if close else name)
    return OptionError(f"unknown option(s) of the nsq {kind}: {', '.join(parts)}")
