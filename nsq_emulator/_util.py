"""Small helpers reproducing Go's formatting and parsing where nsqd's bytes depend on them."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "GoValueError",
    "go_quote",
    "go_json",
    "go_bytes_list",
    "parse_base10",
    "to_int64",
    "go_atoi",
    "http_date",
    "rfc3339",
    "civil",
    "parse_query",
]

_U64 = 1 << 64
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


class GoValueError(ValueError):
    """A value Go's parsers reject; ``str(err)`` is Go's error text."""


_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x22: '\\"',
    0x5C: "\\\\",
}


def go_quote(data: bytes) -> bytes:
    """``fmt.Sprintf("%q", string(data))``: Go's double-quoted, escaped rendering."""
    out = ['"']
    text = data.decode("utf-8", "surrogateescape")
    for ch in text:
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif cp in _ESCAPES:
            out.append(_ESCAPES[cp])
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x80 or (ch.isprintable() and cp != 0xFEFF):
            out.append(ch)
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out).encode("utf-8")


def go_json(obj: Any) -> bytes:
    """``json.Marshal``: compact, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped, UTF-8 kept."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
        .encode("utf-8")
    )


def go_bytes_list(items: list[bytes]) -> bytes:
    """``fmt.Sprintf("%v", [][]byte{...})``: ``[[80 85 66] [116]]``."""
    return (
        "[" + " ".join("[" + " ".join(str(b) for b in item) + "]" for item in items) + "]"
    ).encode()


def parse_base10(data: bytes) -> int | None:
    """nsqd's ``protocol.ByteToBase10``: digits only (empty is 0), wrapping like a uint64."""
    n = 0
    for b in data:
        if not 0x30 <= b <= 0x39:
            return None
        n = (n * 10 + (b - 0x30)) % _U64
    return n


def to_int64(n: int) -> int:
    """Reinterpret an integer as Go's int64 (two's complement wrap-around)."""
    n %= _U64
    return n - _U64 if n > _I64_MAX else n


def go_atoi(data: bytes) -> int:
    """``strconv.Atoi`` (64-bit): optional sign then ASCII digits; raises :class:`GoValueError`."""
    text = data.decode("utf-8", "replace")
    quoted = go_quote(data).decode("utf-8")
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise GoValueError(f"strconv.Atoi: parsing {quoted}: invalid syntax")
    value = int(text)
    if not _I64_MIN <= value <= _I64_MAX:
        raise GoValueError(f"strconv.Atoi: parsing {quoted}: value out of range")
    return value


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def civil(unix_time: float) -> tuple[int, int, int, int, int, int, int]:
    """UTC ``(year, month, day, hour, minute, second, weekday 0=Monday)`` of a Unix time
    (proleptic Gregorian calendar, computed without any clock or time module)."""
    secs = int(unix_time // 1)
    days, rem = divmod(secs, 86400)
    hour, rem = divmod(rem, 3600)
    minute, second = divmod(rem, 60)
    weekday = (days + 3) % 7  # 1970-01-01 was a Thursday
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month, day, hour, minute, second, weekday


def http_date(unix_time: float) -> str:
    """An HTTP ``Date`` header value (RFC 7231 IMF-fixdate) for a Unix time."""
    y, mo, d, h, mi, s, wd = civil(unix_time)
    return f"{_DAYS[wd]}, {d:02d} {_MONTHS[mo - 1]} {y:04d} {h:02d}:{mi:02d}:{s:02d} GMT"


def rfc3339(unix_time: float) -> str:
    y, mo, d, h, mi, s, _ = civil(unix_time)
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}Z"


_HEX = "0123456789abcdefABCDEF"


def _unescape(part: str) -> str:
    out = bytearray()
    i = 0
    raw = part.encode("utf-8", "surrogateescape")
    n = len(raw)
    while i < n:
        b = raw[i]
        if b == 0x25:  # %
            hexpart = raw[i + 1 : i + 3].decode("latin-1")
            if len(hexpart) != 2 or hexpart[0] not in _HEX or hexpart[1] not in _HEX:
                raise GoValueError(f'invalid URL escape "{raw[i : i + 3].decode("latin-1")}"')
            out.append(int(hexpart, 16))
            i += 3
        elif b == 0x2B:  # +
            out.append(0x20)
            i += 1
        else:
            out.append(b)
            i += 1
    return out.decode("utf-8", "surrogateescape")


def parse_query(raw: str) -> dict[str, list[str]]:
    """``url.ParseQuery``: ``&``-separated, ``+`` is a space, ``;`` and bad escapes are errors.

    Go keeps parsing after an error and returns the first one; callers only need to know
    that there was one, so this raises :class:`GoValueError` at the end.
    """
    values: dict[str, list[str]] = {}
    first_error: GoValueError | None = None
    for part in raw.split("&"):
        if not part:
            continue
        if ";" in part:
            first_error = first_error or GoValueError("invalid semicolon separator in query")
            continue
        key, _, value = part.partition("=")
        try:
            key = _unescape(key)
            value = _unescape(value)
        except GoValueError as exc:
            first_error = first_error or exc
            continue
        values.setdefault(key, []).append(value)
    if first_error is not None:
        raise first_error
    return values


_OFFSET_TYPES = ("timestamp", "special", "virtual_queue", "msgcount")


def parse_start_position(raw: bytes) -> tuple[str, int]:
    """The partitioned server's ``ConsumeOffset.FromBytes``: ``type:int64``; ValueError with
    the server's text."""
    parts = raw.split(b":")
    text = raw.decode("utf-8", "replace")
    if len(parts) != 2:
        raise ValueError("invalid consume offset:" + text)
    kind = parts[0].decode("utf-8", "replace")
    if kind not in _OFFSET_TYPES:
        raise ValueError("invalid consume offset:" + text)
    try:
        value = go_atoi(parts[1])
    except GoValueError as exc:
        raise ValueError(str(exc).replace("strconv.Atoi", "strconv.ParseInt")) from None
    return kind, value
