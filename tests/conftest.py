"""Shared fixtures: an isolated DSCTL_HOME per test that also fails the test if it leaves processes behind;
the test tiers; how a test shares this machine with the one beside it."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from pathlib import Path

import pytest

from helpers import processes_under

# -- tiers ------------------------------------------------------------------------------------------------------------
#
# Every test is in exactly one tier, given here as a marker, so a tier runs by name (`pytest -m unit -n 0`):
#   unit         no TensorFlow (not even imported), no CLI subprocess, no child processes, no stand-in servers, no
#                sshd: what a developer runs after every edit, in well under a minute in one process;
#   integration  real processes: everything marked `slow` (TensorFlow's servers, trainers, a VM's root filesystem)
#                or `integration` (the CLI as a subprocess, entrypoint checks in child processes, TensorFlow
#                imported in-process to build datasets, ...) outside tests/gcp;
#   cloud        the Google Cloud provider's tests, tests/gcp/ (stand-ins, a real sshd, VM boots).
# A test file says `pytestmark = pytest.mark.integration` (or a test `@pytest.mark.integration`) when it is heavy;
# the tier markers themselves are added here and are never written in test files.
TIERS = ("unit", "integration", "cloud")
TESTS = Path(__file__).resolve().parent
CLOUD = TESTS / "gcp"
_HEAVY_MODULE = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.(slow|integration)\b", re.MULTILINE)


def _tier(item: pytest.Item) -> str:
    if CLOUD in Path(str(item.path)).resolve().parents:
        return "cloud"
    marks = {m.name for m in item.iter_markers()}
    return "integration" if marks & {"slow", "integration"} else "unit"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier(item)
        written = {m.name for m in item.iter_markers()} & (set(TIERS) - {tier, "integration"})  # a tier written by hand
        if written:
            raise pytest.UsageError(f"{item.nodeid}: marked {', '.join(sorted(written))} but its tier is {tier} "
                                    "(tests/conftest.py: tiers are given by the folder and the slow/integration marks)")
        if tier == "cloud" and item.get_closest_marker("integration"):
            raise pytest.UsageError(f"{item.nodeid}: tests in tests/gcp are the cloud tier; drop its integration mark")
        item.add_marker(tier)


def pytest_ignore_collect(collection_path: Path, config):
    """`-m unit`, `-m integration` or `-m cloud` alone: leave out the files that hold none of that tier's tests,
    so a tier does not pay for importing what the others import (TensorFlow, Google's client libraries).
    The same tests are selected as without this; only fewer are collected and deselected."""
    tier = (config.getoption("markexpr") or "").strip()
    if tier not in TIERS:
        return None
    path = Path(collection_path).resolve()
    in_cloud = path == CLOUD or CLOUD in path.parents
    if tier == "cloud":
        return True if (not in_cloud and path.is_file() and path.suffix == ".py") else None
    if in_cloud:
        return True
    if tier == "unit" and path.is_file() and path.name.startswith("test_") and path.suffix == ".py":
        if _HEAVY_MODULE.search(path.read_text()):
            return True
    return None


SLOTS = 2  # tests that keep a core busy at once: this machine has 2 (pyproject.toml runs 3 test processes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """How a test shares this 2-core machine with the ones pytest-xdist runs beside it (pyproject.toml: -n 3).

    The machine has SLOTS cores. A `slow` test (it starts TensorFlow processes) takes one slot for its whole run,
    a `timed` test (it measures throughput, knees or deadlines) takes them all and so runs with no other slow test
    beside it, nor a light `integration` one (a CLI subprocess, a short entrypoint check), which otherwise runs
    beside anything; tests marked `background` (they mostly wait on timers: an outage, a time limit) and unit
    tests take nothing. So a third test process runs a
    background test, or the light ones, while two slow tests use the cores: a test that sleeps for minutes no longer
    holds a core's worth of the suite. The tier markers change none of this: a test that starts TensorFlow's servers
    or trainers is marked `slow`. Slots are file locks in the run's temp dir, taken behind a turnstile so a waiting
    `timed` test is not starved by slow ones. They are held over the test's whole protocol, fixtures included: a
    module's fixture (a root filesystem, a corpus of CLI runs) is set up inside its first test's setup, before any
    function-scoped fixture could take a slot."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    marks = {m.name for m in item.iter_markers()}
    if run is None or "background" in marks or not marks & {"timed", "slow", "integration"}:
        yield
        return
    locks = Path(tempfile.gettempdir()) / f"dsctl-tests-{run}"
    locks.mkdir(exist_ok=True)
    slots = [locks / f"slot-{i}" for i in range(SLOTS)]
    quiet = locks / "quiet"  # a timed test also keeps the light integration tests (CLI subprocesses) away
    with _locked(locks / "turnstile", fcntl.LOCK_EX):  # held while waiting: no slow test slips in first
        if "timed" in marks:
            held = [_locked(quiet, fcntl.LOCK_EX), *(_locked(path, fcntl.LOCK_EX) for path in slots)]
        elif "slow" in marks:
            held = [_free_slot(slots)]
        else:
            held = [_locked(quiet, fcntl.LOCK_SH)]
    try:
        yield
    finally:
        for lock in held:
            lock.__exit__()


def _free_slot(slots: list[Path]) -> _locked:
    """The first slot nobody holds, waited for."""
    while True:
        for path in slots:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return _locked.holding(fd)
            except BlockingIOError:
                os.close(fd)
        time.sleep(0.05)


class _locked:
    """flock(path, how), taken when made, let go on leaving the `with` (or on __exit__)."""

    def __init__(self, path: Path, how: int):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, how)

    @classmethod
    def holding(cls, fd: int) -> _locked:
        lock = cls.__new__(cls)
        lock.fd = fd
        return lock

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


