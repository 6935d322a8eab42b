"""``python -m nsq_cli serve | pub | tail | stats | demo | worker`` (installed as
``nsq-sansio``)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nsq_cli"))
