"""The Google Cloud provider's parts, each on its own: fast tests, no TensorFlow processes.

Settings and credentials errors, the plan, names, request bodies, quoting of
what reaches a remote shell, the startup script, the wheel, operation error
classification, confirmed deletion, Ctrl-C during `up`, and the stand-in's own
list filter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import zipfile

import pytest
from conftest import CALLER, PROJECT, ZONE, changes, credentials_of, gcp_spec
from fake_gce import matches, parse_filter
from metadata_server import MetadataServer

from dsctl.orchestrator.run import JobRunner
from dsctl.specs import SpecError, load_spec, load_spec_text
from helpers import EXAMPLES, dsctl, wait_for

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}

MINIMAL_GCP = """
name: g
provider: gcp
trainer: {machine: tpu-v2-8, steps: 10}
pipeline: {builtin: synthetic}
"""


# -- settings and credentials ---------------------------------------------------------------------------
def test_missing_project_zone_and_credentials_are_clear_errors(no_credentials, monkeypatch):
    from dsctl.provisioners.gcp.settings import resolve

    spec = load_spec_text(MINIMAL_GCP).spec
    with pytest.raises(SpecError, match=r"gcp.project: provider: gcp needs a Google Cloud project: set gcp.project"):
        resolve(spec)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p$(reboot)")
    with pytest.raises(SpecError, match="is not a Google Cloud project id"):
        resolve(spec)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "acme-ml")
    with pytest.raises(SpecError, match=r"gcp.zone: provider: gcp needs a zone .* set gcp.zone"):
        resolve(spec)
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", "us-central1-b")
    with pytest.raises(SpecError) as info:
        resolve(spec)
    assert "needs Google Cloud credentials and none were found" in str(info.value)
    assert "gcloud auth application-default login" in str(info.value)
    # With the APIs pointed elsewhere (tests, private endpoints), anonymous credentials are used instead.
    for var in ("DSCTL_GCE_ENDPOINT", "DSCTL_TPU_ENDPOINT", "DSCTL_CRM_ENDPOINT", "STORAGE_EMULATOR_HOST"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.setenv("DSCTL_SSH_PORT", "2222")
    s = resolve(spec)
    assert (s.project, s.zone, s.ssh_port, s.bucket) == ("acme-ml", "us-central1-b", 2222, "acme-ml-dsctl")
    assert s.python == "/opt/dsctl/venv/bin/python" and s.bootstrap


def test_the_provider_check_refuses_before_anything_is_made(no_credentials, tmp_path):
    from dsctl.provisioners import get_provider

    with pytest.raises(SpecError, match="gcp.project"):
        get_provider("gcp").check(load_spec_text(MINIMAL_GCP).spec, 4, tmp_path)


# -- spec -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra,where,message", [
    ("gcp: {dispatcher_port: 6000, worker_port: 6000}", "gcp.worker_port", "both use port 6000"),
    ("gcp: {zone: uscentral1}", "gcp.zone", "zone must look like 'us-central1-a'"),
    ("gcp: {labels: {Team: x}}", "gcp.labels", "label Team="),
    ("gcp: {labels: {dsctl-run: x}}", "gcp.labels", "set by dsctl itself"),
    ("gcp: {projct: p}", "gcp.projct", "unknown key 'projct'. Did you mean 'project'?"),
    ("gcp: {bucket: 'b$(reboot)'}", "gcp.bucket", "a bucket name is 3-222 lower-case letters"),
    ("gcp: {project: 'p; rm -rf ~'}", "gcp.project", "a project id is 6-30 lower-case letters"),
])
def test_gcp_section_errors_point_at_the_field(extra, where, message):
    with pytest.raises(SpecError) as info:
        load_spec_text(MINIMAL_GCP + extra + "\n", "job.yaml")
    assert where in str(info.value) and message in str(info.value), str(info.value)


def test_tpu_trainer_name_is_checked_for_gcp_only():
    bad = MINIMAL_GCP.replace("tpu-v2-8", "tpu-2-8")
    with pytest.raises(SpecError, match="trainer.machine: 'tpu-2-8' is not a TPU VM type"):
        load_spec_text(bad)
    load_spec_text(bad.replace("provider: gcp", "provider: local"))  # locally a machine type is only a price


def test_every_shipped_gcp_example_still_loads_and_a_local_spec_may_keep_its_gcp_section():
    s = load_spec(EXAMPLES / "gcp-resnet50.yaml").spec
    # The flagship example names only its project and zone: every other gcp field has a working default.
    assert s.provider == "gcp" and s.gcp.model_dump(exclude_defaults=True) == {"project": "my-project",
                                                                              "zone": "us-central1-b"}
    local = load_spec_text(MINIMAL_GCP.replace("provider: gcp", "provider: local") + "gcp: {project: acme-ml}\n").spec
    assert local.gcp.project == "acme-ml"


# -- plan ---------------------------------------------------------------------------------------------------
def test_plan_of_the_papers_resnet50_example(no_credentials):
    from dsctl.costmodel import load_catalog
    from dsctl.provisioners.gcp import plan

    spec = load_spec(EXAMPLES / "gcp-resnet50.yaml").spec
    p = plan(spec)
    assert [(line.role, line.machine, line.count, line.kind, line.provisioning) for line in p.lines] == [
        ("dispatcher", "n2-standard-8", 1, "VM", "spot"), ("workers", "n2-standard-8", 16, "VM", "spot"),
        ("trainers", "tpu-v2-8", 1, "TPU VM", "standard")]
    # Each line at the price of how it is bought: the service as Spot (the paper's $0.08/h), the TPU on-demand.
    cat = load_catalog(spec.pricing)
    n2 = cat.split("n2-standard-8", provisioning="spot").total
    tpu = cat.split("tpu-v2-8", provisioning="standard").total
    assert p.lines[1].per_hour_each == pytest.approx(n2) and p.lines[2].per_hour_each == pytest.approx(tpu)
    assert p.per_hour == pytest.approx(n2 * 17 + tpu)
    # 112,320 steps at no more than 1000/222 batches/s: the paper's $40.6 with the service.
    assert p.lower_bound and p.job_cost == pytest.approx(40.6, abs=0.1)
    text = p.render()
    assert "Spot" in text and "on-demand" in text and "at least $40.59" in text and "no zone is set" not in text
    assert "TensorFlow 2.18.0 on every VM" in text and "external address" in text
    big = plan(spec, 640, batches_per_s=4.5)
    assert big.lines[1].count == 640 and big.per_hour == pytest.approx(n2 * 641 + tpu)
    assert not big.lower_bound and big.job_hours == pytest.approx(112320 / 4.5 / 3600)
    assert big.as_dict()["lines"][1]["per_hour"] == pytest.approx(n2 * 640)
    # On-demand workers are priced on-demand, never at the Spot price: this catalog has no such price, so it says so.
    standard = spec.model_copy(update={"service": spec.service.model_copy(update={"provisioning": "standard"})})
    p = plan(standard)
    assert p.lines[1].per_hour_each is None and p.per_hour is None
    assert any("service.provisioning" in n for n in p.notes)
    listed = plan(standard.model_copy(update={"pricing": "gcp-us-central1-2025"}))
    assert listed.lines[1].per_hour_each == pytest.approx(
        load_catalog("gcp-us-central1-2025").split("n2-standard-8", provisioning="standard").total)


def test_plan_without_a_known_length_gives_the_hourly_cost(no_credentials):
    from dsctl.provisioners.gcp import plan

    spec = load_spec_text(MINIMAL_GCP.replace("steps: 10", "steps: 10, model: {kind: synthetic}")
                          + "gcp: {project: acme-ml, zone: us-central1-b}\n").spec
    p = plan(spec)
    assert p.job_cost is None and "per hour it runs" in p.render() and "project acme-ml, zone us-central1-b" in p.render()


# -- names, bodies ------------------------------------------------------------------------------------------
def test_names_fit_compute_engine_rules_even_for_long_run_ids():
    from dsctl.provisioners.gcp import naming

    rid = "a-very-long-job-name-that-uses-all-forty-1122-031500-ab12"
    names = [naming.instance_name(rid, "dispatcher", 0), naming.instance_name(rid, "worker", 9999),
             naming.firewall_name(rid)]
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", n) for n in names), names
    assert naming.instance_name(rid, "worker", 1) != naming.instance_name(rid + "x", "worker", 1)
    assert re.fullmatch(r"[a-z0-9_-]{0,63}", naming.label_value(rid.upper() + "!" * 40))


def test_request_bodies_gpu_spot_public_ips_subnetwork_service_account():
    from google.cloud import compute_v1 as c

    from dsctl.provisioners.gcp import compute
    from dsctl.provisioners.gcp.settings import GcpSettings

    s = GcpSettings(project="p", zone="us-central1-b", subnetwork="sub", public_ips=True)
    vm = compute.VmConfig(machine="a2-highgpu-2g", labels={"dsctl-run": "r"}, tag="t", metadata={"ssh-keys": "u:k"},
                          image="gpu-img", service_account="dsctl-supervisor@p.iam.gserviceaccount.com")
    body = c.Instance.to_dict(compute.instance_body(s, "n", vm))
    assert body["guest_accelerators"] == [{"accelerator_type": "zones/us-central1-b/acceleratorTypes/nvidia-tesla-a100",
                                           "accelerator_count": 2}]
    assert body["scheduling"]["on_host_maintenance"] == "TERMINATE"  # GPUs cannot live-migrate
    assert body["disks"][0]["initialize_params"]["source_image"] == "gpu-img"
    assert body["network_interfaces"][0]["access_configs"][0]["type_"] == "ONE_TO_ONE_NAT"
    assert body["network_interfaces"][0]["subnetwork"] == "projects/p/regions/us-central1/subnetworks/sub"
    assert body["service_accounts"] == [{"email": "dsctl-supervisor@p.iam.gserviceaccount.com",
                                         "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert not body.get("shielded_instance_config")  # its image does not support Shielded VM (vm.shielded False)
    shielded = c.Instance.to_dict(compute.instance_body(s, "n", compute.VmConfig(
        machine="n2-standard-8", labels={}, tag="t", metadata={}, image="img", shielded=True)))
    assert shielded["shielded_instance_config"] == {"enable_secure_boot": True, "enable_vtpm": True,
                                                    "enable_integrity_monitoring": True}
    # Bulk insert: bare names in instanceProperties (machine, GPU and disk types), all or nothing.
    bulk = c.BulkInsertInstanceResource.to_dict(compute.bulk_body(s, ["w-0", "w-1"], vm))
    assert (int(bulk["count"]), int(bulk["min_count"]), sorted(bulk["per_instance_properties"])) == (2, 2, ["w-0", "w-1"])
    props = bulk["instance_properties"]
    assert props["machine_type"] == "a2-highgpu-2g" and props["guest_accelerators"][0]["accelerator_type"] == "nvidia-tesla-a100"
    assert props["disks"][0]["initialize_params"]["disk_type"] == "pd-balanced"
    spot = c.Instance.to_dict(compute.instance_body(s, "n", compute.VmConfig(
        machine="n2-standard-8", labels={}, tag="t", metadata={}, image="img", provisioning="spot")))["scheduling"]
    assert (spot["provisioning_model"], spot["instance_termination_action"], spot["automatic_restart"]) == ("SPOT", "STOP", False)
    internal = GcpSettings(project="p", zone="us-central1-b", public_ips=False)
    assert not c.Instance.to_dict(compute.instance_body(internal, "n", vm))["network_interfaces"][0].get("access_configs")
    from dsctl.provisioners.gcp.machinetypes import machine_kind

    assert machine_kind("n2-standard-8").kind == "cpu" and machine_kind("tpu-v5litepod-4").accelerator == "v5litepod-4"


# -- what reaches a remote shell ------------------------------------------------------------------------------
def test_every_value_reaching_a_remote_shell_is_quoted(tmp_path):
    """Run the launch and fetch commands in a real shell with hostile values: nothing is interpreted."""
    from dsctl.provisioners.gcp import remote

    pwned = tmp_path / "pwned"
    evil = f"$(touch {pwned}); `touch {pwned}`; ' \" && touch {pwned} #"
    fake_python = tmp_path / "py thon's"
    fake_python.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/args.txt"\n')
    fake_python.chmod(0o755)
    layout = remote.Layout(str(tmp_path / "node dir; $(touch pwned)"))
    cmd = remote.launch(layout, str(fake_python), "dsctl.runtime.worker", ["--dispatcher", evil, "--host", "10.0.0.2"],
                        env={"X": evil})
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    pid, start = remote.parse_launch(out.stdout)
    assert pid > 0
    deadline = time.monotonic() + 10
    while not (tmp_path / "args.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "args.txt").read_text().splitlines() == ["-m", "dsctl.runtime.worker", "--dispatcher", evil,
                                                                "--host", "10.0.0.2"]
    for cmd in (remote.stop(layout, start), remote.status([layout.dir, evil]), remote.probe(evil, evil),
                remote.fetch(evil, evil, evil, evil, [evil], evil), remote.tail(evil), remote.wait_file(evil, 0.1)):
        subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=30)
    assert not pwned.exists() and not (tmp_path / "pwned").exists()


def test_a_process_that_ends_between_readings_is_never_reported_killed(tmp_path):
    """Polled as fast as the status command runs, a process that exits 0 reads either as running or as
    exited with code 0: never as gone without an exit code (which poll() reports as -9, killed)."""
    from dsctl.provisioners.gcp import remote

    program = tmp_path / "python"
    program.write_text("#!/bin/sh\nsleep 0.$(( $$ % 7 ))\nexit 0\n")  # ends at varying moments
    program.chmod(0o755)
    layout = remote.Layout(str(tmp_path / "node"))

    def ended(start: int) -> remote.ProcStatus | None:
        at = time.monotonic()
        res = subprocess.run(["bash", "-c", remote.status([layout.dir])], capture_output=True, text=True, timeout=30)
        st = remote.parse_status(res.stdout, at)[layout.dir]
        return None if st.running(start) else st

    seen = []
    for _ in range(30):
        out = subprocess.run(["bash", "-c", remote.launch(layout, str(program), "m", [])], capture_output=True,
                             text=True, timeout=30)
        _, start = remote.parse_launch(out.stdout)
        seen.append(wait_for(lambda start=start: ended(start), timeout=30, interval=0, what="the process to end").exit_code)
    assert seen == [0] * 30


def test_startup_script_installs_from_the_wheelhouse_only_and_is_valid_bash():
    """Its real run is tests/gcp/test_gcp_boot.py (a Debian 12 root filesystem with no network but Cloud Storage)."""
    from dsctl.provisioners.gcp import software, startup
    from dsctl.specs import load_spec_text

    for machine in ("n2-standard-8", "a2-highgpu-1g", "tpu-v2-8"):
        spec = load_spec_text(MINIMAL_GCP.replace("tpu-v2-8", machine) + "gcp: {project: acme-ml, zone: us-central1-b}\n").spec
        sw = software.resolve(spec, "2.21.0")
        for kind in sw.kinds.values():
            text = startup.script(kind=kind, tf_version=sw.tensorflow_version, bucket="b",
                                  wheelhouse_prefix="dsctl/wheelhouses/abc/", dsctl_prefix="dsctl/runs/r/staging/",
                                  dsctl_wheel="dsctl-0.1.0+gabc-py3-none-any.whl")
            assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
            assert startup.MARKER in text and "--no-index" in text and "--without-pip" in text
            assert "apt-get" not in text and "pypi" not in text.lower()
            if kind.tensorflow:
                assert kind.tensorflow in text
            if kind.kind == "tpu":  # the runtime's own TensorFlow, seen from the venv
                assert "--system-site-packages" in text and "tensorflow" not in text.split("--find-links")[1].split("||")[0]
            assert ("nvidia-smi" in text) == (kind.kind == "gpu")


def test_wheel_of_this_version_has_the_runtime_and_a_consistent_record(tmp_path):
    import base64
    import hashlib

    from dsctl.provisioners.gcp.wheel import build_wheel

    path = build_wheel(tmp_path)
    assert re.fullmatch(r"dsctl-\d+\.\d+\.\d+\+g[0-9a-f]{10}-py3-none-any\.whl", path.name)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert {"dsctl/__init__.py", "dsctl/runtime/worker.py", "dsctl/runtime/pipelines/synthetic.py",
                "dsctl/specs/schema.py", "dsctl/costmodel/catalogs/paper-2023-06.yaml"} <= names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        record = z.read(next(n for n in names if n.endswith("RECORD"))).decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if digest:
                data = z.read(name)
                assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                assert int(size) == len(data)
    assert build_wheel(tmp_path / "again").name == path.name  # same code, same version


def test_key_pair_is_private_and_reused(tmp_path):
    from dsctl.provisioners.gcp.keys import ensure_key_pair

    kp = ensure_key_pair(tmp_path, "dsctl-r")
    assert oct(kp.private_path.stat().st_mode & 0o777) == "0o600"
    assert oct(kp.private_path.parent.stat().st_mode & 0o777) == "0o700"
    assert kp.public.startswith("ssh-ed25519 ")
    assert ensure_key_pair(tmp_path, "dsctl-r") == kp


# -- against the stand-in, without SSH --------------------------------------------------------------------------
def _fleet(run_id: str, **settings):
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.resources import Fleet
    from dsctl.provisioners.gcp.settings import GcpSettings

    return Fleet(Clients(GcpSettings(project=PROJECT, zone=ZONE, running_timeout_s=20, **settings).with_env_endpoints()),
                 run_id)


DEBIAN = "projects/debian-cloud/global/images/family/debian-12"


def _machine(run_id: str, role: str, index: int, machine: str = "n2-standard-8"):
    from dsctl.provisioners.gcp import compute, naming
    from dsctl.provisioners.gcp.machinetypes import machine_kind
    from dsctl.provisioners.gcp.resources import Machine

    kind = machine_kind(machine).kind
    vm = compute.VmConfig(machine=machine, labels=naming.labels(run_id, "j", role, index=index),
                          tag=naming.network_tag(run_id), metadata={},
                          image="tpu-vm-tf-2.18.0-pjrt-v5p-and-below" if kind == "tpu" else DEBIAN)
    return Machine(role, index, naming.instance_name(run_id, role, index), vm, kind)


def _rules(run_id: str):
    from dsctl.provisioners.gcp import firewall, naming

    return firewall.run_rules(run_id, naming.network_tag(run_id), 5050, 5051)


def test_tpu_out_of_capacity_is_classified(cloud):
    """A TPU queued resource that finds no capacity within gcp.tpu_timeout_s fails with Cloud TPU's reason."""
    from dsctl.provisioners.gcp.errors import ZoneExhausted

    cloud.faults.tpu_exhausted = True
    fleet = _fleet("tpu-run", tpu_timeout_s=2)
    m = _machine("tpu-run", "trainer", 0, "tpu-v2-8")
    fleet.create([m])
    with pytest.raises(ZoneExhausted) as info:
        fleet.wait_tpu(m, lambda *a: None)
    assert f"zone {ZONE} has no capacity for 1 TPU v2-8 VM" in str(info.value)
    fleet.sweep()
    assert cloud.counts() == NOTHING


