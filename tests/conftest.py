"""Shared fixtures: an isolated DSCTL_HOME per test that also fails the test if it leaves processes behind;
the test tiers; how a test shares this machine with the one beside it; and, once the whole session has run, a
check that no cgroup of dsctl's is left."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from helpers import processes_under, remove_cgroup

# The provider contract suite's asserts say what they compared, as a test file's do.
pytest.register_assert_rewrite("contract.suite")

# The Ctrl-C tests send SIGINT to dsctl as a terminal does. A suite started in the background by a non-interactive
# shell (`.ci/run &`) inherits SIGINT ignored, and an ignored signal stays ignored in every process started from
# here, so dsctl would never see it (Python installs its Ctrl-C handler only where SIGINT is not ignored). Each test
# process (pytest's own and every xdist worker import this file) takes SIGINT back; the processes it starts then get
# the default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
    workers = getattr(config, "workerinput", {}).get("workercount", 0)
    if workers >= 2:
        items[:] = _laid_out(items, workers)


def _kind(item: pytest.Item) -> str:
    marks = {m.name for m in item.iter_markers()}
    for kind in ("background", "timed", "slow"):
        if kind in marks:
            return kind
    return "integration" if "integration" in marks else "free"  # free: takes no lock (unit, cloud without slow)


def _laid_out(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The tests in the order pytest-xdist hands them out, so the long ones overlap instead of queueing at the end.

    xdist's worksteal scheduler gives each of the `workers` processes one contiguous chunk of the list (the first
    len // workers tests to the first, and so on), then idle processes steal from the end of the busiest queue.
    So the list is laid out in chunks: the `background` tests (minutes of waiting on timers, no slot) open the first
    chunk and the `timed` ones (they hold the whole machine) the second, so both start at once and the timed tests
    run while the background ones wait; the third chunk opens with the tests that take no lock, which run beside
    the timed ones. The `slow` tests are dealt out to every chunk after those, and the light integration tests and
    the rest fill each chunk to its size, at its end, where stealing takes them first. Every xdist process computes
    the same order (xdist checks that their collections agree)."""
    by_kind: dict[str, list[pytest.Item]] = {k: [] for k in ("background", "timed", "slow", "integration", "free")}
    for item in items:
        by_kind[_kind(item)].append(item)
    chunks: list[list[pytest.Item]] = [[] for _ in range(workers)]
    chunks[0] += by_kind["background"]
    chunks[1] += by_kind["timed"]
    if workers >= 3:
        chunks[2] += by_kind["free"]
        by_kind["free"] = []
    for i, item in enumerate(by_kind["slow"]):
        chunks[i % workers].append(item)
    rest = by_kind["integration"] + by_kind["free"]
    sizes, left = [], len(items)
    for i in range(workers):  # the sizes xdist cuts: len(pending) // nodes_remaining, in turn
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    out: list[pytest.Item] = []
    spill: list[pytest.Item] = []
    for chunk, size in zip(chunks, sizes):
        spill += chunk[size:]  # a chunk already past its size (many tests of one kind) gives its tail on
        chunk[:] = chunk[:size]
    rest = spill + rest
    for chunk, size in zip(chunks, sizes):
        take = max(size - len(chunk), 0)
        out += chunk + rest[:take]
        rest = rest[take:]
    return out + rest


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
def notices() -> list[str]:
    """What the run store told the user on its own (the WARNING records of the orchestrator's `notices` logger). A
    warning said once per process is forgotten first, so each test hears it afresh."""
    from dsctl.orchestrator import home as home_module

    got: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    handler = Collect()
    home_module._warned.clear()
    home_module.notices.addHandler(handler)
    yield got
    home_module.notices.removeHandler(handler)


@pytest.fixture
def keep_umask():
    """dsctl sets its process's umask to 0o077; give pytest's back after the test."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield
    os.umask(saved)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh DSCTL_HOME; the builtin data cache is shared across tests to save generation time."""
    h = tmp_path / "dsctl-home"
    h.mkdir(mode=0o700)  # as dsctl makes a new home (an existing one keeps its mode)
    shared_cache = Path(os.environ.get("DSCTL_TEST_CACHE", "/tmp/dsctl-test-cache"))
    shared_cache.mkdir(parents=True, exist_ok=True)
    (h / "cache").symlink_to(shared_cache)
    monkeypatch.setenv("DSCTL_HOME", str(h))
    yield h
    leftovers = processes_under(h)
    described = [_describe(p) for p in leftovers]
    for p in leftovers:
        p.kill()
    assert not leftovers, f"processes left running: {described}"


