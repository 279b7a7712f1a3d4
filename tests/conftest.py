"""Shared fixtures: an isolated DSCTL_HOME per test that also fails the test if it leaves processes behind."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from helpers import processes_under


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """How a test shares this 2-core machine with the one pytest-xdist runs beside it (pyproject.toml: -n 2).

    `timed` tests (they measure throughput, knees or deadlines) run alone; the other `slow` tests (they start
    TensorFlow processes) run beside one another; tests marked `background` (mostly waiting on timers) and
    unit tests run beside anything. A file lock in the run's temp dir does it: exclusive for `timed`, shared for
    `slow`, behind a turnstile so a waiting `timed` test is not starved by the shared ones. It is held over the
    test's whole protocol, fixtures included: a module's fixture (a root filesystem, a corpus of CLI runs) is
    set up inside its first test's setup, before any function-scoped fixture could take the lock."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    marks = {m.name for m in item.iter_markers()}
    if run is None or "background" in marks or not marks & {"timed", "slow"}:
        yield
        return
    locks = Path(tempfile.gettempdir()) / f"dsctl-tests-{run}"
    locks.mkdir(exist_ok=True)
    with _locked(locks / "turnstile", fcntl.LOCK_EX):  # held while waiting: no shared test slips in first
        share = _locked(locks / "machine", fcntl.LOCK_EX if "timed" in marks else fcntl.LOCK_SH)
    with share:
        yield


class _locked:
    """flock(path, how), taken when made, let go on leaving the `with`."""

    def __init__(self, path: Path, how: int):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, how)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing the last descriptor releases the lock


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh DSCTL_HOME; the builtin data cache is shared across tests to save generation time."""
    h = tmp_path / "dsctl-home"
    h.mkdir()
    shared_cache = Path(os.environ.get("DSCTL_TEST_CACHE", "/tmp/dsctl-test-cache"))
    shared_cache.mkdir(parents=True, exist_ok=True)
    (h / "cache").symlink_to(shared_cache)
    monkeypatch.setenv("DSCTL_HOME", str(h))
    yield h
    leftovers = processes_under(h)
    for p in leftovers:
        p.kill()
    assert not leftovers, f"processes left running: {[p.cmdline() for p in leftovers]}"


