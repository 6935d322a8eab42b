"""Kept for tests/spark, which imports these from here: the real servers are in
:mod:`tests.support.servers`, the loopback helpers in :mod:`tests.support.net`."""

from tests.support.net import free_port as free_port
from tests.support.net import wait_http as wait_http
from tests.support.servers import Nsqd as Nsqd
