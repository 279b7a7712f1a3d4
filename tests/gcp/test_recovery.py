"""What a poll of a running Google Cloud deployment reports about its VMs (provisioners/gcp/recovery.py, through
GcpProvider.poll and .restart) and what the supervisor above it (orchestrator/supervision.py) makes of that, on a
clock the test moves: outages within and past gcp.outage_limit_s, stopped worker and dispatcher VMs brought back,
trainer VMs and deleted VMs ending the run, and how often Compute Engine is asked. The policy itself, on every
provider, is unit-tested with a fake provider in tests/test_supervision.py; starting a VM and restarting its process
for real is in test_gcp_faults.py."""

from __future__ import annotations

import threading

import pytest

from dsctl.orchestrator.outcome import RunFailed
from dsctl.orchestrator.supervision import MAX_RESTARTS, OUTAGE_EVENT_AFTER_S, Supervisor
from dsctl.provisioners import Deployment, Node
from dsctl.provisioners.gcp import GcpDeployment, GcpProvider
from dsctl.provisioners.gcp.clients import Clients
from dsctl.provisioners.gcp.context import Context
from dsctl.provisioners.gcp.recovery import STATUS_EVERY_S, Recovery
from dsctl.provisioners.gcp.settings import GcpSettings
from dsctl.provisioners.gcp.state import GcpNode, Vm


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def deployment(fault_tolerant=False) -> Deployment:
    dep = Deployment(run_id="r", provider="gcp", run_dir="/nonexistent",
                     state=GcpDeployment(settings=GcpSettings(project="dsctl-test", zone="us-central1-b")))
    for role, i in (("dispatcher", 0), ("worker", 0), ("worker", 1), ("trainer", 0)):
        dep.nodes.append(Node(role=role, index=i, address=f"10.0.0.{len(dep.nodes) + 2}:5051", state=GcpNode(
            vm=Vm(name=f"vm-{role}-{i}", host=f"h-{role}-{i}"), remote_pid=7, fault_tolerant=fault_tolerant)))
    return dep


