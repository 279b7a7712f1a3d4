"""What happens when a dispatcher or worker dies: one policy, the same on every provider.

tf.data service clients wait for a lost worker's address forever, and for a lost dispatcher until
their 300 s timeout, so a server that exits must come back at its own address or the job ends:
- a worker is restarted at its address; the elements it had in flight are lost (at-most-once);
- a fault-tolerant dispatcher (service.fault_tolerant) is restarted from its journal at its
  address; any other dispatcher that exits fails the job at once, saying why;
- each server is restarted at most MAX_RESTARTS times; past that the job fails with its log's tail;
- every restart is an event in the run's record ("worker-restarted", "dispatcher-restarted").
The provider reports which servers exited (Provider.poll) and carries a restart out (Provider.restart);
how it does so (a taken port waited for, a stopped VM started again) is its own.
"""

from __future__ import annotations

from dsctl.provisioners import Deployment, EventSink, Node, Provider, ServerExit, TrainerState

from .outcome import RunFailed

MAX_RESTARTS = 5  # per server


def _who(node: Node) -> str:
    return "the dispatcher" if node.role == "dispatcher" else f"{node.role} {node.index}"


class Supervisor:
    """Polls a running deployment through its provider and applies the restart policy to what it reports."""

    def __init__(self, provider: Provider, dep: Deployment, fault_tolerant: bool, events: EventSink,
                 max_restarts: int = MAX_RESTARTS):
        self.provider, self.dep, self.events = provider, dep, events
        self.fault_tolerant = fault_tolerant
        self.max_restarts = max_restarts
        self.restarts: dict[tuple[str, int], int] = {}

    def poll(self) -> TrainerState:
        """One look at the deployment; exited servers are restarted (or the run fails); the trainers' state."""
        seen = self.provider.poll(self.dep, self.events)
        for exited in seen.exited:
            self._restart(exited)
        return seen.trainers

    def _restart(self, exited: ServerExit) -> None:
        node, code = exited.node, exited.code
        dispatcher = node.role == "dispatcher"
        if dispatcher and not self.fault_tolerant:
            raise RunFailed(f"the dispatcher exited (code {code}) and the job is not fault-tolerant, so its trainers "
                            "cannot go on; set service.fault_tolerant: true to have dsctl restart it from its journal. "
                            f"Its log ends with:\n{self.provider.log_tail(self.dep, node)}")
        key = (node.role, node.index)
        count = self.restarts[key] = self.restarts.get(key, 0) + 1
        if count > self.max_restarts:
            raise RunFailed(f"{_who(node)} died {count} times; giving up. Its log ends with:\n"
                            f"{self.provider.log_tail(self.dep, node)}")
        journal = " from its journal" if dispatcher else ""
        self.events("dispatcher-restarted" if dispatcher else "worker-restarted",
                    f"{_who(node)} exited (code {code}); restarting it at {node.address}{journal}")
        self.provider.restart(self.dep, node, self.events)
