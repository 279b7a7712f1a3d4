"""Faults on the way up, on the stand-in cloud: each ends with a clear error (or a retried success) and nothing left.

"Nothing left" is checked on everything that bills or lingers: instances, TPU VMs (and their queued
resources), firewall rules, and the run's staging objects in Cloud Storage.

- a quota too small for the workers' bulk insert, where the preflight could not read it: one paragraph naming
  the quota metric, region, resource, zone and count; the bulk insert made none (all or nothing) and everything
  else was deleted
- bursts of 503 (and 429): retried with backoff, the job succeeds
- a VM stuck in PROVISIONING: times out naming it, everything deleted
- a TensorFlow version mismatch on one VM: refused before anything starts, everything deleted
- kill -9 of the process running `dsctl up`: `dsctl down RUN` (from state) or down_by_label (no state) removes all
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import BUCKET, CALLER, PROJECT, ZONE, gcp_spec

from dsctl.orchestrator.run import JobRunner, RunFailed
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import load_deployment
from dsctl.provisioners.gcp import down_by_label, find_by_label
from dsctl.specs import load_spec
from helpers import dsctl, processes_under, wait_for

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}


def _run_failing(spec) -> tuple[JobRunner, str]:
    runner = JobRunner(load_spec(spec))
    with pytest.raises(RunFailed) as info:
        runner.run()
    return runner, str(info.value)


def staged(run_id: str) -> list[str]:
    """The run's staging objects still in the bucket."""
    from conftest import owner_storage

    client = owner_storage()
    return [b.name for b in client.list_blobs(BUCKET, prefix=f"dsctl/runs/{run_id}/staging/")]


def test_a_quota_too_small_for_the_workers_leaves_nothing_and_names_the_quota(cloud, home, tmp_path):
    cloud.set_quota("N2_CPUS", 24, region="us-central1")  # the dispatcher fits (8); 8 workers (64 CPUs) do not
    # The caller may not read the region's quotas (no compute.regions.get), so the check before anything is created
    # cannot see it (as with quota another run takes meanwhile): the create call meets it.
    cloud.deny(CALLER, "compute.regions.get", f"projects/{PROJECT}")
    spec = gcp_spec(tmp_path / "job", home=home, workers=8, trainer_machine="a2-highgpu-1g")
    runner, message = _run_failing(spec)
    # One paragraph: which quota, where, for what, how many, that it is not a rate limit, and what to do.
    assert "\n" not in message
    for part in ("8 n2-standard-8 worker VMs", f"zone {ZONE}",
                 "quota N2_CPUS (compute.googleapis.com/n2_cpus) in region us-central1 (limit 24)",
                 "8 were asked for", "not a passing rate limit", "IAM & Admin > Quotas",
                 "Everything the run had created was deleted"):
        assert part in message, (part, message)
    # All or nothing: the bulk insert made no worker; the dispatcher, the GPU trainer and the rules were deleted.
    made = [(k, b["labels"]["dsctl-role"]) for k, b in cloud.created if k == "instance"]
    assert ("instance", "worker") not in made and ("instance", "dispatcher") in made
    # A quota is not retried as if it were a rate limit: one bulk insert call.
    assert len([1 for m, p in cloud.calls if m == "POST" and p.endswith("/bulkInsert")]) == 1
    gpu = next(b for k, b in cloud.created if k == "instance" and b["labels"]["dsctl-role"] == "trainer")
    assert {"key": "install-nvidia-driver", "value": "True"} in gpu["metadata"]["items"]
    assert cloud.counts() == NOTHING and staged(runner.run_id) == []
    assert RunStore().get(runner.run_id).status == "failed"
    dep = load_deployment(runner.run_dir)
    assert dep.status == "down" and not dep.nodes and not dep.state.firewalls


def test_a_tpu_quota_on_the_queued_request_is_named_and_not_retried(cloud, home, tmp_path):
    """A TPU quota the check before anything is created could not read (no cloudquotas.quotas.get; or another run took
    it meanwhile): the queued resource meets it, and that is named, not retried."""
    cloud.set_tpu_quota("TPUV2sPerProjectPerZoneForTPUAPI", 0, zone=ZONE)
    cloud.deny(CALLER, "cloudquotas.quotas.get", f"projects/{PROJECT}")
    spec = gcp_spec(tmp_path / "job", home=home, workers=1, trainer_machine="tpu-v2-8")
    runner, message = _run_failing(spec)
    assert "TPUV2sPerProjectPerZoneForTPUAPI" in message and "not a passing rate limit" in message, message
    assert len([1 for m, p in cloud.calls if m == "POST" and p.endswith("/queuedResources")]) == 1
    assert cloud.counts() == NOTHING and staged(runner.run_id) == []


