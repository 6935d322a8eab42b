"""``python -m nsq_emulator``: one emulated nsqd and an nsqlookupd on loopback until stopped
(:func:`nsq_emulator._serve.main`, which is also the command line's ``serve``)."""

import sys

from ._serve import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nsq_emulator"))
