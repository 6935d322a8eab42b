"""How the text of an option of the ``nsq`` data source is read: each parser takes the option's
name and its text (stripped, not empty) and gives the value, or an :class:`OptionError` that
names the option.  The tables of ``_options`` pair each option with its parser."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nsq_proto import ConfigError, StartFrom, parse_addresses
from nsq_proto.wire import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "OptionError",
    "Parser",
    "addresses",
    "boolean",
    "channel",
    "choice",
    "integer",
    "option_key",
    "partitions",
    "seconds",
    "start_from",
    "text",
    "topic",
]


class OptionError(ValueError):
    """An option of the ``nsq`` data source is missing or malformed."""


# tracebacks name it where users import it from
OptionError.__module__ = "nsq_spark"


def option_key(name: str) -> str:
    """An option's name without its spelling: case, underscores and dashes."""
    return name.replace("_", "").replace("-", "").lower()


# -- how an option's text is read: (the option's name, its text, stripped and not empty) -> value

Parser = Callable[[str, str], Any]


def text(name: str, value: str) -> str:
    return value


def integer(minimum: int, maximum: int | None = None) -> Parser:
    def parse(name: str, value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
        if number < minimum:
            raise OptionError(f"option {name!r} must be at least {minimum}, not {number}")
        if maximum is not None and number > maximum:
            raise OptionError(f"option {name!r} is {minimum}..{maximum}")
        return number

    return parse


def seconds(minimum: float) -> Parser:
    def parse(name: str, value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise OptionError(
                f"option {name!r} must be a number of seconds, not {value!r}"
            ) from None
        if not number >= minimum or number == float("inf"):
            raise OptionError(f"option {name!r} must be at least {minimum} s, not {value!r}")
        return number

    return parse


def boolean(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {name!r} must be true or false, not {value!r}")


def choice(*choices: str, none: str | None = None) -> Parser:
    """One of ``choices`` (any case); ``none``: the choice that stands for no value."""

    def parse(name: str, value: str) -> str | None:
        lowered = value.lower()
        if lowered not in choices:
            listed = f"{', '.join(choices[:-1])} or {choices[-1]}"
            raise OptionError(f"option {name!r} is {listed}, not {lowered!r}")
        return None if lowered == none else lowered

    return parse


def addresses(*, lookupd: bool = False, http_scheme: bool = False) -> Parser:
    """Comma-separated ``host:port`` (the clients' own check); ``lookupd``: nsqlookupd's, which
    may also be ``http://host:port``; ``http_scheme``: the source's own requests, ``http://``
    or ``https://`` allowed."""

    def parse(name: str, value: str) -> tuple[str, ...]:
        out = tuple(a.strip() for a in value.split(",") if a.strip())
        checked = out
        if http_scheme:
            checked = tuple(a.removeprefix("https://").removeprefix("http://") for a in out)
        try:
            parse_addresses(name, checked, http=lookupd)
        except ConfigError as exc:
            raise OptionError(f"option {name!r}{str(exc).removeprefix(name)}") from None
        return out

    return parse


def _not_a_name(name: str, value: str, what: str) -> OptionError:
    return OptionError(
        f"option {name!r}: {value!r} is not a {what} name"
        " (1 to 64 of a-z A-Z 0-9 . _ -, optionally ending in #ephemeral)"
    )


def topic(name: str, value: str) -> str:
    if not is_valid_topic_name(value):
        raise _not_a_name(name, value, "topic")
    return value


def channel(name: str, value: str) -> str:
    if not is_valid_channel_name(value):
        raise _not_a_name(name, value, "channel")
    return value


def partitions(name: str, value: str) -> tuple[int, ...]:
    try:
        partitions = tuple(int(p) for p in value.split(",") if p.strip())
    except ValueError:
        raise OptionError(
            f"option {name!r} is a comma-separated list of integers, not {value!r}"
        ) from None
    if any(p < 0 for p in partitions):
        raise OptionError(f"option {name!r} takes non-negative partition numbers")
    return partitions


def start_from(name: str, value: str) -> StartFrom | dict[int, StartFrom]:
    """``end``, ``timestamp:<unix s>``, ``virtual_queue:<offset>``, ``msgcount:<n>``, or per
    partition ``0=end,1=msgcount:5``."""
    try:
        if "=" not in value:
            return StartFrom.parse(value)
        positions: dict[int, StartFrom] = {}
        for item in value.split(","):
            partition, sep, position = item.partition("=")
            if not sep or not partition.strip().isdigit():
                raise ConfigError(f"{item.strip()!r} is not <partition>=<position>")
            positions[int(partition)] = StartFrom.parse(position)
        return positions
    except ConfigError as exc:
        raise OptionError(
            f"option {name!r} takes end, timestamp:<unix seconds>, virtual_queue:<offset>, "
            f"msgcount:<n>, or <partition>=<position>,...: {exc}"
        ) from None
