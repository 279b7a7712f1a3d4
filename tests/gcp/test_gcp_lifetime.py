"""Every machine of a run has an end, whatever dies: Compute Engine's maxRunDuration (DELETE) on every VM, a
supervisor's VM that is never Spot, and a dead man's switch on every VM and TPU VM that deletes its machine once
the run's supervisor has stopped writing its heartbeat.

The request bodies and the plan are checked on their own; the stand-in's enforcement of maxRunDuration through
its API; the real watchdog program against the stand-in TPU API and Cloud Storage emulator; and a run supervised
on its dispatcher "VM" whose supervisor is killed (or whose VM is deleted) mid-run, after which every other VM
and the TPU VM are gone within gcp.heartbeat_limit_s with no dsctl running; the same for a run supervised by
`dsctl up` on the user's machine (gcp.supervisor: here) killed mid-run; and a supervisor whose teardown cannot
delete a VM, which keeps its own VM and says what it left where `dsctl status` and `runs show` read it. The
boot path (the startup script starting the watchdog as a systemd unit or a nohup'd loop) runs in a booted VM:
test_vmboot.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import BUCKET, PROJECT, ZONE, gcp_spec
from guests import GuestWatchdogs
from metadata_server import MetadataServer

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners.gcp import compute, lifetime, watchdog
from dsctl.provisioners.gcp.settings import GcpSettings
from dsctl.provisioners.gcp.storage import HeartbeatObject
from helpers import processes_under, wait_for

LIMIT_S = 30.0  # the e2e runs' gcp.heartbeat_limit_s


def _sched(provisioning: str, machine: str = "n2-standard-8", max_run_s: float | None = 7200) -> dict:
    from google.cloud import compute_v1 as c

    s = GcpSettings(project="p", zone="us-central1-b")
    vm = compute.VmConfig(machine=machine, labels={}, tag="t", metadata={}, image="img", provisioning=provisioning,
                          max_run_s=max_run_s)
    return c.Instance.to_dict(compute.instance_body(s, "n", vm))["scheduling"]


def test_every_vm_with_a_limit_is_deleted_at_it_spot_ones_too():
    for provisioning, machine in (("standard", "n2-standard-8"), ("spot", "n2-standard-8"),
                                  ("standard", "a2-highgpu-1g"), ("spot", "a2-highgpu-1g")):
        sched = _sched(provisioning, machine)
        assert (int(sched["max_run_duration"]["seconds"]), sched["instance_termination_action"]) == (7200, "DELETE"), \
            (provisioning, machine, sched)
    assert _sched("spot", max_run_s=None)["instance_termination_action"] == "STOP"  # Compute Engine's own default
    s = GcpSettings(project="p", zone="us-central1-b", max_duration_s=600)
    assert lifetime.max_run_s(s) == 600 + lifetime.MAX_RUN_MARGIN_S


def test_the_plan_prices_a_supervising_dispatcher_on_demand_and_says_so(no_credentials):
    from dsctl.provisioners.gcp.planning import plan
    from dsctl.specs import load_spec_text

    text = ("name: g\nprovider: gcp\nservice: {workers: 2, provisioning: spot}\n"
            "trainer: {machine: n2-standard-8, steps: 10}\npipeline: {builtin: synthetic}\n"
            "gcp: {project: acme-ml, zone: us-central1-b%s}\n")
    vm = plan(load_spec_text(text % "", "job.yaml").spec)
    lines = {line.role: line for line in vm.lines}
    assert (lines["dispatcher"].provisioning, lines["workers"].provisioning) == ("standard", "spot")
    assert any("supervisor" in n and "on-demand" in n for n in vm.notes)
    here = plan(load_spec_text(text % ", supervisor: here", "job.yaml").spec)
    assert {line.role: line.provisioning for line in here.lines}["dispatcher"] == "spot"
    assert lines["dispatcher"].per_hour > {line.role: line for line in here.lines}["dispatcher"].per_hour


@pytest.mark.parametrize("action, after", [("DELETE", None), ("STOP", "TERMINATED")])
def test_the_stand_in_ends_a_vm_at_its_max_run_duration(cloud, action, after):
    from conftest import credentials_of
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1 as c

    api = c.InstancesClient(credentials=credentials_of(cloud), client_options=ClientOptions(api_endpoint=cloud.endpoint),
                            transport="rest")
    body = c.Instance(name="limited", machine_type=f"zones/{ZONE}/machineTypes/e2-small",
                      disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
                          source_image="projects/debian-cloud/global/images/family/debian-12"))],
                      network_interfaces=[c.NetworkInterface(network="global/networks/default")],
                      scheduling=c.Scheduling(max_run_duration=c.Duration(seconds=30), instance_termination_action=action))
    api.insert_unary(project=PROJECT, zone=ZONE, instance_resource=body)
    time.sleep(0.3)  # PROVISIONING, STAGING, RUNNING
    assert api.get(project=PROJECT, zone=ZONE, instance="limited").status != "TERMINATED"
    with cloud.lock:  # 29 s of its 30 have passed
        cloud.instances[(PROJECT, ZONE, "limited")]["_created_at"] -= 29
    cloud.tick()
    assert api.get(project=PROJECT, zone=ZONE, instance="limited").status == "RUNNING"
    with cloud.lock:
        cloud.instances[(PROJECT, ZONE, "limited")]["_created_at"] -= 2
    cloud.tick()
    time.sleep(0.3)  # the stand-in's stopping time
    names = {i.name: i.status for i in api.list(project=PROJECT, zone=ZONE)}
    assert names.get("limited") == after


def _tpu_node(cloud, name: str, metadata: dict) -> None:
    from conftest import credentials_of
    from google.api_core.client_options import ClientOptions
    from google.cloud import tpu_v2

    api = tpu_v2.TpuClient(credentials=credentials_of(cloud), transport="rest",
                           client_options=ClientOptions(api_endpoint=cloud.endpoint))
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=f"projects/{PROJECT}/locations/{ZONE}", node_id=name,
        node=tpu_v2.Node(accelerator_type="v2-8", runtime_version="tpu-ubuntu2204-base",
                         network_config=tpu_v2.NetworkConfig(network="default"), metadata=metadata))]))
    api.create_queued_resource(parent=f"projects/{PROJECT}/locations/{ZONE}", queued_resource_id=name,
                               queued_resource=qr)
    wait_for(lambda: cloud.counts()["tpus"] == 1 and (PROJECT, ZONE, name) in cloud.tpus, timeout=30, what="the node")


def test_a_tpu_vms_watchdog_deletes_its_node_once_the_heartbeat_stops(cloud, tmp_path):
    """The real watchdog program, as a TPU VM runs it: through the TPU API (its queued resource, with force)."""
    from conftest import owner_storage

    s = GcpSettings(project=PROJECT, zone=ZONE, bucket=BUCKET, heartbeat_limit_s=15).with_env_endpoints()
    config = lifetime.watchdog_config(s, "run-1", tpus=True, tpu_node="tpu-1")
    assert config.tpu_node == f"projects/{PROJECT}/locations/{ZONE}/nodes/tpu-1"
    heart = HeartbeatObject(owner_storage(), BUCKET, "run-1")
    heart.beat(1)
    _tpu_node(cloud, "tpu-1", {lifetime.WATCHDOG_KEY: config.to_json()})
    # The TPU VM runs as the supervisor's account, with what dsctl grants it (accounts.py) and nothing more.
    account = f"dsctl-supervisor@{PROJECT}.iam.gserviceaccount.com"
    for role in ("roles/tpu.admin", "roles/compute.instanceAdmin.v1"):
        cloud.grant(account, role, f"projects/{PROJECT}")
    cloud.grant(account, "roles/storage.objectAdmin", f"projects/_/buckets/{BUCKET}")
    with MetadataServer(attributes={lifetime.WATCHDOG_KEY: config.to_json()}, project_id=PROJECT,
                        instance_name="t1v-n-0123abcd-w-0", zone=ZONE, service_account=account,
                        token_issuer=cloud.issue_token) as mds:
        proc = subprocess.Popen([sys.executable, "-c", watchdog.PROGRAM], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "GCE_METADATA_HOST": f"127.0.0.1:{mds.port}"})
        try:
            for beat in range(2, 12):  # 20 s of beats: longer than the limit, and the node stays
                time.sleep(2)
                heart.beat(beat)
                assert cloud.counts()["tpus"] == 1, "deleted while its supervisor beats"
            stopped = time.monotonic()
            wait_for(lambda: cloud.counts()["tpus"] == 0, timeout=15 + config.check_s + 10, interval=0.5,
                     what="the TPU node and its queued resource to be deleted")
            took = time.monotonic() - stopped
            assert 15 - 2 <= took <= 15 + 2 * config.check_s + 3, took
        finally:
            proc.kill()
            out = proc.communicate(timeout=10)[0]
    assert f"deleting {config.tpu_node}: HTTP 200" in out, out


# -- a supervised run whose supervisor is lost -------------------------------------------------------------------
def _supervisor(run_id: str) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "supervise" in cmd and any(run_id in part for part in cmd):
            return p
    return None


def _machines(cloud) -> dict:
    counts = cloud.counts()
    return {"instances": counts["instances"], "tpus": counts["tpus"]}


@pytest.mark.slow
@pytest.mark.background
@pytest.mark.parametrize("lost", ["supervisor killed", "supervisor's VM deleted"])
def test_a_run_whose_supervisor_is_lost_ends_by_itself(cloud, sshd, home, tmp_path, lost):
    guests = GuestWatchdogs(tmp_path / "guests", cloud)
    cloud.on_created.append(guests.created)
    cloud.on_deleted.append(guests.deleted)
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=900, service=", provisioning: spot",
                    gcp={"heartbeat_limit_s": LIMIT_S})
    try:
        env = {**os.environ, "DSCTL_HOME": str(home)}
        proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--detach", "--yes", "--json"],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run_id = json.loads(proc.stdout)["run"]["id"]
        # The dispatcher VM runs the supervisor: on-demand though the service is Spot; every VM is deleted at its
        # limit; every VM and the TPU VM has a watchdog.
        bodies = [(kind, b) for kind, b in cloud.created if kind in ("instance", "tpu", "queued_resource")]
        dispatcher = next(b for kind, b in bodies if kind == "instance" and "-dispatcher-" in b["name"])
        assert dispatcher["scheduling"].get("provisioningModel", "STANDARD") == "STANDARD"
        workers = [b for kind, b in bodies if kind == "instance" and "-worker-" in b["name"]]
        assert workers and all(b["scheduling"]["provisioningModel"] == "SPOT" for b in workers)
        for kind, b in bodies:
            if kind == "instance":
                assert b["scheduling"]["instanceTerminationAction"] == "DELETE" and b["scheduling"]["maxRunDuration"]
        # A watchdog on the dispatcher VM and on the TPU VM: the VMs whose account may end the run's VMs (the worker's
        # may delete nothing).
        wait_for(lambda: len(guests.running) == 2, timeout=30, what="a watchdog on the dispatcher and the TPU VM")
        assert not [n for n in guests.running if "-worker-" in n]
        time.sleep(LIMIT_S + 5)  # longer than the limit: the supervisor's heartbeat keeps every machine
        assert _machines(cloud) == {"instances": 2, "tpus": 1}

        supervisor = _supervisor(run_id)
        assert supervisor is not None
        lost_at = time.monotonic()
        if lost == "supervisor killed":
            supervisor.send_signal(signal.SIGKILL)
        else:
            name = next(n for n in guests.running if "-dispatcher-" in n)
            cloud.delete_instance(PROJECT, ZONE, name, None)

            def died() -> bool:
                cloud.tick()  # the deletion completes on the stand-in's clock, at a call after its stopping time
                return not supervisor.is_running() or supervisor.status() == psutil.STATUS_ZOMBIE

            wait_for(died, timeout=10, what="the supervisor to die with its VM")
        check_s = lifetime.check_every_s(LIMIT_S)
        wait_for(lambda: _machines(cloud) == {"instances": 0, "tpus": 0}, timeout=LIMIT_S + 2 * check_s + 30,
                 interval=0.5, what="the watchdogs to delete every VM of the run and the TPU VM")
        took = time.monotonic() - lost_at
        # The last beat came at most one beat before the loss; a watchdog notices at most one check late.
        assert took <= LIMIT_S + 2 * check_s + 8, f"{took:.1f} s"
        assert not [p for p in psutil.process_iter(["cmdline"]) if "dsctl.cli.main" in (p.info["cmdline"] or [])
                    and any(run_id in part or str(home) in part for part in p.info["cmdline"])], "nobody runs dsctl"
        # A deleted VM's processes end with it (the stand-in ends them as it reaps the VM, on whichever thread made
        # the call that reaped it).
        wait_for(lambda: processes_under(home) == [], timeout=15, what="the deleted VMs' processes to end")
        # What no watchdog deletes (its firewall rules bill nothing) `dsctl down` finds and deletes.
        down = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "down", run_id], capture_output=True, text=True,
                              timeout=300, env=env)
        assert down.returncode == 0, down.stderr[-2000:]
        assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
    finally:
        guests.close()


# -- a teardown that leaves something -----------------------------------------------------------------------------
def _dsctl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsctl.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_a_supervisor_that_cannot_delete_a_vm_keeps_its_own_and_says_what_is_left(cloud, sshd, home, tmp_path):
    """The run's worker VM is protected against deletion once created (instances.setDeletionProtection, by someone
    else): Compute Engine refuses every instances.delete of it (HTTP 400). The supervisor's teardown deletes the rest,
    keeps its own VM and exits, its heartbeat with it (then the watchdogs end what they can, as for a supervisor
    killed: above), and says what is left where `dsctl status` and `runs show` read it, which delete nothing; `dsctl
    down RUN`, once the protection is off, deletes it all."""
    def protect(resource: dict) -> None:
        name = resource.get("name", "")
        if "-worker-" in name:
            with cloud.lock:
                cloud.instances[(PROJECT, ZONE, name)]["deletionProtection"] = True

    cloud.on_created.append(protect)
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="n2-standard-8", epochs=1)
    up = _dsctl("up", str(spec), "--detach", "--yes", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    run_id = json.loads(up.stdout)["run"]["id"]
    wait_for(lambda: _supervisor(run_id) is None, timeout=180, what="the supervisor to end the run and exit")
    with cloud.lock:
        left = sorted(name for (_, _, name) in cloud.instances)
    assert [n.split("-")[-2] for n in left] == ["dispatcher", "worker"], left  # its own VM too; the trainer VM went
    dispatcher, worker = left
    assert cloud.counts() == {"instances": 2, "firewalls": 0, "tpus": 0}
    # Said where `dsctl status` and `runs show` read it (from any machine: the record in Cloud Storage); looking
    # deletes nothing.
    status = _dsctl("status", "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    [row] = json.loads(status.stdout)
    assert row["run"] == run_id and row["status"] == "ended; its supervisor left resources behind", row
    assert worker in row["left_behind"] and f"left its own VM {dispatcher}" in row["left_behind"], row
    shown = _dsctl("runs", "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    said = [e["message"] for e in json.loads(shown.stdout)["events"] if e["kind"] == "left-behind"]
    assert len(said) == 1 and worker in said[0] and dispatcher in said[0], said
    with cloud.lock:
        assert sorted(name for (_, _, name) in cloud.instances) == left, "looking deletes nothing"
        cloud.instances[(PROJECT, ZONE, worker)]["deletionProtection"] = False
    down = _dsctl("down", run_id)
    assert down.returncode == 0, down.stderr[-2000:]
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
    assert json.loads(_dsctl("status", "--json").stdout) == []


@pytest.mark.slow
@pytest.mark.background
def test_a_run_supervised_here_whose_dsctl_is_killed_ends_by_itself(cloud, sshd, home, tmp_path):
    """gcp.supervisor: here: the attached `dsctl up` supervises the run and beats for it; kill -9 of it (a laptop
    that dies) leaves the watchdogs of the dispatcher VM and the TPU VM to delete every VM of the run within the limit,
    with nobody running dsctl."""
    guests = GuestWatchdogs(tmp_path / "guests", cloud)
    cloud.on_created.append(guests.created)
    cloud.on_deleted.append(guests.deleted)
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=900,
                    gcp={"supervisor": "here", "heartbeat_limit_s": LIMIT_S})
    check_s = lifetime.check_every_s(LIMIT_S)
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--yes"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(guests.running) == 2, timeout=60, what="a watchdog on the dispatcher and the TPU VM")
        booted = time.monotonic()
        run_id = next((home / "runs").glob("*/state.json")).parent.name
        wait_for(lambda: RunStore().windows(run_id), timeout=120, what="the run to train")
        # Longer than the limit since the VMs booted: dsctl's heartbeat keeps every machine.
        time.sleep(max(0.0, booted + LIMIT_S + 2 * check_s - time.monotonic()))
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
        assert _machines(cloud) == {"instances": 2, "tpus": 1}
        up.kill()
        up.wait(30)
        killed = time.monotonic()
        wait_for(lambda: _machines(cloud) == {"instances": 0, "tpus": 0}, timeout=LIMIT_S + 2 * check_s + 30,
                 interval=0.5, what="the watchdogs to delete every VM of the run and the TPU VM")
        took = time.monotonic() - killed
        assert took <= LIMIT_S + 2 * check_s + 8, f"{took:.1f} s"
        wait_for(lambda: processes_under(home) == [], timeout=15, what="the deleted VMs' processes to end")
        # What no watchdog deletes (its firewall rules bill nothing) `dsctl down` finds and deletes.
        assert cloud.counts()["firewalls"] > 0
        down = _dsctl("down", run_id)
        assert down.returncode == 0, down.stderr[-2000:]
        assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
    finally:
        if up.poll() is None:
            up.kill()
        guests.close()
