"""Mistakes mypy --strict must catch: each line marked ``# error`` is one error, and mypy
reports errors on no other line (tests/test_typing.py checks it)."""

from __future__ import annotations

import nsq_anyio
import nsq_trio
from nsq_anyio import blocking


async def mistakes() -> None:
    nsq_anyio.Consumer("t", "c", max_in_fligth=100)  # error
    nsq_anyio.Consumer("t", "c", max_in_flight="100")  # error
    nsq_anyio.Consumer("t", "c", tls_v1=True)  # error
    nsq_trio.Producer(nsqd_tcp_adresses=["127.0.0.1:4150"])  # error
    nsq_trio.Producer(pool_size=2.5)  # error
    blocking.Consumer("t", "c", max_inflight=5)  # error
    async with nsq_anyio.Consumer("t", "c") as consumer:
        async for message in consumer:
            await message.finsh()  # error
            print(len(message.body), message.body + "")  # error
        consumer.stats()["in_fligth"]  # error
