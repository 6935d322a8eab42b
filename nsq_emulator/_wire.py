"""The vocabulary of the server side of a V2 connection, shared by every part of it.

A connection is a generator (see :mod:`._conn_core`) that yields what it waits for: a
:class:`Read` of ``n`` bytes or of a line, or :data:`AWAIT_TLS`; commands raise
:class:`ClientError` to answer with an error frame.  :class:`GoBufWriter` is the model of
nsqd's buffered writer that decides where output is cut.  Nothing here knows about nsqd
itself, topics or commands.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "AWAIT_TLS",
    "LINE",
    "MAGIC_V2",
    "MAX_LINE",
    "MS",
    "AwaitTLS",
    "ClientError",
    "ClientState",
    "GoBufWriter",
    "Proto",
    "Read",
    "Step",
    "fatal",
    "nonfatal",
    "pack_frame_header",
    "unpack_i32",
    "valid_name",
]

MAGIC_V2: Final = b"  V2"
#: nsqd's bufio reader size: a command line longer than this closes the connection
MAX_LINE: Final = 16 * 1024
#: the ``n`` of a :class:`Read` that waits for a whole line
LINE: Final = -1
#: nanoseconds per millisecond
MS: Final = 1_000_000

pack_frame_header = struct.Struct(">i").pack
unpack_i32 = struct.Struct(">i").unpack


class ClientState(IntEnum):
    """A client's state as nsqd's ``/stats`` reports it."""

    #: connected (magic read), not subscribed
    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    #: after SUB
    SUBSCRIBED = 3
    #: after CLS
    CLOSING = 4


class ClientError(Exception):
    """An error frame: ``code`` + ``" "`` + ``description``; fatal ones close the connection."""

    def __init__(self, code: bytes | str, description: bytes | str, *, fatal: bool = True) -> None:
        self.code = code.encode() if isinstance(code, str) else code
        self.description = description.encode() if isinstance(description, str) else description
        self.fatal = fatal
        super().__init__(self.data.decode("utf-8", "replace"))

    @property
    def data(self) -> bytes:
        return self.code + b" " + self.description


def fatal(code: str, description: bytes | str) -> ClientError:
    """An error frame that closes the connection."""
    return ClientError(code, description, fatal=True)


def nonfatal(code: str, description: bytes | str) -> ClientError:
    """An error frame after which the connection goes on."""
    return ClientError(code, description, fatal=False)


@dataclass(frozen=True, slots=True)
class Read:
    """What the protocol generator waits for: ``n`` bytes (or a line) and the error nsqd
    reports if the connection ends (EOF or read timeout) before they arrive."""

    n: int
    error: ClientError | None = None


class AwaitTLS:
    """The type of :data:`AWAIT_TLS`."""


#: what the protocol generator yields while the adapter runs the TLS handshake
AWAIT_TLS: Final = AwaitTLS()

Step = Read | AwaitTLS
#: a protocol generator: it yields steps and is sent what each step read
Proto = Generator[Step, Any, Any]


class GoBufWriter:
    """Go's ``bufio.Writer`` in front of a sink: same flush points, same pass-through of
    large writes when the buffer is empty."""

    __slots__ = ("_buf", "_sink", "size")

    def __init__(self, size: int, sink: Callable[[bytes], None]) -> None:
        self.size = max(1, size)
        self._buf = bytearray()
        self._sink = sink

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def write(self, p: bytes) -> None:
        buf = self._buf
        while len(p) > self.size - len(buf):
            if not buf:
                self._sink(p)
                return
            n = self.size - len(buf)
            buf += p[:n]
            p = p[n:]
            self.flush()
        buf += p

    def flush(self) -> None:
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            self._sink(data)


def valid_name(raw: bytes, *, channel: bool = False) -> bool:
    """A topic (or channel) name from the wire, checked as nsqd checks it."""
    try:
        name = raw.decode("ascii")
    except UnicodeDecodeError:
        return False
    return is_valid_channel_name(name) if channel else is_valid_topic_name(name)