class Watcher:
    """The SSH watcher as poll sees it: no process readings (every trainer counts as running), and the hosts that
    have not answered since when."""

    def __init__(self):
        self.quiet: dict[str, float] = {}

    def start(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {}

    def unreachable(self) -> dict[str, tuple[float, str]]:
        return {host: (since, "timed out") for host, since in self.quiet.items()}


class World:
    """The VMs' statuses as Compute Engine would list them, and restores the test finishes by hand; the gcp provider
    polled by the supervisor, as a run does."""

    def __init__(self, dep: Deployment, limit: float = 600.0):
        self.dep, self.clock, self.events = dep, Clock(), []
        self.status = {n.state.vm.name: "RUNNING" for n in dep.nodes}
        self.lists, self.attempts, self.restores, self.api_down = 0, 0, [], False
        self.refused: set[str] = set()  # VMs that will not start again
        self.release = threading.Event()
        self.recovery = Recovery(list_statuses=self.list, restore=self.restore, outage_limit_s=limit, clock=self.clock)
        self.provider = GcpProvider()
        ctx = Context(dep, Clients(dep.state.settings), None)
        ctx.watcher = self.watcher = Watcher()  # type: ignore[assignment]
        self.provider._ctx, self.provider._recovery = ctx, self.recovery
        fault_tolerant = dep.by_role("dispatcher")[0].state.fault_tolerant
        self.supervisor = Supervisor(self.provider, dep, fault_tolerant, lambda kind, msg: self.events.append((kind, msg)),
                                     clock=self.clock)

    def list(self):
        self.attempts += 1
        if self.api_down:
            raise ConnectionError("no route to compute.googleapis.com")
        self.lists += 1
        return dict(self.status)

    def restore(self, node):
        self.restores.append(node.state.vm.name)
        self.release.wait(10)
        if node.state.vm.name in self.refused:
            raise RuntimeError("start refused")
        return self.clock.now

    def check(self, unreachable=None, advance=1.0):
        """One poll of the run, `advance` s after the last; True while the trainers cannot be seen."""
        self.clock.now += advance
        self.watcher.quiet = unreachable or {}
        return self.supervisor.poll().blind

    def kinds(self):
        return [k for k, _ in self.events]


def test_an_outage_within_the_limit_is_two_events_and_blinds_the_stall_clock_meanwhile():
    w = World(deployment())
    assert w.check() is False
    lost_at = w.clock.now
    everyone = {n.state.vm.host: lost_at for n in w.dep.nodes}
    assert w.check(everyone, advance=OUTAGE_EVENT_AFTER_S - 2) is True, "the trainers cannot be seen"
    assert w.kinds() == [], "a short silence is not an outage yet"
    for _ in range(60):
        assert w.check(everyone, advance=5.0) is True  # 5 minutes: far within the 10-minute limit
    assert w.kinds() == ["ssh-lost"] and "4 VMs" in w.events[0][1] and "gcp.outage_limit_s = 600 s" in w.events[0][1]
    assert w.check({}) is False
    assert w.kinds() == ["ssh-lost", "ssh-back"] and "outage of 30" in w.events[1][1]
    assert w.restores == [], "RUNNING VMs that do not answer are waited for, never restarted"


def test_an_outage_past_the_limit_ends_the_run_and_says_how_to_allow_longer():
    w = World(deployment(), limit=120.0)
    w.check()
    lost = {"h-worker-1": w.clock.now}
    w.check(lost, advance=100.0)
    with pytest.raises(RunFailed, match=r"vm-worker-1\) have not answered SSH for 12\d s, more than "
                                          r"gcp.outage_limit_s \(120 s\); Compute Engine lists them as RUNNING"):
        w.check(lost, advance=25.0)


def test_a_stopped_worker_vm_is_brought_back_once_and_its_stopped_time_is_kept():
    w = World(deployment())
    w.check()
    w.status["vm-worker-1"] = "TERMINATED"
    w.check(advance=STATUS_EVERY_S)
    assert w.kinds() == ["vm-stopped"] and "worker 1's VM vm-worker-1 is TERMINATED" in w.events[0][1]
    for _ in range(5):  # still stopped in the listing, and unreachable: neither starts it twice nor is an outage
        w.check({"h-worker-1": w.clock.now - 30}, advance=STATUS_EVERY_S)
    assert w.restores == ["vm-worker-1"] and w.kinds() == ["vm-stopped"]
    w.status["vm-worker-1"] = "RUNNING"
    w.release.set()
    w.recovery._restoring["vm-worker-1"].future.result(timeout=10)
    w.check()
    assert w.kinds() == ["vm-stopped", "worker-restarted"] and "worker 1 is back at 10.0.0.4:5051" in w.events[1][1]
    assert w.supervisor.stopped_s == {"worker": pytest.approx(5 * STATUS_EVERY_S)}


def test_a_fault_tolerant_dispatcher_vm_is_brought_back_and_a_failed_restore_ends_the_run():
    w = World(deployment(fault_tolerant=True))
    w.check()
    w.status["vm-dispatcher-0"] = "STOPPED"
    w.refused.add("vm-dispatcher-0")
    w.release.set()
    w.check(advance=STATUS_EVERY_S)
    assert w.restores == ["vm-dispatcher-0"]
    w.recovery._restoring["vm-dispatcher-0"].future.exception(timeout=10)
    with pytest.raises(RunFailed, match="the dispatcher's VM vm-dispatcher-0 was stopped and could not be brought "
                                          "back: start refused"):
        w.check()


def test_a_worker_vm_stopped_again_and_again_counts_against_the_restart_budget():
    """Each time its VM is brought back is one of the worker's MAX_RESTARTS restarts, as a process exit is."""
    w = World(deployment())
    w.release.set()
    w.check()
    for _ in range(MAX_RESTARTS):
        w.status["vm-worker-1"] = "TERMINATED"
        w.check(advance=STATUS_EVERY_S)
        w.recovery._restoring["vm-worker-1"].future.result(timeout=10)
        w.status["vm-worker-1"] = "RUNNING"
        w.check()
    assert w.kinds() == ["vm-stopped", "worker-restarted"] * MAX_RESTARTS
    w.status["vm-worker-1"] = "TERMINATED"
    with pytest.raises(RunFailed, match=f"worker 1 died {MAX_RESTARTS + 1} times; giving up"):
        w.check(advance=STATUS_EVERY_S)
    assert w.restores == ["vm-worker-1"] * MAX_RESTARTS


@pytest.mark.parametrize("role, status, says", [
    ("trainer", "TERMINATED", "trainer 0's VM vm-trainer-0 is TERMINATED .*no checkpoint"),
    ("trainer", "PREEMPTED", "trainer 0's VM vm-trainer-0 is PREEMPTED"),  # a TPU VM's state
    ("dispatcher", "TERMINATED", "not fault-tolerant.*service.fault_tolerant: true"),
    ("worker", None, "worker 0's VM vm-worker-0 no longer exists"),
])
def test_what_cannot_be_brought_back_ends_the_run_at_once(role, status, says):
    w = World(deployment())
    w.check()
    name = f"vm-{role}-0"
    if status is None:
        del w.status[name]
    else:
        w.status[name] = status
    with pytest.raises(RunFailed, match=says):
        w.check(advance=STATUS_EVERY_S)
    assert w.restores == []


def test_a_vm_added_after_the_last_listing_is_not_missing_from_it():
    w = World(deployment())
    w.check()
    new = Node(role="worker", index=2, address="10.0.0.9:5051", state=GcpNode(
        vm=Vm(name="vm-worker-2", host="h-worker-2"), remote_pid=8, launched_at=w.clock.now + 1))
    w.dep.nodes.append(new)
    w.check(advance=2.0)  # the listing (1 s before its launch) does not have it: not known yet, not gone
    assert w.events == []
    with pytest.raises(RunFailed, match="worker 2's VM vm-worker-2 no longer exists"):
        w.check(advance=STATUS_EVERY_S)  # a listing after its launch that does not have it: gone


def test_vms_being_deleted_or_not_started_yet_are_left_alone():
    w = World(deployment())
    w.dep.by_role("worker")[1].state.vm.deleting = True
    w.dep.by_role("worker")[0].state.remote_pid = None
    w.status.update({"vm-worker-1": "STOPPING", "vm-worker-0": "TERMINATED"})
    w.check()
    assert w.restores == [] and w.events == []


def test_compute_engine_is_asked_every_15_s_and_soon_after_a_vm_goes_quiet_never_each_poll():
    w = World(deployment())
    for _ in range(16):
        w.check(advance=1.0)  # 16 polls in 16 s: a list at the first and one 15 s later
    assert w.lists == 2
    w.check({"h-worker-0": w.clock.now}, advance=1.0)  # 1 s after that list: too soon to ask again
    assert w.lists == 2
    w.check({"h-worker-0": w.clock.now - 1}, advance=2.0)
    assert w.lists == 3, "a VM that stopped answering is looked up within 3 s"
    for _ in range(14):
        w.check({"h-worker-0": w.clock.now - 1}, advance=1.0)  # still quiet: back to every 15 s
    assert w.lists == 3


def test_with_the_api_out_of_reach_too_nothing_is_decided():
    w = World(deployment())
    w.check()
    w.api_down = True
    w.status["vm-trainer-0"] = "TERMINATED"  # unknown to dsctl while the API cannot be asked
    tried = w.attempts
    for _ in range(300):  # a minute of polls, every VM quiet (the laptop is offline)
        w.check({n.state.vm.host: 1000.0 for n in w.dep.nodes}, advance=0.2)
    assert w.events[-1][0] == "ssh-lost" and w.recovery.api_error.startswith("ConnectionError")
    assert w.attempts - tried <= 60 / 3 + 1, "asked at most every 3 s while it fails"
    w.api_down = False
    with pytest.raises(RunFailed, match="trainer 0"):
        w.check(advance=STATUS_EVERY_S)
