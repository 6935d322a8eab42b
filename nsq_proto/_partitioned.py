"""Partitioned NSQ helpers: sharding keys to partitions, and recognising the server.

go-nsq maps a sharding key to a partition as ``murmur3_32(key) mod partition_num`` with
MurmurHash3 x86 32-bit, seed 0 (the hasher its docs and tests configure); ``partition_num``
comes from the ``meta`` of a lookup made with ``metainfo``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from ._errors import LocalProtocolError

__all__ = [
    "TOPOLOGY_CHANGED",
    "Hasher",
    "murmur3_32",
    "partition_for_key",
    "is_partitioned_version",
]

#: the partitioned server's refusals that mean the cluster moved (a leader changed, a partition
#: is not writable here, the topic is not on this node yet): look the topic up again, and
#: retry a publish or subscription there
TOPOLOGY_CHANGED: Final = frozenset(
    {"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_TOPIC_NOT_EXIST"}
)

_MASK: Final = 0xFFFFFFFF
_C1: Final = 0xCC9E2D51
_C2: Final = 0x1B873593
_iter_blocks = struct.Struct("<I").iter_unpack

#: a sharding hasher: key bytes -> a non-negative int (go-nsq's ``hash.Hash32``'s ``Sum32``)
Hasher = Callable[[bytes], int]


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data`` (an unsigned 32-bit int)."""
    if type(seed) is not int or not 0 <= seed <= _MASK:
        raise ValueError(f"seed {seed!r} is not an unsigned 32-bit integer")
    length = len(data)
    body = length & ~3
    h = seed
    for (k,) in _iter_blocks(data[:body]):
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK
        h = (h * 5 + 0xE6546B64) & _MASK
    tail = data[body:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = (k * _C1) & _MASK
        k = ((k << 15) | (k >> 17)) & _MASK
        k = (k * _C2) & _MASK
        h ^= k
    h ^= length & _MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def partition_for_key(key: bytes | str, partition_num: int, hasher: Hasher | None = None) -> int:
    """The partition an ordered publish with sharding ``key`` goes to (go-nsq's convention):
    ``hasher(key) mod partition_num``, with MurmurHash3 x86 32-bit, seed 0, by default.

    ``key`` is hashed as bytes, UTF-8 encoded when it is text.  ``partition_num`` must be
    positive: go-nsq refuses ordered publishing when the lookup meta lacks it or it is <= 0.
    A ``hasher`` that returns anything but a non-negative int is a LocalProtocolError.
    """
    if type(partition_num) is not int or partition_num <= 0:
        raise LocalProtocolError(
            f"partition_num must be a positive int (from the lookup meta), not {partition_num!r}"
        )
    if isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(f"sharding key {key!r} cannot be encoded as UTF-8") from exc
    elif isinstance(key, bytes):
        data = key
    else:
        raise LocalProtocolError(f"sharding key must be bytes or str, not {type(key).__name__}")
    if hasher is None:
        return murmur3_32(data) % partition_num
    value = hasher(data)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LocalProtocolError(
            f"the sharding hasher {hasher!r} returned {value!r}, not a non-negative int"
        )
    return value % partition_num


def is_partitioned_version(version: str) -> bool:
    """True for the partitioned server's version strings (``x.y.z-HA.a.b.c``)."""
    return isinstance(version, str) and "-HA." in version
