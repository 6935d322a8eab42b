"""Exceptions of the anyio adapter: everything a user catches is an NSQError."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from nsq_proto import NSQError

__all__ = ["TransportError", "map_transport_errors"]


class TransportError(NSQError, ConnectionError):
    """The network failed: refused, reset, timed out, TLS handshake failed."""


_TRANSPORT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    TimeoutError,
)


@contextmanager
def map_transport_errors(what: str) -> Iterator[None]:
    try:
        yield
    except _TRANSPORT_EXCEPTIONS as exc:
        raise TransportError(f"{what}: {exc or type(exc).__name__}") from exc
