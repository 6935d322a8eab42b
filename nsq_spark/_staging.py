"""Where the tasks of the executor-side source make what they consumed durable before they
FINish it: one Arrow IPC file per (run, batch, partition) under a location that the driver and
every executor reach (a local path, or any ``pyarrow.fs`` URI: ``hdfs://``, ``s3://``, ...).

``<location>/<run>/_source``   written by the driver; a task that does not see it is not on a
                               filesystem shared with the driver
``<location>/<run>/<batch>/<partition>.arrow``   the rows of one task, written once, with
                               the ids of their messages (a column the query does not see)
``<location>/<run>/<batch>/<partition>.fin``     written once nsqd confirmed their FINs
``<location>/<run>/_suspects/<batch>-<partition>.arrow``   at commit, the ids of staged rows
                               whose FIN was not confirmed: nsqd may deliver them again, and
                               a later task recognizes them (kept ``redelivery_window``)
``<location>/<run>/_committed/<batch>``   the last batch committed (written before its staged
                               rows are deleted)

An attempt of a batch that was committed already (the slow attempt that speculation copied,
or a task that Spark is ending) ran too late: Spark keeps no row of it.  It must not take
messages then (they would be FINished and never written), so a task looks at the last batch
committed before it consumes, and again once it staged (the name of its batch's rows is free
again once they were deleted): too late, it deletes what it staged, gives its messages back
and fails.  A late attempt killed in between leaves its rows staged: the driver deletes them
at its next commit without taking their ids for written (their messages come back after
``msg_timeout``, and are rows then).

A file is written under a temporary name and then moved to its name, without replacing one
already there: the first writer wins, and a task that loses reads the winner's rows.  On a
local filesystem the move is ``link`` + ``unlink`` (atomic, fails if the name exists); on HDFS a
rename (which refuses an existing name); on object stores (S3, GCS) a check then a copy, which
is not exclusive: two attempts of one task running at the same moment (speculation) may both
believe they won there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]

__all__ = ["Staging", "StagingNotShared", "default_staging_location"]

_MARKER = "_source"
_SUSPECTS = "_suspects"
_COMMITTED = "_committed"
#: the column of the staged rows that holds their messages' ids, and the schema metadata key
#: of the nsqd they came from
ID_COLUMN = "__nsq_id"
NSQD_KEY = b"nsq_spark.nsqd"


class StagingNotShared(RuntimeError):
    """A task does not see what the driver wrote to the staging location."""


# tracebacks name it where users import it from
StagingNotShared.__module__ = "nsq_spark"


def default_staging_location() -> str:
    """A directory of this machine: right for ``local[*]`` and for executors on this machine
    only (a task elsewhere fails with :class:`StagingNotShared`)."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), "nsq-spark-staging")


