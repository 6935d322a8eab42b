"""A pytest plugin (installed with the package, entry point ``pytest11``): emulated NSQ
servers for any test suite, one fixture away.

- ``nsq_emulator``: emulated nsqd and nsqlookupd served on free loopback ports for one test
  (:func:`nsq_emulator.loopback.serve_emulator`; its ``cluster.nsqd_tcp_addresses`` and
  ``cluster.lookupd_http_addresses`` go to the code under test).  An async fixture: the test
  runs under anyio's pytest plugin (``@pytest.mark.anyio``), once per backend of its
  ``anyio_backend`` fixture (by default every one installed; a ``conftest.py`` fixture of
  that name chooses, as the documentation's "Testing" page shows).  The marker
  ``@pytest.mark.nsq_emulator(nsqd_count=2, lookupd=False, nsqd_options={...})`` passes
  options to :func:`~nsq_emulator.loopback.serve_emulator`.
- ``nsq_memory_network``: a :class:`nsq_emulator.MemoryNetwork` on a virtual clock with
  one emulated nsqd at ``nsqd1:4150`` (HTTP ``:4151``) registered with an nsqlookupd at
  ``lookupd:4161``, for tests of sans-IO cores (``net.attach(core)``); those servers are
  ``net.nsqd("nsqd1:4150")`` and ``net.lookupd("lookupd:4161")``.

Loading the plugin imports the sans-IO emulator alone (no event loop, no socket); the
loopback host and anyio come with the first test that asks for ``nsq_emulator``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

from ._lookupd import Lookupd
from ._network import MemoryNetwork
from ._nsqd import Nsqd
from ._options import NsqdOptions

if TYPE_CHECKING:
    from .loopback import EmulatorCluster

__all__ = ["nsq_emulator", "nsq_memory_network"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "nsq_emulator(**options): options of nsq_emulator.loopback.serve_emulator for the "
        "nsq_emulator fixture (nsqd_count, lookupd, nsqd_options, tls_context, ...)",
    )


@pytest.fixture
async def nsq_emulator(request: pytest.FixtureRequest) -> AsyncIterator[EmulatorCluster]:
    """Emulated nsqd (and nsqlookupd) on free loopback ports, for one test."""
    from .loopback import serve_emulator

    marker = request.node.get_closest_marker("nsq_emulator")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    async with serve_emulator(**options) as cluster:
        yield cluster


@pytest.fixture
def nsq_memory_network() -> MemoryNetwork:
    """An in-memory network on a virtual clock: nsqd ``nsqd1:4150`` behind lookupd
    ``lookupd:4161`` (``net.nsqd("nsqd1:4150")``, ``net.lookupd("lookupd:4161")``)."""
    net = MemoryNetwork()
    lookupd = net.add_lookupd(Lookupd(broadcast_address="lookupd", http_port=4161))
    lookupd.register(net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1"))))
    return net
