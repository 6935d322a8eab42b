"""nsq_anyio: an NSQ client on anyio (asyncio or trio), driving the nsq_proto cores.

.. code-block:: python

    async with nsq_anyio.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
        await producer.publish("topic", b"body")

    async with nsq_anyio.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as consumer:
        async for message in consumer:
            await message.finish()
"""

from nsq_client import Message as Message
from nsq_client import TransportError as TransportError
from nsq_proto import AuthRequired as AuthRequired
from nsq_proto import ConfigError as ConfigError
from nsq_proto import ConnectionClosedError as ConnectionClosedError
from nsq_proto import LocalProtocolError as LocalProtocolError
from nsq_proto import NSQError as NSQError
from nsq_proto import PublishTimeout as PublishTimeout
from nsq_proto import RemoteProtocolError as RemoteProtocolError
from nsq_proto import ServerError as ServerError
from nsq_proto import TraceReceipt as TraceReceipt

from ._consumer import Consumer as Consumer
from ._producer import Producer as Producer

__all__ = [
    "AuthRequired",
    "ConfigError",
    "ConnectionClosedError",
    "Consumer",
    "LocalProtocolError",
    "Message",
    "NSQError",
    "Producer",
    "PublishTimeout",
    "RemoteProtocolError",
    "ServerError",
    "TraceReceipt",
    "TransportError",
    "serve_emulator",
]


def __getattr__(name: str) -> object:
    # the emulator host is imported on first use: the client itself does not need it
    if name == "serve_emulator":
        from ._server import serve_emulator

        return serve_emulator
    raise AttributeError(name)