def test_a_retried_tpu_request_is_not_made_twice_and_tpus_wait_on_their_own_clock(cloud):
    """TPU VMs are asked for as queued resources with a request id, a validity window of gcp.tpu_timeout_s, and
    the run's Spot choice; their addresses are read from the node once it is READY."""
    from dsctl.provisioners.gcp.machinetypes import machine_kind

    fleet = _fleet("qr-run", tpu_timeout_s=120, public_ips=True)
    m = _machine("qr-run", "trainer", 0, "tpu-v2-8")
    m.vm.provisioning = "spot"
    fleet.create([m])
    body = next(b for k, b in cloud.created if k == "queued_resource")
    assert body["queueingPolicy"]["validUntilDuration"] == "120s" and "spot" in body
    qr_posts = [(meth, p) for meth, p in cloud.calls if meth == "POST" and p.endswith("/queuedResources")]
    assert len(qr_posts) == 1
    seen = []
    fleet.wait_tpu(m, lambda m, internal, external: seen.append((internal, external)))
    assert seen and seen[0][0] and seen[0][1] and seen[0][0] != seen[0][1]  # external address requested (default)
    assert machine_kind(m.vm.machine).kind == "tpu"
    fleet.sweep()
    assert cloud.counts() == NOTHING


def test_quota_refused_by_the_insert_call_itself_is_classified_the_same(cloud):
    from dsctl.provisioners.gcp.errors import QuotaExceeded

    cloud.faults.fail_nth_instance, cloud.faults.fail_label, cloud.faults.fail_sync = 1, ("dsctl-role", "worker"), True
    fleet = _fleet("sync-run")
    with pytest.raises(QuotaExceeded) as info:
        fleet.create([_machine("sync-run", "worker", i) for i in range(4)])
    assert f"Google Cloud refused to create 4 n2-standard-8 worker VMs in zone {ZONE}" in str(info.value)
    assert "4 were asked for" in str(info.value)


