"""What each extra of ``pyproject.toml`` installs, and programs run as where only some extras
are installed: a finder placed first on ``sys.meta_path`` refuses the modules of the others,
as a package that is not installed would (``ModuleNotFoundError``)."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable

from . import ROOT

#: the top-level module a distribution installs, where its name says otherwise
_MODULE = {
    "python-snappy": "snappy",
    "opentelemetry-api": "opentelemetry",
    "opentelemetry-sdk": "opentelemetry",
}
#: the extras that install a part of the library (the others install tools: test, docs, dev)
PARTS = ("snappy", "anyio", "trio", "spark", "connect", "otel", "metrics")

_PRELUDE = """\
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name in {blocked!r} or name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def extra_modules() -> dict[str, set[str]]:
    """Each extra -> the top-level modules it installs (with those of the extras it names)."""
    extras: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def modules(extra: str) -> set[str]:
        found: set[str] = set()
        for requirement in extras[extra]:
            name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]
            if name == "nsq-sansio":
                inner = re.search(r"\[(.*)\]", requirement)
                assert inner is not None, requirement
                for other in inner[1].split(","):
                    found |= modules(other.strip())
            else:
                found.add(_MODULE.get(name, name).replace("-", "_"))
        return found

    return {extra: modules(extra) for extra in extras}


def program_with(extras: Iterable[str], code: str) -> list[str]:
    """A command running ``code`` as where the package is installed with ``extras`` alone:
    the modules that the other extras of :data:`PARTS` install cannot be imported."""
    installed = extra_modules()
    allowed = set().union(*(installed[extra] for extra in extras))
    blocked = set().union(*(installed[part] for part in PARTS)) - allowed
    return [sys.executable, "-c", _PRELUDE.format(blocked=sorted(blocked)) + code]


def program_without(modules: Iterable[str], code: str) -> list[str]:
    """A command running ``code`` where ``modules`` (top-level, or dotted: a module of the
    project) cannot be imported, as where they are not installed."""
    return [sys.executable, "-c", _PRELUDE.format(blocked=sorted(modules)) + code]


def uses(extras: Iterable[str], names: Iterable[str], *, on_trio: bool = False) -> list[str]:
    """A command that, installed with ``extras`` alone, imports the modules ``names``, runs
    the command line's ``--help`` when they name it (``nsq-sansio``) and, ``on_trio``, runs
    anyio on trio: it exits with 0 when that is all it needs."""
    names = list(names)
    modules = [name for name in names if name != "nsq-sansio"]
    code = f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
    if on_trio:
        code += "import anyio\nanyio.run(anyio.sleep, 0, backend='trio')\n"
    if "nsq-sansio" in names:
        code += (
            "from nsq_cli import main\n"
            "try:\n    status = main(['--help'])\n"
            "except SystemExit as exit:\n    status = exit.code\n"
            "sys.exit(status)\n"
        )
    return program_with(extras, code)
