"""An in-memory network between client cores and emulated servers, on a virtual clock.

Wire a consumer or producer core (or several) to emulated nsqd and nsqlookupd without a
socket, a thread or a real clock, and drive the whole system deterministically::

    net = MemoryNetwork()
    nsqd = net.add_nsqd(Nsqd(NsqdOptions(broadcast_address="nsqd1")))
    consumer = net.attach(Consumer("t", "c", nsqd_tcp_addresses=["nsqd1:4150"]))
    net.start()
    nsqd.publish("t", b"hello", net.now)
    net.run_until_idle()
    for event in net.take_events(consumer): ...
    net.advance(60.0)          # fire every timer (heartbeats, timeouts, backoff) on the way

TLS is negotiated but not encrypted (both sides are told the handshake is done).  A server
that is missing or stopped refuses connections with :class:`ConnectionRefusedError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from nsq_proto import (
    ClientCore,
    Close,
    Connect,
    Event,
    HttpRequest,
    Output,
    Send,
    StartTLS,
    parse_address,
)

from ._cluster import Cluster
from ._lookupd import Lookupd
from ._nsqd import Nsqd
from ._protocol import NsqdConnection

#: the type of core attached (a consumer or a producer), given back as it is
C = TypeVar("C", bound=ClientCore)

__all__ = ["MemoryNetwork", "ClientCore", "NetworkStalled"]


class NetworkStalled(RuntimeError):
    """The system kept producing work past the step limit (a ping-pong bug)."""


class _Link(NamedTuple):
    """A client connection, as the server that accepted it sees it."""

    nsqd: Nsqd
    server: NsqdConnection


@dataclass(eq=False)
class _Attached:
    core: ClientCore
    on_event: Callable[[Event], None] | None
    events: list[Event] = field(default_factory=list)
    links: dict[int, _Link] = field(default_factory=dict)


S = TypeVar("S")


def _at(servers: dict[tuple[str, int], S], address: str, kind: str) -> S:
    server = servers.get(parse_address(address))
    if server is None:
        known = ", ".join(f"{host}:{port}" for host, port in sorted(servers)) or "none"
        raise KeyError(f"no {kind} at {address} (this network has {known})")
    return server


class MemoryNetwork:
    """Moves bytes between attached cores and the emulated servers; owns the clock.

    The servers are reached as clients reach them: ``net.nsqd("nsqd1:4150")``,
    ``net.lookupd("lookupd:4161")``."""

    def __init__(
        self,
        *,
        now: float = 0.0,
        max_steps: int = 100_000,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self.now = now
        #: the host's wall clock (e.g. ``time.time``): the Unix time of the servers' ``now``
        #: (message timestamps, ``/stats``, HTTP dates) is read from it once, when each server
        #: is added; None: each server's ``wall_clock_offset``, else ``FIXED_EPOCH``
        self.wall_clock = wall_clock
        self.max_steps = max_steps
        #: every nsqd, by ``(broadcast address, TCP port)``: ``nsqds[("nsqd1", 4150)]``
        #: (:meth:`nsqd` takes the address as clients write it, ``"nsqd1:4150"``)
        self.nsqds: dict[tuple[str, int], Nsqd] = {}
        #: every nsqlookupd, by ``(broadcast address, HTTP port)`` (:meth:`lookupd`)
        self.lookupds: dict[tuple[str, int], Lookupd] = {}
        self.clusters: list[Cluster] = []
        self._clients: list[_Attached] = []
        #: frozen nsqd -> what reached their connections meanwhile (bytes, or None: closed)
        self._frozen: dict[Nsqd, list[tuple[NsqdConnection, bytes | None]]] = {}

    # ------------------------------------------------------------------ topology

    def add_nsqd(self, nsqd: Nsqd) -> Nsqd:
        """Reachable at ``broadcast_address:tcp_port`` (TCP) and ``:http_port`` (HTTP)."""
        opts = nsqd.options
        self.nsqds[(opts.broadcast_address, opts.tcp_port)] = nsqd
        if self.wall_clock is not None:
            nsqd.set_wall_clock(self.wall_clock(), self.now)
        return nsqd

    def add_lookupd(self, lookupd: Lookupd) -> Lookupd:
        """Reachable at ``broadcast_address:http_port``."""
        self.lookupds[(lookupd.broadcast_address, lookupd.http_port)] = lookupd
        if self.wall_clock is not None:
            lookupd.set_wall_clock(self.wall_clock(), self.now)
        return lookupd

    def nsqd(self, address: str) -> Nsqd:
        """The nsqd clients reach at ``address``, written as they write it (``"nsqd1:4150"``:
        its broadcast address and TCP port); a KeyError naming those the network has."""
        return _at(self.nsqds, address, "nsqd")

    def lookupd(self, address: str) -> Lookupd:
        """The nsqlookupd clients reach at ``address`` (``"lookupd:4161"``: its broadcast
        address and HTTP port); a KeyError naming those the network has."""
        return _at(self.lookupds, address, "nsqlookupd")

    def add_cluster(self, cluster: Cluster) -> Cluster:
        """Every node and lookupd of a partitioned cluster."""
        self.clusters.append(cluster)
        for node in cluster.nodes:
            self.add_nsqd(node)
        for lookupd in cluster.lookupds:
            self.add_lookupd(lookupd)
        return cluster

    def attach(self, core: C, on_event: Callable[[Event], None] | None = None) -> C:
        """Connect a core to the network and give it back (typed as given: a consumer's
        ``finish``, a producer's ``publish``).  Its events are kept for :meth:`take_events`,
        or handed to ``on_event`` (which may call back into the core, e.g. to FIN)."""
        self._clients.append(_Attached(core, on_event))
        return core

    def start(self) -> None:
        """Start every attached core and run until nothing moves."""
        for client in self._clients:
            client.core.start(self.now)
        self.run_until_idle()

    def take_events(self, core: ClientCore) -> list[Event]:
        for client in self._clients:
            if client.core is core:
                events, client.events = client.events, []
                return events
        raise KeyError("that core is not attached")

    def freeze(self, nsqd: Nsqd) -> None:
        """Stop ``nsqd`` as SIGSTOP does: connections are still accepted (the kernel does
        that), but nothing is read, answered or timed until :meth:`thaw`."""
        self._frozen.setdefault(nsqd, [])

    def thaw(self, nsqd: Nsqd) -> None:
        """Resume a frozen nsqd (SIGCONT): it reads what arrived meanwhile, in order."""
        held = self._frozen.pop(nsqd, [])
        for server, data in held:
            if data is None:
                server.connection_lost(self.now)
            else:
                server.receive_data(data, self.now)
        nsqd.handle_timer(self.now)
        self.run_until_idle()

    def _is_frozen(self, link: _Link) -> bool:
        return link.nsqd in self._frozen

    # ------------------------------------------------------------------ running

    def run_until_idle(self) -> None:
        """Deliver everything that can be delivered now; fails if that never ends."""
        for _ in range(self.max_steps):
            if not self._step():
                return
        raise NetworkStalled(f"still busy after {self.max_steps} steps")

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward, firing every timer due on the way in order."""
        target = self.now + seconds
        self.run_until_idle()
        for _ in range(self.max_steps):
            deadline = self.next_deadline()
            if deadline is None or deadline > target:
                break
            self.now = max(self.now, deadline)
            self._fire_timers()
            self.run_until_idle()
        else:
            raise NetworkStalled(f"timers kept firing for {self.max_steps} rounds")
        self.now = target
        self._fire_timers()
        self.run_until_idle()

    def next_deadline(self) -> float | None:
        deadlines = [c.core.next_deadline() for c in self._clients]
        deadlines += [n.next_deadline() for n in self._servers() if n not in self._frozen]
        return min((d for d in deadlines if d is not None), default=None)

    def _servers(self) -> list[Nsqd]:
        return list(self.nsqds.values())

    def _fire_timers(self) -> None:
        now = self.now
        for nsqd in self._servers():
            if nsqd not in self._frozen:
                nsqd.handle_timer(now)
        for client in self._clients:
            client.core.handle_timer(now)

    def _step(self) -> bool:
        moved = False
        now = self.now
        for client in self._clients:
            core = client.core
            deadline = core.next_deadline()
            if deadline is not None and deadline <= now:
                # due now (a producer's flush of what its callers queued): now is the time
                core.handle_timer(now)
            while (out := core.next_output()) is not None:
                moved = True
                self._carry_out(client, out)
            for conn_id, link in list(client.links.items()):
                if self._frozen and self._is_frozen(link):
                    continue
                server = link.server
                data = server.data_to_send()
                if data:
                    moved = True
                    client.core.receive_data(conn_id, data, self.now)
                if server.tls_requested:
                    moved = True
                    server.tls_established(self.now)
                    client.core.tls_established(conn_id, self.now)
                if server.closed and not data:
                    moved = True
                    del client.links[conn_id]
                    client.core.connection_lost(conn_id, self.now, None)
        return moved

    def _carry_out(self, client: _Attached, out: Output) -> None:
        now = self.now
        core = client.core
        if isinstance(out, Event):
            if client.on_event is not None:
                client.on_event(out)
            else:
                client.events.append(out)
        elif type(out) is Send:
            link = client.links.get(out.conn_id)
            if link is not None:
                if self._frozen and self._is_frozen(link):
                    self._frozen[link.nsqd].append((link.server, out.data))
                else:
                    link.server.receive_data(out.data, now)
        elif isinstance(out, Connect):
            nsqd = self.nsqds.get((out.host, out.port))
            try:
                if nsqd is None:
                    raise ConnectionRefusedError(f"nothing listens on {out.host}:{out.port}")
                client.links[out.conn_id] = _Link(nsqd, nsqd.accept(now))
            except ConnectionRefusedError as exc:
                core.connection_lost(out.conn_id, now, exc)
                return
            core.connection_made(out.conn_id, now)
        elif isinstance(out, StartTLS):
            pass  # completed in _step once the server asks for the handshake too
        elif isinstance(out, Close):
            link = client.links.pop(out.conn_id, None)
            if link is not None:
                if self._frozen and self._is_frozen(link):
                    self._frozen[link.nsqd].append((link.server, None))
                else:
                    link.server.connection_lost(now)
        elif isinstance(out, HttpRequest):
            self._http(core, out)

    def _http(self, core: ClientCore, req: HttpRequest) -> None:
        now = self.now
        address = (req.host, req.port)
        lookupd = self.lookupds.get(address)
        nsqd = next(
            (
                n
                for n in self.nsqds.values()
                if (n.options.broadcast_address, n.options.http_port) == address
            ),
            None,
        )
        try:
            if lookupd is not None:
                http = lookupd.http_connection(now)
            elif nsqd is not None:
                http = nsqd.http_connection(now)
            else:
                raise ConnectionRefusedError(f"nothing listens on {req.host}:{req.port}")
        except ConnectionRefusedError as exc:
            core.http_failed(req.request_id, exc, now)
            return
        http.receive_data(req.data, now)
        core.http_data(req.request_id, http.data_to_send(), now)
        http.receive_data(b"", now)
        core.http_data(req.request_id, b"", now)
