"""nsq_proto: a sans-IO NSQ protocol core (standard NSQ and the partitioned extension).

No I/O, no clocks, no threads: bytes and ``now`` go in; bytes to send, events and deadlines
come out.
"""

from . import _commands as commands
from ._compress import DeflateCodec as DeflateCodec
from ._compress import SnappyCodec as SnappyCodec
from ._config import ConfigError as ConfigError
from ._config import ConnectionConfig as ConnectionConfig
from ._connection import NON_FATAL_ERRORS as NON_FATAL_ERRORS
from ._connection import Connection as Connection
from ._connection import parse_error_frame as parse_error_frame
from ._consumer import ConnectionStats as ConnectionStats
from ._consumer import Consumer as Consumer
from ._consumer import ConsumerConfig as ConsumerConfig
from ._consumer import parse_address as parse_address
from ._core import ClientCore as ClientCore
from ._errors import AuthRequired as AuthRequired
from ._errors import ConnectionClosedError as ConnectionClosedError
from ._errors import FrameTooLarge as FrameTooLarge
from ._errors import HandshakeTimeout as HandshakeTimeout
from ._errors import InvalidName as InvalidName
from ._errors import LocalProtocolError as LocalProtocolError
from ._errors import LookupdError as LookupdError
from ._errors import NSQError as NSQError
from ._errors import NSQTimeout as NSQTimeout
from ._errors import ProtocolError as ProtocolError
from ._errors import ReadTimeout as ReadTimeout
from ._errors import RemoteProtocolError as RemoteProtocolError
from ._errors import ServerError as ServerError
from ._events import BackoffChanged as BackoffChanged
from ._events import CloseWaitReceived as CloseWaitReceived
from ._events import ConnectionClosed as ConnectionClosed
from ._events import ConnId as ConnId
from ._events import ErrorReceived as ErrorReceived
from ._events import Event as Event
from ._events import HeartbeatReceived as HeartbeatReceived
from ._events import LookupFailed as LookupFailed
from ._events import LookupSucceeded as LookupSucceeded
from ._events import MessageGivenUp as MessageGivenUp
from ._events import MessageReceived as MessageReceived
from ._events import PublishFailed as PublishFailed
from ._events import PublishSucceeded as PublishSucceeded
from ._events import Ready as Ready
from ._events import StartFromApplied as StartFromApplied
from ._events import StartFromFailed as StartFromFailed
from ._events import Stopped as Stopped
from ._events import Subscribed as Subscribed
from ._ext_filter import ExtFilter as ExtFilter
from ._features import DEFAULT_MAX_RDY_COUNT as DEFAULT_MAX_RDY_COUNT
from ._features import AuthResult as AuthResult
from ._features import NegotiatedFeatures as NegotiatedFeatures
from ._features import TraceReceipt as TraceReceipt
from ._frames import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from ._frames import FrameDecoder as FrameDecoder
from ._frames import FrameType as FrameType
from ._frames import encode_frame as encode_frame
from ._lookupd import LookupResult as LookupResult
from ._lookupd import Peer as Peer
from ._lookupd import TopicMeta as TopicMeta
from ._message import Message as Message
from ._message import MessageLayout as MessageLayout
from ._message import decode_message as decode_message
from ._names import is_valid_channel_name as is_valid_channel_name
from ._names import is_valid_topic_name as is_valid_topic_name
from ._outputs import Action as Action
from ._outputs import Close as Close
from ._outputs import Connect as Connect
from ._outputs import HttpRequest as HttpRequest
from ._outputs import Output as Output
from ._outputs import Send as Send
from ._outputs import StartTLS as StartTLS
from ._partitioned import murmur3_32 as murmur3_32
from ._partitioned import partition_for_key as partition_for_key
from ._producer import Producer as Producer
from ._producer import ProducerConfig as ProducerConfig
from ._producer import PublishTimeout as PublishTimeout
from ._start_from import StartFrom as StartFrom
from ._state import ConnectionState as ConnectionState
from ._version import __version__ as __version__

__all__ = [
    "commands",
    "BackoffChanged",
    "ClientCore",
    "Connect",
    "ConnectionStats",
    "Consumer",
    "ConsumerConfig",
    "HttpRequest",
    "LookupFailed",
    "LookupResult",
    "LookupSucceeded",
    "StartFrom",
    "StartFromApplied",
    "StartFromFailed",
    "MessageGivenUp",
    "Peer",
    "Producer",
    "ProducerConfig",
    "PublishTimeout",
    "Stopped",
    "TopicMeta",
    "murmur3_32",
    "parse_address",
    "partition_for_key",
    "Action",
    "AuthRequired",
    "AuthResult",
    "Close",
    "CloseWaitReceived",
    "ConfigError",
    "ExtFilter",
    "Connection",
    "ConnectionClosed",
    "ConnectionClosedError",
    "ConnectionConfig",
    "ConnectionState",
    "ConnId",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_RDY_COUNT",
    "DeflateCodec",
    "ErrorReceived",
    "Event",
    "FrameDecoder",
    "FrameTooLarge",
    "HandshakeTimeout",
    "FrameType",
    "HeartbeatReceived",
    "InvalidName",
    "LocalProtocolError",
    "LookupdError",
    "Message",
    "MessageLayout",
    "MessageReceived",
    "NON_FATAL_ERRORS",
    "NSQError",
    "NSQTimeout",
    "NegotiatedFeatures",
    "Output",
    "ProtocolError",
    "PublishFailed",
    "PublishSucceeded",
    "ReadTimeout",
    "Ready",
    "RemoteProtocolError",
    "Send",
    "ServerError",
    "SnappyCodec",
    "StartTLS",
    "Subscribed",
    "TraceReceipt",
    "__version__",
    "decode_message",
    "encode_frame",
    "is_valid_channel_name",
    "is_valid_topic_name",
    "parse_error_frame",
]
