"""The exception tree of the protocol core."""

from __future__ import annotations

__all__ = [
    "NSQError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "FrameTooLarge",
    "InvalidName",
    "ServerError",
    "ConnectionClosedError",
    "LookupdError",
    "ReadTimeout",
    "AuthRequired",
]


class NSQError(Exception):
    """Root of every error raised by this library."""


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


class ConnectionClosedError(NSQError):
    """The connection closed before the request was answered."""


class LookupdError(NSQError):
    """A lookupd answer could not be used (bad status, malformed or hostile JSON)."""


class ReadTimeout(NSQError):
    """Nothing was read from the server within the read timeout (heartbeats included)."""


class AuthRequired(NSQError):
    """nsqd requires AUTH and no secret is configured."""
