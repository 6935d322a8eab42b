"""nsq_emulator: a deterministic, sans-IO emulator of nsqd and nsqlookupd.

The emulator plays the server role byte for byte as nsqd/nsqlookupd v1.3.0 do (every
capture of a real nsqd v1.3.0 replays exactly), and the partitioned server of the
partitioned NSQ extension.  It does no I/O, reads no clock and starts no thread: bytes and
``now`` (seconds on the caller's monotonic clock) go in, bytes and deadlines come out.  Wire
a client core to it in memory, or serve it from an adapter that only moves bytes and time:
:mod:`nsq_emulator.loopback` (``serve_emulator``, on anyio) serves it on loopback TCP, and
``python -m nsq_emulator`` runs one nsqd and an nsqlookupd there until stopped;
:mod:`nsq_emulator.proxy` (``FaultProxy``, on anyio) puts network faults (a delay, half-open,
trickled bytes, resets) between a client and any nsqd.  The emulator is built
on the public names of :mod:`nsq_proto` alone; :mod:`nsq_emulator.frames` holds what only a
server writes (message frames, traced-publish receipts).  Its pytest plugin
(``nsq_emulator.pytest_plugin``, registered by the package) gives the ``nsq_emulator`` and
``nsq_memory_network`` fixtures.

nsqd over TCP
-------------
::

    nsqd = Nsqd(NsqdOptions(), rng=random.Random(1))   # rng: optional, see Nsqd
    conn = nsqd.accept(now)                            # a client connected
    conn.receive_data(data, now)                       # bytes read; b"" = EOF
    send(conn.data_to_send())                          # everything queued, compressed
    if conn.tls_requested:                             # after the plain IDENTIFY response
        tls_server_handshake(conn.take_trailing_data())
        conn.tls_established(now)                      # nsqd then sends OK inside TLS
    if conn.closed: close_socket_after_sending()
    deadline = nsqd.next_deadline()                    # float | None
    nsqd.handle_timer(now)                             # heartbeats, timeouts, deferred

``Nsqd(options=None, *, rng=None, now=0.0)``
    ``accept(now, *, remote_address=None) -> NsqdConnection``, ``next_deadline()``,
    ``handle_timer(now)``, ``pending()`` (connections with new output or just closed: any
    call may queue bytes on other connections), ``connections``, ``running``,
    ``unix_ns(now)``.
    Direct API: ``publish(topic, body, now, *, delay=0.0, partition=-1) -> bytes`` (the id),
    ``create_topic``, ``create_channel``, ``delete_topic``, ``delete_channel``,
    ``pause_topic``, ``pause_channel``; partitioned server:
    ``create_partition(topic, partition, now, *, ordered, ext, disable_channel_auto_create)``.
    Inspection: ``topic_names()``, ``channel_names(topic)``, ``topic_stats(topic) ->
    TopicStats``, ``channel_stats(topic, channel) -> ChannelStats`` (depth, in flight,
    deferred, counters, clients), ``channel_messages(topic, channel) -> list[MessageInfo]``,
    ``client_stats(conn=None) -> list[ClientStats]`` (server-side ``ready_count`` and
    ``in_flight_count``), ``stats(...)`` (the ``/stats?format=json`` object).
    Faults: ``fail_next(*, code, description="", fatal=True, command=None)`` (answer the
    next command with that error frame), ``delay_output(seconds)``,
    ``drop_connections(now)``, ``stop(now, *, lose_messages=False)``, ``start(now)``.
    Without ``rng`` subscribers are served round-robin; with it a ready subscriber is
    picked at random and it drives ``sample_rate``.

``NsqdConnection``
    ``receive_data(data, now)``, ``data_to_send()``, ``closed``, ``tls_requested``,
    ``take_trailing_data()``, ``tls_established(now, *, common_name="")``,
    ``connection_lost(now)``; inspection: ``state`` (:class:`ClientState`),
    ``ready_count``, ``in_flight_count``, ``message_count``, ``finish_count``,
    ``requeue_count``, ``subscription``, ``is_ready``, negotiated ``heartbeat_interval``,
    ``msg_timeout``, ``snappy``, ``deflate``, ``tls``; faults: ``drop(now)``,
    ``stall()``/``resume(now)``, ``delay_output(seconds)``.

``NsqdOptions`` (frozen): limits and defaults of nsqd v1.3.0 (``max_rdy_count``,
``max_msg_size``, ``max_body_size``, ``max_req_timeout``, ``msg_timeout``,
``max_msg_timeout``, ``max_heartbeat_interval``, ``heartbeat_interval``,
``max_output_buffer_size``, ``max_deflate_level``, ``snappy``, ``deflate``, ``tls``,
``tls_required``, ``auth``, addresses and ports, ``version``, ``partitioned``, ``node_id``,
``wall_clock_offset``, ``queue_scan_refresh_interval``...).  The servers read no clock: the
Unix time of their ``now`` (message timestamps, ``/stats``, HTTP dates) is the host's wall
clock once it calls ``set_wall_clock(unix_time, now)`` (``serve_emulator`` does,
``MemoryNetwork(wall_clock=time.time)`` too), unless ``wall_clock_offset`` fixes it, and
``FIXED_EPOCH + now`` when neither says.  ``auth`` is an
:data:`Authorizer`: ``AuthRequest -> AuthState | None`` (``None`` = the auth server failed);
an ``AuthState(identity, identity_url, authorizations, ttl)`` lists ``Authorization(topic,
channels, permissions)`` entries (regular expressions, as the auth server sends them), and
``static_authorizer({secret: AuthState(...)})`` builds an authorizer from a table.
:class:`NsqdStopped` (a ``ConnectionRefusedError``) is raised by a stopped nsqd.

HTTP
----
Every server answers HTTP through ``handle(method, target, headers=(), body=b"", *,
now=None) -> HttpResponse`` (``(status, headers, body)``, headers in Go's wire order) and
through ``http_connection(now) -> HttpServerConnection`` (h11 in the server role:
``receive_data(data, now)``, ``data_to_send()``, ``closed``).  nsqd: ``/ping``, ``/info``,
``/pub``, ``/mpub``, ``/stats``, ``/topic/*``, ``/channel/*``.

``Lookupd(*, broadcast_address, hostname, tcp_port, http_port, version=None,
partitioned=False, tombstone_lifetime=45.0, ...)``
    ``register(nsqd, *, remote_address=None)``, ``unregister(nsqd)``, ``topics()``,
    ``channels(topic)``, ``producers(topic)``; HTTP ``/lookup``, ``/topics``,
    ``/channels``, ``/nodes``, ``/ping``, ``/info``, ``/topic/create|delete``,
    ``/channel/create|delete``, ``/topic/tombstone``.

Partitioned NSQ
---------------
``Cluster(nodes=3, *, options=None, lookupds=1, rng=None, now=0.0,
allow_write_without_channels=False)`` owns partitioned :class:`Nsqd` nodes (``.nodes``) and
:class:`Lookupd` (``.lookupd``, ``.lookupds``): ``create_topic(name, now, *, partitions,
replicas, ordered, ext, disable_channel_auto_create, leaders) -> PartitionedTopic``,
``create_channel(topic, channel, now)``, ``leader(topic, partition)``, ``topic(topic,
partition)``, ``move_leader(topic, partition, to_node, now)``, ``stop_node(i, now, *,
lose_messages=False, failover=True)``, ``start_node(i, now)``, ``next_deadline()``,
``handle_timer(now)``.  The lookupd answers ``/lookup?topic=&access=r|w&metainfo=true
&partition=`` and ``/listlookup``.  :class:`PartitionedTopic` (the topic as the cluster's
coordinator holds it: partitions, leaders, replicas) is not the client's parsed ``meta`` of a
lookup, :class:`nsq_proto.TopicMeta`.

:class:`MemoryNetwork` wires client cores (``nsq_proto.Consumer``/``Producer``) to emulated
servers in memory on a virtual clock, with no socket (``wall_clock=time.time`` gives its
servers the wall clock's dates); it raises :class:`NetworkStalled` instead of looping
forever.
"""

