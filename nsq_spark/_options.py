"""The data source's options: Spark hands them over as strings; they are checked here, once, on
the driver, and turned into keyword arguments of ``nsq_anyio.Consumer`` / ``nsq_anyio.Producer``.

Each option is written once, in the tables below (``CONNECTION_OPTIONS``, ``SOURCE_OPTIONS``,
``SINK_OPTIONS``): its name, how its text is read (a parser of ``_option_parsers``), its
default (per read mode where they differ), the read modes it applies to and a line of
documentation. The parsing, the defaults, the unknown-option suggestions and the read-mode
check all come from them, and
``docs/spark.md``'s option tables are checked against them.

Option names are case-insensitive and underscores are optional: ``max_in_flight``,
``maxInFlight`` and ``MAXINFLIGHT`` are the same option.
"""

from __future__ import annotations

import difflib
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nsq_proto import StartFrom

from . import _option_parsers as parse
from ._option_parsers import OptionError, Parser, option_key

__all__ = [
    "OptionError",
    "Option",
    "PerMode",
    "Share",
    "READ_MODES",
    "CONNECTION_OPTIONS",
    "SOURCE_OPTIONS",
    "SINK_OPTIONS",
    "ConnectionOptions",
    "SourceOptions",
    "SinkOptions",
    "parse_source_options",
    "parse_sink_options",
]


# -- the tables --------------------------------------------------------------------------------

#: the source's read modes: ``executors`` (tasks consume on the executors, replayable batches)
#: and ``driver`` (one reader on the driver holds the messages)
READ_MODES = ("executors", "driver")
_BOTH = frozenset(READ_MODES)
_DRIVER = frozenset({"driver"})
_EXECUTORS = frozenset({"executors"})


@dataclass(frozen=True)
class Share:
    """A default: another option's value divided by ``by`` (at least 1)."""

    of: str
    by: int = 2


@dataclass(frozen=True)
class PerMode:
    """A default that differs between the read modes."""

    executors: Any
    driver: Any


@dataclass(frozen=True)
class Option:
    """One option of the data source."""

    name: str
    parse: Parser
    #: the value when the option is not given: a value, a ``Share`` of another option's, or
    #: ``PerMode``
    default: Any
    #: one line of documentation
    doc: str
    #: the source's read modes it applies to (given in another, it is refused)
    modes: frozenset[str] = _BOTH
    #: the source cannot do without it
    required: bool = False
    #: what the default means when it is ``None`` (the documentation's words)
    default_means: str = ""
    #: the name without its spelling (case, underscores)
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", option_key(self.name))

    def default_in(self, mode: str) -> Any:
        return getattr(self.default, mode) if isinstance(self.default, PerMode) else self.default


#: what every connection needs (source and sink, both read modes): where, TLS, compression,
#: auth, identity
CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option(
        "nsqd_tcp_addresses",
        parse.addresses(),
        (),
        "comma-separated host:port of nsqd, no scheme",
    ),
    Option(
        "lookupd_http_addresses",
        parse.addresses(lookupd=True),
        (),
        "comma-separated host:port of nsqlookupd, no scheme",
    ),
    Option("tls", parse.boolean, False, "TLS, verifying the server with the system's CAs"),
    Option("tls_ca_file", parse.text, None, "CA bundle to verify nsqd with (turns TLS on)"),
    Option("tls_cert_file", parse.text, None, "client certificate (turns TLS on)"),
    Option("tls_key_file", parse.text, None, "the client certificate's key"),
    Option(
        "tls_hostname",
        parse.text,
        None,
        "the name to verify",
        default_means="the address's host",
    ),
    Option("tls_verify", parse.boolean, True, "false skips certificate verification"),
    Option(
        "compression",
        parse.choice("snappy", "deflate", "none", none="none"),
        None,
        "snappy or deflate",
        default_means="none",
    ),
    Option("deflate_level", parse.integer(1, 9), 6, "deflate's level, 1..9"),
    Option("auth_secret", parse.text, None, "AUTH secret"),
    Option("client_id", parse.text, None, "IDENTIFY's client_id"),
    Option(
        "heartbeat_interval", parse.seconds(1.0), None, "IDENTIFY's heartbeat interval, seconds"
    ),
    Option("dial_timeout", parse.seconds(0.001), None, "seconds to open a connection"),
)

