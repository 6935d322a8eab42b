"""The wire, below the state machines: frames and the data of nsqd's fixed responses
(``OK``, ``CLOSE_WAIT``, the heartbeat), message layouts, compression codecs, names, error
frames and the partitioned extension's sharding hash.  The connection and client cores
use these; so can tools that read captures or speak the protocol their own way.  The command
encoders are in :mod:`nsq_proto.commands`."""

from __future__ import annotations

from ._compress import DeflateCodec as DeflateCodec
from ._compress import SnappyCodec as SnappyCodec
from ._connection import NON_FATAL_ERRORS as NON_FATAL_ERRORS
from ._connection import parse_error_frame as parse_error_frame
from ._frames import CLOSE_WAIT as CLOSE_WAIT
from ._frames import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from ._frames import HEARTBEAT as HEARTBEAT
from ._frames import OK as OK
from ._frames import FrameDecoder as FrameDecoder
from ._frames import FrameType as FrameType
from ._frames import encode_frame as encode_frame
from ._message import MessageLayout as MessageLayout
from ._message import decode_message as decode_message
from ._names import is_valid_channel_name as is_valid_channel_name
from ._names import is_valid_topic_name as is_valid_topic_name
from ._partitioned import TOPOLOGY_CHANGED as TOPOLOGY_CHANGED
from ._partitioned import murmur3_32 as murmur3_32
from ._partitioned import partition_for_key as partition_for_key

__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "HEARTBEAT",
    "NON_FATAL_ERRORS",
    "OK",
    "TOPOLOGY_CHANGED",
    "DeflateCodec",
    "FrameDecoder",
    "FrameType",
    "MessageLayout",
    "SnappyCodec",
    "decode_message",
    "encode_frame",
    "is_valid_channel_name",
    "is_valid_topic_name",
    "murmur3_32",
    "parse_error_frame",
    "partition_for_key",
]
