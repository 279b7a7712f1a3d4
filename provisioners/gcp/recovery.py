"""What becomes of a Google Cloud run's VMs, as its poll reports it: lost SSH, stopped and deleted VMs; and a stopped
VM brought back when the supervisor has its node restarted.

A VM that stops answering SSH may be fine (the user's laptop lost its network, a VPN dropped)
or gone (a Spot preemption, a stop). dsctl asks Compute Engine instead of guessing: one list
call (per 500 VMs) every STATUS_EVERY_S, and again soon after a VM stops answering.

What it finds goes into the poll, typed (provisioners/contract.py); what that means for the run (which losses end
it, the restart budget, how long an outage may last, and the events) is decided above the provider, in
orchestrator/supervision.py, the same for every provider:

- A VM found stopped (TERMINATED, STOPPED, SUSPENDED, a TPU's PREEMPTED) is a MachineLost with
  its status, and one the listing no longer has (deleted outside dsctl) a MachineLost without.
  When the supervisor has its node restarted, `bring_back` starts the VM again in the background
  (restore.py). It keeps its internal address, so the trainers' tf.data clients, which wait for
  a lost worker's address, reconnect to the same worker once its process runs again at its old
  port; a fault-tolerant dispatcher's journal is on its disk. The restore's end is a MachineBack:
  how long the VM was stopped (from when dsctl saw it stopped to when it ran again), or why it
  could not be brought back.
- VMs that are RUNNING but do not answer are an Outage: since when, which VMs, what Compute
  Engine lists them as, and the limit gcp.outage_limit_s. Their processes are not judged while
  it lasts (`unseen`), and when a trainer's VM is among them the trainers are `blind`: no news
  from them is not a stall.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..contract import MachineBack, MachineLost, Outage
from ..state import Deployment, Node
from .state import gcp

STATUS_EVERY_S = 15.0  # list the run's VMs this often
STATUS_SOON_S = 3.0  # ... and this soon after a VM stops answering SSH
STOPPED = frozenset({"STOPPING", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED", "PREEMPTED"})
GONE_HOW = "it was deleted outside dsctl (or preempted with instanceTerminationAction DELETE)"
LIMIT_FIELD = "gcp.outage_limit_s"


@dataclass
class _Restore:
    node: Node
    since: float  # when dsctl saw its VM stopped (monotonic)
    future: Future  # -> the monotonic time the VM was RUNNING again


@dataclass
class Look:
    """What one look at the run's VMs found, for the provider's poll."""

    lost: list[MachineLost]
    back: list[MachineBack]
    outage: Outage | None
    unseen: set[str | None]  # hosts whose processes are not judged now: out of reach, stopped, being brought back
    blind: bool  # a trainer's VM is out of reach


def _machine(node: Node) -> str:
    return f"VM {gcp(node).vm.name}"


class Recovery:
    """Reports what Compute Engine and the watcher's reach say of a running deployment's VMs; brings a stopped one
    back when asked.

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
        self._quiet: set[str] = set()
        self._unlooked: set[str] = set()
        self._restoring: dict[str, _Restore] = {}
        self._lost: dict[str, float] = {}  # VM -> when it was found stopped, as the last look reported it

    def restoring(self, node: Node) -> bool:
        return gcp(node).vm.name in self._restoring

    def lost(self, node: Node) -> bool:
        """Whether the last look reported this node's VM stopped (and it is not being brought back yet)."""
        return gcp(node).vm.name in self._lost

    def bring_back(self, node: Node) -> None:
        """Start the node's stopped VM again and restart its process, in the background; the next looks report how
        it went (MachineBack)."""
        name = gcp(node).vm.name
        since = self._lost.pop(name, self._clock())
        self._restoring[name] = _Restore(node, since, self._pool.submit(self._restore, node))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one look ----------------------------------------------------------------------------------
    def look(self, dep: Deployment, unreachable: dict[str, float]) -> Look:
        """What the VMs' statuses and `unreachable` (host -> since when it has not answered) say now."""
        now = self._clock()
        self._refresh(now, set(unreachable))
        back = self._finish_restores(now)
        lost = []
        for node in dep.nodes:
            if gcp(node).remote_pid and not gcp(node).vm.deleting:
                found = self._check_vm(node)
                if found is not None:
                    lost.append(found)
        self._lost = {gcp(m.node).vm.name: self._lost.get(gcp(m.node).vm.name, now) for m in lost
                      if m.status is not None}
        away: set[str | None] = {gcp(n).vm.host for n in dep.nodes if self.restoring(n)}
        away |= {gcp(m.node).vm.host for m in lost}
        outage = {h: since for h, since in unreachable.items() if h not in away}
        trainers = {gcp(n).vm.host for n in dep.by_role("trainer")}
        return Look(lost=lost, back=back, outage=self._outage(dep, outage), unseen=away | set(unreachable),
                    blind=any(h in trainers for h in outage))

    def _refresh(self, now: float, quiet: set[str]) -> None:
        self._unlooked |= quiet - self._quiet  # went quiet since the last listing: look them up soon
        self._quiet = quiet
        if now < self._next_list and not (self._unlooked and now - self._tried_at >= STATUS_SOON_S):
            return
        self._next_list = now + STATUS_EVERY_S
        self._tried_at = now
        try:
            self.statuses = self._list()
            self._last_list = now
            self._unlooked = set()
            self.api_error = None
        except Exception as exc:  # noqa: BLE001 - the API is out of reach too (a laptop offline): report nothing new
            self.api_error = f"{type(exc).__name__}: {exc}"

    def _check_vm(self, node: Node) -> MachineLost | None:
        state = gcp(node)
        name = state.vm.name
        if name in self._restoring or self.statuses is None or self._last_list <= self._back_at.get(name, -math.inf):
            return None
        if name not in self.statuses:
            if state.launched_at is not None and self._last_list <= state.launched_at:
                return None  # listed before this VM's process was started (a worker just added): not known yet
            return MachineLost(node, _machine(node), None, gone_how=GONE_HOW)
        status = self.statuses[name]
        return MachineLost(node, _machine(node), status) if status in STOPPED else None

    def _finish_restores(self, now: float) -> list[MachineBack]:
        out = []
        for name, r in list(self._restoring.items()):
            if not r.future.done():
                continue
            del self._restoring[name]
            self._back_at[name] = now
            self._next_list = min(self._next_list, now + STATUS_SOON_S)  # see it RUNNING soon
            exc = r.future.exception()
            if exc is not None:
                out.append(MachineBack(r.node, _machine(r.node), error=str(exc)))
                continue
            running_at = r.future.result()
            out.append(MachineBack(r.node, _machine(r.node), stopped_s=max(running_at - r.since, 0.0),
                                   relaunch_s=max(now - running_at, 0.0)))
        return out

    def _outage(self, dep: Deployment, hosts: dict[str, float]) -> Outage | None:
        if not hosts:
            return None
        on: dict[str, str] = {}
        for n in dep.nodes:
            on.setdefault(gcp(n).vm.host or "", gcp(n).vm.name)
        if self.api_error:
            listed = f"Compute Engine could not be asked either ({self.api_error})"
        elif self.statuses:
            listed = "Compute Engine lists them as " + ", ".join(sorted({self.statuses.get(on[h], "?")
                                                                         for h in hosts if h in on}))
        else:
            listed = "their Compute Engine status is unknown"
        return Outage(since=min(hosts.values()), machines=[on.get(h, h) for h in hosts], limit_s=self.outage_limit_s,
                      limit_field=LIMIT_FIELD, noun="VM", channel="SSH", listed=listed)