#: the source's own options
SOURCE_OPTIONS: tuple[Option, ...] = (
    Option("topic", parse.topic, None, "the topic to read", required=True),
    Option("channel", parse.channel, None, "the channel to read", required=True),
    Option(
        "read_mode",
        parse.choice(*READ_MODES),
        "executors",
        "executors: tasks consume on the executors; driver: one reader on the driver",
    ),
    Option(
        "nsqd_http_addresses",
        parse.addresses(http_scheme=True),
        (),
        "nsqd's HTTP host:port, one for each of nsqd_tcp_addresses, in the same order",
        _EXECUTORS,
    ),
    Option(
        "staging_location",
        parse.text,
        None,
        "where tasks stage the rows of a batch (a path or a pyarrow.fs URI)",
        _EXECUTORS,
        default_means="a directory of the system's temporary directory",
    ),
    Option(
        "max_bytes_per_trigger",
        parse.integer(1),
        # a driver reader's batch travels inside its task: the JVM holds several copies of it
        # at once while it ships it (a 1 GB driver ran out of heap with 64 MiB batches)
        PerMode(executors=256 * 1024 * 1024, driver=Share("max_bytes_in_flight", by=4)),
        "the largest micro-batch in bytes of message bodies",
    ),
    Option(
        "max_bytes_per_task",
        parse.integer(1),
        32 * 1024 * 1024,
        "the most bytes of message bodies one task consumes",
        _EXECUTORS,
    ),
    Option(
        "max_messages_per_task",
        parse.integer(1),
        100_000,
        "the most messages one task consumes",
        _EXECUTORS,
    ),
    Option(
        "redelivery_window",
        parse.seconds(0.0),
        86_400.0,
        "seconds the ids of rows whose FIN nsqd did not confirm are kept",
        _EXECUTORS,
    ),
    Option(
        "task_idle_timeout",
        parse.seconds(0.001),
        1.0,
        "seconds a task waits for its next message before it ends with fewer",
        _EXECUTORS,
    ),
    Option(
        "max_in_flight",
        parse.integer(1),
        100_000,
        "the most messages the reader holds",
        _DRIVER,
    ),
    Option(
        "max_bytes_in_flight",
        parse.integer(1),
        128 * 1024 * 1024,
        "about the most bytes of message bodies the reader holds",
        _DRIVER,
    ),
    Option(
        "max_messages_per_trigger",
        parse.integer(1),
        PerMode(executors=1_000_000, driver=Share("max_in_flight")),
        "the largest micro-batch in messages",
    ),
    Option(
        "max_connections_per_nsqd",
        parse.integer(1),
        64,
        "connections to one nsqd when one cannot hold what is asked",
    ),
    Option(
        "num_partitions",
        parse.integer(1),
        1,
        "Spark partitions per micro-batch (fewer when it has fewer messages)",
        _DRIVER,
    ),
    Option(
        "min_partitions",
        parse.integer(1),
        1,
        "the fewest Spark partitions (tasks) of a micro-batch with messages enough",
        _EXECUTORS,
    ),
    Option("msg_timeout", parse.seconds(1.0), 60.0, "seconds; asked of nsqd in IDENTIFY"),
    Option(
        "max_msg_timeout",
        parse.seconds(1.0),
        900.0,
        "nsqd's --max-msg-timeout: no TOUCH past it",
        _DRIVER,
    ),
    Option(
        "max_attempts",
        parse.integer(0),
        0,
        "give a message up after this many deliveries; 0: never",
    ),
    Option(
        "available_now_idle_timeout",
        parse.seconds(0.0),
        2.0,
        "seconds without a new message that end an availableNow run",
        _DRIVER,
    ),
    Option("ordered", parse.boolean, False, "partitioned NSQ: SUB_ORDERED", _DRIVER),
    Option(
        "partitions",
        parse.partitions,
        None,
        "partitioned NSQ: the partitions to consume",
        default_means="all",
    ),
    Option(
        "start_from",
        parse.start_from,
        None,
        "partitioned NSQ: where a new query starts",
        _DRIVER,
    ),
    Option(
        "reconnect_delay",
        parse.seconds(0.0),
        None,
        "seconds before reconnecting to a lost nsqd",
        default_means="8",
    ),
    Option(
        "connect_timeout",
        parse.seconds(0.001),
        30.0,
        "seconds after the start by which the source must be subscribed",
    ),
)

