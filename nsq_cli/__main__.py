"""``python -m nsq_cli serve | pub | tail | stats | demo | worker`` (installed as
``nsq-sansio``)."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nsq_cli"))
