from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_proto import LocalProtocolError
from nsq_proto._partitioned import is_partitioned_version, murmur3_32, partition_for_key


def reference_murmur3_32(data: bytes, seed: int = 0) -> int:
    """A second, deliberately plain transcription of MurmurHash3_x86_32 (byte-wise reads)."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) % 2**32

    def mix_k(k: int) -> int:
        k = (k * 0xCC9E2D51) % 2**32
        k = rotl(k, 15)
        return (k * 0x1B873593) % 2**32

    h = seed
    n = len(data)
    i = 0
    while i + 4 <= n:
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        h ^= mix_k(k)
        h = rotl(h, 13)
        h = (h * 5 + 0xE6546B64) % 2**32
        i += 4
    rest = n - i
    k = 0
    if rest == 3:
        k ^= data[i + 2] << 16
    if rest >= 2:
        k ^= data[i + 1] << 8
    if rest >= 1:
        k ^= data[i]
        h ^= mix_k(k)
    h ^= n % 2**32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) % 2**32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) % 2**32
    h ^= h >> 16
    return h


# (key, murmur3, mod 2, mod 4, mod 8, mod 10, mod 16): partitioned-nsq.md section 7
SECTION_7 = [
    ("", 0x00000000, 0, 0, 0, 0, 0),
    ("hello", 0x248BFA47, 1, 3, 7, 1, 7),
    ("publish_test_case", 0xB26D8B3C, 0, 0, 4, 6, 12),
    ("order-10001", 0x9900C2C1, 1, 1, 1, 5, 1),
    ("12345", 0x13A51193, 1, 3, 3, 3, 3),
]


@pytest.mark.parametrize(("key", "digest", "m2", "m4", "m8", "m10", "m16"), SECTION_7)
def test_section_7_vectors(
    key: str, digest: int, m2: int, m4: int, m8: int, m10: int, m16: int
) -> None:
    assert murmur3_32(key.encode()) == digest
    assert reference_murmur3_32(key.encode()) == digest
    for n, expected in ((2, m2), (4, m4), (8, m8), (10, m10), (16, m16)):
        assert partition_for_key(key, n) == expected
        assert partition_for_key(key.encode(), n) == expected


# published MurmurHash3_x86_32 vectors: every tail length, seeds 0, 1, 0xffffffff, 0x9747b28c
PUBLISHED = [
    (b"", 0, 0x00000000),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\x00", 0, 0x514E28B7),
    (b"\x00\x00", 0, 0x30F4C306),
    (b"\x00\x00\x00", 0, 0x85F0B427),
    (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
    (b"\xff\xff\xff\xff", 0, 0x76293B50),
    (b"\x21", 0, 0x72661CF4),
    (b"\x21\x43", 0, 0xA0F7B07A),
    (b"\x21\x43\x65", 0, 0x7E4A8634),
    (b"\x21\x43\x65\x87", 0, 0xF55B516B),
    (b"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"ab", 0x9747B28C, 0x74875592),
    (b"abc", 0x9747B28C, 0xC84A62DD),
    (b"abcd", 0x9747B28C, 0xF0478627),
    (b"aa", 0x9747B28C, 0x5D211726),
    (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    (b"The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723),
    (b"hello", 0, 0x248BFA47),
]


@pytest.mark.parametrize(("data", "seed", "digest"), PUBLISHED)
def test_published_vectors(data: bytes, seed: int, digest: int) -> None:
    assert murmur3_32(data, seed) == digest
    assert reference_murmur3_32(data, seed) == digest


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), seed=st.integers(0, 2**32 - 1))
def test_matches_reference(data: bytes, seed: int) -> None:
    digest = murmur3_32(data, seed)
    assert 0 <= digest < 2**32
    assert digest == reference_murmur3_32(data, seed)


@settings(max_examples=200, deadline=None)
@given(key=st.text(max_size=40) | st.binary(max_size=40), partition_num=st.integers(1, 4096))
def test_partition_range_and_determinism(key: str | bytes, partition_num: int) -> None:
    partition = partition_for_key(key, partition_num)
    assert 0 <= partition < partition_num
    assert partition_for_key(key, partition_num) == partition
    data = key.encode() if isinstance(key, str) else key
    assert partition == murmur3_32(data) % partition_num
    assert partition_for_key(key, 1) == 0


@pytest.mark.parametrize("partition_num", [0, -1, -(2**40), True, 2.0, None, "4"])
def test_bad_partition_num(partition_num: object) -> None:
    with pytest.raises(LocalProtocolError, match="partition_num must be a positive int"):
        partition_for_key("k", partition_num)  # type: ignore[arg-type]


def test_bad_keys() -> None:
    with pytest.raises(LocalProtocolError, match="cannot be encoded as UTF-8"):
        partition_for_key("\ud800", 4)
    with pytest.raises(LocalProtocolError, match="must be bytes or str"):
        partition_for_key(42, 4)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="must be bytes or str"):
        partition_for_key(bytearray(b"k"), 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [-1, 2**32, 1.0])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ValueError, match="seed"):
        murmur3_32(b"x", seed)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.3.7-HA.1.13.0", True),
        ("0.3.7-HA.1.9.6", True),
        ("1.3.0", False),
        ("0.3.8", False),
        ("", False),
        ("HA.1", False),
        ("1.0-ha.1", False),
    ],
)
def test_is_partitioned_version(version: str, expected: bool) -> None:
    assert is_partitioned_version(version) is expected