def _describe(p: psutil.Process) -> str:
    """A leftover process for the failure message (one that has already ended says so instead of raising)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error as exc:
        return f"pid {p.pid} ({type(exc).__name__})"




# -- the end of the session: nothing of dsctl's left (processes, mounts, cgroups) -----------------------------------

def pytest_sessionfinish(session, exitstatus):
    """In the main process (not an xdist worker), once every test has run, nothing of dsctl's from this session is
    left: no process whose command line or DSCTL_HOME lies below the session's temp folders (a process holds the
    run's network namespace and its listening ports, so none of those is left either), no mount below them (the
    tests' small disks), and no cgroup that dsctl made for a run of this session (provisioners/containment.py,
    `dsctl-run-<run id>` for a run dir below the session's temp folder) or for an entrypoint check whose dsctl is
    gone; no named network namespace a test made (tests/helpers.py ClientNetns, `/run/netns/dsctl-test-<pid>-<tag>`)
    and no cgroup v1 memory cgroup a test made to have a process killed for memory (tests/test_oom.py,
    `dsctl-test-oom-<pid>-<n>`), of this session or of one whose process is gone. What is left is ended, and the
    session fails naming it. Another session's (one running beside this one) are left alone."""
    if hasattr(session.config, "workerinput"):
        return
    from dsctl.provisioners.containment import CHECK_PREFIX, RUN_PREFIX, Cgroup, cgroup_name, leftover_cgroups

    base = session.config._tmp_path_factory.getbasetemp()
    roots = _session_roots(base)
    lines = [f"process {pid}: {cmd}" for pid, cmd in _processes_below(roots)]
    lines += [f"mount {m}" for m in _mounts_below(roots)]
    found = leftover_cgroups()
    ours = {cgroup_name(RUN_PREFIX, run) for run in _run_ids_below(base)} if found else set()
    left = [g for g in found if g.name in ours or (g.name.startswith(CHECK_PREFIX) and _abandoned(g.name))]
    for path in left:
        group = Cgroup(path)
        held = group.describe(limit=5)
        try:
            group.end()
        except (OSError, TimeoutError) as exc:
            held.append(f"(could not be ended: {exc})")
        lines.append(f"cgroup {path}: {'; '.join(held) or 'empty'}")
    lines += _end_test_netns() + _end_oom_cgroups()
    if not lines:
        return
    _end_leftovers(roots)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("left after the session by dsctl (a teardown or a test's clean-up missed each):", red=True)
        for line in lines:
            reporter.write_line(f"  {line}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _run_ids_below(base: Path) -> set[str]:
    """The names of the run dirs (`.../runs/<run id>`) below `base` (symlinks, e.g. the shared cache, not followed)."""
    ids = set()
    for folder, dirs, _files in os.walk(base):
        if os.path.basename(folder) == "runs":
            ids.update(dirs)
            dirs.clear()
    return ids


def _abandoned(name: str) -> bool:
    """A check's cgroup (`dsctl-check-<pid>-<n>`) whose dsctl process is gone."""
    owner = name.split("-")[2] if name.count("-") >= 3 else ""
    return owner.isdigit() and not Path(f"/proc/{owner}").exists()


def _made_here_or_abandoned(name: str, prefix: str) -> bool:
    """Whether a test's `<prefix><pid>-...` is this process's, or its maker (an xdist worker, another session) is gone:
    a namespace or cgroup a live test process of another session holds is left to it."""
    owner = name[len(prefix):].split("-", 1)[0]
    return owner.isdigit() and (int(owner) == os.getpid() or not Path(f"/proc/{owner}").exists())


def _end_test_netns() -> list[str]:
    """Remove the named network namespaces the tests made (ClientNetns) that are left, with what runs in them and
    their veth pair (deleting the namespace deletes its end, and so the pair); one line each for the report."""
    from helpers import NETNS_PREFIX

    try:
        names = sorted(n for n in os.listdir("/run/netns") if n.startswith(NETNS_PREFIX))
    except OSError:
        return []
    if names and shutil.which("ip") is None:
        return [f"network namespace /run/netns/{n}: (could not be removed: iproute2's ip is not installed)" for n in names
                if _made_here_or_abandoned(n, NETNS_PREFIX)]
    lines = []
    for name in (n for n in names if _made_here_or_abandoned(n, NETNS_PREFIX)):
        inside = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
        pids = [int(p) for p in inside.stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        gone = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, timeout=30)
        held = f"processes {', '.join(map(str, pids))} in it" if pids else "nothing in it"
        failed = f" (could not be removed: {gone.stderr.strip()})" if gone.returncode else ""
        lines.append(f"network namespace /run/netns/{name}: {held}{failed}")
    return lines


OOM_PREFIX = "dsctl-test-oom-"  # tests/test_oom.py's memory cgroups: dsctl-test-oom-<pid>-<n>


def _end_oom_cgroups() -> list[str]:
    """Remove the cgroup v1 memory cgroups tests/test_oom.py made that are left (below this process's own memory
    cgroup, where it makes them), killing what is in them; one line each for the report."""
    mine = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                 if "memory" in line.split(":", 2)[1].split(",")), None)
    parent = Path("/sys/fs/cgroup/memory") / (mine or "/").lstrip("/")
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(OOM_PREFIX))
    except OSError:
        return []
    lines = []
    for name in (n for n in names if _made_here_or_abandoned(n, OOM_PREFIX)):
        folder = parent / name
        held = remove_cgroup(folder)
        failed = " (could not be removed)" if folder.exists() else ""
        lines.append(f"memory cgroup {folder}: {f'processes {held}' if held else 'empty'}{failed}")
    return lines


def _session_roots(base: Path) -> list[str]:
    """The session's temp folders: pytest's (the workers' are below it) and, the same session seen through a
    symlink, its resolved path."""
    return sorted({str(base), str(base.resolve())})


def _processes_below(roots: list[str]) -> list[tuple[int, str]]:
    """Live processes (pid, command line) whose command line or DSCTL_HOME names a path below one of `roots`; not
    this session's process and what started it (`timeout 900 pytest --basetemp=...` names the root too)."""
    found = []
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if p.pid in own or p.status() == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(p.info["cmdline"] or []) + " " + (p.info["environ"] or {}).get("DSCTL_HOME", "")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(root in text for root in roots):
            found.append((p.pid, text.strip()[:200]))
    return found


def _mounts_below(roots: list[str]) -> list[str]:
    """Mount points below one of `roots` (from /proc/self/mounts, where a space in a path is written \\040)."""
    points = [line.split()[1].replace("\\040", " ") for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [m for m in points if any(m.startswith(root + "/") for root in roots)]


def _end_leftovers(roots: list[str]) -> None:
    """Kill what was found and unmount what is mounted, so a failed session leaves the machine clean."""
    for pid, _ in _processes_below(roots):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    for point in sorted(_mounts_below(roots), reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
