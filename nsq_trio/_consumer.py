"""``nsq_trio.Consumer``: :class:`nsq_client.Consumer` on the trio backend."""

from __future__ import annotations

from typing import Unpack

import nsq_client

from ._backend import BACKEND

__all__ = ["Consumer"]


class Consumer(nsq_client.Consumer):
    __doc__ = nsq_client.Consumer.__doc__

    def __init__(
        self, topic: str, channel: str, **arguments: Unpack[nsq_client.ConsumerArguments]
    ) -> None:
        super().__init__(BACKEND, topic, channel, **arguments)


Consumer.__module__ = "nsq_trio"