from ._cluster import Cluster as Cluster
from ._cluster import PartitionedTopic as PartitionedTopic
from ._http import HttpResponse as HttpResponse
from ._http import HttpServerConnection as HttpServerConnection
from ._lookupd import Lookupd as Lookupd
from ._network import MemoryNetwork as MemoryNetwork
from ._network import NetworkStalled as NetworkStalled
from ._nsqd import ChannelStats as ChannelStats
from ._nsqd import ClientStats as ClientStats
from ._nsqd import MessageInfo as MessageInfo
from ._nsqd import Nsqd as Nsqd
from ._nsqd import NsqdStopped as NsqdStopped
from ._nsqd import TopicStats as TopicStats
from ._options import FIXED_EPOCH as FIXED_EPOCH
from ._options import Authorization as Authorization
from ._options import Authorizer as Authorizer
from ._options import AuthRequest as AuthRequest
from ._options import AuthState as AuthState
from ._options import NsqdOptions as NsqdOptions
from ._options import static_authorizer as static_authorizer
from ._protocol import ClientState as ClientState
from ._protocol import NsqdConnection as NsqdConnection

__all__ = [
    "Authorization",
    "Authorizer",
    "AuthRequest",
    "AuthState",
    "ChannelStats",
    "ClientState",
    "ClientStats",
    "Cluster",
    "FIXED_EPOCH",
    "HttpResponse",
    "HttpServerConnection",
    "Lookupd",
    "MemoryNetwork",
    "NetworkStalled",
    "MessageInfo",
    "Nsqd",
    "NsqdConnection",
    "NsqdOptions",
    "NsqdStopped",
    "PartitionedTopic",
    "TopicStats",
    "static_authorizer",
]
