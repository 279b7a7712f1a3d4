"""How a process ended, in words a user acts on: an exit code, a signal, or the kernel's out-of-memory killer.

An out-of-memory kill looks like any other SIGKILL from outside (exit status -9, or 137 from a shell), so it is named
as one only with evidence, and the evidence is said:
- the memory cgroup the process ran in (and each cgroup above it) counts the kills of its out-of-memory killer
  (`oom_kill` in memory.events on cgroup v2, in memory.oom_control on cgroup v1's memory controller). The counters
  are read when the process starts (`watch`), as it is gone when it is described and a count from before it started
  proves nothing; a count that rose while it ran is evidence.
- the kernel log names the process it killed (`Killed process <pid> (<name>)`, with the cgroup whose limit was
  hit), readable from /dev/kmsg where the kernel lets this user read it (root, or kernel.dmesg_restrict=0).
Neither may be readable (a container without its cgroup files, a user without the kernel log); the description
then says that a SIGKILL is how the kernel ends a process out of memory, and that it could not tell.

It sits with the specs, the lowest layer, because the entrypoint check (specs/entrypoints.py), the command runner
(runtime/command.py) and the launcher that forks dsctl's servers and trainers (runtime/launcher.py, whose words the
orchestrator reports for a trainer that failed) all describe exits with it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
KMSG = "/dev/kmsg"
KILLED = -signal.SIGKILL  # a child's exit status when SIGKILL ended it (subprocess, os.waitstatus_to_exitcode)
SHELL_KILLED = 128 + signal.SIGKILL  # what a shell reports for a command SIGKILL ended


@dataclass
class Watch:
    """A process's memory cgroups and their out-of-memory kill counts when it started, and when it started."""

    pid: int
    started: float = field(default_factory=time.monotonic)
    counters: dict[str, int] = field(default_factory=dict)  # cgroup folder -> oom_kill count


def watch(pid: int) -> Watch:
    """Read right after starting `pid`: its memory cgroups (its own and those above it) and their kill counts."""
    w = Watch(pid)
    for folder in _memory_cgroups(pid):
        count = _oom_kills(folder)
        if count is not None:
            w.counters[str(folder)] = count
    return w


def oom_evidence(pid: int | None, w: Watch | None = None) -> str | None:
    """What shows that the kernel's out-of-memory killer ended `pid` (once it has exited), or None."""
    found = []
    if w is not None:
        for folder, before in w.counters.items():
            after = _oom_kills(Path(folder))
            if after is not None and after > before:
                limit = _limit(Path(folder))
                found.append(f"memory cgroup {folder} counted {after - before} out-of-memory kill(s) while it ran"
                             f"{f' (its limit: {limit})' if limit else ''}")
    since = w.started if w is not None else None
    if pid is not None or since is not None:
        line = _kernel_log(pid, since)
        if line:
            said = "the kernel log says" if pid is not None else "the kernel log says, while it ran"
            found.append(f"{said}: {line!r}")
    return "; ".join(found) or None


@dataclass(frozen=True)
class Ending:
    """How a process ended, in two parts so a caller can put its own words between them ("... after 12 batches"):
    `how`, a verb phrase ("exited with code 3", "was killed by the kernel's out-of-memory killer (SIGKILL)"), and for
    a SIGKILL `why` dsctl says so (the evidence, what to do, or that it could not tell)."""

    how: str
    why: str = ""
    oom: bool = False  # the kernel's out-of-memory killer ended it, by the evidence

    def __str__(self) -> str:
        return f"{self.how}: {self.why}" if self.why else self.how


def judge(code: int, *, pid: int | None = None, watch: Watch | None = None, since: float | None = None) -> Ending:
    """How a process ended, with the evidence of an out-of-memory kill looked up: for a SIGKILL, in the cgroups
    `watch` read when the process started and in the kernel log for `pid` (or, with `since` alone, any kill since
    then: a time.monotonic() of this machine). With none of them (a process on another machine) it does not look,
    and says it could not tell. What every reader of an exit status calls: the entrypoint check, the command runner,
    the launcher that forks dsctl's servers and trainers."""
    if code not in (KILLED, SHELL_KILLED):
        return ending(code)
    if watch is None and since is not None:
        watch = Watch(pid if pid is not None else 0, started=since)
    if pid is None and watch is None:
        return ending(code, None, readable=False)
    return ending(code, oom_evidence(pid, watch))


def judge_lost(pid: int, watch: Watch) -> Ending | None:
    """A process whose exit status nobody can read (the parent that reaped it ended first): a SIGKILL by the kernel's
    out-of-memory killer when the kernel log names its pid since it was watched (a cgroup's count alone could be
    another process's kill), else None: how it ended is not known."""
    if _kernel_log(pid, watch.started) is None:
        return None
    return ending(KILLED, oom_evidence(pid, watch))


def describe(code: int, *, pid: int | None = None, watch: Watch | None = None, since: float | None = None) -> str:
    """`judge`, as one phrase."""
    return str(judge(code, pid=pid, watch=watch, since=since))


