"""What a poll of a Google Cloud deployment reports (provisioners/gcp/processes.py), and a restart whose VM stopped
answering (GcpProvider.restart), on readings the test writes: no cloud, no SSH.

The provider reports servers that ended and leaves the decision to the orchestrator (orchestrator/supervision.py);
it must not report one on a reading taken before the server was (re)started, nor one on a VM it cannot see now.
"""

from __future__ import annotations

from dsctl.provisioners import Deployment, Node
from dsctl.provisioners.gcp import GcpDeployment, GcpNode, GcpProvider, Vm
from dsctl.provisioners.gcp.clients import Clients
from dsctl.provisioners.gcp.context import Context
from dsctl.provisioners.gcp.errors import SshUnreachable
from dsctl.provisioners.gcp.processes import exited_servers, trainers
from dsctl.provisioners.gcp.remote import ProcStatus
from dsctl.provisioners.gcp.settings import GcpSettings

LAUNCHED = 100.0  # when every process was started (monotonic)


class Readings:
    """The watcher as poll sees it: the latest reading of each process."""

    def __init__(self):
        self.snap: dict[tuple[str, int], ProcStatus] = {}

    def start(self) -> None:
        pass

    def snapshot(self) -> dict:
        return dict(self.snap)

    def read(self, role: str, index: int, *, at: float, rc: int | None) -> None:
        self.snap[(role, index)] = ProcStatus(dir=f"/d/{role}-{index}", pid=7, rc=rc, state=None if rc is not None else "S",
                                              cpu_ticks=0, start_time=500, rss_bytes=0, ready=None, metrics_size=None,
                                              clk_tck=100, at=at)


class Unreachable:
    """SSH to a VM that stopped answering."""

    def run(self, host, command, **kwargs):
        raise SshUnreachable(f"ssh to {host}: timed out")


def deployment(tmp_path) -> Deployment:
    dep = Deployment(run_id="r", provider="gcp", run_dir=str(tmp_path),
                     state=GcpDeployment(settings=GcpSettings(project="dsctl-test", zone="us-central1-b")))
    for role, i in (("dispatcher", 0), ("worker", 0), ("worker", 1), ("trainer", 0)):
        dep.nodes.append(Node(role=role, index=i, address=f"10.0.0.{len(dep.nodes) + 2}:5051", state=GcpNode(
            vm=Vm(name=f"vm-{role}-{i}", host=f"h-{role}-{i}", internal_ip=f"10.0.0.{len(dep.nodes) + 2}"),
            remote_pid=7, start_time=500, launched_at=LAUNCHED, port=5051)))
    return dep


def context(dep: Deployment) -> tuple[Context, Readings]:
    ctx = Context(dep, Clients(dep.state.settings), None, ssh=Unreachable())  # type: ignore[arg-type]
    ctx.watcher = readings = Readings()
    return ctx, readings


def test_only_what_ended_after_its_start_on_a_vm_in_sight_is_reported(tmp_path):
    dep = deployment(tmp_path)
    ctx, readings = context(dep)
    readings.read("dispatcher", 0, at=LAUNCHED + 1, rc=None)  # serving
    readings.read("worker", 0, at=LAUNCHED - 1, rc=1)  # its predecessor's end, read before this one started
    readings.read("worker", 1, at=LAUNCHED + 1, rc=-9)
    readings.read("trainer", 0, at=LAUNCHED + 1, rc=0)
    assert [(e.node.role, e.node.index, e.code) for e in exited_servers(ctx, unseen=set())] == [("worker", 1, -9)]
    assert exited_servers(ctx, unseen={"h-worker-1"}) == [], "a VM out of sight is not judged on an old reading"
    assert trainers(ctx, unseen=set()) == ([], {0: 0})
    assert trainers(ctx, unseen={"h-trainer-0"}) == ([0], {}), "a trainer out of sight counts as running"
    dep.by_role("worker")[1].state.remote_pid = None  # never started: nothing to report
    assert exited_servers(ctx, unseen=set()) == []


def test_a_restart_on_a_vm_gone_quiet_is_left_to_the_next_polls(tmp_path):
    """The orchestrator restarts what a poll reports; if the VM stopped answering meanwhile, the restart starts
    nothing and the server is reported again while it can be seen (recovery.py decides about the VM)."""
    dep = deployment(tmp_path)
    dep.dispatcher_address = dep.by_role("dispatcher")[0].address
    ctx, readings = context(dep)
    provider = GcpProvider()
    provider._ctx = ctx
    readings.read("dispatcher", 0, at=LAUNCHED + 1, rc=-9)
    readings.read("worker", 1, at=LAUNCHED + 1, rc=-9)
    exited = exited_servers(ctx, unseen=set())
    assert [(e.node.role, e.node.index) for e in exited] == [("dispatcher", 0), ("worker", 1)]
    for e in exited:
        provider.restart(dep, e.node, lambda kind, message: None)  # SshUnreachable: nothing started
    assert [n.state.launched_at for n in dep.nodes] == [LAUNCHED] * 4
    assert exited_servers(ctx, unseen=set()) == exited
