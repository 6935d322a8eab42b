"""``start_from`` (``_start_from.py``): the positions a consumer of the partitioned server
starts from, per partition, their checks and their wire form.  The consumer's part that sets
them is :mod:`nsq_proto._start_positions` (``test_start_positions.py``, and
``test_start_positions_x_emulator.py`` against the emulator); the real twins are in
``tests/real/test_partitioned.py``, the Spark source's in ``tests/spark``.

The position is set over the leader's HTTP API (``/channel/setoffset``) before the first
subscription to a partition: the TCP form (``SUB_ADVANCED`` with five tokens) is read by the
server without its partition token and would move whichever partition the node leads first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from nsq_proto import (
    ConfigError,
    Consumer,
    ConsumerConfig,
    StartFrom,
)


def test_start_from_positions_and_their_wire_form() -> None:
    assert StartFrom.end().token() == b"special:-1"
    assert StartFrom.timestamp(1700000000.9).token() == b"timestamp:1700000000"
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    assert StartFrom.timestamp(when) == StartFrom("timestamp", 1704161045)
    assert StartFrom.queue_offset(4096).token() == b"virtual_queue:4096"
    assert StartFrom.message_count(1).token() == b"msgcount:1"
    assert StartFrom.parse(" end ") == StartFrom.end()
    assert StartFrom.parse("msgcount:12") == StartFrom.message_count(12)
    assert StartFrom.parse("timestamp:5") == StartFrom.timestamp(5)
    assert StartFrom.timestamp(datetime(2024, 1, 1, tzinfo=UTC)).value == 1704067200


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: StartFrom("offset", 1), "unknown start position kind 'offset'"),  # type: ignore[arg-type]
        (lambda: StartFrom("msgcount", True), "a start position is an int, not True"),
        (lambda: StartFrom("special", 0), "the only special start position is -1 (the end)"),
        (lambda: StartFrom.queue_offset(-1), "a virtual_queue start position must be 0..2^63-1"),
        (lambda: StartFrom.message_count(1 << 63), "a msgcount start position must be 0..2^63-1"),
        (lambda: StartFrom.timestamp(True), "a start time is Unix seconds or a datetime"),
        (lambda: StartFrom.timestamp("today"), "a start time is Unix seconds or a datetime"),  # type: ignore[arg-type]
        (lambda: StartFrom.timestamp(datetime(2024, 1, 1)), "give an aware datetime"),
        (lambda: StartFrom.timestamp(float("nan")), "a start time must be finite, not nan"),
        (lambda: StartFrom.parse("12"), "a start position reads 'end' or 'kind:value'"),
        (lambda: StartFrom.parse("msgcount:x"), "start position 'msgcount:x': 'x' is not an int"),
    ],
)
def test_start_from_refuses_what_the_server_would(make: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(says)


def test_start_from_needs_lookupd_and_valid_positions() -> None:
    with pytest.raises(ConfigError, match="lookupd"):
        Consumer(
            "events",
            "c",
            ConsumerConfig(start_from=StartFrom.end()),
            nsqd_tcp_addresses=["127.0.0.1:4150"],
        )
    for bad in (
        lambda: StartFrom("special", 0),
        lambda: StartFrom.queue_offset(-1),
        lambda: StartFrom.timestamp(float("nan")),
        lambda: ConsumerConfig(start_from={0: "end"}),  # type: ignore[dict-item]
        lambda: StartFrom.parse("latest"),
    ):
        with pytest.raises(ConfigError):
            bad()
    assert StartFrom.parse("end") == StartFrom.end()
    assert StartFrom.parse("timestamp:1700000000").token() == b"timestamp:1700000000"
