"""Containment: every process dsctl starts for a run, or for checking a spec, in one cgroup the kernel tracks.

A process group is not a container: a process that calls setsid (a daemon, a double fork) leaves it,
so stopping a run's process groups leaves such a process running, unknown to `dsctl status` and
`dsctl down`. A cgroup v2 cgroup is: a process is in it from the moment it is forked until it exits,
whatever it does with sessions and groups, and everything in it can be listed (`cgroup.procs`) and
killed at once (`cgroup.kill`). So the local provider makes one per deployment (`dsctl-run-<run id>`)
and starts its launcher inside it (everything the launcher forks is inside too); the spec's
entrypoint check gets one per check (`dsctl-check-<pid>-<n>`, orchestrator/preflight.py). Ending a
container kills what is left in it and removes it; its path is in the deployment's state file, so
`dsctl down` in a new process (after `kill -9` of `dsctl up`) ends it the same way, and `dsctl status`
counts what it holds (`contents`: the daemons among it named).

Why not a PID namespace of the run: inside one, a process sees its own pid numbered in the
namespace while /proc is the machine's, so `os.getpid()` and `psutil.Process()` in the servers,
trainers and the user's code would name other processes (the ready files carry pids the provider
checks); a new /proc would need a mount namespace too. A cgroup changes nothing the processes see.

The cgroup is made below this process's own (from /proc/self/cgroup, on the cgroup2 mount found in
/proc/self/mountinfo), which is where the machine lets it be made: root anywhere, anyone else in a
subtree delegated to them (`systemd-run --user --scope -p Delegate=yes dsctl ...`). Where none can
be made (no cgroup v2, no permission) dsctl goes on with process groups and says so (the run's
event `not-contained`), unless DSCTL_LOCAL_CONTAINMENT=require; `none` never makes one. The runner of
a user's command (runtime/command.py) is also a child subreaper: a second line of defence either way.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsctl.errors import DsctlError
from dsctl.specs import SpecError

from .contract import Contents

CONTAINMENT_ENV = "DSCTL_LOCAL_CONTAINMENT"
CONTAINMENT_MODES = ("auto", "none", "require")
PREFIX = "dsctl-"
RUN_PREFIX = "dsctl-run-"
CHECK_PREFIX = "dsctl-check-"
NAME_MAX = 255
END_TIMEOUT_S = 10.0  # for the kernel to kill what is in a container (a process in uninterruptible sleep can take long)
STRAY_GRACE_S = 2.0  # a daemon left in a container gets SIGTERM and this long before SIGKILL


class NotContained(DsctlError):
    """DSCTL_LOCAL_CONTAINMENT=require where no container can be made, or an unknown value of it."""


def mode() -> str:
    """auto (default: a cgroup where the machine allows it, else process groups and a warning), none, or require."""
    value = (os.environ.get(CONTAINMENT_ENV) or "auto").strip().lower()
    if value not in CONTAINMENT_MODES:
        raise SpecError(f"the environment variable {CONTAINMENT_ENV} is {os.environ.get(CONTAINMENT_ENV)!r}; use "
                           "auto (the default: every process dsctl starts for a run in one cgroup where this machine "
                           "allows it), none (process groups only: a daemon a pipeline starts may outlive the run) or "
                           "require (refuse to run without a cgroup).")
    return value


@dataclass
class Containment:
    """What a deployment's processes are in, as its state file keeps it: a cgroup's path, or why there is none."""

    contained: bool
    cgroup: str | None = None
    reason: str | None = None


# -- where cgroups can be made -------------------------------------------------------------------------------------

def _unescape(field: str) -> str:
    """A path from /proc/self/mountinfo, where space, tab, newline and backslash are written as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def own_cgroup_dir(mountinfo: str, cgroup: str) -> tuple[Path | None, str]:
    """This process's own cgroup v2 folder, from the text of /proc/self/mountinfo and /proc/self/cgroup;
    (None, why not) where there is none to make cgroups below."""
    own = next((line[3:] for line in cgroup.splitlines() if line.startswith("0::")), None)
    if own is None:
        return None, "this machine has no cgroup v2 hierarchy (only cgroup v1)"
    own = own.strip()
    if own.endswith(" (deleted)") or not own.startswith("/"):
        return None, f"this process's cgroup ({own}) cannot be used"
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep or not tail.startswith("cgroup2 "):
            continue
        fields = head.split()
        if len(fields) >= 5:
            mounts.append((_unescape(fields[3]), _unescape(fields[4]), fields[5] if len(fields) > 5 else ""))
    if not mounts:
        return None, "no cgroup v2 file system is mounted (cgroup2 is not in /proc/self/mountinfo)"
    for root, point, options in mounts:
        if own == root or own.startswith(root.rstrip("/") + "/"):
            if options.split(",")[0] == "ro":
                return None, f"the cgroup v2 file system at {point} is mounted read-only"
            return Path(point) / own[len(root.rstrip("/")):].lstrip("/"), ""
    return None, f"this process's cgroup ({own}) is outside every cgroup v2 mount this process sees"


