"""nsq_anyio: an NSQ client on anyio (asyncio or trio), driving the nsq_proto cores.

.. code-block:: python

    async with nsq_anyio.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
        await producer.publish("topic", b"body")

    async with nsq_anyio.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as consumer:
        async for message in consumer:
            await message.finish()
"""

from nsq_client.exports import *  # noqa: F403 (the message, the errors, TraceReceipt)
from nsq_client.exports import __all__ as _exports

from ._consumer import Consumer as Consumer
from ._producer import Producer as Producer

__all__ = [*_exports, "Consumer", "Producer"]
