"""nsq_proto.testing (deprecated): kept for compatibility; the emulator is :mod:`nsq_emulator`.

Every name here is the object of :mod:`nsq_emulator` (``nsq_proto.testing.Nsqd is
nsq_emulator.Nsqd``), so code written against this module keeps working; new code imports
:mod:`nsq_emulator`.  The rest of the emulator lives there too: the loopback host
(:mod:`nsq_emulator.loopback`, also ``nsq_anyio.serve_emulator``), ``python -m nsq_emulator``,
the pytest plugin (``nsq_emulator.pytest_plugin``) and the frames only a server writes
(:mod:`nsq_emulator.frames`).  The core (the rest of :mod:`nsq_proto`) does not import it.
"""

from nsq_emulator import FIXED_EPOCH as FIXED_EPOCH
from nsq_emulator import Authorization as Authorization
from nsq_emulator import Authorizer as Authorizer
from nsq_emulator import AuthRequest as AuthRequest
from nsq_emulator import AuthState as AuthState
from nsq_emulator import ChannelStats as ChannelStats
from nsq_emulator import ClientState as ClientState
from nsq_emulator import ClientStats as ClientStats
from nsq_emulator import Cluster as Cluster
from nsq_emulator import HttpResponse as HttpResponse
from nsq_emulator import HttpServerConnection as HttpServerConnection
from nsq_emulator import Lookupd as Lookupd
from nsq_emulator import MemoryNetwork as MemoryNetwork
from nsq_emulator import MessageInfo as MessageInfo
from nsq_emulator import NetworkStalled as NetworkStalled
from nsq_emulator import Nsqd as Nsqd
from nsq_emulator import NsqdConnection as NsqdConnection
from nsq_emulator import NsqdOptions as NsqdOptions
from nsq_emulator import NsqdStopped as NsqdStopped
from nsq_emulator import PartitionedTopic as PartitionedTopic
from nsq_emulator import TopicMeta as TopicMeta
from nsq_emulator import TopicStats as TopicStats
from nsq_emulator import static_authorizer as static_authorizer

__all__ = [
    "Authorization",
    "Authorizer",
    "AuthRequest",
    "AuthState",
    "ChannelStats",
    "ClientState",
    "ClientStats",
    "Cluster",
    "FIXED_EPOCH",
    "HttpResponse",
    "HttpServerConnection",
    "Lookupd",
    "MemoryNetwork",
    "NetworkStalled",
    "MessageInfo",
    "Nsqd",
    "NsqdConnection",
    "NsqdOptions",
    "NsqdStopped",
    "PartitionedTopic",
    "TopicMeta",
    "TopicStats",
    "static_authorizer",
]
