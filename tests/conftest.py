"""Options of the whole test suite.

``--require-real-servers`` (or ``NSQ_REQUIRE_REAL_SERVERS=1``): a test that needs a real
server (marked ``real_nsqd``) and is skipped fails instead, so that a run that was meant to
judge the client against real nsqd, nsqlookupd and the partitioned cluster cannot pass
without them.  CI sets it."""

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
