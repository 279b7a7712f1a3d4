"""The one supervision policy (orchestrator/supervision.py), driven through a fake provider whose poll reports the
test writes: the restart budget, the dispatcher's fault tolerance, lost machines and outages, and the events each
records. No processes, no clock but the test's: what holds here holds on every provider."""

from __future__ import annotations

import pytest

from dsctl.orchestrator.outcome import RunFailed
from dsctl.orchestrator.supervision import MAX_RESTARTS, OUTAGE_EVENT_AFTER_S, Supervisor
from dsctl.provisioners import (
    Deployment,
    MachineBack,
    MachineLost,
    Node,
    Outage,
    Poll,
    ServerExit,
    TrainerState,
)


class Clock:
    def __init__(self):
        self.now = 5000.0

    def __call__(self):
        return self.now


class FakeProvider:
    """The contract's poll, restart and log_tail: each poll returns the next report the test queued (none: the
    trainer runs and nothing happened); restarts are only written down."""

    name = "fake"

    def __init__(self):
        self.reports: list[Poll] = []
        self.restarted: list[tuple[str, int]] = []

    def report(self, blind: bool = False, **found) -> None:
        self.reports.append(Poll(TrainerState(running=[0], exit_codes={}, blind=blind), **found))

    def poll(self, dep, events) -> Poll:
        return self.reports.pop(0) if self.reports else Poll(TrainerState(running=[0], exit_codes={}))

    def restart(self, dep, node, events) -> None:
        self.restarted.append((node.role, node.index))

    def log_tail(self, dep, node) -> str:
        return f"{node.role}-{node.index}: Check failed: out of file descriptors"


class Run:
    def __init__(self, fault_tolerant: bool = False):
        self.dep = Deployment(run_id="r", provider="fake", run_dir="/nonexistent")
        for role, i in (("dispatcher", 0), ("worker", 0), ("worker", 1), ("trainer", 0)):
            self.dep.nodes.append(Node(role=role, index=i, address=f"10.0.0.{len(self.dep.nodes) + 2}:5051"))
        self.provider, self.clock, self.events = FakeProvider(), Clock(), []
        self.supervisor = Supervisor(self.provider, self.dep, fault_tolerant,  # type: ignore[arg-type]
                                     lambda kind, message: self.events.append((kind, message)), clock=self.clock)

    def node(self, role: str, index: int = 0) -> Node:
        return next(n for n in self.dep.nodes if (n.role, n.index) == (role, index))

    def poll(self, advance: float = 1.0) -> TrainerState:
        self.clock.now += advance
        return self.supervisor.poll()

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


def stopped(node: Node, status: str = "TERMINATED") -> MachineLost:
    return MachineLost(node, f"VM vm-{node.role}-{node.index}", status)


def outage(since: float, machines: list[str], limit_s: float = 600.0) -> Outage:
    return Outage(since=since, machines=machines, limit_s=limit_s, limit_field="gcp.outage_limit_s", noun="VM",
                  channel="SSH", listed="Compute Engine lists them as RUNNING")


# -- servers whose process ended --------------------------------------------------------------------------------------
def test_a_worker_is_restarted_up_to_the_budget_then_the_run_fails_with_its_logs_tail():
    run = Run()
    worker = run.node("worker", 1)
    for _ in range(MAX_RESTARTS):
        run.provider.report(exited=[ServerExit(worker, -9)])
        run.poll()
    assert run.provider.restarted == [("worker", 1)] * MAX_RESTARTS
    assert run.kinds() == ["worker-restarted"] * MAX_RESTARTS
    assert run.events[0][1] == "worker 1 exited (code -9); restarting it at 10.0.0.4:5051"
    run.provider.report(exited=[ServerExit(worker, -9)])
    with pytest.raises(RunFailed) as failed:
        run.poll()
    assert str(failed.value) == (f"worker 1 died {MAX_RESTARTS + 1} times; giving up. Its log ends with:\n"
                                 "worker-1: Check failed: out of file descriptors")
    assert run.provider.restarted == [("worker", 1)] * MAX_RESTARTS, "not restarted past the budget"