def test_zone_exhausted_names_the_zone_and_machine(cloud, home, tmp_path):
    cloud.faults.fail_nth_instance, cloud.faults.fail_label = 1, ("dsctl-role", "dispatcher")
    cloud.faults.error_code = "ZONE_RESOURCE_POOL_EXHAUSTED"
    spec = gcp_spec(tmp_path / "job", home=home, workers=2)
    runner, message = _run_failing(spec)
    assert f"zone {ZONE} has no capacity for 1 n2-standard-8 dispatcher VM" in message
    assert "another zone (gcp.zone)" in message
    assert cloud.counts() == NOTHING and staged(runner.run_id) == []


def test_stuck_in_provisioning_times_out_and_is_cleaned_up(cloud, home, tmp_path):
    cloud.faults.stuck_names = ["worker-1"]
    spec = gcp_spec(tmp_path / "job", home=home, workers=3, gcp={"running_timeout_s": 3})
    t0 = time.monotonic()
    runner, message = _run_failing(spec)
    assert time.monotonic() - t0 < 30
    assert "did not reach RUNNING within 3 s" in message
    assert f"dsctl-{runner.run_id}-worker-1 (PROVISIONING)" in message
    assert cloud.counts() == NOTHING and staged(runner.run_id) == []


def test_tensorflow_version_mismatch_is_refused(cloud, sshd, home, tmp_path):
    """worker-1's Python reports another TensorFlow: dsctl refuses before starting any server."""
    fake_python = tmp_path / "python-on-vms"
    fake_python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        # The VM of worker 1 has TensorFlow 2.20.0; every other VM has this machine's.
        if [ "$1" = "-c" ] && [ "$3" = "worker-1" ]; then
          echo '{{"node": "worker-1", "python": "3.11.7", "tensorflow": "2.20.0", "dsctl": "0.1.0"}}'
          exit 0
        fi
        exec {sys.executable} "$@"
        """))
    fake_python.chmod(0o755)
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, python=str(fake_python))
    runner, message = _run_failing(spec)
    from dsctl.provisioners.gcp.settings import local_tensorflow_version

    tf = local_tensorflow_version()
    assert f"TensorFlow versions differ: the trainer (trainer-0) runs TensorFlow {tf}, but worker-1 has 2.20.0" in message
    assert "every machine must run the trainer's TensorFlow" in message
    assert "\n" not in message
    assert not list((home / "vms").rglob("pid")), "no server was started"
    assert cloud.counts() == NOTHING and staged(runner.run_id) == []


USER_PIPELINE = """
import tensorflow as tf

def make_dataset(size=64):
    return tf.data.Dataset.range(size).map(lambda i: {"x": tf.fill([8], tf.cast(i, tf.float32))}).batch(8).repeat()
"""

USER_MODEL = """
STEPS = []

def train_step(batch):
    STEPS.append(int(batch["x"].shape[0]))