class Staging:
    """One staging location (picklable: it opens its filesystem where it is used)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._fs: Any = None
        self._root = ""
        self._local = False

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"])  # type: ignore[misc]

    def _open(self) -> tuple[Any, str]:
        if self._fs is None:
            location = self.location
            if "://" in location:
                fs, root = pafs.FileSystem.from_uri(location)
            else:
                fs, root = pafs.LocalFileSystem(), os.path.abspath(location)
            self._local = isinstance(fs, pafs.LocalFileSystem)
            self._fs, self._root = fs, root.rstrip("/")
        return self._fs, self._root

    def _run_dir(self, run: str) -> str:
        _, root = self._open()
        return f"{root}/{run}"

    def path(self, run: str, batch: int, index: int) -> str:
        return f"{self._run_dir(run)}/{batch}/{index}.arrow"

    # -- the driver -------------------------------------------------------------------------

    def mark(self, run: str) -> None:
        """Create the run's directory and its marker (idempotent)."""
        fs, _ = self._open()
        directory = self._run_dir(run)
        fs.create_dir(directory, recursive=True)
        marker = f"{directory}/{_MARKER}"
        if fs.get_file_info(marker).type == pafs.FileType.NotFound:
            with fs.open_output_stream(marker) as out:
                out.write(b"nsq_spark staging\n")

    def delete_through(self, run: str, batch: int, *, redelivery_window: float = 0.0) -> int:
        """Commit the run's batches up to ``batch``: delete their staged rows; how many
        batches.

        The ids of rows whose FIN nsqd did not confirm are kept first, as suspects, then the
        batch is marked committed, then the rows go; suspects older than
        ``redelivery_window`` seconds go too.  Rows staged under a batch committed earlier
        are a late attempt's, never written: deleted, and not suspects."""
        fs, _ = self._open()
        directory = self._run_dir(run)
        before = self.committed(run)
        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        batches = [
            (int(info.base_name), info.path)
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory
            and info.base_name.isdigit()
            and int(info.base_name) <= batch
        ]
        for number, path in batches:
            if number > before:
                self._keep_suspects(fs, run, path, number)
        if batch > before:
            self._mark_committed(fs, run, batch)
        for _number, path in batches:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_dir(path)
        self._expire_suspects(fs, run, redelivery_window)
        return len(batches)

    def committed(self, run: str) -> int:
        """The last batch of the run that the driver committed (0: none)."""
        fs, _ = self._open()
        selector = pafs.FileSelector(
            f"{self._run_dir(run)}/{_COMMITTED}", allow_not_found=True, recursive=False
        )
        names = [info.base_name for info in fs.get_file_info(selector)]
        return max((int(name) for name in names if name.isdigit()), default=0)

    def _mark_committed(self, fs: Any, run: str, batch: int) -> None:
        """A file named after the batch, then the older ones go: one is always there."""
        directory = f"{self._run_dir(run)}/{_COMMITTED}"
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(f"{directory}/{batch}"):
            pass
        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        for info in fs.get_file_info(selector):
            if info.base_name.isdigit() and int(info.base_name) < batch:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(info.path)

    def _keep_suspects(self, fs: Any, run: str, directory: str, batch: int) -> None:
        selector = pafs.FileSelector(directory, allow_not_found=True, recursive=False)
        names = {info.base_name for info in fs.get_file_info(selector)}
        for name in sorted(names):
            index, dot, kind = name.partition(".")
            if not (dot and kind == "arrow" and index.isdigit()) or f"{index}.fin" in names:
                continue
            with fs.open_input_file(f"{directory}/{name}") as source:
                table = pa.ipc.open_file(source).read_all()
            if ID_COLUMN not in table.column_names or not table.num_rows:
                continue
            ids = table.select([ID_COLUMN]).replace_schema_metadata(table.schema.metadata)
            suspects = f"{self._run_dir(run)}/{_SUSPECTS}"
            fs.create_dir(suspects, recursive=True)
            final = f"{suspects}/{batch}-{index}.arrow"
            temporary = f"{suspects}/.{batch}-{index}.{uuid.uuid4().hex}.tmp"
            with fs.open_output_stream(temporary) as out:
                with pa.ipc.new_file(out, ids.schema) as writer:
                    writer.write_table(ids)
            fs.move(temporary, final)

    def _expire_suspects(self, fs: Any, run: str, window: float) -> None:
        selector = pafs.FileSelector(
            f"{self._run_dir(run)}/{_SUSPECTS}", allow_not_found=True, recursive=False
        )
        now = time.time()
        for info in fs.get_file_info(selector):
            if info.mtime is not None and now - info.mtime.timestamp() > window:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(info.path)

    # -- the tasks --------------------------------------------------------------------------

    def check_shared(self, run: str) -> None:
        fs, _ = self._open()
        marker = f"{self._run_dir(run)}/{_MARKER}"
        if fs.get_file_info(marker).type == pafs.FileType.NotFound:
            raise StagingNotShared(
                f"the nsq source's staging location {self.location!r} is not shared with the "
                f"driver ({marker} is missing here): on a cluster, set the option "
                "staging_location to a location the driver and every executor reach (HDFS, "
                "S3, a shared mount)"
            )

    def read(self, run: str, batch: int, index: int) -> pa.Table | None:
        """The rows staged for this task, or None if none were."""
        fs, _ = self._open()
        try:
            source = fs.open_input_file(self.path(run, batch, index))
        except FileNotFoundError:
            return None
        with source:
            return pa.ipc.open_file(source).read_all()

    def suspects(self, run: str, nsqd: str) -> frozenset[bytes]:
        """The ids of messages from ``nsqd`` that were staged (and so written) but whose FIN
        nsqd did not confirm: if one comes again, it is a copy."""
        fs, _ = self._open()
        selector = pafs.FileSelector(
            f"{self._run_dir(run)}/{_SUSPECTS}", allow_not_found=True, recursive=False
        )
        ids: set[bytes] = set()
        for info in fs.get_file_info(selector):
            if not info.base_name.endswith(".arrow"):
                continue
            try:
                with fs.open_input_file(info.path) as source:
                    table = pa.ipc.open_file(source).read_all()
            except FileNotFoundError:  # expired meanwhile
                continue
            if (table.schema.metadata or {}).get(NSQD_KEY) == nsqd.encode():
                ids.update(table.column(ID_COLUMN).to_pylist())
        return frozenset(ids)

    def discard(self, run: str, batch: int, index: int) -> None:
        """Delete the rows this task staged (a late attempt's: never written)."""
        fs, _ = self._open()
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(self.path(run, batch, index))

    def confirm(self, run: str, batch: int, index: int) -> None:
        """nsqd confirmed the FINs of the staged rows of this task."""
        fs, _ = self._open()
        with fs.open_output_stream(f"{self._run_dir(run)}/{batch}/{index}.fin"):
            pass

    def publish(self, run: str, batch: int, index: int, table: pa.Table) -> bool:
        """Stage ``table`` unless another attempt did first; True if this one won."""
        fs, _ = self._open()
        final = self.path(run, batch, index)
        directory = final.rsplit("/", 1)[0]
        fs.create_dir(directory, recursive=True)
        temporary = f"{directory}/.{index}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(temporary) as out:
            with pa.ipc.new_file(out, table.schema) as writer:
                writer.write_table(table)
        try:
            return self._move_if_absent(fs, temporary, final)
        finally:
            with contextlib.suppress(FileNotFoundError, OSError):
                fs.delete_file(temporary)

    def _move_if_absent(self, fs: Any, temporary: str, final: str) -> bool:
        if self._local:
            try:
                os.link(temporary, final)
            except FileExistsError:
                return False
            except OSError as exc:  # a filesystem without hard links
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV):
                    raise
            else:
                return True
        if fs.get_file_info(final).type != pafs.FileType.NotFound:
            return False
        try:
            fs.move(temporary, final)  # HDFS refuses an existing name
        except OSError:
            if fs.get_file_info(final).type != pafs.FileType.NotFound:
                return False
            raise
        return True