def _own_cgroup_dir() -> tuple[Path | None, str]:
    try:
        return own_cgroup_dir(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError as exc:
        return None, f"/proc cannot be read ({exc.strerror})"


def cgroup_name(prefix: str, key: str) -> str:
    """A folder name for a cgroup: the prefix and `key` in letters a cgroup name may have, cut (with a hash of the
    whole key) to the longest name a folder may have."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)
    name = prefix + safe
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{name[:NAME_MAX - len(digest) - 1]}-{digest}"


def _why(exc: OSError, what: str, where: Path) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{what} in {where} is not permitted (not root, and that cgroup is not delegated to you; "
                f"`systemd-run --user --scope -p Delegate=yes dsctl ...` runs dsctl in one that is)")
    if exc.errno == errno.EROFS:
        return f"{what} in {where} is refused: the cgroup file system is read-only here"
    return f"{what} in {where} failed: {exc.strerror}"


# -- one container -------------------------------------------------------------------------------------------------

class Cgroup:
    """One cgroup v2 folder: processes join it, are listed in it, and are ended with it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Cgroup({str(self.path)!r})"

    # Made, and proved usable, before anything is started in it.
    @classmethod
    def make(cls, name: str) -> tuple[Cgroup | None, str]:
        """A new cgroup `name` below this process's own, that a child can join; (None, why not) where it cannot."""
        parent, why = _own_cgroup_dir()
        if parent is None:
            return None, why
        return cls.make_at(parent / name)

    @classmethod
    def make_at(cls, path: Path) -> tuple[Cgroup | None, str]:
        """The cgroup at `path` (made if missing), once a child has joined it; (None, why not) where it cannot."""
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            return None, _why(exc, "making a cgroup", path.parent)
        group = cls(path)
        code = group._probe()
        if code:
            group.remove()
            return None, _why(OSError(code, os.strerror(code)), "moving a process into a cgroup", path.parent)
        return group, ""

    def _probe(self) -> int:
        """Whether a process may join (a delegated subtree needs write access to more than the folder): a forked
        child tries and exits; its errno, or 0."""
        procs = str(self.path / "cgroup.procs").encode()
        pid = os.fork()
        if pid == 0:  # only system calls here: this process may have threads
            code = 0
            try:
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError as exc:
                code = exc.errno or errno.EPERM
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def joiner(self) -> Callable[[], None]:
        """What a child runs between fork and exec (Popen's preexec_fn) to be in this cgroup from its first
        instruction: everything it then forks is inside from birth, and no window lets a fork escape."""
        procs = str(self.path / "cgroup.procs").encode()

        def join() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

        return join

    # What it holds.
    def exists(self) -> bool:
        return (self.path / "cgroup.procs").exists()

    def pids(self) -> list[int]:
        """Every process in it and in any cgroup below it (a nested run's)."""
        out: list[int] = []
        for folder, _dirs, _files in os.walk(self.path):
            try:
                text = (Path(folder) / "cgroup.procs").read_text()
            except OSError:
                continue
            out += [int(p) for p in text.split()]
        return out

    def populated(self) -> bool:
        """Whether any process is in it or below it (cgroup.events says it at once; pids() where it cannot)."""
        try:
            for line in (self.path / "cgroup.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() == "1"
        except OSError:
            if not self.exists():
                return False
        return bool(self.pids())

    def describe(self, pids: list[int] | None = None, limit: int = 5) -> list[str]:
        """What runs in it, as `pid N (command)`, for an event."""
        out = []
        for pid in (self.pids() if pids is None else pids)[:limit]:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            out.append(f"pid {pid} ({cmd[:120] or '?'})")
        return out

    def holds_this_process(self) -> bool:
        """Whether this process is in it or in a cgroup below it."""
        own, _ = _own_cgroup_dir()
        return own is not None and (own == self.path or self.path in own.parents)

    # Its end.
    def kill(self) -> None:
        """SIGKILL everything in it and below it: cgroup.kill (Linux 5.14+), else each process it lists, until none."""
        try:
            fd = os.open(str(self.path / "cgroup.kill"), os.O_WRONLY)
        except FileNotFoundError:
            if not self.exists():
                return
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)

    def end(self, timeout_s: float = END_TIMEOUT_S, grace_s: float = 0.0,
            reap: Callable[[], None] = lambda: None) -> list[str]:
        """Kill what is left in it (SIGTERM and `grace_s` first, when given), wait until it is empty, and remove
        it and the cgroups below it. Returns what was still running in it, described. `reap` collects the exit
        status of killed processes that are this process's children (a zombie keeps nothing, but a tidy end).
        TimeoutError if it is not empty after `timeout_s` (a process stuck in the kernel); it is left in place. An
        OSError (EBUSY), touching nothing, when this process is in it: ending it would end the command doing so."""
        if not self.exists():
            return []
        if self.holds_this_process():
            raise OSError(errno.EBUSY, f"this dsctl command runs inside {self.path} (it was started by one of the run's "
                                       "own processes), and ending that cgroup would end it too; run it from outside "
                                       "the run")
        left = self.pids()
        described = self.describe(left, limit=len(left))
        if left and grace_s > 0:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace_s
            while self.populated() and time.monotonic() < deadline:
                reap()
                time.sleep(0.02)
        deadline = time.monotonic() + timeout_s
        while self.populated():
            self.kill()
            reap()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the processes in cgroup {self.path} did not end within {timeout_s:.0f} s of "
                                   f"SIGKILL: {'; '.join(self.describe()) or 'none listed'}")
            time.sleep(0.02)
        reap()
        self.remove()
        return described

    def remove(self) -> None:
        """Remove the (empty) cgroup and those below it, deepest first; one that is gone already is fine."""
        for folder, _dirs, _files in sorted(os.walk(self.path), key=lambda w: -len(w[0])):
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.05)  # the kernel can lag a moment behind the last exit
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    pass


