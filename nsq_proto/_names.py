"""Topic and channel name rules (nsqd ``internal/protocol/names.go``)."""

from __future__ import annotations

import re

from ._errors import InvalidName

__all__ = [
    "MAX_NAME_LENGTH",
    "is_valid_topic_name",
    "is_valid_channel_name",
    "check_topic",
    "check_channel",
]

MAX_NAME_LENGTH = 64
_EPHEMERAL = "#ephemeral"
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?\Z")


def _is_valid(name: str) -> bool:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LENGTH:
        return False
    return _NAME_RE.match(name) is not None


def is_valid_topic_name(name: str) -> bool:
    """True when ``name`` is 1..64 of ``[.a-zA-Z0-9_-]`` with an optional ``#ephemeral`` suffix."""
    return _is_valid(name)


def is_valid_channel_name(name: str) -> bool:
    """Channel names follow the same rule as topic names."""
    return _is_valid(name)


#: topic names found valid (a producer checks its few topics on every publish); bounded
_VALID_TOPICS: set[str] = set()


def check_topic(name: str) -> str:
    if name in _VALID_TOPICS and type(name) is str:
        return name
    if not _is_valid(name):
        raise InvalidName(f"topic name {name!r} is not valid")
    if len(_VALID_TOPICS) < 4096:
        _VALID_TOPICS.add(name)
    return name


def check_channel(name: str) -> str:
    if not _is_valid(name):
        raise InvalidName(f"channel name {name!r} is not valid")
    return name
