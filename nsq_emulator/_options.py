"""Options of the emulated nsqd and the authorizer model (nsqd's ``--auth-http-address``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "NsqdOptions",
    "Authorization",
    "AuthState",
    "AuthRequest",
    "Authorizer",
    "static_authorizer",
    "STANDARD_VERSION",
    "PARTITIONED_VERSION",
    "FIXED_EPOCH",
]

#: the version string of the standard server the captures were taken from
STANDARD_VERSION = "1.3.0"
#: the version string of the partitioned server described by the partitioned NSQ notes
PARTITIONED_VERSION = "0.3.7-HA.1.13.0"
#: the Unix time at ``now == 0`` of a server given neither ``wall_clock_offset`` nor a wall
#: clock by its host (2023-11-14 22:13:20 UTC)
FIXED_EPOCH = 1_700_000_000.0


@dataclass(frozen=True, slots=True)
class Authorization:
    """One entry of an auth server's ``authorizations`` list.

    ``topic`` and ``channels`` are regular expressions searched (not anchored) like Go's
    ``regexp.MatchString``; ``permissions`` holds ``"subscribe"`` and/or ``"publish"``.
    """

    topic: str
    channels: tuple[str, ...] = (".*",)
    permissions: tuple[str, ...] = ("subscribe", "publish")

    def allows(self, topic: str, channel: str) -> bool:
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        if re.search(self.topic, topic) is None:
            return False
        return any(re.search(c, channel) is not None for c in self.channels)


@dataclass(frozen=True, slots=True)
class AuthState:
    """What the auth server answered (HTTP 200): identity and authorizations, valid ``ttl`` s."""

    identity: str = ""
    identity_url: str = ""
    authorizations: tuple[Authorization, ...] = ()
    ttl: float = 3600.0

    def valid(self) -> bool:
        """nsqd's checks on an auth answer: known permissions, compilable patterns, ttl > 0."""
        if self.ttl <= 0:
            return False
        for auth in self.authorizations:
            if any(p not in ("subscribe", "publish") for p in auth.permissions):
                return False
            try:
                re.compile(auth.topic)
                for channel in auth.channels:
                    re.compile(channel)
            except re.error:
                return False
        return True


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """The query nsqd sends to its auth server (``GET /auth?...``)."""

    secret: str
    remote_ip: str
    tls: bool
    common_name: str = ""


#: The auth server: ``None`` models every failure nsqd reports as ``E_AUTH_FAILED AUTH failed``
#: (non-200 status, bad JSON, unreachable).  An :class:`AuthState` that fails :meth:`valid`
#: is treated the same way.
Authorizer = Callable[[AuthRequest], AuthState | None]


def static_authorizer(secrets: Mapping[str, AuthState]) -> Authorizer:
    """An authorizer answering from a fixed table; unknown secrets fail (HTTP 401)."""
    table = dict(secrets)

    def authorize(request: AuthRequest) -> AuthState | None:
        return table.get(request.secret)

    return authorize


@dataclass(frozen=True, slots=True, kw_only=True)
class NsqdOptions:
    """Settings of an emulated nsqd.  Durations are seconds, sizes bytes.

    Defaults are those of nsqd v1.3.0.  ``partitioned=True`` emulates the partitioned server
    (version ``0.3.7-HA.1.13.0``, no topic auto-creation, binary message ids, 3-interval
    read timeout, the extra commands).
    """

    max_rdy_count: int = 2500
    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_req_timeout: float = 3600.0
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_heartbeat_interval: float = 60.0
    #: heartbeat interval used until IDENTIFY changes it (nsqd: --client-timeout / 2)
    heartbeat_interval: float = 30.0
    max_output_buffer_size: int = 65536
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    min_output_buffer_timeout: float = 0.025
    max_output_buffer_timeout: float = 30.0
    max_deflate_level: int = 6
    snappy: bool = True
    deflate: bool = True
    #: the adapter has a server certificate: IDENTIFY may negotiate ``tls_v1``
    tls: bool = False
    #: every command but IDENTIFY needs TLS, and the plain HTTP port refuses everything
    tls_required: bool = False
    #: the auth server; ``None`` disables AUTH (``E_AUTH_DISABLED``)
    auth: Authorizer | None = field(default=None, compare=False)
    broadcast_address: str = "127.0.0.1"
    hostname: str = "localhost"
    tcp_port: int = 4150
    http_port: int = 4151
    https_port: int = 4152
    #: ``None`` means the version of the flavour: ``1.3.0`` or ``0.3.7-HA.1.13.0``
    version: str | None = None
    partitioned: bool = False
    #: the node id mixed into standard message ids (nsqd's ``--node-id``, 0..1023)
    node_id: int = 0
    #: added to ``now`` to get the Unix time of message timestamps, ids and HTTP dates.  None:
    #: the host's wall clock (``serve_emulator``, ``MemoryNetwork(wall_clock=time.time)``),
    #: else :data:`FIXED_EPOCH`; a number gives the same timestamps on every run
    wall_clock_offset: float | None = None
    #: 0 means unlimited (nsqd's ``--max-channel-consumers``)
    max_channel_consumers: int = 0
    #: messages beyond this many per queue are reported as ``backend_depth``
    mem_queue_size: int = 10000
    #: how long the server waits for the TLS handshake after the IDENTIFY response
    tls_handshake_timeout: float = 5.0
    #: nsqd's queue-scan worker only learns about new channels on a refresh tick every
    #: 5 s (from process start), so message timeouts and deferred messages of a channel
    #: younger than that fire late, as with nsqd (capture ``msg_timeout_new_channel``).
    #: 0 makes every timer exact
    queue_scan_refresh_interval: float = 5.0
    #: the partitioned server's ``--max-conn-for-client`` (0: unlimited)
    max_conn_for_client: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.node_id < 1024:
            raise ValueError("node_id must be in 0..1023")
        if self.max_rdy_count < 0 or self.max_msg_size < 1 or self.max_body_size < 1:
            raise ValueError("max_rdy_count, max_msg_size and max_body_size must be positive")
        if self.heartbeat_interval <= 0 or self.max_heartbeat_interval <= 0:
            raise ValueError("heartbeat intervals must be positive")
        if self.msg_timeout <= 0 or self.max_msg_timeout < self.msg_timeout:
            raise ValueError("msg_timeout must be positive and at most max_msg_timeout")
        if not 1 <= self.max_deflate_level <= 9:
            raise ValueError("max_deflate_level must be 1..9")

    @property
    def server_version(self) -> str:
        if self.version is not None:
            return self.version
        return PARTITIONED_VERSION if self.partitioned else STANDARD_VERSION

    @property
    def auth_enabled(self) -> bool:
        return self.auth is not None
