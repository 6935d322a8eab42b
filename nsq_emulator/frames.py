"""What a server writes and a client only reads: the data of a message frame and the receipt
of a traced publish.

They are the inverse of :func:`nsq_proto.wire.decode_message` and of the client core's
reading of a :class:`nsq_proto.TraceReceipt`; :func:`nsq_proto.wire.encode_frame` makes a
whole frame of them (``FrameType.MESSAGE`` and ``FrameType.RESPONSE``).  The emulated nsqd
writes its messages with them, and a test of a client core can play a server with them.
"""

from __future__ import annotations

import struct
from typing import Final

from nsq_proto import TraceReceipt

__all__ = ["encode_message_data", "encode_trace_receipt"]

_TS_ATTEMPTS: Final = struct.Struct(">qH")
_U16: Final = struct.Struct(">H")
_POSITION: Final = struct.Struct(">QI")
_RECEIPT: Final = struct.Struct(">2sQQQI")


def encode_message_data(
    msg_id: bytes,
    timestamp: int,
    attempts: int,
    body: bytes,
    *,
    ext_version: int | None = None,
    ext_data: bytes = b"",
    queue_position: tuple[int, int] | None = None,
) -> bytes:
    """The data of a message frame, as a server writes it: ``timestamp:i64 | attempts:u16 |
    id:16``, then (partitioned server) the extension header ``ext_version:u8 [ext_len:u16
    ext_data]`` when ``ext_version`` is given, the queue position ``queue_offset:u64 |
    raw_size:u32`` when ``queue_position`` is, and the body.  ``msg_id`` is 16 bytes."""
    if len(msg_id) != 16:
        raise ValueError("a message id is 16 bytes")
    parts = [_TS_ATTEMPTS.pack(timestamp, attempts), msg_id]
    if ext_version is not None:
        parts.append(bytes((ext_version,)))
        if ext_version != 0:
            parts.append(_U16.pack(len(ext_data)))
            parts.append(ext_data)
    if queue_position is not None:
        parts.append(_POSITION.pack(*queue_position))
    parts.append(body)
    return b"".join(parts)


def encode_trace_receipt(receipt: TraceReceipt) -> bytes:
    """The data of the 30-byte response to PUB_TRACE / MPUB_TRACE (partitioned server):
    ``"OK" | internal_id:u64 | trace_id:u64 | queue_offset:u64 | raw_size:u32``."""
    return _RECEIPT.pack(
        b"OK", receipt.internal_id, receipt.trace_id, receipt.queue_offset, receipt.raw_size
    )