# -- a run's container, as the local provider and `dsctl status` use it ----------------------------------------------

def plan_run(run_id: str) -> Containment:
    """Where a new run's cgroup is to be (by DSCTL_LOCAL_CONTAINMENT), or why it has none, before it is made: the
    caller records this first, so a `dsctl up` killed right after making it leaves nothing `dsctl down` misses."""
    how = mode()
    if how == "none":
        return Containment(contained=False, reason=f"{CONTAINMENT_ENV}=none")
    parent, why = _own_cgroup_dir()
    if parent is None:
        return _refused(how, why)
    return Containment(contained=True, cgroup=str(parent / cgroup_name(RUN_PREFIX, run_id)))


def make_run(planned: Containment) -> tuple[Containment, Cgroup | None]:
    """The planned cgroup made and proved joinable; else (not contained, why) under auto, NotContained under
    require."""
    if not planned.contained or not planned.cgroup:
        return planned, None
    group, why = Cgroup.make_at(Path(planned.cgroup))
    if group is None:
        return _refused(mode(), why), None
    return planned, group


def _refused(how: str, why: str) -> Containment:
    if how == "require":
        raise NotContained(f"{CONTAINMENT_ENV}=require, but this machine does not let dsctl put the run's processes "
                           f"in a cgroup of their own: {why}. Run where it can (as root, or in a delegated cgroup), or "
                           f"set {CONTAINMENT_ENV}=auto to run with process groups only.")
    return Containment(contained=False, reason=why)


def not_contained_warning(reason: str | None) -> str:
    return ("warning: the run's processes are stopped by process group only, so a process one of them starts in a "
            "session of its own (a daemon: setsid, a double fork) is not stopped by the run's teardown nor by "
            f"`dsctl down`, and `dsctl status` does not count it. No cgroup for the run: {reason or 'unknown'}.")


def container_of(state: object) -> Cgroup | None:
    """The cgroup a provider's deployment state names (its `container`), if it has one."""
    containment = getattr(state, "container", None)
    if isinstance(containment, Containment) and containment.contained and containment.cgroup:
        return Cgroup(containment.cgroup)
    return None


def contents(group: Cgroup, known_sessions: set[int]) -> Contents:
    """What `group` holds now, for `dsctl status`: every process counted, and those outside the sessions of the
    deployment's known processes (each server, trainer and the launcher leads a session of its own, and what they
    start stays in it unless it makes its own: a daemon) described, so the user sees what `dsctl down` will end."""
    pids = group.pids() if group.exists() else []
    others = [pid for pid in pids if _session(pid) not in known_sessions]
    return Contents(container=str(group.path), processes=len(pids), others=group.describe(others, limit=len(others)))


