"""A griffe extension: the docstrings' reST markup (roles, double backquotes, literal blocks)
as Markdown, so the API reference renders them as code."""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def _blocks(text: str) -> str:
    """``.. code-block:: lang`` and paragraphs ending in ``::`` become fenced blocks."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        lang = None
        if stripped.startswith(".. code-block::"):
            lang = stripped.removeprefix(".. code-block::").strip() or "text"
        elif stripped.endswith("::") and not stripped.startswith(".."):
            lang = "text"
            head = line[: line.rstrip().rfind("::")].rstrip()
            if head:
                out.append(head + ":" if not head.endswith(":") else head)
        else:
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        i += 1
        body: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        code = textwrap.dedent("\n".join(body)).strip("\n")
        out += ["", f"```{'python' if lang == 'python' else 'text'}", *code.split("\n"), "```", ""]
    return "\n".join(out)


def markdown(text: str) -> str:
    text = _blocks(text)
    # roles and literals outside the fenced blocks only
    parts = re.split(r"(```.*?```)", text, flags=re.S)
    for n in range(0, len(parts), 2):
        parts[n] = _LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", parts[n]))
    return "".join(parts)


class RstDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """``__doc__ = Base.__doc__`` in a class body: the class shows its base's docstring."""
        for cls in _classes(pkg):
            if cls.docstring is not None or "__doc__" not in cls.members:
                continue
            for base in cls.resolved_bases:
                if base.docstring is not None:
                    cls.docstring = griffe.Docstring(
                        markdown(base.docstring.value), parent=cls, lineno=cls.lineno
                    )
                    break


def _classes(module: griffe.Module) -> list[griffe.Class]:
    found: list[griffe.Class] = []
    for member in module.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Class):
            found.append(member)
        elif isinstance(member, griffe.Module):
            found.extend(_classes(member))
    return found
