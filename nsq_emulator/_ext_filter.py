"""The partitioned server's ``ext_filter`` (IDENTIFY): which extended messages a client gets.

As the server builds it: a rule it cannot build (type 0 or unknown, an empty key or data, a
regexp or glob that does not compile, an empty list) is ignored and the client gets every
message; a message without a JSON header (extension version 4) never matches; the key is a
gjson path (``a.b``: key ``b`` inside ``a``, ``\\.`` for a dot in a key).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ._store import StoredMessage

__all__ = ["build_ext_filter"]

#: the extension version of a JSON header
_JSON_EXT = 4
Matcher = Callable[[StoredMessage], bool]


def build_ext_filter(rule: Any) -> Matcher | None:
    """The matcher of an ``ext_filter`` object (a dict); None where the server ignores it."""
    if not isinstance(rule, dict):
        return None
    kind = rule.get("type")
    key = rule.get("filter_ext_key")
    data = rule.get("filter_data")
    inverse = rule.get("inverse") is True
    if not isinstance(kind, int) or kind == 0 or not isinstance(key, str) or not key:
        return None
    if not isinstance(data, str):
        data = ""
    if not data and kind != 4:
        return None
    test: Callable[[dict[str, Any]], bool]
    if kind == 1:
        test = _exact(key, data)
    elif kind == 2:
        try:
            pattern = re.compile(data)
        except re.error:
            return None
        test = _search(key, pattern)
    elif kind == 3:
        try:
            pattern = re.compile(_glob_regex(data), re.DOTALL)
        except (re.error, ValueError):
            return None
        test = _search(key, pattern, full=True)
    elif kind == 4:
        items = rule.get("filter_data_list")
        if not isinstance(items, list) or not items:
            return None
        chain = []
        for item in items:
            if not isinstance(item, dict):
                return None
            k, v = item.get("filter_ext_key"), item.get("filter_data")
            if not (isinstance(k, str) and k and isinstance(v, str) and v):
                return None
            chain.append(_exact(k, v))
        relation = key

        def test(header: dict[str, Any]) -> bool:
            if relation == "any":
                return any(t(header) for t in chain)
            return relation == "all" and all(t(header) for t in chain)
    else:
        return None

    def matches(msg: StoredMessage) -> bool:
        header = _header(msg)
        matched = header is not None and test(header)
        return matched != inverse

    return matches


def _header(msg: StoredMessage) -> dict[str, Any] | None:
    if msg.ext_version != _JSON_EXT:
        return None
    try:
        obj = json.loads(msg.ext_data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _get(header: dict[str, Any], path: str) -> Any:
    value: Any = header
    for part in re.split(r"(?<!\\)\.", path):
        if not isinstance(value, dict):
            return None
        value = value.get(part.replace("\\.", "."))
    return value


def _exact(key: str, expected: str) -> Callable[[dict[str, Any]], bool]:
    def test(header: dict[str, Any]) -> bool:
        value = _get(header, key)
        return isinstance(value, str) and value == expected

    return test


def _search(key: str, pattern: re.Pattern[str], *, full: bool = False) -> Callable[..., bool]:
    def test(header: dict[str, Any]) -> bool:
        value = _get(header, key)
        text = value if isinstance(value, str) else ""
        found = pattern.fullmatch(text) if full else pattern.search(text)
        return found is not None

    return test


def _glob_regex(glob: str) -> str:
    """gobwas/glob without separators: ``*`` any run, ``?`` one character, ``[...]`` and
    ``[!...]`` classes, ``{a,b}`` alternatives, ``\\`` escapes."""
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "\\":
            i += 1
            if i == len(glob):
                raise ValueError("glob ends with an escape")
            out.append(re.escape(glob[i]))
        elif c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = glob.find("]", i + 1)
            if end < 0:
                raise ValueError("unclosed [")
            body = glob[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    if depth:
        raise ValueError("unclosed {")
    return "".join(out)