def test_the_budget_is_per_server():
    run = Run()
    for _ in range(MAX_RESTARTS):
        run.provider.report(exited=[ServerExit(run.node("worker", 1), 1)])
        run.poll()
    run.provider.report(exited=[ServerExit(run.node("worker", 0), 1)])
    run.poll()
    assert run.provider.restarted[-1] == ("worker", 0)


def test_a_dispatcher_that_is_not_fault_tolerant_fails_the_run_at_its_first_exit():
    run = Run(fault_tolerant=False)
    run.provider.report(exited=[ServerExit(run.node("dispatcher"), 1)])
    with pytest.raises(RunFailed, match=r"^the dispatcher exited \(code 1\) and the job is not fault-tolerant, .*"
                                        r"set service.fault_tolerant: true .*Its log ends with:\n"
                                        r"dispatcher-0: Check failed"):
        run.poll()
    assert run.provider.restarted == [] and run.events == []


def test_a_fault_tolerant_dispatcher_is_restarted_from_its_journal():
    run = Run(fault_tolerant=True)
    run.provider.report(exited=[ServerExit(run.node("dispatcher"), -9)])
    run.poll()
    assert run.provider.restarted == [("dispatcher", 0)]
    assert run.events == [("dispatcher-restarted",
                           "the dispatcher exited (code -9); restarting it at 10.0.0.2:5051 from its journal")]


# -- machines ---------------------------------------------------------------------------------------------------------
def test_a_stopped_worker_machine_is_restarted_and_its_stopped_time_kept_once_it_is_back():
    run = Run()
    worker = run.node("worker", 1)
    run.provider.report(lost=[stopped(worker)])
    assert run.poll().stopped_s == {}
    assert run.provider.restarted == [("worker", 1)]
    assert run.events == [("vm-stopped", "worker 1's VM vm-worker-1 is TERMINATED (a Spot preemption, host maintenance "
                                         "or a stop); starting it again (it keeps its address, 10.0.0.4:5051)")]
    run.poll()  # still on its way back: nothing new
    run.provider.report(back=[MachineBack(worker, "VM vm-worker-1", stopped_s=42.4, relaunch_s=3.0)])
    state = run.poll()
    assert run.kinds() == ["vm-stopped", "worker-restarted"]
    assert run.events[1][1].startswith("worker 1 is back at 10.0.0.4:5051: its VM vm-worker-1 ran again after 42 s "
                                       "stopped and its process was restarted 3 s later")
    assert state.stopped_s == {"worker": pytest.approx(42.4)}
    run.provider.report(back=[MachineBack(worker, "VM vm-worker-1", stopped_s=10.0)])
    assert run.poll().stopped_s == {"worker": pytest.approx(52.4)}, "summed per role"


def test_a_fault_tolerant_dispatchers_stopped_machine_is_restarted():
    run = Run(fault_tolerant=True)
    run.provider.report(lost=[stopped(run.node("dispatcher"), "STOPPED")])
    run.poll()
    assert run.provider.restarted == [("dispatcher", 0)] and run.kinds() == ["vm-stopped"]
    run.provider.report(back=[MachineBack(run.node("dispatcher"), "VM vm-dispatcher-0", stopped_s=30.0)])
    assert run.poll().stopped_s == {"dispatcher": 30.0}
    assert run.kinds() == ["vm-stopped", "dispatcher-restarted"]


def test_lost_machines_count_against_the_same_budget_as_exits():
    run = Run()
    worker = run.node("worker", 0)
    for i in range(MAX_RESTARTS):
        run.provider.report(**({"lost": [stopped(worker)]} if i % 2 else {"exited": [ServerExit(worker, -9)]}))
        run.poll()
    run.provider.report(lost=[stopped(worker, "PREEMPTED")])
    with pytest.raises(RunFailed, match=rf"^worker 0 died {MAX_RESTARTS + 1} times; giving up. Its log ends with:\n"
                                        "worker-0: Check failed"):
        run.poll()
    assert len(run.provider.restarted) == MAX_RESTARTS


