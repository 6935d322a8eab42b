"""nsq_client: the full async NSQ client on any event loop, through a :class:`Backend`.

The protocol decisions are the sans-IO cores' (:mod:`nsq_proto`); this package drives them on
a backend (TCP streams, TLS, events, cancel scopes, task groups and the loop's clock) and gives
the application its ``Consumer``, ``Producer`` and ``Message``.  ``nsq_anyio`` and ``nsq_trio``
bind it to anyio and trio (their ``Consumer`` and ``Producer`` set ``default_backend``); to run
it elsewhere, implement :class:`Backend` (most of it comes with :class:`BackendBase`) and give it
as ``backend=``:

.. code-block:: python

    async with nsq_client.Consumer("topic", "channel", backend=MyBackend(), nsqd_tcp_addresses=[...]) as c:
        async for message in c:
            await message.finish()
"""

from ._backend import AbortStream as AbortStream
from ._backend import Backend as Backend
from ._backend import BackendBase as BackendBase
from ._backend import EventFactory as EventFactory
from ._backend import EventLike as EventLike
from ._backend import NowaitStream as NowaitStream
from ._backend import PushStream as PushStream
from ._backend import ScopeFactory as ScopeFactory
from ._backend import ScopeLike as ScopeLike
from ._backend import Stream as Stream
from ._backend import TaskGroupContext as TaskGroupContext
from ._backend import TaskGroupLike as TaskGroupLike
from ._consumer import Consumer as Consumer
from ._message import GiveUpHook as GiveUpHook
from ._message import Handler as Handler
from ._message import Message as Message
from ._options import ConnectionOptions as ConnectionOptions
from ._options import ConsumerArguments as ConsumerArguments
from ._options import ConsumerOptions as ConsumerOptions
from ._options import ProducerArguments as ProducerArguments
from ._options import ProducerOptions as ProducerOptions
from ._producer import Producer as Producer
from ._runner import CoreRunner as CoreRunner
from ._runner import TransportError as TransportError
from ._stats import ConsumerConnectionStats as ConsumerConnectionStats
from ._stats import ConsumerStats as ConsumerStats
from ._stats import ProducerConnectionStats as ProducerConnectionStats
from ._stats import ProducerStats as ProducerStats

__all__ = [
    "AbortStream",
    "Backend",
    "BackendBase",
    "ConnectionOptions",
    "Consumer",
    "ConsumerArguments",
    "ConsumerConnectionStats",
    "ConsumerOptions",
    "ConsumerStats",
    "CoreRunner",
    "EventFactory",
    "EventLike",
    "GiveUpHook",
    "Handler",
    "Message",
    "NowaitStream",
    "PushStream",
    "Producer",
    "ProducerArguments",
    "ProducerConnectionStats",
    "ProducerOptions",
    "ProducerStats",
    "ScopeFactory",
    "ScopeLike",
    "Stream",
    "TaskGroupContext",
    "TaskGroupLike",
    "TransportError",
]

for _public in (Consumer, CoreRunner, Message, Producer, TransportError, BackendBase):
    _public.__module__ = __name__
del _public
