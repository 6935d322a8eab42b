"""nsq_proto: a sans-IO NSQ protocol core (standard NSQ and the partitioned extension).

No I/O, no clocks, no threads: bytes and ``now`` go in; bytes to send, events and deadlines
come out.
"""

from . import commands as commands
from . import wire as wire
from ._config import ConfigError as ConfigError
from ._config import ConnectionConfig as ConnectionConfig
from ._config import parse_addresses as parse_addresses
from ._config import parse_client_addresses as parse_client_addresses
from ._connection import Connection as Connection
from ._consumer import REQUEUE_GRACE as REQUEUE_GRACE
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
from ._events import MessagesReceived as MessagesReceived
from ._events import PublishesSucceeded as PublishesSucceeded
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
from ._lookupd import LookupResult as LookupResult
from ._lookupd import Peer as Peer
from ._lookupd import TopicMeta as TopicMeta
from ._lookupd import parse_lookup_response as parse_lookup_response
from ._message import Message as Message
from ._outputs import Action as Action
from ._outputs import Close as Close
from ._outputs import Connect as Connect
from ._outputs import HttpRequest as HttpRequest
from ._outputs import Output as Output
from ._outputs import Send as Send
from ._outputs import StartTLS as StartTLS
from ._producer import Producer as Producer
from ._producer import ProducerConfig as ProducerConfig
from ._producer import ProducerConnectionInfo as ProducerConnectionInfo
from ._producer import PublishTimeout as PublishTimeout
from ._start_from import StartFrom as StartFrom
from ._state import ConnectionState as ConnectionState
from ._version import __version__ as __version__

__all__ = [
    "Action",
    "AuthRequired",
    "AuthResult",
    "BackoffChanged",
    "ClientCore",
    "Close",
    "CloseWaitReceived",
    "ConfigError",
    "ConnId",
    "Connect",
    "Connection",
    "ConnectionClosed",
    "ConnectionClosedError",
    "ConnectionConfig",
    "ConnectionState",
    "ConnectionStats",
    "Consumer",
    "ConsumerConfig",
    "DEFAULT_MAX_RDY_COUNT",
    "ErrorReceived",
    "Event",
    "ExtFilter",
    "FrameTooLarge",
    "HandshakeTimeout",
    "HeartbeatReceived",
    "HttpRequest",
    "InvalidName",
    "LocalProtocolError",
    "LookupFailed",
    "LookupResult",
    "LookupSucceeded",
    "LookupdError",
    "Message",
    "MessageGivenUp",
    "MessageReceived",
    "MessagesReceived",
    "NSQError",
    "NSQTimeout",
    "NegotiatedFeatures",
    "Output",
    "Peer",
    "Producer",
    "ProducerConfig",
    "ProducerConnectionInfo",
    "ProtocolError",
    "PublishFailed",
    "PublishSucceeded",
    "PublishesSucceeded",
    "PublishTimeout",
    "REQUEUE_GRACE",
    "ReadTimeout",
    "Ready",
    "RemoteProtocolError",
    "Send",
    "ServerError",
    "StartFrom",
    "StartFromApplied",
    "StartFromFailed",
    "StartTLS",
    "Stopped",
    "Subscribed",
    "TopicMeta",
    "TraceReceipt",
    "commands",
    "parse_address",
    "parse_addresses",
    "parse_client_addresses",
    "parse_lookup_response",
    "wire",
    "__version__",
]
