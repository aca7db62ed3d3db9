"""Session-wide reporting: which real C++ trees the real-data tests read (Debian's packages
when `make test` could install them, else the demo wheels; tests/fixtures/real_cpp.py)."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    real_cpp = sys.modules.get("tests.fixtures.real_cpp")  # imported only by the tests using it
    if real_cpp is None or not real_cpp.USED:
        return
    terminalreporter.section("real C++ read by the real-data tests")
    for label in sorted(real_cpp.USED):
        tests = sorted(real_cpp.USED[label])
        terminalreporter.write_line(f"{label}: {len(tests)} tests")
        for test in tests:
            terminalreporter.write_line(f"    {test}")
