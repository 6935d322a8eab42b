"""The public surface, and the purity of nsq_proto: no I/O module, no clock, no global random."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

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
        "import sys; import nsq_proto, nsq_emulator, nsq_emulator.frames; "
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
    pyproject = tomllib.loads((PROTO.parent / "pyproject.toml").read_text())
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert (PROTO.parent / pattern.rstrip("*") / "py.typed").is_file(), pattern


def test_the_top_level_shows_the_state_machines_events_and_errors() -> None:
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


def test_each_name_has_one_place() -> None:
    """The emulator (its loopback host and pytest plugin included) is nsq_emulator, the command
    line nsq_cli, the client's runner nsq_client.CoreRunner: no other module names them."""
    import nsq_anyio
    import nsq_cli
    import nsq_client
    import nsq_emulator

    for gone in ("nsq_proto.testing", "nsq_anyio._server", "nsq_anyio.pytest_plugin"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)
    assert importlib.util.find_spec("nsq_anyio.__main__") is None
    for module, name in [
        (nsq_anyio, "serve_emulator"),
        (nsq_anyio, "EmulatorCluster"),
        (nsq_client, "Driver"),
        (nsq_emulator, "TopicMeta"),
    ]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"
    assert callable(nsq_cli.main) and callable(nsq_cli.serve_main)


def test_the_entry_points_name_what_exists() -> None:
    project = tomllib.loads((PROTO.parent / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"nsq-sansio": "nsq_cli:main"}
    assert project["entry-points"]["pytest11"] == {"nsq_sansio": "nsq_emulator.pytest_plugin"}
    for target in [*project["scripts"].values(), *project["entry-points"]["pytest11"].values()]:
        module, _, attribute = target.partition(":")
        loaded = importlib.import_module(module)
        assert not attribute or callable(getattr(loaded, attribute)), target


#: the packages whose public classes and functions each say what they are, and the modules of
#: nsq_spark's options (parsed from Spark's strings: the names its errors and docs speak of)
DOCUMENTED = [
    "nsq_proto",
    "nsq_client",
    "nsq_anyio",
    "nsq_trio",
    "nsq_emulator",
    "nsq_spark",
    "nsq_spark._options",
]


def _docstring(obj: Any) -> str | None:
    """``obj``'s own docstring (not one a class inherits, nor the signature a dataclass or a
    named tuple writes when it has none); read from the source where the module is compiled."""
    module = sys.modules[obj.__module__]
    path = Path(str(module.__file__))
    if path.suffix != ".py":  # a compiled build of the core: its source is beside it
        source = path.with_name(obj.__module__.rpartition(".")[2] + ".py")
        for node in ast.parse(source.read_text()).body:
            defines = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, defines) and node.name == obj.__name__:
                return ast.get_docstring(node)
        return None
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    if doc is not None and doc.startswith(f"{obj.__name__}("):
        return None
    return doc


@pytest.mark.parametrize("package", DOCUMENTED)
def test_every_public_class_and_function_has_a_docstring(package: str) -> None:
    if package.startswith("nsq_spark"):
        pytest.importorskip("pyspark")
    if package == "nsq_trio":
        pytest.importorskip("trio")
    module = importlib.import_module(package)
    # the classes and functions defined here (not aliases of Python's own, as ConnId of int)
    public = [
        obj
        for obj in (getattr(module, name) for name in module.__all__)
        if (inspect.isclass(obj) or inspect.isroutine(obj))
        and getattr(obj, "__module__", "").startswith("nsq_")
    ]
    undocumented = [obj.__name__ for obj in public if not (_docstring(obj) or "").strip()]
    assert public
    assert undocumented == [], f"{package}: no docstring"