def describe_exit(code: int, evidence: str | None = None, *, readable: bool | None = None) -> str:
    """`ending`, as one phrase."""
    return str(ending(code, evidence, readable=readable))


def ending(code: int, evidence: str | None = None, *, readable: bool | None = None) -> Ending:
    """A process's end: "exited with code 3", "was killed by signal 15 (SIGTERM)", or, for a SIGKILL with evidence,
    "was killed by the kernel's out-of-memory killer (SIGKILL)" and the evidence. Without evidence, a SIGKILL says
    it may have been the out-of-memory killer and what could not be read (`readable`: whether the evidence was
    readable here; None: look)."""
    if code == KILLED or code == SHELL_KILLED:
        how = "was killed by signal 9 (SIGKILL)" if code == KILLED else "exited with code 137 (128 + SIGKILL)"
        if evidence:
            sig = "SIGKILL" if code == KILLED else "exit code 137: 128 + SIGKILL"
            return Ending(f"was killed by the kernel's out-of-memory killer ({sig})",
                          f"it ran out of memory. Evidence: {evidence}. Give it more memory (a larger machine, a higher "
                          "memory limit) or make it use less (smaller batches, buffers, shuffle buffers)", oom=True)
        if readable is None:
            readable = evidence_readable()
        why = ("neither its memory cgroup nor the kernel log recorded an out-of-memory kill, so something sent it "
               "SIGKILL (kill -9)" if readable else
               "the kernel's out-of-memory killer ends a process so, but neither its memory cgroup's counters nor the "
               "kernel log (/dev/kmsg) is readable here to tell, so it ran out of memory or was sent SIGKILL "
               "(kill -9)")
        return Ending(how, why)
    if code < 0 and -code in signal.valid_signals():
        return Ending(f"was killed by signal {-code} ({signal.Signals(-code).name})")
    return Ending(f"exited with code {code}")


def evidence_readable() -> bool:
    """Whether this process can read some evidence of out-of-memory kills: its memory cgroup's counter, or the
    kernel log."""
    if any(_oom_kills(f) is not None for f in _memory_cgroups(os.getpid())):
        return True
    try:
        os.close(os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


# -- cgroups ------------------------------------------------------------------------------------------------------
def _mounts() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(cgroup v1 memory mounts, cgroup v2 mounts), each as (root in the hierarchy, mount point)."""
    v1: list[tuple[str, str]] = []
    v2: list[tuple[str, str]] = []
    try:
        lines = (PROC / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return v1, v2
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, fs = left.split(), right.split()
        if len(parts) < 5 or len(fs) < 3:
            continue
        root, point = parts[3], parts[4].replace("\\040", " ")
        if fs[0] == "cgroup2":
            v2.append((root, point))
        elif fs[0] == "cgroup" and "memory" in fs[2].split(","):
            v1.append((root, point))
    return v1, v2


def _memory_cgroups(pid: int) -> list[Path]:
    """The folders of `pid`'s memory cgroups, its own first, then each one above it, within the mounts seen here."""
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return []
    v1, v2 = _mounts()
    out: list[Path] = []
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        mounts = v2 if hid == "0" and controllers == "" else v1 if "memory" in controllers.split(",") else []
        for root, point in mounts:
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            folder = Path(point + rel.rstrip("/"))
            base = Path(point)
            while folder.is_dir() and (folder == base or base in folder.parents):
                out.append(folder)
                if folder == base:
                    break
                folder = folder.parent
    return out


def _oom_kills(folder: Path) -> int | None:
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        try:
            text = (folder / name).read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        if m:
            return int(m.group(1))
    return None


def _limit(folder: Path) -> str | None:
    for name in ("memory.max", "memory.limit_in_bytes"):  # v2, v1
        try:
            text = (folder / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return f"{int(text) / (1 << 20):.0f} MiB"
    return None


# -- the kernel log -----------------------------------------------------------------------------------------------
def _kernel_log(pid: int | None, since: float | None) -> str | None:
    """The kernel's last line about killing `pid` for memory (any process, when pid is None) after `since` (a
    time.monotonic(), the log's own clock), or None when there is none or the log cannot be read."""
    if pid is None and since is None:
        return None
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    who = str(pid) if pid is not None else r"\d+"
    pattern = re.compile(rf"(Killed process {who} \(|oom-kill:.*\bpid={who},)")
    found = memcg = None
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records overwritten while reading; go on with the next
                continue
            if not record:
                break
            head, _, message = record.partition(";")
            fields = head.split(",")
            if since is not None and len(fields) > 2 and fields[2].isdigit() and int(fields[2]) / 1e6 < since - 1:
                continue
            message = message.split("\n", 1)[0]
            if pattern.search(message):
                if message.startswith("oom-kill:"):
                    m = re.search(r"oom_memcg=([^,]*)", message)
                    memcg = m.group(1) if m else memcg
                else:
                    found = message
    finally:
        os.close(fd)
    if found and memcg and memcg != "/":
        return f"{found} (the limit of memory cgroup {memcg})"
    return found