def test_api_rate_quota_403_is_retried(cloud):
    # Every second call to a method and path is refused: each call still succeeds on its next attempt.
    cloud.faults.burst_every, cloud.faults.burst_length, cloud.faults.burst_status = 2, 1, 403
    fleet = _fleet("rate-run")
    machines = [_machine("rate-run", "worker", i) for i in range(3)] + [_machine("rate-run", "dispatcher", 0)]
    fleet.create(machines, _rules("rate-run"))
    fleet.wait_running(machines, 20, lambda *a: None)
    fleet.delete([m.name for m in machines], [], [r.name for r in _rules("rate-run")])
    assert cloud.errors_injected >= 3
    assert cloud.counts() == NOTHING


def test_deletion_is_confirmed_before_the_state_forgets(cloud):
    cloud.timing.stopping_s = 1.0  # deleted VMs linger in STOPPING for a second
    fleet = _fleet("del-run")
    machines = [_machine("del-run", "worker", i) for i in range(3)]
    fleet.create(machines, _rules("del-run"))
    fleet.wait_running(machines, 20, lambda *a: None)
    forgotten = []

    def on_gone(name):
        with cloud.lock:  # at the moment the caller forgets it, the stand-in must no longer have it
            assert not [k for k in cloud.instances if k[2] == name]
        forgotten.append(name)

    t0 = time.monotonic()
    fleet.delete([m.name for m in machines], [], ["dsctl-del-run-svc"], on_gone)
    assert time.monotonic() - t0 >= 1.0
    assert sorted(forgotten) == sorted([m.name for m in machines] + ["dsctl-del-run-svc"])
    fleet.sweep()  # the deny rule, found by its name
    assert cloud.counts() == NOTHING


