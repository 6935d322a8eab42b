"""Server-side filtering of an extended topic's messages by their JSON header (``ext_filter``).

The partitioned server reads the filter from IDENTIFY and applies it to every message it would
send on the connection: a message that does not match is **finished for the whole channel**
(no other consumer of the channel gets it), and a message without a JSON header never matches
(so with ``inverse`` it is delivered).  It applies only to extended topics.  A filter the
server cannot build is logged and ignored there, never answered with an error, so every rule
is checked here, when the filter is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import ConfigError

__all__ = ["ExtFilter"]

#: the ``type`` numbers of the server's filter rules
_TYPES = {"exact": 1, "regexp": 2, "glob": 3, "any": 4, "all": 4}
FilterKind = Literal["exact", "regexp", "glob", "any", "all"]


@dataclass(frozen=True, slots=True)
class ExtFilter:
    """One ``ext_filter`` rule; make it with :meth:`exact`, :meth:`regexp`, :meth:`glob`,
    :meth:`any_of` or :meth:`all_of`, and pass it as ``ext_filter=`` to a consumer.

    ``key`` names a key of the JSON header (the server reads it as a gjson path, so
    ``"a.b"`` is key ``b`` inside object ``a``).  An exact rule matches a string value equal to
    ``value``; regexp and glob rules test the value when it is a string, and the empty string
    otherwise.  ``inverse`` delivers what the rule does not match.
    """

    kind: FilterKind
    key: str = ""
    value: str = ""
    #: for ``any``/``all``: header key -> exact value
    matches: Mapping[str, str] = field(default_factory=dict)
    inverse: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _TYPES:
            raise ConfigError(f"ext_filter kind must be one of {sorted(_TYPES)}, not {self.kind!r}")
        if not isinstance(self.inverse, bool):
            raise ConfigError(f"ext_filter inverse must be a bool, not {self.inverse!r}")
        if self.kind in ("any", "all"):
            if not self.matches:
                raise ConfigError(f"an ext_filter of kind {self.kind!r} needs at least one match")
            for key, value in self.matches.items():
                _check_text("key", key)
                _check_text("value", value)
            return
        _check_text("key", self.key)
        _check_text("value", self.value)
        if self.kind == "regexp":
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ConfigError(
                    f"ext_filter regexp {self.value!r} does not compile: {exc}"
                ) from exc

    @classmethod
    def exact(cls, key: str, value: str, *, inverse: bool = False) -> ExtFilter:
        """Messages whose header ``key`` is the string ``value``."""
        return cls("exact", key, value, inverse=inverse)

    @classmethod
    def regexp(cls, key: str, pattern: str, *, inverse: bool = False) -> ExtFilter:
        """Messages whose header ``key`` matches the regular expression ``pattern`` (Go's RE2
        syntax on the server: keep to what RE2 and Python share)."""
        return cls("regexp", key, pattern, inverse=inverse)

    @classmethod
    def glob(cls, key: str, pattern: str, *, inverse: bool = False) -> ExtFilter:
        """Messages whose header ``key`` matches the glob ``pattern`` (``*``, ``?``,
        ``[...]``, ``{a,b}``)."""
        return cls("glob", key, pattern, inverse=inverse)

    @classmethod
    def any_of(cls, matches: Mapping[str, str], *, inverse: bool = False) -> ExtFilter:
        """Messages whose header has at least one of the ``key: value`` pairs."""
        return cls("any", matches=dict(matches), inverse=inverse)

    @classmethod
    def all_of(cls, matches: Mapping[str, str], *, inverse: bool = False) -> ExtFilter:
        """Messages whose header has every one of the ``key: value`` pairs."""
        return cls("all", matches=dict(matches), inverse=inverse)

    def to_json(self) -> dict[str, Any]:
        """The ``ext_filter`` object of IDENTIFY."""
        body: dict[str, Any] = {"type": _TYPES[self.kind]}
        if self.inverse:
            body["inverse"] = True
        if self.kind in ("any", "all"):
            body["filter_ext_key"] = self.kind
            body["filter_data_list"] = [
                {"filter_ext_key": k, "filter_data": v} for k, v in self.matches.items()
            ]
        else:
            body["filter_ext_key"] = self.key
            body["filter_data"] = self.value
        return body


def _check_text(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"an ext_filter {what} must be a non-empty string, not {value!r}")
