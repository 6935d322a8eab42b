"""The exception tree of the protocol core."""

from __future__ import annotations

import copy

__all__ = [
    "NSQError",
    "ProtocolError",
    "LocalProtocolError",
    "ConfigError",
    "RemoteProtocolError",
    "FrameTooLarge",
    "InvalidName",
    "ServerError",
    "ConnectionClosedError",
    "LookupdError",
    "NSQTimeout",
    "ReadTimeout",
    "HandshakeTimeout",
    "PublishTimeout",
    "AuthRequired",
    "PERMANENT_CODES",
    "permanent_cause",
    "fresh_copy",
]


class NSQError(Exception):
    """Root of every error raised by this library.

    ``permanent`` is True for a failure that retrying the same way will not heal (a TLS
    certificate nsqd's peer does not trust, TLS required but not configured, AUTH refused):
    a producer fails its publishes at once instead of retrying them until they time out.
    """

    permanent: bool = False


class ProtocolError(NSQError):
    """Something broke the protocol; use one of the two subclasses."""

    def __init__(self, msg: str) -> None:
        if type(self) is ProtocolError:
            raise TypeError(
                "ProtocolError is abstract: raise LocalProtocolError or RemoteProtocolError"
            )
        super().__init__(msg)


class LocalProtocolError(ProtocolError):
    """The caller asked for something the protocol does not allow (now)."""


class ConfigError(LocalProtocolError, ValueError):
    """A configuration value is out of range or of the wrong type."""


class RemoteProtocolError(ProtocolError):
    """The peer (nsqd or nsqlookupd) broke the protocol."""


class FrameTooLarge(RemoteProtocolError):
    """A frame's size field is above the configured maximum."""


class InvalidName(LocalProtocolError, ValueError):
    """A topic or channel name does not follow the naming rules."""


class ServerError(NSQError):
    """nsqd answered a command with an error frame (``E_CODE description``)."""

    def __init__(self, code: str, text: str, fatal: bool) -> None:
        super().__init__(f"{code} {text}".rstrip() if text else code)
        self.code = code
        self.text = text
        self.fatal = fatal
        self.permanent = code in PERMANENT_CODES or (code == "E_INVALID" and "TLS required" in text)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.code, self.text, self.fatal), self.__dict__)


class ConnectionClosedError(NSQError):
    """The connection closed before the request was answered."""


class LookupdError(NSQError):
    """A lookupd answer could not be used (bad status, malformed or hostile JSON)."""


class NSQTimeout(NSQError, TimeoutError):
    """Something did not happen in time: the parent of every timeout of this library, and a
    ``TimeoutError``, so ``except TimeoutError`` catches them too."""


class ReadTimeout(NSQTimeout):
    """Nothing was read from the server within the read timeout (heartbeats included)."""


class HandshakeTimeout(ReadTimeout):
    """nsqd accepted the connection but did not complete the handshake in time."""


class PublishTimeout(NSQTimeout):
    """No nsqd acknowledged the publish within ``publish_timeout``."""


class AuthRequired(NSQError):
    """nsqd requires AUTH and no secret is configured."""

    permanent = True


#: error codes after which reconnecting the same way fails the same way
PERMANENT_CODES = frozenset({"E_AUTH_FAILED"})


def permanent_cause(error: BaseException | None) -> NSQError | None:
    """The permanent :class:`NSQError` in ``error`` or its chain of causes, if any."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, NSQError) and error.permanent:
            return error
        error = error.__cause__
        seen += 1
    return None


def fresh_copy(error: NSQError) -> NSQError:
    """A new instance of ``error`` with the same cause, to raise in one more task."""
    try:
        new = copy.copy(error)
    except Exception:  # an exotic subclass: share the instance
        return error
    new.__cause__ = error.__cause__
    new.__traceback__ = None
    return new
