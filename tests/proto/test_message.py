"""The message frames of ``_message.py``: the partitioned server's layouts, cut short."""

from __future__ import annotations

import pytest

from nsq_proto import Message, RemoteProtocolError
from nsq_proto.wire import MessageLayout, decode_message

from .helpers import mid


@pytest.mark.parametrize(
    ("layout", "tail", "says"),
    [
        (MessageLayout(ext_header=True), b"", "ends inside its extension header"),
        (MessageLayout(ext_header=True), b"\x01\x00", "ends inside its extension length"),
        (MessageLayout(ext_header=True), b"\x01\x00\x05ab", "ends inside its extension data"),
        (MessageLayout(queue_position=True), b"\x00" * 11, "ends inside its queue position"),
    ],
)
def test_truncated_partitioned_message_frames_are_remote_errors(
    layout: MessageLayout, tail: bytes, says: str
) -> None:
    header = b"\x00" * 8 + b"\x00\x01" + mid(1)  # timestamp, attempts, id
    with pytest.raises(RemoteProtocolError, match=f"message frame {says}"):
        decode_message(header + tail, layout)
    full = decode_message(header + b"\x01\x00\x02{}" + b"body", MessageLayout(ext_header=True))
    assert (full.ext_version, full.ext_data, full.body) == (1, b"{}", b"body")


class _AppMessage(Message):
    __slots__ = ("note",)


def test_decode_message_builds_the_class_given() -> None:
    header = b"\x00" * 8 + b"\x00\x02" + mid(1)
    standard = decode_message(header + b"body", cls=_AppMessage)
    assert type(standard) is _AppMessage
    assert (standard.id, standard.attempts, standard.body) == (mid(1), 2, b"body")
    ext = decode_message(header + b"\x04\x00\x02{}x", MessageLayout(ext_header=True), _AppMessage)
    assert type(ext) is _AppMessage
    assert (ext.ext_version, ext.ext_data, ext.body) == (4, b"{}", b"x")
    assert type(decode_message(header + b"body")) is Message
