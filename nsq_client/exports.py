"""What every adapter re-exports beside its ``Consumer`` and ``Producer``: the message, the
errors an application meets, and the trace receipt (``from nsq_client.exports import *``)."""

from nsq_proto import AuthRequired as AuthRequired
from nsq_proto import ConfigError as ConfigError
from nsq_proto import ConnectionClosedError as ConnectionClosedError
from nsq_proto import LocalProtocolError as LocalProtocolError
from nsq_proto import NSQError as NSQError
from nsq_proto import NSQTimeout as NSQTimeout
from nsq_proto import PublishTimeout as PublishTimeout
from nsq_proto import RemoteProtocolError as RemoteProtocolError
from nsq_proto import ServerError as ServerError
from nsq_proto import TraceReceipt as TraceReceipt

from ._message import Message as Message
from ._runner import TransportError as TransportError

__all__ = [
    "AuthRequired",
    "ConfigError",
    "ConnectionClosedError",
    "LocalProtocolError",
    "Message",
    "NSQError",
    "NSQTimeout",
    "PublishTimeout",
    "RemoteProtocolError",
    "ServerError",
    "TraceReceipt",
    "TransportError",
]
