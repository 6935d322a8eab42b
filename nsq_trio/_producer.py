"""``nsq_trio.Producer``: :class:`nsq_client.Producer` on the trio backend."""

import nsq_client

from ._backend import BACKEND

__all__ = ["Producer"]


class Producer(nsq_client.Producer):
    __doc__ = nsq_client.Producer.__doc__
    default_backend = BACKEND


Producer.__module__ = "nsq_trio"