#: the sink's own options
SINK_OPTIONS: tuple[Option, ...] = (
    Option("topic", parse.topic, None, "the topic of rows without a topic column"),
    Option("batch_size", parse.integer(1), 500, "rows per MPUB"),
    Option("batch_bytes", parse.integer(1), 1024 * 1024, "bytes per MPUB"),
    Option("max_outstanding", parse.integer(1), 8, "unacknowledged requests per connection"),
    Option("pool_size", parse.integer(1), 1, "connections per nsqd and worker process"),
    Option("publish_timeout", parse.seconds(0.001), 30.0, "seconds before a publish fails"),
    Option("max_publish_attempts", parse.integer(1), 3, "tries of a publish before the task fails"),
)

#: Spark's own options, which reach the data source too: the generic ``path`` of
#: ``load()``/``save()``, the sink's checkpoint
_SPARK_SOURCE_OPTIONS = ("path",)
_SPARK_SINK_OPTIONS = ("path", "checkpoint_location")


# -- the parsed options ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConnectionOptions:
    """What every connection needs: where, TLS, compression, auth, identity (the fields of
    ``CONNECTION_OPTIONS``, which has their defaults)."""

    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    tls: bool
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_hostname: str | None
    tls_verify: bool
    compression: str | None
    deflate_level: int
    auth_secret: str | None
    client_id: str | None
    heartbeat_interval: float | None
    dial_timeout: float | None

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


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """The source's options, as :func:`parse_source_options` makes them: ``connection`` and
    the fields of ``SOURCE_OPTIONS`` (which has their defaults, read modes and
    documentation)."""

    connection: ConnectionOptions
    topic: str
    channel: str
    read_mode: str
    nsqd_http_addresses: tuple[str, ...]
    staging_location: str | None
    max_bytes_per_trigger: int
    max_bytes_per_task: int
    max_messages_per_task: int
    redelivery_window: float
    task_idle_timeout: float
    max_in_flight: int
    max_bytes_in_flight: int
    max_messages_per_trigger: int
    max_connections_per_nsqd: int
    num_partitions: int
    min_partitions: int
    msg_timeout: float
    max_msg_timeout: float
    max_attempts: int
    available_now_idle_timeout: float
    ordered: bool
    partitions: tuple[int, ...] | None
    start_from: StartFrom | Mapping[int, StartFrom] | None
    reconnect_delay: float | None
    connect_timeout: float

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


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """The sink's options: ``connection`` and the fields of ``SINK_OPTIONS`` (which has their
    defaults and documentation)."""

    connection: ConnectionOptions
    topic: str | None
    batch_size: int
    batch_bytes: int
    max_outstanding: int
    pool_size: int
    publish_timeout: float
    max_publish_attempts: int

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


# -- parsing -----------------------------------------------------------------------------------


class _Given:
    """The options as Spark gives them: strings, any spelling of the names."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._values: dict[str, tuple[str, str]] = {}
        for name, value in options.items():
            if value is None:
                continue
            self._values[option_key(str(name))] = (str(name), str(value))

    def text(self, option: Option) -> str | None:
        """The option's text, stripped; ``None`` when it is absent or empty."""
        found = self._values.get(option.key)
        value = None if found is None else found[1].strip()
        return value or None

    def unknown(self, known: Mapping[str, str]) -> list[str]:
        """The options given that are not ``known`` (spelling-free key -> name)."""
        return sorted(name for key, (name, _) in self._values.items() if key not in known)


def _parse(table: Iterable[Option], given: _Given, kind: str) -> tuple[dict[str, Any], set[str]]:
    """The values of ``table``'s options that are given (each read by its parser), and which
    were; a missing required option fails."""
    values: dict[str, Any] = {}
    named: set[str] = set()
    for option in table:
        text = given.text(option)
        if text is None:
            if option.required:
                raise OptionError(f"the nsq {kind} needs the option {option.name!r}")
            continue
        values[option.name] = option.parse(option.name, text)
        named.add(option.name)
    return values, named


