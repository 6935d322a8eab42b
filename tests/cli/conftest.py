"""What the command line's tests share as fixtures: ``server``, the emulator served by the
command line in a process of its own, and ``real``, a real nsqd and nsqlookupd."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.served import server
from tests.support.servers import NSQD, NSQLOOKUPD, Lookupd, Nsqd

__all__ = ["real", "server"]


@pytest.fixture
def real() -> Iterator[dict[str, str]]:
    if not (NSQD and NSQLOOKUPD):
        pytest.skip("no real nsqd/nsqlookupd: set NSQD and NSQLOOKUPD to the binaries")
    lookupd = Lookupd()
    nsqd = Nsqd(lookupd=lookupd, durable=False)
    try:
        lookupd.start()
        nsqd.start()
        yield {
            "lookupd HTTP": lookupd.http_address,
            "nsqd TCP": nsqd.tcp_address,
            "nsqd HTTP": f"127.0.0.1:{nsqd.http}",
        }
    finally:
        nsqd.cleanup()
        lookupd.stop()