def test_ctrl_c_during_up_deletes_everything(cloud, home, tmp_path):
    cloud.faults.stuck_names = ["worker-2"]  # keeps `up` waiting for RUNNING
    spec = gcp_spec(tmp_path / "job", home=home, workers=3, gcp={"running_timeout_s": 60})
    runner = JobRunner(load_spec(spec))

    def interrupt_when_created():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and cloud.counts()["instances"] < 4:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_created, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert cloud.counts() == NOTHING
    from dsctl.orchestrator.store import RunStore

    assert RunStore().get(runner.run_id).status == "interrupted"


# -- the stand-in's filter, as Compute Engine reads it ---------------------------------------------------------------
def test_stand_in_list_filter():
    obj = {"name": "a-1", "status": "RUNNING", "labels": {"dsctl-run": "r1", "dsctl-role": "worker"}}
    assert parse_filter('labels.dsctl-run = "r1"') == [("labels.dsctl-run", "=", "r1")]
    assert matches(obj, parse_filter('(labels.dsctl-run = "r1") AND (labels.dsctl-role = "worker")'))
    assert matches(obj, parse_filter('labels.dsctl-run = r1 AND status != "STOPPING"'))
    assert not matches(obj, parse_filter('labels.dsctl-run = "r2"'))
    assert matches(obj, parse_filter("name eq a-.*")) and not matches(obj, parse_filter("name ne a-.*"))
    assert matches(obj, parse_filter("labels.dsctl-role:*"))
    with pytest.raises(ValueError):
        parse_filter("labels.x >< 3")


