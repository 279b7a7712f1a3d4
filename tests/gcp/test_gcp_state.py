"""A Google Cloud run's state file (provisioners/gcp/state.py): typed, and read back from what older dsctl wrote.

legacy_state.json is a state file as dsctl wrote it before the typed state, mid-run: captured from that
revision's provider (`git show HEAD~1:provisioners/gcp/provider.py`, up + wait_ready + start_trainers) on the
stand-in cloud: a fault-tolerant dispatcher, two workers, a TPU trainer recording its steps and ids, the run's
two firewall rules, every detail in a node's `extra` and the settings in a `gcp` pseudo-node. Added by hand, as
that revision's hand_off and detached `dsctl up` recorded them: the `supervisor` node of a run handed over to its
dispatcher VM, and the `monitor` node. `dsctl down` of such a run must find every VM, firewall rule and the
supervisor in it.
"""

from __future__ import annotations

from pathlib import Path

from conftest import PROJECT, ZONE

from dsctl.provisioners import load_deployment
from dsctl.provisioners.gcp import GcpDeployment, GcpNode, GcpProvider, Vm
from dsctl.provisioners.gcp.state import FirewallRule, RemoteProcess

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
RUN = "legacy-0001"
VMS = [f"dsctl-{RUN}-{n}" for n in ("dispatcher-0", "worker-0", "worker-1", "trainer-0")]
RULES = [f"dsctl-{RUN}-svc", f"dsctl-{RUN}-deny"]


def legacy_run(home: Path) -> Path:
    run_dir = home / "runs" / RUN
    run_dir.mkdir(parents=True)
    text = (Path(__file__).parent / "legacy_state.json").read_text().replace("{home}", str(home))
    (run_dir / "state.json").write_text(text)
    return run_dir


def test_an_old_state_file_reads_as_typed_state(tmp_path):
    run_dir = legacy_run(tmp_path)
    dep = load_deployment(run_dir)
    assert [(n.role, n.index) for n in dep.nodes] == [("dispatcher", 0), ("worker", 0), ("worker", 1), ("trainer", 0)]
    assert [n.state.vm.name for n in dep.nodes] == VMS and all(isinstance(n.state, GcpNode) for n in dep.nodes)
    state = dep.state
    assert isinstance(state, GcpDeployment)
    assert (state.settings.project, state.settings.zone, state.settings.bucket) == (PROJECT, ZONE, "dsctl-test-staging")
    assert state.settings.tensorflow_version == "2.18.0" and state.settings.software.for_kind("tpu").kind == "tpu"
    disp = dep.by_role("dispatcher")[0]
    assert disp.address == dep.dispatcher_address == "127.0.0.2:25532"
    assert (disp.state.remote_pid, disp.state.start_time, disp.state.port) == (21520, 502343, 25532)
    assert disp.state.fault_tolerant and disp.state.ready and disp.state.vm.status == "running"
    assert (disp.state.vm.internal_ip, disp.state.vm.external_ip, disp.state.vm.host) == ("127.0.0.2", "127.0.1.2",
                                                                                           "127.0.1.2")
    trainer = dep.by_role("trainer")[0]
    assert trainer.metrics == f"{run_dir}/metrics/trainer-0.jsonl"
    assert trainer.state.steps == f"{run_dir}/metrics/trainer-0.steps.json"
    assert trainer.state.ids == f"{run_dir}/metrics/trainer-0.ids.json"
    assert trainer.state.vm.kind == "tpu" and trainer.state.vm.machine == "tpu-v2-8"
    assert state.trainer_vms == {0: Vm(name=VMS[3], kind="tpu", machine="tpu-v2-8", status="running",
                                       dir=trainer.state.vm.dir, internal_ip="127.0.0.5", host="127.0.1.5",
                                       tensorflow="2.21.0")}
    assert state.firewalls == [FirewallRule(RULES[0], "created"), FirewallRule(RULES[1], "created")]
    assert state.supervisor == RemoteProcess(instance=VMS[0], host="127.0.1.2", dir=f"{disp.state.vm.dir}/supervisor",
                                             remote_pid=23019, start_time=503650)
    assert state.bucket_ready and state.staged and state.software.wheel is None
    assert dep.monitor is not None and dep.monitor.pid == 4194301 and dep.monitor.log == f"{run_dir}/up.log"
    assert GcpProvider().handed_off(dep)
    # Saved again, it is in today's form, and reads back the same.
    dep.save()
    assert '"extra"' not in (run_dir / "state.json").read_text()
    assert load_deployment(run_dir) == dep


def test_down_of_an_old_state_file_deletes_every_vm_and_rule_in_it(cloud, home):
    """Every resource is deleted by the name the old state recorded: nothing is left for the sweep by label."""
    from test_gcp_parts import _fleet, _machine, _rules

    from dsctl.orchestrator.deployments import handed_off

    _fleet(RUN).create([_machine(RUN, "dispatcher", 0), _machine(RUN, "worker", 0), _machine(RUN, "worker", 1),
                        _machine(RUN, "trainer", 0, "tpu-v2-8")], _rules(RUN))
    assert cloud.counts() == {"instances": 3, "firewalls": 2, "tpus": 1}
    run_dir = legacy_run(home)
    dep = load_deployment(run_dir)
    assert handed_off(dep), "`dsctl down` asks the run's supervisor to stop first"
    events = []
    GcpProvider().down(dep, lambda kind, message: events.append((kind, message)))
    assert cloud.counts() == NOTHING
    deleted = [path.rsplit("/", 1)[-1] for method, path in cloud.calls if method == "DELETE"]
    assert set(VMS + RULES) <= set(deleted), deleted
    done = [message for kind, message in events if kind == "down"]
    assert len(done) == 1 and "found by label" not in done[0], done
    dep = load_deployment(run_dir)
    assert dep.status == "down" and not dep.nodes
    assert not dep.state.firewalls and not dep.state.trainer_vms
