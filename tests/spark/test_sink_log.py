"""The tests' reader of Spark's file-sink log (``sink_log.py``), on logs laid out as Spark
writes them: an entry is written under a temporary name, with its checksum, then renamed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]  # no type information (as in nsq_spark)
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from .sink_log import SinkLog


def _data_file(out: Path, name: str, bodies: list[bytes]) -> str:
    path = out / name
    pq.write_table(pa.table({"body": bodies}), path)
    return f"file://{path}"


def _entry(files: list[str]) -> str:
    lines = [json.dumps({"path": f, "action": "add"}) for f in files]
    return "\n".join(["v1", *lines]) + "\n"


def test_an_entry_counts_once_renamed_and_only_entries_count(tmp_path: Path) -> None:
    out = tmp_path / "out"
    log = out / "_spark_metadata"
    sink = SinkLog(out)
    assert sink.entries() == () and sink.rows() == []
    log.mkdir(parents=True)
    first = _data_file(out, "part-0.parquet", [b"a", b"b"])
    (log / "0").write_text(_entry([first]))
    (log / ".0.crc").write_bytes(b"crc")
    assert sink.entries() == ("0",)
    # batch 1 being written: its temporary entry and checksum are there, not yet renamed
    # (as many names in the directory as once it is committed)
    second = _data_file(out, "part-1.parquet", [b"c"])
    (log / ".1.5a1e.tmp").write_text(_entry([second]))
    (log / "..1.5a1e.tmp.crc").write_bytes(b"crc")
    writing = sink.entries()
    assert list(writing) == ["0"] and [r["body"] for r in sink.rows()] == [b"a", b"b"]
    os.rename(log / ".1.5a1e.tmp", log / "1")
    os.rename(log / "..1.5a1e.tmp.crc", log / ".1.crc")
    committed = sink.entries()
    assert list(committed) == ["0", "1"] and committed != writing
    assert [[r["body"] for r in b] for b in sink.batches()] == [[b"a", b"b"], [b"c"]]


def test_a_compacted_entry_lists_every_file_again_and_counts_its_batch_once(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    log = out / "_spark_metadata"
    log.mkdir(parents=True)
    files = [_data_file(out, f"part-{i}.parquet", [f"m{i}".encode()]) for i in range(11)]
    for i in range(9):
        (log / str(i)).write_text(_entry([files[i]]))
    (log / "9.compact").write_text(_entry(files[:10]))
    (log / "10").write_text(_entry([files[10]]))
    sink = SinkLog(out)
    assert sink.entries()[-3:] == ("8", "9.compact", "10")
    batches = sink.batches()
    assert [len(b) for b in batches] == [1] * 11
    assert [r["body"] for r in sink.rows()] == [f"m{i}".encode() for i in range(11)]
