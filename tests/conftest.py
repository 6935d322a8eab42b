"""Options of the whole test suite.

``--require-real-servers`` (or ``NSQ_REQUIRE_REAL_SERVERS=1``): a test that needs a real
server (marked ``real_nsqd``) and is skipped fails instead, so that a run that was meant to
judge the client against real nsqd, nsqlookupd and the partitioned cluster cannot pass
without them.  CI sets it.

The suite runs on ``-n auto`` pytest-xdist workers (``pyproject.toml``; ``-n 0`` runs it in
one process, for ``--pdb`` say); the Spark tests share one worker (one Spark at a time on the
machine), and a test marked ``alone`` (the standalone Spark cluster's: seven JVMs starve two
cores on their own) runs while no other test of the run does: the other workers wait before
their next test.  The figures that tests report (``record_property("figure", ...)``: the fault
suite's, the cluster's) come back with each test's report and are printed at the end of the
run."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Generator, Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-real-servers",
        action="store_true",
        default=os.environ.get("NSQ_REQUIRE_REAL_SERVERS", "") not in ("", "0"),
        help="fail (rather than skip) every test that needs a real server it cannot find",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and item.get_closest_marker("real_nsqd") is not None
        and item.config.getoption("--require-real-servers")
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"a real-server test was skipped under --require-real-servers: {reason}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "alone: runs while no other test of the run does (the other pytest-xdist workers "
        "wait before their next test)",
    )


class _Turns:
    """Across the pytest-xdist workers of one run (a file named after the run): a test marked
    ``alone`` takes the turnstile (byte 0 of the file), so that no test starts, then waits for
    the tests running to end (byte 1, which each test holds shared while it runs)."""

    def __init__(self, run: str) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"nsq-sansio-tests-{run}.lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextlib.contextmanager
    def hold(self, alone: bool) -> Iterator[None]:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
        if not alone:  # through the turnstile: a test alone waiting for its turn goes first
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, 1, 1)
            try:
                yield
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 1)
        finally:
            if alone:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)

    def close(self) -> None:
        os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


_turns: _Turns | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    global _turns
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing runs beside
        yield
        return
    if _turns is None:
        _turns = _Turns(run)
    with _turns.hold(item.get_closest_marker("alone") is not None):
        yield


def pytest_unconfigure(config: pytest.Config) -> None:
    if _turns is not None:
        _turns.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # one Spark (a JVM of 1 GB and more, or a whole standalone cluster) at a time
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))


_FIGURES: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _FIGURES.extend(str(v) for k, v in report.user_properties if k == "figure")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _FIGURES:
        terminalreporter.section("figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
