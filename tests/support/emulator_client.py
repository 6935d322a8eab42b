"""A tiny scripted client for driving the emulator in tests (plain, no compression)."""

from __future__ import annotations

import json
import struct
from typing import Any

from nsq_emulator import Nsqd, NsqdConnection
from nsq_proto._frames import FrameDecoder
from nsq_proto._message import Message, MessageLayout, decode_message

MAGIC = b"  V2"
PARTITIONED_LAYOUT = MessageLayout(binary_id=True)
ORDERED_LAYOUT = MessageLayout(binary_id=True, queue_position=True)


def body(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def identify_cmd(**fields: Any) -> bytes:
    data = json.dumps(fields, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + body(data)


def pub_cmd(topic: str, data: bytes) -> bytes:
    return f"PUB {topic}\n".encode() + body(data)


def mpub_cmd(topic: str, *messages: bytes) -> bytes:
    inner = struct.pack(">I", len(messages)) + b"".join(body(m) for m in messages)
    return f"MPUB {topic}\n".encode() + body(inner)


class Client:
    """Writes raw commands to an :class:`NsqdConnection` and decodes what comes back."""

    def __init__(
        self,
        nsqd: Nsqd,
        now: float = 0.0,
        *,
        identify: dict[str, Any] | None = None,
        layout: MessageLayout | None = None,
    ) -> None:
        self.nsqd = nsqd
        self.conn: NsqdConnection = nsqd.accept(now)
        self.decoder = FrameDecoder()
        self.layout = layout
        self.frames: list[tuple[int, bytes]] = []
        self.send(MAGIC, now)
        if identify is not None:
            self.send(identify_cmd(**identify), now)
            resp = self.read()
            assert resp and resp[0][0] == 0, resp

    def send(self, data: bytes, now: float) -> None:
        self.conn.receive_data(data, now)

    def read(self) -> list[tuple[int, bytes]]:
        out = self.decoder.feed(self.conn.data_to_send())
        self.frames.extend(out)
        return out

    def responses(self) -> list[bytes]:
        return [d for t, d in self.read() if t == 0]

    def messages(self, frames: list[tuple[int, bytes]] | None = None) -> list[Message]:
        got = self.read() if frames is None else frames
        if self.layout is None:
            return [decode_message(d) for t, d in got if t == 2]
        return [decode_message(d, self.layout) for t, d in got if t == 2]

    def subscribe(self, topic: str, channel: str, now: float, rdy: int | None = None) -> None:
        self.send(f"SUB {topic} {channel}\n".encode(), now)
        assert self.read() == [(0, b"OK")]
        if rdy is not None:
            self.send(f"RDY {rdy}\n".encode(), now)

    def fin(self, msg_id: bytes, now: float) -> None:
        self.send(b"FIN " + msg_id + b"\n", now)

    def req(self, msg_id: bytes, delay_ms: int, now: float) -> None:
        self.send(b"REQ " + msg_id + b" " + str(delay_ms).encode() + b"\n", now)

    def touch(self, msg_id: bytes, now: float) -> None:
        self.send(b"TOUCH " + msg_id + b"\n", now)
