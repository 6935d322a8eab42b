"""``python -m nsq_anyio serve | pub | tail | stats | demo``: the command line, which is the
:mod:`nsq_cli` package now (``nsq-sansio``); kept so that this spelling keeps working."""

from __future__ import annotations

import sys

from nsq_cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nsq_anyio"))
