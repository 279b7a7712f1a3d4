"""Keeping a Google Cloud run going through what happens to it: lost SSH, stopped and preempted VMs.

A VM that stops answering SSH may be fine (the user's laptop lost its network, a VPN dropped)
or gone (a Spot preemption, a stop). dsctl asks Compute Engine instead of guessing: one list
call (per 500 VMs) every STATUS_EVERY_S, and again soon after a VM stops answering.

- A worker VM found stopped (TERMINATED, STOPPED, SUSPENDED, a TPU's PREEMPTED) is started
  again in the background. It keeps its internal address, so the trainers' tf.data clients,
  which wait for a lost worker's address, reconnect to the same worker once its process runs
  again at its old port. The elements it had in flight are lost (at-most-once, as when a local
  worker dies) and counted the same way. A fault-tolerant dispatcher's VM likewise: its
  journal is on its disk.
- A trainer VM found stopped, the VM of a dispatcher that is not fault-tolerant, or a VM
  deleted outside dsctl ends the run, saying which and why.
- A VM that is RUNNING but does not answer is an outage: nothing is decided about it while it
  lasts, the trainers' stall clock stops (`check` returns True), and the run fails, and is torn
  down, only once the outage has lasted gcp.outage_limit_s (10 minutes by default). Its start
  and end are events in the run's record.

The seconds each VM spent stopped (from when dsctl saw it stopped to when it ran again) are
kept per role, so a run is priced for the VM-hours it held.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..contract import EventSink
from ..state import Deployment, Node
from .errors import RemoteError, describe
from .state import gcp

STATUS_EVERY_S = 15.0  # list the run's VMs this often
STATUS_SOON_S = 3.0  # ... and this soon after a VM stops answering SSH
OUTAGE_EVENT_AFTER_S = 10.0  # a VM silent this long is an outage worth an event
STOPPED = frozenset({"STOPPING", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED", "PREEMPTED"})


@dataclass
class _Restore:
    node: Node
    since: float  # when dsctl saw its VM stopped (monotonic)
    future: Future  # -> the monotonic time the VM was RUNNING again


def who(node: Node) -> str:
    return "the dispatcher" if node.role == "dispatcher" else f"{node.role} {node.index}"


class Recovery:
    """Decides what a poll of a running deployment means; the provisioner acts on it.

    `list_statuses()` gives every VM's status by name (instances and TPU VMs); `restore(node)`
    starts a stopped VM, restarts its process, and returns when the VM was RUNNING again.
    """

    def __init__(self, *, list_statuses: Callable[[], dict[str, str]], restore: Callable[[Node], float],
                 outage_limit_s: float, clock: Callable[[], float] = time.monotonic, threads: int = 8):
        self._list = list_statuses
        self._restore = restore
        self.outage_limit_s = outage_limit_s
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dsctl-restore")
        self.statuses: dict[str, str] | None = None  # from the last list that worked
        self.api_error: str | None = None  # why the last list failed, if it did
        self._next_list = 0.0
        self._last_list = self._tried_at = -math.inf
        self._back_at: dict[str, float] = {}  # VM -> when it was brought back (a listing before that is stale)
        self._lost: set[str] = set()
        self._unlooked: set[str] = set()
        self._restoring: dict[str, _Restore] = {}
        self._outage_since: float | None = None  # an outage that has been announced
        self.stopped_s: dict[str, float] = {}  # role -> VM-seconds its VMs spent stopped

    def restoring(self, node: Node) -> bool:
        return gcp(node).vm.name in self._restoring

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one look ----------------------------------------------------------------------------------
    def check(self, dep: Deployment, unreachable: dict[str, float], events: EventSink) -> bool:
        """Act on the VMs' statuses and on `unreachable` (host -> since when); True while a trainer's VM cannot
        be reached (its progress is unknown, not stalled). Raises RemoteError when the run cannot go on."""
        now = self._clock()
        self._refresh(now, set(unreachable))
        self._finish_restores(now, events)
        for node in dep.nodes:
            if gcp(node).remote_pid and not gcp(node).vm.deleting:
                self._check_vm(node, now, events)
        restoring = {gcp(r.node).vm.host for r in self._restoring.values()}
        outage = {h: since for h, since in unreachable.items() if h not in restoring}
        self._check_outage(dep, outage, now, events)
        trainers = {gcp(n).vm.host for n in dep.by_role("trainer")}
        return any(h in trainers for h in outage)

    def _refresh(self, now: float, lost: set[str]) -> None:
        self._unlooked |= lost - self._lost  # went quiet since the last listing: look them up soon
        self._lost = lost
        if now < self._next_list and not (self._unlooked and now - self._tried_at >= STATUS_SOON_S):
            return
        self._next_list = now + STATUS_EVERY_S
        self._tried_at = now
        try:
            self.statuses = self._list()
            self._last_list = now
            self._unlooked = set()
            self.api_error = None
        except Exception as exc:  # noqa: BLE001 - the API is out of reach too (a laptop offline): decide nothing
            self.api_error = f"{type(exc).__name__}: {exc}"

    def _check_vm(self, node: Node, now: float, events: EventSink) -> None:
        state = gcp(node)
        name = state.vm.name
        if name in self._restoring or self.statuses is None or self._last_list <= self._back_at.get(name, -math.inf):
            return
        if name not in self.statuses:
            if state.launched_at is not None and self._last_list <= state.launched_at:
                return  # listed before this VM's process was started (a worker just added): not known yet
            raise RemoteError(f"{who(node)}'s VM {name} no longer exists: it was deleted outside dsctl (or preempted "
                              "with instanceTerminationAction DELETE), so the run cannot go on.")
        status = self.statuses[name]
        if status not in STOPPED:
            return
        what = f"{who(node)}'s VM {name} is {status} (a Spot preemption, host maintenance or a stop)"
        if node.role == "trainer":
            raise RemoteError(f"{what}. A trainer cannot go on without its VM, and this one has no checkpoint to "
                              "resume from, so the run ends and everything is deleted; use trainer.provisioning: "
                              "standard for trainers that must not be preempted.")
        if node.role == "dispatcher" and not state.fault_tolerant:
            raise RemoteError(f"{what}, and the job is not fault-tolerant, so its trainers cannot go on; set "
                              "service.fault_tolerant: true to have dsctl start its VM again and restart it from its "
                              "journal.")
        events("vm-stopped", f"{what}; starting it again (it keeps its internal address, {node.address})")
        self._restoring[name] = _Restore(node, now, self._pool.submit(self._restore, node))

    def _finish_restores(self, now: float, events: EventSink) -> None:
        for name, r in list(self._restoring.items()):
            if not r.future.done():
                continue
            del self._restoring[name]
            self._back_at[name] = now
            self._next_list = min(self._next_list, now + STATUS_SOON_S)  # see it RUNNING soon
            exc = r.future.exception()
            if exc is not None:
                raise RemoteError(f"{who(r.node)}'s VM {name} was stopped and could not be brought back: {exc}")
            running_at = r.future.result()
            stopped = max(running_at - r.since, 0.0)
            self.stopped_s[r.node.role] = self.stopped_s.get(r.node.role, 0.0) + stopped
            kind = "dispatcher-restarted" if r.node.role == "dispatcher" else "worker-restarted"
            events(kind, f"{who(r.node)} is back at {r.node.address}: its VM {name} ran again after {stopped:.0f} s "
                         f"stopped and its process was restarted {now - running_at:.0f} s later; what it had in flight "
                         "is lost")

    def _check_outage(self, dep: Deployment, outage: dict[str, float], now: float, events: EventSink) -> None:
        if not outage:
            if self._outage_since is not None:
                events("ssh-back", f"every VM answers SSH again, after an outage of {now - self._outage_since:.0f} s; "
                                   "what the trainers wrote meanwhile is read now")
                self._outage_since = None
            return
        first = min(outage.values())
        lasted = now - first
        names = _names(dep, outage)
        if self._outage_since is None and lasted >= OUTAGE_EVENT_AFTER_S:
            self._outage_since = first
            events("ssh-lost", f"{describe(len(outage), 'VM')} ({names}) have not answered SSH for {lasted:.0f} s; the "
                               "run goes on (its processes do not need SSH) and dsctl keeps reconnecting, up to "
                               f"gcp.outage_limit_s = {self.outage_limit_s:.0f} s")
        if lasted > self.outage_limit_s:
            api = (f"Compute Engine could not be asked either ({self.api_error})" if self.api_error else
                   "Compute Engine lists them as " + ", ".join(sorted({self.statuses.get(n, '?') for n in
                                                                       _instances(dep, outage)})) if self.statuses
                   else "their Compute Engine status is unknown")
            raise RemoteError(f"{describe(len(outage), 'VM')} ({names}) have not answered SSH for {lasted:.0f} s, more "
                              f"than gcp.outage_limit_s ({self.outage_limit_s:.0f} s); {api}. The run is ended and its "
                              "VMs deleted; raise gcp.outage_limit_s, or run detached (dsctl up --detach), for runs "
                              "that must outlive longer outages.")


def _instances(dep: Deployment, hosts: dict[str, float]) -> list[str]:
    return [gcp(n).vm.name for n in dep.nodes if gcp(n).vm.host in hosts]


def _names(dep: Deployment, hosts: dict[str, float], most: int = 4) -> str:
    names = sorted(set(_instances(dep, hosts))) or sorted(hosts)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
