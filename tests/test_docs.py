"""The documentation site: its code blocks run, its links resolve, and the configuration
reference matches the dataclasses it documents."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from nsq_proto import ConnectionConfig, ConsumerConfig, ProducerConfig

from .support import ROOT
from .support.codeblocks import Block, blocks, run, with_served_addresses

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
BLOCKS = [b for page in PAGES for b in blocks(page)]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_code_block_runs(block: Block, tmp_path: Path) -> None:
    if block.directive == "skip":
        pytest.skip(f"{block.name}: {block.reason}")
    run(block, tmp_path)


def test_a_served_port_that_begins_like_a_documented_one_is_left_alone() -> None:
    # nsqd served on 41619 begins like lookupd's documented 4161: the block must still
    # reach nsqd at 41619, never "33141" + "9"
    served = {
        "nsqd TCP": "127.0.0.1:41619",
        "nsqd HTTP": "127.0.0.1:41510",
        "lookupd HTTP": "127.0.0.1:33141",
    }
    code = 'tcp = "127.0.0.1:4150"\nhttp = "127.0.0.1:4151"\nlookupd = "127.0.0.1:4161"\n'
    assert with_served_addresses(code, served) == (
        'tcp = "127.0.0.1:41619"\nhttp = "127.0.0.1:41510"\nlookupd = "127.0.0.1:33141"\n'
    )


def test_the_sink_section_says_how_often_a_failed_publish_is_tried() -> None:
    sink = (DOCS / "spark.md").read_text().split("## The sink")[1].split("\n## ")[0]
    # Spark tries a failed task again only as its settings say; local[N] does not
    assert "`spark.task.maxFailures`" in sink
    assert "with the master `local[N]`, a task is tried\nonce" in sink
    assert "`local[N,M]`" in sink


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, f"{page} is not in mkdocs.yml's nav"


REFERENCE = sorted((DOCS / "reference").glob("*.md"))
#: what a reference page says first: its body is generated, and how to see it
GENERATED = (
    "This reference is generated from the docstrings when the documentation site is built (`pip "
    'install -e ".[docs]" && mkdocs serve`, or `mkdocs build`); read as plain Markdown, on a '
    "forge, each `::: name` line stands for the reference of that name."
)


@pytest.mark.parametrize("page", REFERENCE, ids=[p.name for p in REFERENCE])
def test_a_reference_page_says_first_that_it_is_generated_and_how(page: Path) -> None:
    """Read on a forge, a reference page is its ``:::`` directives: it says so at its top."""
    heading, _, rest = page.read_text().partition("\n\n")
    assert heading.startswith("# `"), page
    assert ":::" in rest
    note = rest.split("\n\n", 1)[0]
    assert " ".join(line.removeprefix("> ") for line in note.splitlines()) == GENERATED


def test_relative_links_point_at_pages() -> None:
    for page in DOCS.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page}: broken link {target}"


# --------------------------------------------------------------- the configuration reference

#: the options of go-nsq's Config (its `opt:"..."` names) that this client has as well
GO_NSQ = frozenset(
    """
    dial_timeout read_timeout lookupd_poll_interval lookupd_poll_jitter lookupd_poll_timeout
    max_requeue_delay default_requeue_delay max_backoff_duration backoff_multiplier
    max_attempts low_rdy_idle_timeout low_rdy_timeout rdy_redistribute_interval client_id
    hostname user_agent heartbeat_interval sample_rate tls_v1 deflate deflate_level snappy
    output_buffer_size output_buffer_timeout max_in_flight msg_timeout auth_secret
    """.split()  # noqa: SIM905
)
#: fields that are fractions, not seconds, though they are floats
FRACTIONS = frozenset({"lookupd_poll_jitter", "reconnect_jitter"})
CONFIG_PAGE = DOCS / "configuration.md"


def table(section: str) -> dict[str, list[str]]:
    """The rows of the first table under ``## {section}``: option -> its other cells."""
    text = CONFIG_PAGE.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        assert name not in rows, f"{section}: {name} listed twice"
        rows[name] = cells[1:]
    return rows


def documented_default(cell: str) -> str:
    return cell.strip("`")


