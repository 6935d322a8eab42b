"""The test harness's own server starts: a server whose port another process took first is
started again on other ports, and is never mistaken for the process that answers there."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.support.net import PortTaken, free_ports, owns_listeners, start_server, wait_serving
from tests.support.servers import MISSING, NSQD, Nsqd

# a one-port HTTP server that answers /ping (200), in a child process
SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def squatter() -> Iterator[http.server.HTTPServer]:
    """Another process's server: answers any GET with 200."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_server_that_lost_its_port_is_not_taken_for_the_one_answering(
    squatter: http.server.HTTPServer,
) -> None:
    port = squatter.server_address[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(PortTaken, match="before it listened"):
            wait_serving(proc, f"http://127.0.0.1:{port}/ping", [port])
    finally:
        proc.kill()
        proc.wait()


def test_start_server_moves_to_other_ports_when_one_was_taken(
    squatter: http.server.HTTPServer,
) -> None:
    taken = squatter.server_address[1]
    chosen: list[list[int]] = []

    def argv_for(ports: list[int]) -> list[str]:
        # the first choice is the squatter's port, as when another test's server bound it
        # between free_ports() and this server's bind
        chosen.append([taken] if not chosen else ports)
        return [sys.executable, "-c", SERVER, str(chosen[-1][0])]

    proc, ports = start_server(argv_for, 1, lambda ports: f"http://127.0.0.1:{chosen[-1][0]}/")
    try:
        assert len(chosen) == 2 and chosen[1] == ports and ports != [taken]
        assert owns_listeners(proc.pid, ports) and not owns_listeners(proc.pid, [taken])
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not NSQD, reason=MISSING)
def test_an_nsqd_whose_ports_were_taken_starts_on_others(
    squatter: http.server.HTTPServer,
) -> None:
    nsqd = Nsqd()
    nsqd.ports = [free_ports(1)[0], squatter.server_address[1]]  # its HTTP port is taken
    try:
        nsqd.start()
        assert nsqd.proc is not None and owns_listeners(nsqd.proc.pid, [nsqd.tcp, nsqd.http])
        assert nsqd.http != squatter.server_address[1]
        nsqd.freeze()
        nsqd.thaw()
        nsqd.stop()
        nsqd.start()  # again on the same ports
        assert owns_listeners(nsqd.proc.pid, [nsqd.tcp, nsqd.http])
    finally:
        nsqd.cleanup()
