"""The public surface, and the purity of nsq_proto: no I/O module, no clock, no global random."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import nsq_proto

PROTO = Path(nsq_proto.__file__).parent
FORBIDDEN_MODULES = {
    "socket",
    "ssl",
    "select",
    "selectors",
    "time",
    "asyncio",
    "anyio",
    "trio",
    "threading",
    "multiprocessing",
    "subprocess",
    "datetime",
}
FORBIDDEN_CALLS = {
    ("random", "random"),
    ("random", "randint"),
    ("random", "uniform"),
    ("random", "choice"),
    ("random", "shuffle"),
    ("os", "urandom"),
}


def proto_sources() -> list[Path]:
    return sorted(PROTO.rglob("*.py"))


@pytest.mark.parametrize("path", proto_sources(), ids=lambda p: str(p.relative_to(PROTO)))
def test_nsq_proto_imports_no_io_module_and_reads_no_clock(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in FORBIDDEN_MODULES, (path, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            assert node.module.split(".")[0] not in FORBIDDEN_MODULES, (path, node.module)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in FORBIDDEN_CALLS, (path, node.attr)


def test_importing_nsq_proto_loads_no_io_module() -> None:
    code = (
        "import sys; import nsq_proto, nsq_proto.testing; "
        f"bad = {sorted(FORBIDDEN_MODULES - {'time', 'datetime', 'threading'})!r}; "
        "print([m for m in bad if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names_are_exported_once_and_exist() -> None:
    names = nsq_proto.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(nsq_proto, name), name


def test_py_typed_is_shipped() -> None:
    assert (PROTO / "py.typed").exists()


def test_the_top_level_shows_the_state_machines_events_and_errors() -> None:
    import importlib

    import nsq_proto.commands
    import nsq_proto.wire

    assert importlib.import_module("nsq_proto.commands") is nsq_proto.commands
    for name in nsq_proto.wire.__all__:
        assert hasattr(nsq_proto.wire, name), name
        # the wire's helpers live below the top level, once
        assert name not in nsq_proto.__all__, name
    for name in ("Connection", "Consumer", "Producer", "MessageReceived", "NSQError"):
        assert name in nsq_proto.__all__


def test_the_responses_a_client_reads_are_public_in_the_wire() -> None:
    import nsq_proto.wire

    assert (nsq_proto.wire.OK, nsq_proto.wire.CLOSE_WAIT, nsq_proto.wire.HEARTBEAT) == (
        b"OK",
        b"CLOSE_WAIT",
        b"_heartbeat_",
    )