def expected_default(name: str, cls: type) -> str:
    (f,) = [f for f in fields(cls) if f.name == name]
    if f.default is MISSING:
        assert callable(f.default_factory), f"{cls.__name__}.{name} has no default"
        value = f.default_factory()
    else:
        value = f.default
    if name == "user_agent":
        return '"nsq_proto/<version>"'  # the version changes; the page says which
    return repr(value).replace("'", '"')


def is_seconds(name: str, cls: type) -> bool:
    (f,) = [f for f in fields(cls) if f.name == name]
    return "float" in str(f.type) and name not in FRACTIONS


SECTIONS = [
    ("Connection options", ConnectionConfig, set()),
    ("Consumer options", ConsumerConfig, {f.name for f in fields(ConnectionConfig)}),
    ("Producer options", ProducerConfig, {f.name for f in fields(ConnectionConfig)}),
]


@pytest.mark.parametrize(("section", "cls", "inherited"), SECTIONS, ids=[s[0] for s in SECTIONS])
def test_configuration_reference_lists_every_option(
    section: str, cls: type, inherited: set[str]
) -> None:
    rows = table(section)
    own = [f.name for f in fields(cls) if f.name not in inherited]
    assert sorted(rows) == sorted(own), f"{section}: the table and {cls.__name__} differ"
    for name in own:
        go_nsq, default, unit = rows[name][:3]
        where = f"{section}, {name}"
        assert documented_default(default) == expected_default(name, cls), where
        same_name = name in GO_NSQ
        assert go_nsq == (f"`{name}`" if same_name else "—"), where
        assert (unit == "s") == is_seconds(name, cls), f"{where}: unit {unit!r}"


# ------------------------------------------------------------------ the Spark data source's options

#: the tables of docs/spark.md's "## Options": what comes before each, and whether it has a read
#: mode column
SPARK_TABLES = [
    ("Connection (source and sink, both read modes):", "CONNECTION_OPTIONS", False),
    ("Source:", "SOURCE_OPTIONS", True),
    ("Sink:", "SINK_OPTIONS", False),
]


def spark_option_table(heading: str) -> dict[str, list[str]]:
    """The rows of the table after ``heading`` in docs/spark.md's options: option -> its
    other cells."""
    text = (DOCS / "spark.md").read_text().split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in body.splitlines():
        assert line.startswith("| "), f"{heading}: {line!r} is not a table row"
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("option", "---"):
            continue
        name = cells[0]
        assert re.fullmatch(r"`[a-z_]+`", name), f"{heading}: {name} is not one option"
        assert name.strip("`") not in rows, f"{heading}: {name} listed twice"
        rows[name.strip("`")] = cells[1:]
    return rows


def spark_default(value: object) -> str:
    """A default as docs/spark.md writes it."""
    from nsq_spark._options import Share

    if isinstance(value, Share):
        return f"`{value.of} / {value.by}`"
    if isinstance(value, bool | str):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"{value:g}"
    if value is None or value == ():
        return ""
    return str(value)


@pytest.mark.parametrize(
    ("heading", "table_name", "with_modes"), SPARK_TABLES, ids=[t[1] for t in SPARK_TABLES]
)
def test_the_spark_option_tables_match_the_sources_table(
    heading: str, table_name: str, with_modes: bool
) -> None:
    pytest.importorskip("pyspark")
    from nsq_spark import _options

    table = getattr(_options, table_name)
    rows = spark_option_table(heading)
    assert list(rows) == [o.name for o in table], f"{heading}: the options differ"
    for option in table:
        cells = rows[option.name]
        if option.required:
            default = "required"
        elif isinstance(option.default, _options.PerMode):
            default = "; ".join(
                f"{mode}: {spark_default(option.default_in(mode))}" for mode in _options.READ_MODES
            )
        elif option.default is None and option.default_means:
            default = option.default_means
        else:
            default = spark_default(option.default)
        assert cells[0] == default, f"{heading} {option.name}: its default"
        modes = "both" if option.modes == set(_options.READ_MODES) else "/".join(option.modes)
        if with_modes:
            assert cells[1] == modes, f"{heading} {option.name}: its read modes"
        else:
            assert modes == "both", f"{heading} {option.name}: a table without read modes"
