"""What happens when a dispatcher or worker dies, a machine is lost, or the machines cannot be reached: one policy,
the same on every provider.

tf.data service clients wait for a lost worker's address forever, and for a lost dispatcher until
their 300 s timeout, so a server that exits must come back at its own address or the job ends:
- a worker is restarted at its address; the elements it had in flight are lost (at-most-once);
- a fault-tolerant dispatcher (service.fault_tolerant) is restarted from its journal at its
  address; any other dispatcher that exits fails the job at once, saying why;
- each server is restarted at most MAX_RESTARTS times, whether its process ended or its machine was lost;
  past that the job fails with its log's tail;
- every restart is an event in the run's record ("worker-restarted", "dispatcher-restarted").

Machines (Poll.lost, Poll.back): a server's machine found stopped (a Spot preemption, host maintenance, a stop) is
restarted as above, its machine started again by the provider ("vm-stopped" when it is found, "worker-restarted"
or "dispatcher-restarted" once it is back; the seconds it spent stopped are kept per role, so the run is priced for
the machine-hours it held). A trainer's stopped machine (no checkpoint to resume from), a non-fault-tolerant
dispatcher's, a machine deleted outside dsctl, or one that could not be brought back ends the run, saying which.

Outages (Poll.outage): machines that run but do not answer are waited for; the run goes on. One silent for
OUTAGE_EVENT_AFTER_S is an event ("ssh-lost"), and so is its end ("ssh-back"); past its limit (a spec field the
provider names, e.g. gcp.outage_limit_s) the run ends and is torn down.

The provider reports what it sees (Provider.poll) and carries a restart out (Provider.restart); how it does so (a
taken port waited for, a stopped VM started again) is its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from dsctl.provisioners import (
    Deployment,
    EventSink,
    MachineBack,
    MachineLost,
    Node,
    Outage,
    Provider,
    ServerExit,
    TrainerState,
)

from .outcome import RunFailed

MAX_RESTARTS = 5  # per server
OUTAGE_EVENT_AFTER_S = 10.0  # machines silent this long are an outage worth an event
OUTAGE_NAMES = 4  # machines an outage's messages name (then "and N more")


def _who(node: Node) -> str:
    return "the dispatcher" if node.role == "dispatcher" else f"{node.role} {node.index}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _names(outage: Outage) -> str:
    names = sorted(set(outage.machines))
    more = len(names) - OUTAGE_NAMES
    return ", ".join(names[:OUTAGE_NAMES]) + (f" and {more} more" if more > 0 else "")


class Supervisor:
    """Polls a running deployment through its provider and applies the restart policy to what it reports."""

    def __init__(self, provider: Provider, dep: Deployment, fault_tolerant: bool, events: EventSink,
                 max_restarts: int = MAX_RESTARTS, clock: Callable[[], float] = time.monotonic):
        self.provider, self.dep, self.events = provider, dep, events
        self.fault_tolerant = fault_tolerant
        self.max_restarts = max_restarts
        self.restarts: dict[tuple[str, int], int] = {}
        self.stopped_s: dict[str, float] = {}  # role -> machine-seconds its machines spent stopped
        self._clock = clock
        self._outage: Outage | None = None  # the outage announced ("ssh-lost"), until it ends

    def poll(self) -> TrainerState:
        """One look at the deployment; exited servers and lost machines are restarted (or the run fails); the
        trainers' state."""
        seen = self.provider.poll(self.dep, self.events)
        for back in seen.back:
            self._back(back)
        for lost in seen.lost:
            self._lost(lost)
        self._outage_seen(seen.outage)
        for exited in seen.exited:
            self._restart(exited)
        return replace(seen.trainers, stopped_s=dict(self.stopped_s))

    # -- servers whose process ended --------------------------------------------------------------------------------
    def _restart(self, exited: ServerExit) -> None:
        node, code = exited.node, exited.code
        dispatcher = node.role == "dispatcher"
        how = exited.why or f"exited (code {code})"
        if dispatcher and not self.fault_tolerant:
            raise RunFailed(f"the dispatcher {how} and the job is not fault-tolerant, so its trainers "
                            "cannot go on; set service.fault_tolerant: true to have dsctl restart it from its journal. "
                            f"Its log ends with:\n{self.provider.log_tail(self.dep, node)}")
        self._budget(node)
        journal = " from its journal" if dispatcher else ""
        self.events("dispatcher-restarted" if dispatcher else "worker-restarted",
                    f"{_who(node)} {how}; restarting it at {node.address}{journal}")
        self.provider.restart(self.dep, node, self.events)

    def _budget(self, node: Node) -> None:
        """One more restart of this server, or the run fails past MAX_RESTARTS."""
        key = (node.role, node.index)
        count = self.restarts[key] = self.restarts.get(key, 0) + 1
        if count > self.max_restarts:
            raise RunFailed(f"{_who(node)} died {count} times; giving up. Its log ends with:\n"
                            f"{self.provider.log_tail(self.dep, node)}")

    # -- machines ---------------------------------------------------------------------------------------------------
    def _lost(self, lost: MachineLost) -> None:
        node = lost.node
        if lost.status is None:
            how = lost.gone_how or "it was removed outside dsctl"
            raise RunFailed(f"{_who(node)}'s {lost.machine} no longer exists: {how}, so the run cannot go on.")
        what = f"{_who(node)}'s {lost.machine} is {lost.status} (a Spot preemption, host maintenance or a stop)"
        if node.role == "trainer":
            raise RunFailed(f"{what}. A trainer cannot go on without its machine, and this one has no checkpoint to "
                            "resume from, so the run ends and everything is deleted; use trainer.provisioning: "
                            "standard for trainers that must not be preempted.")
        if node.role == "dispatcher" and not self.fault_tolerant:
            raise RunFailed(f"{what}, and the job is not fault-tolerant, so its trainers cannot go on; set "
                            "service.fault_tolerant: true to have dsctl start its machine again and restart it from "
                            "its journal.")
        self._budget(node)
        self.events("vm-stopped", f"{what}; starting it again (it keeps its address, {node.address})")
        self.provider.restart(self.dep, node, self.events)

    def _back(self, back: MachineBack) -> None:
        node = back.node
        if back.error is not None:
            raise RunFailed(f"{_who(node)}'s {back.machine} was stopped and could not be brought back: {back.error}")
        self.stopped_s[node.role] = self.stopped_s.get(node.role, 0.0) + back.stopped_s
        self.events("dispatcher-restarted" if node.role == "dispatcher" else "worker-restarted",
                    f"{_who(node)} is back at {node.address}: its {back.machine} ran again after {back.stopped_s:.0f} s "
                    f"stopped and its process was restarted {back.relaunch_s:.0f} s later; what it had in flight is "
                    "lost")

    # -- outages ----------------------------------------------------------------------------------------------------
    def _outage_seen(self, outage: Outage | None) -> None:
        now = self._clock()
        if outage is None:
            if self._outage is not None:
                o, self._outage = self._outage, None
                self.events("ssh-back", f"every {o.noun} answers {o.channel} again, after an outage of "
                                        f"{now - o.since:.0f} s; what the trainers wrote meanwhile is read now")
            return
        lasted = now - outage.since
        silent = f"{_count(len(outage.machines), outage.noun)} ({_names(outage)}) have not answered " \
                 f"{outage.channel} for {lasted:.0f} s"
        if self._outage is None and lasted >= OUTAGE_EVENT_AFTER_S:
            self._outage = outage
            self.events("ssh-lost", f"{silent}; the run goes on (its processes do not need {outage.channel}) and dsctl "
                                    f"keeps reconnecting, up to {outage.limit_field} = {outage.limit_s:.0f} s")
        if lasted > outage.limit_s:
            listed = f"; {outage.listed}" if outage.listed else ""
            raise RunFailed(f"{silent}, more than {outage.limit_field} ({outage.limit_s:.0f} s){listed}. The run is "
                            f"ended and its {outage.noun}s deleted; raise {outage.limit_field}, or run detached (dsctl "
                            "up --detach), for runs that must outlive longer outages.")
