"""What a typed application writes: mypy --strict must accept all of it."""

from __future__ import annotations

import ssl

import nsq_anyio
import nsq_client
import nsq_trio
from nsq_anyio import blocking
from nsq_proto import ConsumerConfig, ProducerConfig


async def consume() -> None:
    async with nsq_anyio.Consumer(
        "topic",
        "channel",
        nsqd_tcp_addresses=["127.0.0.1:4150"],
        max_in_flight=100,
        msg_timeout=30.0,
        tls=ssl.create_default_context(),
        auth_secret="secret",
    ) as consumer:
        same: nsq_anyio.Consumer = consumer
        async for message in consumer:
            body: bytes = message.body
            attempts: int = message.attempts
            await message.finish()
        stats: nsq_client.ConsumerStats = same.stats()
        rdy: int = stats["connections"][0]["rdy"]
        print(body, attempts, rdy)


async def produce() -> None:
    config = ProducerConfig(pool_size=2)
    async with nsq_trio.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"], config=config) as p:
        same: nsq_trio.Producer = p
        await same.publish("topic", b"body", delay=1.5)
        pending: int = same.stats()["pending"]
        print(pending)


def synchronous() -> None:
    with blocking.Consumer(
        "topic", "channel", config=ConsumerConfig(max_in_flight=5), backoff=False
    ) as consumer:
        for message in consumer:
            message.finish()
