"""nsq_cli: the command line (``nsq-sansio``, the ``anyio`` extra).

``nsq-sansio serve`` (the emulator on loopback), ``pub``, ``tail``, ``stats`` and ``demo``;
also run as ``python -m nsq_cli`` and, as before, ``python -m nsq_anyio``.  ``python -m
nsq_emulator`` is its ``serve`` alone.  It sits above the client: it runs on :mod:`nsq_anyio`
and serves :mod:`nsq_emulator`, and neither imports it.  See the documentation's "Command
line" page for the options and the exit statuses.
"""

from ._cli import main as main
from ._cli import serve_main as serve_main

__all__ = ["main", "serve_main"]
