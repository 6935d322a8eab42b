"""``python -m nsq_emulator``: one emulated nsqd and an nsqlookupd on loopback until stopped,
with the options of the command line's ``serve`` (``--host``, ``--tcp-port`` 4150,
``--http-port`` 4151, ``--lookupd-http-port`` 4161, ``--backend``).

It is that command (:func:`nsq_cli.serve_main`): one implementation of the options, the
output, the stop on SIGINT or SIGTERM and the exit statuses.  It is the only module of the
emulator that imports a package of this project other than :mod:`nsq_proto`
(``tests/test_import_graph.py`` holds the emulator to that).
"""

from __future__ import annotations

import sys

from nsq_cli import serve_main

if __name__ == "__main__":
    sys.exit(serve_main(prog="python -m nsq_emulator"))
