"""What a streaming query wrote through Spark's file sink, read from the sink's log
(``OUT/_spark_metadata``) as a reader of OUT sees it, while the query still runs.

The log holds one entry per committed batch, ``N`` (and every tenth one compacted,
``N.compact``, listing the files of every batch so far).  Spark writes an entry under a
temporary name (``.N.<uuid>.tmp``, with its checksum ``..N.<uuid>.tmp.crc`` on a local
filesystem) and then renames it to ``N``; the checksum of a committed entry is ``.N.crc``.  Only
the entries count: a directory listing taken while an entry is being written has as many
names as one taken once it was renamed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["SinkLog"]


class SinkLog:
    """The file sink's log under ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.log = out / "_spark_metadata"

    def entries(self) -> tuple[str, ...]:
        """The names of the committed entries, in batch order (cheap: a directory listing).
        It changes exactly when a batch is committed."""
        try:
            names = [e.name for e in self.log.iterdir()]
        except FileNotFoundError:
            return ()
        committed = [n for n in names if _batch_of(n) is not None]
        return tuple(sorted(committed, key=lambda n: (_batch_of(n), n)))

    def batches(self) -> list[list[dict[str, Any]]]:
        """The rows of each committed batch.  A compacted entry lists the files of every batch
        so far: the files it lists first are that batch's."""
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # no type information

        seen: set[str] = set()
        out = []
        for name in self.entries():
            rows: list[dict[str, Any]] = []
            for line in (self.log / name).read_text().splitlines()[1:]:
                if line.strip():
                    path = json.loads(line)["path"].removeprefix("file:")
                    if path not in seen:
                        seen.add(path)
                        rows.extend(pq.read_table(path).to_pylist())
            out.append(rows)
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [row for batch in self.batches() for row in batch]


def _batch_of(name: str) -> int | None:
    """The batch of a committed entry's name (``N`` or ``N.compact``), else None."""
    number, dot, kind = name.partition(".")
    if number.isdigit() and (not dot or kind == "compact"):
        return int(number)
    return None
