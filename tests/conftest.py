"""Options of the whole test suite.

``--require-real-servers`` (or ``NSQ_REQUIRE_REAL_SERVERS=1``): a test that needs a real
server (marked ``real_nsqd``) and is skipped fails instead, so that a run that was meant to
judge the client against real nsqd, nsqlookupd and the partitioned cluster cannot pass
without them.  CI sets it.

The suite runs on ``-n auto`` pytest-xdist workers (``pyproject.toml``; ``-n 0`` runs it in
one process, for ``--pdb`` say); the Spark tests share one worker (one Spark at a time on the
machine).  The fault suite's figures come back with each test's report and are printed at the
end of the run."""

from __future__ import annotations

import os
from collections.abc import Generator

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
        terminalreporter.section("fault suite figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
