"""``nsq_anyio.Consumer``: :class:`nsq_client.Consumer` on the anyio backend."""

import nsq_client

from ._backend import BACKEND

__all__ = ["Consumer"]


class Consumer(nsq_client.Consumer):
    __doc__ = nsq_client.Consumer.__doc__
    default_backend = BACKEND


Consumer.__module__ = "nsq_anyio"
