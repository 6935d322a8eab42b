"""``nsq_trio.Producer``: :class:`nsq_client.Producer` on the trio backend."""

from __future__ import annotations

from typing import Unpack

import nsq_client

from ._backend import BACKEND

__all__ = ["Producer"]


class Producer(nsq_client.Producer):
    __doc__ = nsq_client.Producer.__doc__

    def __init__(self, **arguments: Unpack[nsq_client.ProducerArguments]) -> None:
        super().__init__(BACKEND, **arguments)


Producer.__module__ = "nsq_trio"