# -- what the CLI calls -------------------------------------------------------------------------------------------
class _Talk:
    """`dsctl up`'s side of the conversation (orchestrator/up.py Conversation), written down."""

    def __init__(self, shown: list, asked: list):
        self.shown, self.asked = shown, asked

    def say(self, text: str) -> None:
        self.shown.append(text)

    def ask(self, question: str) -> bool:
        self.asked.append(question)
        return True


def test_confirm_asks_only_for_gcp_and_never_without_a_terminal(cloud, home, tmp_path):
    from dsctl.orchestrator.up import UpOptions, approved
    from dsctl.provisioners.gcp import GcpProvider
    from dsctl.provisioners.gcp.planning import confirm

    spec = load_spec(gcp_spec(tmp_path / "job", home=home)).spec
    shown, asked = [], []
    ask = lambda q: asked.append(q) or True  # noqa: E731
    assert GcpProvider().confirm(spec, 3, yes=True, ask=ask, echo=shown.append)
    # A local run bills nothing: `dsctl up` asks only a provider that plans (contract.Plans).
    assert approved(load_spec_text(MINIMAL_GCP.replace("gcp", "local", 1)), UpOptions(path=tmp_path / "job.yaml"),
                    _Talk(shown, asked))
    assert not shown and not asked
    with pytest.raises(SpecError, match="pass --yes"):  # stdin is no terminal here
        GcpProvider().confirm(spec, 3, yes=False, ask=ask, echo=shown.append)
    assert confirm(spec, 3, yes=False, ask=ask, echo=shown.append, interactive=True)
    assert asked == ["Create these machines on Google Cloud?"]
    assert f"project {PROJECT}, zone {ZONE}" in shown[-1] and "workers" in shown[-1]
    # Before asking, the live project was checked (reads only): nothing was created.
    assert cloud.counts() == NOTHING and _only_reads(cloud)