def _session(pid: int) -> int | None:
    """The session `pid` is in; None when it has exited meanwhile."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def find_run_cgroup(run_id: str) -> Cgroup | None:
    """A run's cgroup found by its name alone (its state file unreadable): below this process's own cgroup first,
    then anywhere on the cgroup2 mount, a few levels deep."""
    name = cgroup_name(RUN_PREFIX, run_id)
    own, _ = _own_cgroup_dir()
    if own is None:
        return None
    if (own / name / "cgroup.procs").exists():
        return Cgroup(own / name)
    mount, _ = own_cgroup_dir(Path("/proc/self/mountinfo").read_text(), "0::/\n")
    for folder, dirs, _files in os.walk(mount or own):
        if name in dirs:
            return Cgroup(Path(folder) / name)
        if folder.count("/") - str(mount or own).count("/") >= 6:
            dirs.clear()
    return None


# -- a container for one command: the entrypoint check ----------------------------------------------------------------

_checks = 0


def for_check() -> tuple[Cgroup | None, str]:
    """A cgroup for one entrypoint check (`dsctl-check-<this pid>-<n>`), or (None, why not) under auto (NotContained
    under require; (None, '') under none). Containers of checks whose dsctl was killed mid-check are ended first."""
    global _checks
    how = mode()
    if how == "none":
        return None, ""
    parent, why = _own_cgroup_dir()
    group = None
    if parent is not None:
        end_abandoned_checks(parent)
        _checks += 1
        group, why = Cgroup.make_at(parent / f"{CHECK_PREFIX}{os.getpid()}-{_checks}")
    if group is None and how == "require":
        raise NotContained(f"{CONTAINMENT_ENV}=require, but this machine does not let dsctl put the process that "
                           f"runs your pipeline's code (the entrypoint check, dsctl profile) in a cgroup of its own: "
                           f"{why}. Run where it can (as root, or in a delegated cgroup), or set {CONTAINMENT_ENV}=auto.")
    return group, why


PR_SET_PDEATHSIG = 1


def start_contained(argv: list[str], on_uncontained: Callable[[str], None] = lambda why: None,
                    **popen: Any) -> tuple[subprocess.Popen, Cgroup | None]:
    """Start `argv` (a child that runs the user's code: the entrypoint check, the profiling process) in a cgroup of
    its own (for_check), in its own session, killed by the kernel if dsctl dies (a parent death signal): (the
    process, its cgroup or None). The caller ends both with `end_contained`, whatever happens. Where no cgroup can
    be made: its process group only, after `on_uncontained(why)`."""
    import ctypes

    group, why = for_check()
    if group is None and why:
        on_uncontained(why)
    join = group.joiner() if group is not None else None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def before_exec() -> None:  # in the child, between fork and exec: system calls only
        if join is not None:
            join()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # dsctl died before the parent death signal was set
            os._exit(1)

    try:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=before_exec, **popen), group
    except BaseException:
        if group is not None:
            group.end()
        raise


def run_contained(argv: list[str], limit_s: float, on_uncontained: Callable[[str], None] = lambda why: None
                  ) -> tuple[int | None, bool]:
    """Run `argv` (the entrypoint check's child: stdin, stdout, stderr the null device) for at most `limit_s`
    seconds in a cgroup of its own, then end it and everything it started, daemons included, whatever happens
    (Ctrl-C, a signal that ends dsctl as Ctrl-C does). The child is also killed by the kernel if dsctl is (a parent
    death signal). Where no cgroup can be made, its process group only, after `on_uncontained(why)` (not under
    DSCTL_LOCAL_CONTAINMENT=none; NotContained under require). (exit code, whether it passed the limit)."""
    proc: subprocess.Popen | None = None
    group: Cgroup | None = None
    timed_out = False
    try:
        proc, group = start_contained(argv, on_uncontained, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        end_contained(proc, group)
    assert proc is not None, "Popen returned or raised"
    return proc.returncode, timed_out


def end_contained(proc: subprocess.Popen | None, group: Cgroup | None) -> None:
    """End a child `start_contained` started and everything it started: its process group at once (its own
    session), then its cgroup (daemons that left the group). Either may be None (a start that failed)."""
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    if group is not None:
        group.end()


def end_abandoned_checks(parent: Path) -> list[str]:
    """End the check containers below `parent` whose dsctl process is gone (killed while it checked); what ran."""
    ended: list[str] = []
    try:
        names = [e.name for e in os.scandir(parent) if e.is_dir() and e.name.startswith(CHECK_PREFIX)]
    except OSError:
        return ended
    for name in names:
        owner = name[len(CHECK_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            try:
                ended += Cgroup(parent / name).end()
            except (OSError, TimeoutError):
                continue
    return ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for this purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def leftover_cgroups(under: Path | None = None) -> list[Path]:
    """Every dsctl cgroup below `under` (default: the whole cgroup2 mount this process sees), for a check that a
    test session left none."""
    if under is None:
        mount, _ = own_cgroup_dir(_read("/proc/self/mountinfo"), "0::/\n")
        if mount is None:
            return []
        under = mount
    out = []
    for folder, dirs, _files in os.walk(under):
        for d in list(dirs):
            if d.startswith(PREFIX):
                out.append(Path(folder) / d)
                dirs.remove(d)  # what is below one of ours is ours too
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
