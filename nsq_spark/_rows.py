"""The source's rows: messages as one Arrow record batch of the query's columns, built on the
driver (``read_mode`` ``driver``) or in a task (``executors``)."""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

if TYPE_CHECKING:
    import nsq_anyio

__all__ = ["message_id", "message_ids", "record_batch"]


def message_id(raw: bytes) -> str:
    """nsqd's ids are 16 hex digits; the partitioned server's are binary (shown in hex)."""
    if raw.isascii():
        text = raw.decode("ascii")
        if text.isprintable():
            return text
    return raw.hex()


def message_ids(messages: Sequence[nsq_anyio.Message]) -> pa.Array:
    """The ids of ``messages`` as they came (binary)."""
    return _binary([m.id for m in messages], pa.binary())


# The columns are built from their buffers: pyarrow imports pandas (when it is installed) the
# first time it converts a Python list or scalar (``pa.array``, ``pa.scalar``), most of the
# first second of a Spark Python worker's first task.


def _binary(values: Sequence[bytes], kind: pa.DataType) -> pa.Array:
    """A binary or string array (``kind``) of ``values`` (UTF-8 already for strings)."""
    offsets = array.array("i", itertools.accumulate(map(len, values), initial=0))
    if offsets.itemsize != 4 or offsets[-1] >= 1 << 31:  # pragma: no cover (beyond int32)
        return pa.array(values, kind)
    return pa.Array.from_buffers(
        kind, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
    )


def _strings(values: Sequence[str], kind: pa.DataType) -> pa.Array:
    """A string array of ``values``, each distinct value encoded once."""
    encoded: dict[str, bytes] = {}
    return _binary([encoded.get(v) or encoded.setdefault(v, v.encode()) for v in values], kind)


#: the array module's typecode of each fixed-width type of the rows
_TYPECODES = {pa.int32(): "i", pa.int64(): "q"}


def _numbers(values: Sequence[int | None], kind: pa.DataType) -> pa.Array:
    """An array of ``kind`` (32- or 64-bit integers, or timestamps stored as the latter) of
    ``values``, where None is null."""
    storage = pa.int64() if pa.types.is_timestamp(kind) else kind
    code = _TYPECODES.get(storage)
    if code is None or array.array(code).itemsize != storage.bit_width // 8:
        return pa.array(values, kind)  # pragma: no cover (a platform without those widths)
    nulls = sum(v is None for v in values)
    validity = None
    if nulls:
        bits = bytearray((len(values) + 7) // 8)
        for i, v in enumerate(values):
            if v is not None:
                bits[i >> 3] |= 1 << (i & 7)
        validity = pa.py_buffer(bytes(bits))
    data = array.array(code, [0 if v is None else v for v in values])
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(data)], nulls)


def _id_strings(ids: pa.Array) -> pa.Array:
    """``ids`` as the ``id`` column shows them (see :func:`message_id`), at once where every
    id is printable ASCII (nsqd's always are)."""
    try:
        text = ids.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: binary ids
        text = None
    if text is not None:
        printable = pc.all(pc.and_(pc.string_is_ascii(text), pc.utf8_is_printable(text))).as_py()
        if printable is None or printable:
            return text
    return _strings([message_id(raw) for raw in ids.to_pylist()], pa.string())


def _column(
    field: pa.Field,
    messages: Sequence[nsq_anyio.Message],
    topic: str,
    ids: pa.Array | None,
) -> pa.Array:
    name, kind = field.name, field.type
    if name == "body":
        return _binary([m.body for m in messages], kind)
    if name == "id":
        return _id_strings(_binary([m.id for m in messages], pa.binary()) if ids is None else ids)
    if name == "attempts":
        return _numbers([m.attempts for m in messages], kind)
    if name == "timestamp":  # nanoseconds to Spark's microseconds
        return _numbers([m.timestamp // 1000 for m in messages], kind)
    if name == "topic":
        return _strings([topic] * len(messages), kind)
    if name == "nsqd":
        return _strings([m.nsqd_address for m in messages], kind)
    if name == "partition":
        return _numbers([m.partition for m in messages], kind)
    if name == "trace_id":
        return _numbers([m.trace_id for m in messages], kind)
    raise ValueError(f"the nsq source has no column {name!r}")


def record_batch(
    messages: Sequence[nsq_anyio.Message],
    arrow_schema: pa.Schema,
    topic: str,
    *,
    ids: pa.Array | None = None,
) -> pa.RecordBatch:
    """The rows of ``messages`` as one Arrow record batch of ``arrow_schema``'s columns
    (``ids``: their :func:`message_ids`, if made already)."""
    # a message's core fields are plain attributes (it is the core's nsq_proto.Message)
    arrays = [_column(f, messages, topic, ids) for f in arrow_schema]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