def _only_reads(cloud) -> bool:
    """Every call so far was a read: GETs, testIamPermissions and policy reads (POSTs that change nothing), and the
    exchange of the caller's refresh token."""
    return not changes(cloud)


def test_down_by_label_needs_project_and_zone(cloud, monkeypatch):
    from dsctl.provisioners import Where
    from dsctl.provisioners.gcp import GcpProvider

    p, said = GcpProvider(), []
    assert not p.looks_there(Where())
    with pytest.raises(SpecError, match="--project P --zone Z"):
        p.down_by_label("some-run", Where(), said.append)
    fleet = _fleet("orphan-run")
    fleet.create([_machine("orphan-run", "worker", 0), _machine("orphan-run", "trainer", 0, "tpu-v2-8")],
                 _rules("orphan-run"))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    assert p.looks_there(Where())
    assert p.down_by_label("orphan-run", Where(zone=ZONE), said.append) == "deleted 1 VM, 1 TPU VM, 2 firewall rules"
    assert cloud.counts() == NOTHING
    assert p.down_by_label("orphan-run", Where(zone=ZONE), said.append) == "nothing found on Google Cloud."


def test_cli_dry_run_prints_the_plan_and_a_real_up_asks_first(cloud, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", home=home, workers=3)
    plan = dsctl("up", spec, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "n2-standard-8" in plan.stdout and "tpu-v2-8" in plan.stdout and "dry run: nothing was created" in plan.stdout
    assert not cloud.calls  # the dry run asked nothing of the APIs
    refused = dsctl("up", spec, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2 and "pass --yes" in refused.stderr and "Traceback" not in refused.stderr
    assert cloud.counts() == NOTHING and _only_reads(cloud)


def test_cli_down_finds_a_run_by_label_without_local_state(cloud, home):
    fleet = _fleet("lost-run")
    fleet.create([_machine("lost-run", "worker", 0), _machine("lost-run", "worker", 1)], _rules("lost-run"))
    assert cloud.counts()["instances"] == 2
    down = dsctl("down", "lost-run", "--project", PROJECT, "--zone", ZONE)
    assert down.returncode == 0, down.stderr
    assert "deleted 2 VMs, 2 firewall rules" in down.stdout and cloud.counts() == NOTHING
    again = dsctl("down", "lost-run", "--project", PROJECT, "--zone", ZONE)
    assert again.returncode == 0 and "nothing found" in again.stdout


def test_fetch_on_the_vm_unpacks_the_code_and_refuses_paths_outside_it(cloud, tmp_path, request):
    """The command trainers run to get the spec and code from Cloud Storage (here: the emulator)."""
    import io
    import sys
    import tarfile

    from conftest import BUCKET

    from dsctl.provisioners.gcp import remote
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.settings import GcpSettings
    from dsctl.provisioners.gcp.storage import Staging, code_archive

    src = tmp_path / "job"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text("secret\n")
    (src / "job.yaml").write_text("name: x\n")
    settings = GcpSettings(project=PROJECT, zone=ZONE, bucket=BUCKET).with_env_endpoints()
    staging = Staging(Clients(settings), "fetch-run")
    staging.upload("spec.json", b'{"name": "x"}')
    staging.upload("code.tar.gz", code_archive(src))
    dest = tmp_path / "vm dir"
    cmd = remote.fetch(sys.executable, BUCKET, staging.staging_prefix, str(dest), ["spec.json", "code.tar.gz"],
                       settings.storage_host)
    # On the VM it calls as the VM's account, with a token from the VM's metadata server.
    mds = MetadataServer(project_id=PROJECT, service_account=CALLER, token_issuer=cloud.issue_token).start()
    request.addfinalizer(mds.stop)
    env = {**os.environ, "GCE_METADATA_HOST": f"127.0.0.1:{mds.port}"}
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert (dest / "spec.json").read_text() == '{"name": "x"}'
    assert sorted(str(p.relative_to(dest / "code")) for p in (dest / "code").rglob("*")) == ["job.yaml", "pkg", "pkg/mod.py"]

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"owned"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    staging.upload("evil.tar.gz", buf.getvalue())
    out = subprocess.run(["bash", "-c", remote.fetch(sys.executable, BUCKET, staging.staging_prefix, str(dest),
                                                       ["evil.tar.gz"], settings.storage_host)],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "refusing archive member" in out.stderr
    assert not (dest / "escaped.txt").exists()

    # Manifest mode (the wheelhouse): every file is checked against the manifest's sha256 before it is kept.
    import hashlib
    import json

    good, bad = b"wheel bytes", b"tampered bytes"
    files = [{"name": "a.whl", "sha256": hashlib.sha256(good).hexdigest(), "size": len(good)}]
    staging.upload("wh/MANIFEST.json", json.dumps({"files": files}).encode())
    staging.upload("wh/a.whl", good)
    fetch = lambda: subprocess.run(["bash", "-c", remote.fetch(  # noqa: E731
        sys.executable, BUCKET, staging.staging_prefix + "wh/", str(tmp_path / "wh"), [], settings.storage_host,
        manifest=True)], capture_output=True, text=True, timeout=60, env=env)
    out = fetch()
    assert out.returncode == 0 and json.loads(out.stdout)["bytes"] > len(good)
    assert (tmp_path / "wh" / "a.whl").read_bytes() == good
    staging.upload("wh/a.whl", bad)
    (tmp_path / "wh" / "a.whl").unlink()
    out = fetch()
    assert out.returncode != 0 and "does not match its manifest" in out.stderr and not (tmp_path / "wh" / "a.whl").exists()


def _fake_wheelhouse(cache, kind) -> None:
    """A complete wheelhouse in the local cache for `kind` (what `pip download` would have left), so no pip runs.
    The CPU kind is the dispatcher's here: its wheelhouse also holds what the run's supervisor needs."""
    import hashlib
    import json

    from dsctl.provisioners.gcp import wheelhouse

    recipe = wheelhouse.Recipe.for_kind(kind, supervisor=kind.kind == "cpu")
    final = cache / recipe.digest
    final.mkdir(parents=True)
    files = []
    for name in ("pip-26.0-py3-none-any.whl", f"stand_in_{kind.kind}-1.0-py3-none-any.whl"):
        data = name.encode() * 100
        (final / name).write_bytes(data)
        files.append({"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    (final / wheelhouse.MANIFEST).write_text(json.dumps({"files": files}))


def test_staging_gives_every_vm_kind_its_wheelhouse_and_the_vms_read_access(cloud, home, tmp_path, monkeypatch):
    """With gcp.bootstrap (the default): this dsctl's wheel in the run's staging folder, one wheelhouse per VM kind
    uploaded once (manifest last) to a shared content-addressed folder, the bucket readable by the VMs' service
    account, and a startup script per kind pointing at them. `down` deletes the run's staging, not the caches."""
    from conftest import BUCKET
    from google.cloud import storage

    from dsctl.provisioners import Deployment
    from dsctl.provisioners.gcp import GcpProvider, accounts, stage, state, vms

    monkeypatch.setenv("DSCTL_WHEELHOUSE_CACHE", str(tmp_path / "wheelhouses"))
    spec = load_spec(gcp_spec(tmp_path / "job", home=home, gcp={"bootstrap": "true", "python": "null"})).spec
    run_dir = home / "runs" / "boot-0001"
    run_dir.mkdir(parents=True)
    dep = Deployment(run_id="boot-0001", provider="gcp", run_dir=str(run_dir))
    p = GcpProvider()
    p.check(spec, 1, tmp_path / "job")
    ctx = p._context(dep, spec)
    kinds = ctx.settings.software
    for kind in kinds.kinds.values():
        _fake_wheelhouse(tmp_path / "wheelhouses", kind)
    events = []
    stage.bucket(ctx)
    accounts.ensure(ctx.clients, p._findings.accounts, lambda kind, msg: events.append(msg))
    stage.software(ctx, spec, {"cpu", "tpu"}, lambda kind, msg: events.append(msg))
    client = storage.Client(project=PROJECT, credentials=credentials_of(cloud))
    blobs = [b.name for b in client.list_blobs(BUCKET)]
    staged = state.of(dep).software
    assert f"dsctl/runs/boot-0001/staging/{staged.wheel}" in blobs
    for kind in ("cpu", "tpu"):
        prefix = staged.wheelhouses[kind]
        assert prefix.startswith("dsctl/wheelhouses/") and f"{prefix}MANIFEST.json" in blobs
        assert f"{prefix}pip-26.0-py3-none-any.whl" in blobs
    # The VMs' accounts (dsctl's own, which the caller may create here) read the bucket: granted on the bucket.
    workers = accounts.own_account("workers", PROJECT)
    assert p._findings.accounts.email("workers") == workers
    policy = client.bucket(BUCKET).get_iam_policy(requested_policy_version=3)
    readers = {m for b in policy.bindings if b["role"] == "roles/storage.objectViewer" for m in b["members"]}
    assert readers == {f"serviceAccount:{workers}"}, readers

    md = vms.metadata(ctx, "tpu")
    script = md["startup-script"]
    assert staged.wheelhouses["tpu"] in script and staged.wheel in script and BUCKET in script
    assert "tpu-vm-tf-" not in script and "--system-site-packages" in script  # the TPU runtime brings TensorFlow
    assert f"tensorflow-cpu=={kinds.tensorflow_version}" in vms.metadata(ctx, "cpu")["startup-script"]
    # No key in metadata, OS Login never turned off: keys go through the OS Login API (oslogin.py).
    assert "ssh-keys" not in md and md["enable-oslogin"] == "TRUE"
    assert ctx.settings.python == "/opt/dsctl/venv/bin/python"

    # A second run finds the wheelhouses in the bucket and uploads nothing.
    again = Deployment(run_id="boot-0002", provider="gcp", run_dir=str(home / "runs" / "boot-0002"))
    (home / "runs" / "boot-0002").mkdir()
    q = GcpProvider()
    q.check(spec, 1, tmp_path / "job")
    more = []
    stage.software(q._context(again, spec), spec, {"cpu", "tpu"}, lambda kind, msg: more.append(msg))
    assert sum("already there" in m for m in more) == 2

    p.down(dep, lambda *a: None)
    q.down(again, lambda *a: None)
    blobs = [b.name for b in client.list_blobs(BUCKET)]
    assert not [b for b in blobs if b.startswith(("dsctl/runs/boot-0001/staging/", "dsctl/runs/boot-0002/staging/"))]
    assert f"{staged.wheelhouses['cpu']}MANIFEST.json" in blobs  # a cache shared by runs: kept


def test_images_data_on_gcp_is_planned_and_a_local_cache_dir_is_refused_with_its_line(cloud, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", home=home, pipeline="{builtin: images, params: {epochs: 1, cache_dir: /tmp/x}}")
    refused = dsctl("up", spec, "--yes")
    flat = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "pipeline.params.cache_dir" in flat and "job.yaml:" in flat and "gs://" in flat
    assert cloud.counts() == NOTHING
    ok = gcp_spec(tmp_path / "job2", home=home, pipeline="{builtin: images, params: {epochs: 1}}")
    plan = dsctl("up", ok, "--dry-run")
    assert plan.returncode == 0 and "TFRecords, generated here once" in " ".join(plan.stdout.split())
