"""nsq_anyio: an NSQ client on anyio (asyncio or trio), driving the nsq_proto cores.

.. code-block:: python

    async with nsq_anyio.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
        await producer.publish("topic", b"body")

    async with nsq_anyio.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as consumer:
        async for message in consumer:
            await message.finish()
"""

from typing import TYPE_CHECKING

from nsq_client.exports import *  # noqa: F403 (the message, the errors, TraceReceipt)
from nsq_client.exports import __all__ as _exports

from ._consumer import Consumer as Consumer
from ._producer import Producer as Producer

__all__ = [*_exports, "Consumer", "EmulatorCluster", "Producer", "serve_emulator"]

if TYPE_CHECKING:  # imported on first use (below); typed for the application
    from nsq_emulator.loopback import EmulatorCluster as EmulatorCluster
    from nsq_emulator.loopback import serve_emulator as serve_emulator


def __getattr__(name: str) -> object:
    # the emulator's loopback host (nsq_emulator.loopback, where it lives now) is imported on
    # first use: the client itself does not need it
    if name in ("serve_emulator", "EmulatorCluster"):
        from nsq_emulator import loopback

        return getattr(loopback, name)
    raise AttributeError(name)
