"""Validated configuration of one nsqd connection (what IDENTIFY asks for)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ._errors import ConfigError
from ._ext_filter import ExtFilter
from ._frames import DEFAULT_MAX_FRAME_SIZE
from ._version import __version__

__all__ = ["ConfigError", "ConnectionConfig", "DEFAULT_USER_AGENT", "check_seconds"]

#: the user agent of every connection and lookupd request unless ``user_agent`` says otherwise
DEFAULT_USER_AGENT = f"nsq-sansio/{__version__}"


def check_seconds(config: object, names: tuple[str, ...], *, positive: bool) -> None:
    """Each named field is a finite number of seconds, > 0 (``positive``) or >= 0."""
    for name in names:
        value = getattr(config, name)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
        if not ok:
            kind = "positive" if positive else "non-negative"
            raise ConfigError(f"{name} must be a {kind} number of seconds, not {value!r}")


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionConfig:
    """Settings of one connection.  Durations are seconds (floats); ms only on the wire.

    Ranges follow nsqd v1.3.0 defaults, so a value nsqd would refuse with a fatal
    ``E_BAD_BODY`` fails here, at construction, instead.
    """

    client_id: str | None = None
    hostname: str | None = None
    user_agent: str | None = DEFAULT_USER_AGENT
    #: None disables heartbeats (nsqd then refuses SUB)
    heartbeat_interval: float | None = 30.0
    #: close the connection after this long without any byte from nsqd; None: two heartbeats
    read_timeout: float | None = None
    #: the handshake (IDENTIFY, TLS, compression, AUTH) must be over this long after the TCP
    #: connection is up: a frozen nsqd (SIGSTOP) accepts connections and then says nothing
    handshake_timeout: float = 10.0
    #: a write to nsqd (or lookupd) that takes longer than this fails the connection: the
    #: bytes of a stop's FINs and REQs are written even while the client is being cancelled,
    #: but not forever
    write_timeout: float = 10.0
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: float | None = None
    output_buffer_size: int | None = None
    #: None keeps nsqd's default, 0 disables output buffering timeouts (-1 on the wire)
    output_buffer_timeout: float | None = None
    auth_secret: bytes | None = None
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: partitioned extension: identify as able to read extended (JSON header) messages
    extend_support: bool = False
    desired_tag: str | None = None
    #: partitioned extension: the server delivers only the extended messages whose JSON
    #: header matches (the others are finished for the whole channel)
    ext_filter: ExtFilter | None = None
    #: extra IDENTIFY keys, sent after the known ones
    identify_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        hb = self.heartbeat_interval
        if hb is not None and not (1.0 <= hb <= 60.0):
            raise ConfigError(f"heartbeat_interval must be 1..60 s or None, not {hb!r}")
        rt = self.read_timeout
        if rt is not None and not (rt > 0 and math.isfinite(rt)):
            raise ConfigError(f"read_timeout must be a positive number of seconds, not {rt!r}")
        ht = self.handshake_timeout
        if isinstance(ht, bool) or not isinstance(ht, int | float) or not (0 < ht < math.inf):
            raise ConfigError(f"handshake_timeout must be a positive number of seconds, not {ht!r}")
        wt = self.write_timeout
        if isinstance(wt, bool) or not isinstance(wt, int | float) or not (0 < wt < math.inf):
            raise ConfigError(f"write_timeout must be a positive number of seconds, not {wt!r}")
        if rt is not None and hb is not None and rt <= hb:
            raise ConfigError("read_timeout must be longer than heartbeat_interval")
        if self.snappy and self.deflate:
            raise ConfigError("snappy and deflate are mutually exclusive")
        if not 1 <= self.deflate_level <= 9:
            raise ConfigError(f"deflate_level must be 1..9, not {self.deflate_level!r}")
        if not 0 <= self.sample_rate <= 99:
            raise ConfigError(f"sample_rate must be 0..99, not {self.sample_rate!r}")
        mt = self.msg_timeout
        if mt is not None and not (mt >= 1.0 and math.isfinite(mt)):
            raise ConfigError(f"msg_timeout must be at least 1 s, not {mt!r}")
        obs = self.output_buffer_size
        if obs is not None and not (obs == -1 or obs >= 64):
            raise ConfigError(f"output_buffer_size must be -1 or >= 64, not {obs!r}")
        obt = self.output_buffer_timeout
        if obt is not None and not (obt == 0 or 0.025 <= obt <= 30.0):
            raise ConfigError(f"output_buffer_timeout must be 0 or 0.025..30 s, not {obt!r}")
        if self.max_frame_size < 1024:
            raise ConfigError("max_frame_size must be at least 1024")
        if self.desired_tag is not None and len(self.desired_tag) > 100:
            raise ConfigError("desired_tag is at most 100 characters")
        if self.ext_filter is not None and not isinstance(self.ext_filter, ExtFilter):
            raise ConfigError(f"ext_filter must be an ExtFilter, not {self.ext_filter!r}")

    def connection_config(self, **changes: Any) -> ConnectionConfig:
        """Just the connection settings of this (consumer or producer) configuration."""
        values = {f.name: getattr(self, f.name) for f in fields(ConnectionConfig)}
        values.update(changes)
        return ConnectionConfig(**values)

    @property
    def effective_read_timeout(self) -> float | None:
        if self.read_timeout is not None:
            return self.read_timeout
        if self.heartbeat_interval is None:
            return None
        return 2.0 * self.heartbeat_interval

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY JSON, keys in a stable order."""
        body: dict[str, Any] = {}
        if self.client_id is not None:
            body["client_id"] = self.client_id
        if self.hostname is not None:
            body["hostname"] = self.hostname
        hb = self.heartbeat_interval
        body["heartbeat_interval"] = -1 if hb is None else _ms(hb)
        body["feature_negotiation"] = True
        if self.user_agent is not None:
            body["user_agent"] = self.user_agent
        if self.tls_v1:
            body["tls_v1"] = True
        if self.snappy:
            body["snappy"] = True
        if self.deflate:
            body["deflate"] = True
            body["deflate_level"] = self.deflate_level
        if self.msg_timeout is not None:
            body["msg_timeout"] = _ms(self.msg_timeout)
        if self.sample_rate:
            body["sample_rate"] = self.sample_rate
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            obt = self.output_buffer_timeout
            body["output_buffer_timeout"] = -1 if obt == 0 else _ms(obt)
        if self.extend_support:
            body["extend_support"] = True
        if self.desired_tag is not None:
            body["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            body["ext_filter"] = self.ext_filter.to_json()
        body.update(self.identify_extra)
        return body
