"""The keyword options of ``Consumer`` and ``Producer``, typed: a misspelled option is a type
error, not a surprise at run time.  Each is the field of the same name of
:class:`nsq_proto.ConsumerConfig` or :class:`nsq_proto.ProducerConfig` (the configuration
reference lists them with their defaults and units)."""

from __future__ import annotations

import dataclasses
import random
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypedDict, TypeVar

from nsq_proto import (
    ConfigError,
    ConnectionConfig,
    ConsumerConfig,
    ExtFilter,
    ProducerConfig,
    StartFrom,
)

from ._backend import Backend
from ._message import GiveUpHook

__all__ = [
    "ConnectionOptions",
    "ConsumerArguments",
    "ConsumerOptions",
    "ProducerArguments",
    "ProducerOptions",
]


class ConnectionOptions(TypedDict, total=False):
    """What every connection negotiates with nsqd in IDENTIFY (TLS is the ``tls`` argument)."""

    client_id: str | None
    hostname: str | None
    user_agent: str | None
    heartbeat_interval: float | None
    read_timeout: float | None
    handshake_timeout: float
    write_timeout: float
    snappy: bool
    deflate: bool
    deflate_level: int
    sample_rate: int
    msg_timeout: float | None
    output_buffer_size: int | None
    output_buffer_timeout: float | None
    auth_secret: bytes | str | None
    max_frame_size: int
    extend_support: bool
    desired_tag: str | None
    ext_filter: ExtFilter | None
    identify_extra: Mapping[str, Any]


class ConsumerOptions(ConnectionOptions, total=False):
    """The options of :class:`nsq_client.Consumer` (fields of ``ConsumerConfig``)."""

    max_in_flight: int
    max_attempts: int
    default_requeue_delay: float
    max_requeue_delay: float
    backoff: bool
    backoff_multiplier: float
    max_backoff_duration: float
    lookupd_poll_interval: float
    lookupd_poll_jitter: float
    lookupd_poll_timeout: float
    lookupd_recheck_delay: float
    low_rdy_idle_timeout: float
    low_rdy_timeout: float
    rdy_redistribute_interval: float
    dial_timeout: float
    reconnect_delay: float
    max_reconnect_delay: float
    reconnect_jitter: float
    stop_timeout: float
    finish_given_up: bool
    ordered: bool
    partitions: tuple[int, ...] | None
    start_from: StartFrom | Mapping[int, StartFrom] | None


class ProducerOptions(ConnectionOptions, total=False):
    """The options of :class:`nsq_client.Producer` (fields of ``ProducerConfig``)."""

    pool_size: int
    max_outstanding: int
    max_coalesced_messages: int
    max_coalesced_bytes: int
    max_publish_attempts: int
    publish_timeout: float
    dial_timeout: float
    reconnect_delay: float
    max_reconnect_delay: float
    reconnect_jitter: float
    lookupd_poll_timeout: float
    lookupd_poll_interval: float
    hasher: Callable[[bytes], int] | None


class ConsumerArguments(ConsumerOptions, total=False):
    """Every keyword argument of an adapter's ``Consumer(topic, channel, ...)``."""

    nsqd_tcp_addresses: Iterable[str]
    lookupd_http_addresses: Iterable[str]
    tls: bool | ssl.SSLContext | None
    tls_hostname: str | None
    on_give_up: GiveUpHook | None
    rng: random.Random | None
    config: ConsumerConfig | None


class ProducerArguments(ProducerOptions, total=False):
    """Every keyword argument of an adapter's ``Producer(...)``."""

    nsqd_tcp_addresses: Iterable[str]
    lookupd_http_addresses: Iterable[str]
    tls: bool | ssl.SSLContext | None
    tls_hostname: str | None
    rng: random.Random | None
    config: ProducerConfig | None


C = TypeVar("C", bound=ConnectionConfig)


def tls_context(backend: Backend, tls: object) -> tuple[bool, Any]:
    """``tls`` (None/False, True, or an ``ssl.SSLContext``) as (use TLS, the context)."""
    if tls is None or tls is False:
        return False, None
    if tls is True:
        return True, backend.default_ssl_context()
    if backend.is_ssl_context(tls):
        return True, tls
    raise ConfigError("tls must be an ssl.SSLContext, True or None")


def chose_max_in_flight(config: ConsumerConfig | None, options: Mapping[str, Any]) -> bool:
    """Whether the user chose max_in_flight (as an option, or in a ``config=`` where it is not
    the default): if not, ``run(handler, concurrency=N)`` raises it to N."""
    default = ConsumerConfig.__dataclass_fields__["max_in_flight"].default
    return "max_in_flight" in options or (config is not None and config.max_in_flight != default)


def build_config(
    kind: type[C],
    backend: Backend,
    config: C | None,
    options: Mapping[str, Any],
    *,
    tls: bool,
) -> C:
    """The configuration of a client: ``config`` or the defaults, with ``options`` on top,
    TLS as the ``tls`` argument says, and IDENTIFY's names filled in from this machine."""
    if config is not None and not isinstance(config, kind):
        raise ConfigError(f"config must be a {kind.__name__}, not {type(config).__name__}")
    if "tls_v1" in options:
        raise ConfigError("give tls=True (or tls=an ssl.SSLContext), not tls_v1")
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} of "
            f"{kind.__name__} (see the configuration reference)"
        )
    values = dict(options)
    if isinstance(values.get("auth_secret"), str):
        values["auth_secret"] = values["auth_secret"].encode()
    base = config if config is not None else kind()
    hostname = backend.hostname()
    if base.client_id is None and "client_id" not in values:
        values["client_id"] = hostname.split(".")[0]
    if base.hostname is None and "hostname" not in values:
        values["hostname"] = hostname
    return dataclasses.replace(base, tls_v1=tls, **values)