"""


@pytest.mark.slow
def test_transient_errors_on_every_api_are_retried_and_the_job_succeeds(cloud, sshd, home, tmp_path):
    """Google's retryable answers (408, 429, 500, 502, 503, 504) on every API dsctl calls, Cloud Storage included:
    each is retried, and the run goes on. Also: the user's pipeline and model code (the spec's folder) reach the GPU
    trainer VM through GCS."""
    # Every third call to one method and path starts two errors in a row, of each status in turn: how many bursts a
    # run meets depends on how often it calls, never on how fast it goes (its checks, creation and teardown alone call
    # several paths three times or more).
    statuses = (503, 429, 500, 502, 504, 408)
    cloud.faults.burst_every, cloud.faults.burst_length, cloud.faults.burst_status = 3, 2, statuses
    cloud.faults.storage_bursts = True
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "mypipe.py").write_text(USER_PIPELINE)
    (tmp_path / "job" / "mymodel.py").write_text(USER_MODEL)
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="a2-highgpu-1g",
                    epochs=None, steps=40, pipeline="{entrypoint: 'mypipe:make_dataset', params: {size: 64}}",
                    model="{kind: python, entrypoint: 'mymodel:train_step'}")
    runner = JobRunner(load_spec(spec))
    summary = runner.run()
    assert RunStore().get(runner.run_id).status == "succeeded"
    assert summary["batches"] == 40
    assert all(cloud.errors_by_status[status] >= 2 for status in statuses), cloud.errors_by_status
    assert {"compute", "storage", "resourcemanager"} <= set(cloud.errors_by_api), cloud.errors_by_api
    gpu = [b for k, b in cloud.created if k == "instance" and b["labels"]["dsctl-role"] == "trainer"][0]
    assert gpu["guestAccelerators"] == [{"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-a100",
                                         "acceleratorCount": 1}]
    assert gpu["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert cloud.counts() == NOTHING
    # The trainer imported the code fetched onto its VM, not the spec's folder here.
    code = next((home / "vms" / runner.run_id).glob("*trainer-0/code"))
    assert sorted(p.name for p in code.iterdir()) == ["__pycache__", "job.yaml", "mymodel.py", "mypipe.py"]
    assert {p.name.split(".")[0] for p in (code / "__pycache__").iterdir()} == {"mymodel", "mypipe"}


def test_each_api_retries_its_first_failed_call(cloud, home, tmp_path):
    """The first call to each path of every API dsctl calls before and while it makes a run's accounts (Resource
    Manager, Service Usage, IAM, Organization Policy, Compute Engine, Cloud Quotas, Cloud Storage) and registers an SSH
    key (OS Login) fails once, with 500, 502, 504 and 408 in turn: each is retried; nothing reaches the user."""
    from dsctl.provisioners.gcp import GcpProvider, accounts, oslogin
    from dsctl.provisioners.gcp.keys import ensure_key_pair

    cloud.secure_by_default = True
    cloud.faults.first_call_statuses = (500, 502, 504, 408)
    cloud.faults.storage_bursts = True
    spec = load_spec(gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8")).spec
    p = GcpProvider()
    p.check(spec, 1, tmp_path / "job")
    accounts.ensure(p._clients, p._findings.accounts, lambda kind, msg: None)
    oslogin.register(p._clients, ensure_key_pair(tmp_path / "run", comment="t"), 600)
    assert {"resourcemanager", "serviceusage", "iam", "orgpolicy", "compute", "cloudquotas", "storage",
            "oslogin"} <= set(cloud.errors_by_api), cloud.errors_by_api
    assert all(cloud.errors_by_status[s] >= 3 for s in (500, 502, 504, 408)), cloud.errors_by_status


DRIVER = """
import sys
from dsctl.orchestrator.run import JobRunner
from dsctl.specs import load_spec
JobRunner(load_spec(sys.argv[1]), run_id=sys.argv[2]).run()   # what `dsctl up JOB.yaml` runs
"""


def _start_then_kill(spec, home, cloud, run_id: str) -> str:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(spec), run_id], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        # Killed once the servers run on the "VMs": they have written their ready files.
        wait_for(lambda: len(list((home / "vms" / run_id).glob("*/ready.json"))) >= 2 or proc.poll() is not None,
                 timeout=120, what="dispatcher and worker ready on the VMs")
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert cloud.counts() == {"instances": 2, "firewalls": 2, "tpus": 1}
    return run_id


@pytest.mark.slow
def test_kill_9_then_down_by_label_with_no_local_state(cloud, sshd, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8",
                    epochs=None, steps=10**6)
    run_id = _start_then_kill(spec, home, cloud, "killed-label-0001")
    shutil.rmtree(home / "runs" / run_id)  # no local state at all
    found = find_by_label(PROJECT, ZONE, run_id)
    assert (len(found.instances), len(found.tpus), found.firewalls) == (2, 1, [f"dsctl-{run_id}-svc",
                                                                               f"dsctl-{run_id}-deny"])
    removed = down_by_label(PROJECT, ZONE, run_id, bucket=BUCKET)
    assert removed.summary().startswith("2 VMs, 1 TPU VM, 2 firewall rules")  # (and the spec, if already staged)
    assert cloud.counts() == NOTHING and staged(run_id) == []
    assert find_by_label(PROJECT, ZONE, run_id).empty
    wait_for(lambda: not processes_under(home), timeout=20, what="the VMs' processes to end with their VMs")


@pytest.mark.slow
def test_kill_9_then_dsctl_down_from_state(cloud, sshd, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8",
                    epochs=None, steps=10**6)
    run_id = _start_then_kill(spec, home, cloud, "killed-state-0001")
    proc = dsctl("down", run_id, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert cloud.counts() == NOTHING and staged(run_id) == []
    dep = load_deployment(home / "runs" / run_id)
    assert dep.status == "down" and not dep.nodes and not dep.state.firewalls
    # `down` stopped the servers over SSH and brought their logs home before deleting the VMs.
    assert (home / "runs" / run_id / "logs" / "dispatcher-0.log").exists()
    wait_for(lambda: not processes_under(home), timeout=20, what="no processes left")