@pytest.mark.parametrize("fault_tolerant, lost, says", [
    (True, lambda run: stopped(run.node("trainer")),
     r"^trainer 0's VM vm-trainer-0 is TERMINATED \(a Spot preemption.*\)\. A trainer cannot go on .*no checkpoint to "
     r"resume from.*trainer.provisioning: standard"),
    (False, lambda run: stopped(run.node("dispatcher")),
     r"^the dispatcher's VM vm-dispatcher-0 is TERMINATED .*and the job is not fault-tolerant.*"
     r"service.fault_tolerant: true"),
    (True, lambda run: MachineLost(run.node("worker", 0), "VM vm-worker-0", None, gone_how="it was deleted by hand"),
     r"^worker 0's VM vm-worker-0 no longer exists: it was deleted by hand, so the run cannot go on\.$"),
])
def test_losses_that_end_the_run_at_once(fault_tolerant, lost, says):
    run = Run(fault_tolerant=fault_tolerant)
    run.provider.report(lost=[lost(run)])
    with pytest.raises(RunFailed, match=says):
        run.poll()
    assert run.provider.restarted == [] and run.events == []


def test_a_machine_that_could_not_be_brought_back_ends_the_run():
    run = Run()
    run.provider.report(lost=[stopped(run.node("worker", 1))])
    run.poll()
    run.provider.report(back=[MachineBack(run.node("worker", 1), "VM vm-worker-1", error="start refused")])
    with pytest.raises(RunFailed, match=r"^worker 1's VM vm-worker-1 was stopped and could not be brought back: "
                                        r"start refused$"):
        run.poll()


# -- outages ----------------------------------------------------------------------------------------------------------
def test_an_outage_within_its_limit_is_two_events_and_the_trainers_state_passes_through():
    run = Run()
    since = run.clock.now
    run.provider.report(blind=True, outage=outage(since, ["vm-a", "vm-b"]))
    assert run.poll(advance=OUTAGE_EVENT_AFTER_S - 1).blind is True
    assert run.events == [], "a short silence is not an outage yet"
    for _ in range(50):
        run.provider.report(blind=True, outage=outage(since, ["vm-a", "vm-b"]))
        run.poll(advance=10.0)  # 500 s: within the 600 s limit
    assert run.kinds() == ["ssh-lost"]
    assert run.events[0][1] == ("2 VMs (vm-a, vm-b) have not answered SSH for 19 s; the run goes on (its processes "
                                "do not need SSH) and dsctl keeps reconnecting, up to gcp.outage_limit_s = 600 s")
    assert run.poll(advance=1.0).blind is False
    assert run.kinds() == ["ssh-lost", "ssh-back"]
    assert run.events[1][1] == ("every VM answers SSH again, after an outage of 510 s; what the trainers wrote "
                                "meanwhile is read now")
    assert run.provider.restarted == []


def test_an_outage_past_its_limit_ends_the_run_naming_the_limit_and_what_the_place_says():
    run = Run()
    since = run.clock.now
    machines = [f"vm-{i}" for i in range(6)]
    run.provider.report(outage=outage(since, machines, limit_s=120.0))
    run.poll(advance=100.0)
    run.provider.report(outage=outage(since, machines, limit_s=120.0))
    with pytest.raises(RunFailed) as failed:
        run.poll(advance=25.0)
    assert str(failed.value) == (
        "6 VMs (vm-0, vm-1, vm-2, vm-3 and 2 more) have not answered SSH for 125 s, more than gcp.outage_limit_s "
        "(120 s); Compute Engine lists them as RUNNING. The run is ended and its VMs deleted; raise "
        "gcp.outage_limit_s, or run detached (dsctl up --detach), for runs that must outlive longer outages.")
