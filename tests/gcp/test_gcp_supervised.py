"""Runs that outlive the user's machine: `dsctl up --detach` on the stand-in cloud, through the real CLI.

The user's `dsctl up --detach` creates the VMs and hands the job over through Cloud Storage: the dispatcher
"VM"'s starter (provisioners/gcp/starter.py, run by the stand-in as its startup script would) starts a real
`dsctl supervise` process there, which reaches the other VMs at their internal addresses and the APIs with
the VM's own credentials, and starts the servers; `dsctl up` exits once it trains, having connected to no
VM. The supervisor runs the job, publishes its record to Cloud Storage, tears everything down, and deletes
its own VM last. Any dsctl with access to the
project reads the record (`runs show`, `logs`) and can stop the run (`down`), local state or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import BUCKET, PROJECT, ZONE, gcp_spec

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import load_deployment
from dsctl.provisioners.gcp import GcpProvider
from helpers import processes_under, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.background]  # they mostly wait: beside the other tests

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
BUCKET_OF = ("--project", PROJECT, "--bucket", BUCKET)  # where its record is
WHERE = (*BUCKET_OF, "--zone", ZONE)  # ... and its VMs


def cli(*args, home=None, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if home is not None:
        env["DSCTL_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "dsctl.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def up_detached(spec) -> str:
    proc = cli("up", spec, "--detach", "--yes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    latest = json.loads(proc.stdout)
    assert latest["progress"]["batches"] > 0 or latest["run"]["status"] != "running", "returns once it trains"
    run_id = latest["run"]["id"]
    # The user's machine never reached a VM: it holds no SSH key of the run (the dispatcher VM started the
    # supervisor from the hand-over in Cloud Storage).
    assert not (Path(os.environ["DSCTL_HOME"]) / "runs" / run_id / "ssh").exists()
    # This spec's `dsctl up` (other tests may run one of their own meanwhile).
    assert not [p for p in psutil.process_iter(["cmdline"]) if "up" in (p.info["cmdline"] or [])
                and "--detach" in (p.info["cmdline"] or []) and str(spec) in (p.info["cmdline"] or [])], \
        "the user's dsctl process is gone"
    return run_id


def show(run_id, home=None, *where) -> dict:
    proc = cli("runs", "show", run_id, "--json", *where, home=home)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def when_ended(run_id, timeout: float, what: str) -> dict:
    def ended():
        record = show(run_id)
        return record if record["status"] != "running" else None

    return wait_for(ended, timeout=timeout, interval=3, what=what)


def test_a_detached_run_finishes_on_the_cloud_and_leaves_nothing(cloud, sshd, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="n2-standard-8", epochs=1,
                    elements=2048, latency_ms=8)
    run_id = up_detached(spec)
    # Nobody looks until it is over; then `runs show` brings the record home.
    record = when_ended(run_id, 300, "the supervised run to end")
    assert record["status"] == "succeeded", record.get("error")
    s = record["summary"]
    assert s["elements_expected"] == 2048 and s["elements_received"] + s["elements_lost"] == 2048
    assert s["batches"] > 0 and s["cost"]["total"] > 0
    assert record["windows"] and all(w["run_id"] == run_id for w in record["windows"])
    kinds = [e["kind"] for e in record["events"]]
    assert "handed-over" in kinds and "training" in kinds and "down" in kinds
    wait_for(lambda: cloud.counts() == NOTHING, timeout=60, what="the supervisor's own VM to be deleted")
    # Its VMs carried the run's maximum duration, so Compute Engine ends them should the supervisor be lost.
    for kind, body in cloud.created:
        if kind == "instance":
            sched = body["scheduling"]
            assert sched["maxRunDuration"]["seconds"] == str(86400 + 3600) and sched["instanceTerminationAction"] == "DELETE"
    assert json.loads(cli("status", "--json").stdout) == [], "ended runs leave `dsctl status`"
    assert processes_under(home) == []


def test_down_from_another_machine_stops_a_detached_run_and_records_it(cloud, sshd, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="n2-standard-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=900)
    run_id = up_detached(spec)
    elsewhere = tmp_path / "another-machine"  # a DSCTL_HOME with no state and no record of the run
    seen = show(run_id, elsewhere, *BUCKET_OF)
    assert seen["status"] == "running" and seen["id"] == run_id
    proc = cli("down", run_id, *WHERE, home=elsewhere)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "recorded it interrupted" in proc.stdout, proc.stdout
    assert cloud.counts() == NOTHING
    there = RunStore(elsewhere / "runs.db").get(run_id)
    assert there.status == "interrupted" and "dsctl down" in there.error
    events = [e["kind"] for e in RunStore(elsewhere / "runs.db").events(run_id)]
    assert "stopped" in events
    # The machine that started it learns the same when it looks, and has nothing left to take down.
    assert show(run_id)["status"] == "interrupted"
    assert json.loads(cli("status", "--json").stdout) == []
    assert processes_under(home) == []


def test_a_detached_run_stops_itself_at_its_maximum_duration(cloud, sshd, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="n2-standard-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=900, gcp={"max_duration_s": 60})
    run_id = up_detached(spec)
    record = when_ended(run_id, 240, "the run to reach its maximum duration")
    assert record["status"] == "interrupted" and "gcp.max_duration_s" in record["error"]
    wait_for(lambda: cloud.counts() == NOTHING, timeout=60, what="everything to be deleted")
    for kind, body in cloud.created:
        if kind == "instance":
            assert body["scheduling"]["maxRunDuration"]["seconds"] == str(60 + 3600)
    assert processes_under(home) == []


def test_an_attached_up_follows_its_supervised_run_to_the_end(cloud, sshd, home, tmp_path):
    """Plain `dsctl up` on Google Cloud: the same supervisor runs the job; this process follows what it
    publishes and prints the run's summary, as for any run."""
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="n2-standard-8", epochs=1,
                    elements=1024, latency_ms=8)
    proc = cli("up", spec, "--yes", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert record["status"] == "succeeded" and record["summary"]["elements_received"] > 0
    assert "handed-over" in [e["kind"] for e in RunStore().events(record["id"])]
    assert RunStore().windows(record["id"]), "the supervisor's windows are in this machine's record"
    wait_for(lambda: cloud.counts() == NOTHING, timeout=60, what="everything to be deleted")
    assert processes_under(home) == []


def test_an_attached_run_whose_dsctl_is_gone_is_torn_down_after_the_outage_limit(cloud, sshd, home, tmp_path):
    """kill -9 of an attached `dsctl up` (a laptop that never comes back): its supervisor no longer hears from it,
    and after gcp.outage_limit_s tears the run down by itself and says why."""
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="n2-standard-8", epochs=None,
                    latency_ms=1, model="{step_time_ms: 20}", duration_s=900, gcp={"outage_limit_s": 20})
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--yes"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    run_dir = wait_for(lambda: next(iter((home / "runs").glob("*/state.json")), None), timeout=60, what="a run dir").parent
    wait_for(lambda: GcpProvider().handed_off(load_deployment(run_dir)), timeout=120, what="the hand-over")
    time.sleep(5)
    up.kill()
    up.wait(30)
    record = when_ended(run_dir.name, 240, "the supervisor to give up on its follower")
    assert record["status"] == "interrupted" and "has not been heard from" in record["error"], record["error"]
    wait_for(lambda: cloud.counts() == NOTHING, timeout=60, what="everything to be deleted")
    assert processes_under(home) == []