def _defaults(table: Iterable[Option], values: dict[str, Any], mode: str) -> None:
    """Fill in the defaults of the options not given (those of ``mode`` where they differ)."""
    shares: list[tuple[str, Share]] = []
    for option in table:
        if option.name in values:
            continue
        default = option.default_in(mode)
        if isinstance(default, Share):
            shares.append((option.name, default))
        else:
            values[option.name] = default
    for name, share in shares:
        values[name] = max(1, values[share.of] // share.by)


def _connection(values: Mapping[str, Any]) -> ConnectionOptions:
    if not values["nsqd_tcp_addresses"] and not values["lookupd_http_addresses"]:
        raise OptionError(
            "give nsqd_tcp_addresses (comma-separated host:port) or lookupd_http_addresses"
        )
    connection = {o.name: values[o.name] for o in CONNECTION_OPTIONS}
    if connection["tls_ca_file"] is not None or connection["tls_cert_file"] is not None:
        connection["tls"] = True
    return ConnectionOptions(**connection)


def _unknown_options(kind: str, unknown: Iterable[str], known: Mapping[str, str]) -> OptionError:
    """The error for options the nsq ``kind`` does not have (``known``: each option's
    spelling-free key to its name), with the likely intended ones."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(option_key(name), list(known), n=1)
        parts.append(f"{name} (did you mean {known[close[0]]}?)" if close else name)
    return OptionError(f"unknown option(s) of the nsq {kind}: {', '.join(parts)}")


def _check_read_mode(named: Iterable[str], mode: str) -> None:
    """An option given that does not apply to the read mode fails, whichever the mode."""
    wrong = [o for o in SOURCE_OPTIONS if o.name in named and mode not in o.modes]
    if wrong:
        raise OptionError(
            "; ".join(
                f"option {o.name!r} needs read_mode {'/'.join(sorted(o.modes))!r}" for o in wrong
            )
        )


#: what the source reads, in order (its topic and channel first), and every name it knows
_SOURCE_TABLE = SOURCE_OPTIONS[:2] + CONNECTION_OPTIONS + SOURCE_OPTIONS[2:]
_SOURCE_KNOWN = {
    option_key(n): n for n in [o.name for o in _SOURCE_TABLE] + list(_SPARK_SOURCE_OPTIONS)
}
_SINK_TABLE = CONNECTION_OPTIONS + SINK_OPTIONS
_SINK_KNOWN = {option_key(n): n for n in [o.name for o in _SINK_TABLE] + list(_SPARK_SINK_OPTIONS)}


def parse_source_options(options: Mapping[str, Any]) -> SourceOptions:
    """The source's options from Spark's strings (any spelling of the names), checked: each
    value by its parser, the required ones given, no unknown option, none of the other read
    mode, what reading on the executors needs; an :class:`OptionError` says what is wrong."""
    given = _Given(options)
    values, named = _parse(_SOURCE_TABLE, given, "data source")
    mode = values.get("read_mode", "executors")
    _defaults(_SOURCE_TABLE, values, mode)
    connection = _connection(values)
    if values["start_from"] is not None and not connection.lookupd_http_addresses:
        raise OptionError("option 'start_from' needs lookupd_http_addresses")
    unknown = given.unknown(_SOURCE_KNOWN)
    if unknown:
        raise _unknown_options("source", unknown, _SOURCE_KNOWN)
    _check_read_mode(named, mode)
    parsed = SourceOptions(
        connection=connection, **{o.name: values[o.name] for o in SOURCE_OPTIONS}
    )
    if mode == "executors":
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


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    """The sink's options from Spark's strings (any spelling of the names), checked as
    :func:`parse_source_options` checks the source's."""
    given = _Given(options)
    values, _ = _parse(_SINK_TABLE, given, "sink")
    _defaults(_SINK_TABLE, values, "executors")
    connection = _connection(values)
    unknown = given.unknown(_SINK_KNOWN)
    if unknown:
        raise _unknown_options("sink", unknown, _SINK_KNOWN)
    return SinkOptions(connection=connection, **{o.name: values[o.name] for o in SINK_OPTIONS})
