"""nsq_emulator is public, documented and pure (no I/O, no clock, no global random), apart
from its loopback host, its fault proxy, its program and its pytest plugin."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nsq_emulator as emu

PACKAGE = Path(emu.__file__).parent
#: the emulator's modules that do I/O: the loopback host (anyio), the fault proxy (anyio),
#: ``python -m nsq_emulator`` (``__main__`` and its serving, ``_serve``) and the pytest plugin
HOSTS = {"loopback.py", "proxy.py", "__main__.py", "_serve.py", "pytest_plugin.py"}
FORBIDDEN_MODULES = {
    "socket",
    "ssl",
    "asyncio",
    "threading",
    "select",
    "selectors",
    "subprocess",
    "time",
    "anyio",
    "trio",
    "os",
    "datetime",
    "multiprocessing",
}


def test_every_public_name_is_exported_and_documented() -> None:
    doc = emu.__doc__ or ""
    for name in emu.__all__:
        assert hasattr(emu, name), name
        assert name in doc or name[0].islower(), f"{name} is not mentioned in the module docs"
    assert "static_authorizer" in doc


def test_importing_does_not_pull_in_io_modules() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import nsq_emulator, nsq_emulator.frames\n"
        "print(','.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    new = set(out.stdout.strip().split(","))
    assert not new & (FORBIDDEN_MODULES | {"snappy", "cramjam"})


def test_sources_import_no_io_and_use_no_global_random() -> None:
    sources = sorted(p for p in PACKAGE.glob("*.py") if p.name not in HOSTS)
    assert {p.name for p in sources} >= {"__init__.py", "_nsqd.py", "frames.py"}
    for path in sources:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = {node.module.split(".")[0]}
            else:
                names = set()
            assert not names & FORBIDDEN_MODULES, f"{path.name}: imports {names}"
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "random"
            ):
                assert node.attr == "Random", f"{path.name}: global random.{node.attr}"
