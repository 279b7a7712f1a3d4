"""One job end to end through the Google Cloud code path, with no cloud.

The real client libraries talk to the loopback Compute/TPU stand-in and the GCS
emulator; dsctl reaches its "VMs" over real SSH and starts a real dispatcher,
real workers and a real trainer there; the orchestrator runs the job as for
any provider. Afterwards nothing is left: no instance, no firewall rule, no TPU
VM, no process (the `home` fixture checks processes).
"""

from __future__ import annotations

import json
import os
import signal
import stat

import pytest
from conftest import BUCKET, VM_ACCOUNT, gcp_spec

from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment, load_deployment
from dsctl.specs import load_spec

pytestmark = pytest.mark.slow


def test_job_runs_on_the_stand_in_cloud_and_leaves_nothing(cloud, sshd, home, tmp_path):
    """The defaults a new user gets: a TPU trainer, ephemeral external addresses, SSH to them only; with hybrid
    placement, so the TPU VM's trainer also runs an in-process worker through the same code path as a local run."""
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="tpu-v2-8", epochs=1,
                    elements=256, latency_ms=10, service=", placement: hybrid, local_workers: 1")
    runner = JobRunner(load_spec(spec))
    # The internal addresses answer no SSH for this run: dsctl must reach every VM, the TPU VM too, externally.
    internal = sshd.procs["internal"]
    os.kill(internal.pid, signal.SIGSTOP)
    try:
        summary = runner.run()
    finally:
        os.kill(internal.pid, signal.SIGCONT)
    record = RunStore().get(runner.run_id)
    assert record.status == "succeeded", record.error
    assert summary["batches"] > 0
    # distributed_epoch: each element exactly once, whichever worker made it (the ids came home from the VM).
    assert (summary["elements_expected"], summary["elements_lost"], summary["elements_duplicated"]) == (256, 0, 0)
    assert summary.get("worker_cpu_cores") is not None, "utilization of the remote workers was sampled"
    # Hybrid placement on the trainer VM: its in-process worker registered with the dispatcher VM (the run's own
    # firewall rule admits trainer -> dispatcher) and produced batches the trainer read in process, beside the remote
    # workers' (the elements above: each exactly once across all three). 10 ms an element: the in-process worker, which
    # reads no network, would otherwise take all 16 shards before a remote worker asked for its first (seen at 1 ms).
    events = [json.loads(line) for line in (runner.run_dir / "metrics" / "trainer-0.jsonl").read_text().splitlines()]
    placement = next(e for e in events if e["event"] == "placement")
    start = next(e for e in events if e["event"] == "start")
    assert placement["local_workers"] == 1 and placement["process"].endswith(f":{start['pid']}"), placement
    assert placement["local_batches"] == placement["by_producer"].get(placement["process"], 0) > 0, placement
    assert placement["remote_batches"] > 0 and len(placement["by_producer"]) <= 3, placement  # own + 2 remote

    # Nothing is left on the cloud, and the state has forgotten everything it deleted.
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
    dep = load_deployment(runner.run_dir)
    assert dep.status == "down"
    assert not [n for n in dep.nodes if n.role in ("dispatcher", "worker", "trainer")] and not dep.state.firewalls
    assert not dep.state.trainer_vms
    # The tf.data service itself was given the internal addresses (the VMs talk inside the VPC).
    assert dep.dispatcher_address.startswith("127.0.0."), dep.dispatcher_address  # internal, not 127.0.1.x

    # What was created, and how: ONE bulk insert for the workers, labelled, with external addresses.
    posts = [p.rsplit("/", 1)[-1] for m, p in cloud.calls if m == "POST" and "/operations/" not in p]
    assert posts.count("bulkInsert") == 1 and posts.count("instances") == 1  # workers in bulk; the dispatcher alone
    kinds = [k for k, _ in cloud.created]
    assert kinds.count("instance") == 3 and kinds.count("queued_resource") == 1 and kinds.count("firewall") == 2
    tag = f"dsctl-{runner.run_id}"
    rules = {b["name"]: b for k, b in cloud.created if k == "firewall"}
    allow, deny = rules[f"{tag}-svc"], rules[f"{tag}-deny"]
    # Ports 0 in this spec: chosen on the VMs, so the unprivileged range, open between the run's VMs only, with
    # SSH (a supervisor on the dispatcher VM reaches the others through it) ...
    assert allow["sourceTags"] == allow["targetTags"] == [tag]
    assert allow["allowed"] == [{"IPProtocol": "tcp", "ports": ["1024-65535", "22"]}]
    # ... and the service ports closed to everything else, ahead of the network's own allow rules
    # (default-allow-internal: 65534).
    assert deny["sourceRanges"] == ["0.0.0.0/0"] and deny["targetTags"] == [tag]
    assert deny["denied"] == [{"IPProtocol": "tcp", "ports": ["1024-65535"]}]
    assert allow["priority"] < deny["priority"] < 65534
    run_label = {"dsctl-run": runner.run_id}
    for kind, body in cloud.created:
        if kind == "firewall":
            continue
        if kind == "queued_resource":
            assert "spot" not in body  # trainer.provisioning: standard
            body = body["tpu"]["nodeSpec"][0]["node"]
            assert body["acceleratorType"] == "v2-8" and body["networkConfig"]["enableExternalIps"] is True
            assert body["runtimeVersion"] == "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"
            assert body["tags"] == [tag]
        elif kind == "instance":
            assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
            assert body["tags"]["items"] == [tag]
        else:
            continue
        assert run_label.items() <= body["labels"].items()
        assert body["labels"]["dsctl-role"] in ("dispatcher", "worker", "trainer")

    # The run's key: 0600, in the run dir, and nowhere in state, events or logs.
    key = runner.run_dir / "ssh" / "id_ed25519"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    secret = key.read_text().strip().splitlines()[1]
    for path in runner.run_dir.rglob("*"):
        if path.is_file() and path != key:
            assert secret not in path.read_text(errors="replace"), f"private key material in {path}"
    assert all(secret not in e["message"] for e in RunStore().events(runner.run_id))

    # Metrics and logs came home, and a copy went to Cloud Storage; the staging objects are gone.
    assert (runner.run_dir / "metrics" / "trainer-0.jsonl").stat().st_size > 0
    assert {p.name for p in (runner.run_dir / "logs").iterdir()} >= {"dispatcher-0.log", "worker-0.log", "worker-1.log"}
    from conftest import owner_storage

    names = [b.name for b in owner_storage().list_blobs(BUCKET, prefix=f"dsctl/runs/{runner.run_id}/")]
    assert f"dsctl/runs/{runner.run_id}/results/metrics/trainer-0.jsonl" in names
    assert not [n for n in names if "/staging/" in n]


def test_one_deployment_measured_twice_and_scaled_as_a_sweep_does(cloud, sshd, home, tmp_path):
    """The sweep's use of a deployment: trainers started, stopped and started again on the same trainer VM,
    workers added with one bulk insert and removed with confirmed deletion, in between."""
    import time

    from dsctl.orchestrator.handles import OwnedDeployment
    from dsctl.orchestrator.supervision import Supervisor
    from dsctl.provisioners import TrainerLaunch
    from dsctl.provisioners.gcp import GcpProvider

    spec_path = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=1, trainer_machine="tpu-v2-8", epochs=None,
                         steps=20)
    spec = load_spec(spec_path).spec
    run_dir = home / "runs" / "sweep-0001"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    dep = Deployment(run_id="sweep-0001", provider="gcp", run_dir=str(run_dir))
    events = []
    sink = lambda kind, message: events.append((kind, message))  # noqa: E731
    p = GcpProvider()
    owned = OwnedDeployment(p, dep, Supervisor(p, dep, spec.service.fault_tolerant, sink))

    def measure(point: str) -> int:
        launch = TrainerLaunch(mode="service", spec_json=run_dir / "spec.json", metrics_dir=run_dir / point,
                               base_dir=tmp_path / "job", cache_dir=home / "cache", count=1, steps=20)
        metrics = owned.start_trainers(launch, sink)
        deadline = time.monotonic() + 120
        while owned.poll(sink).running and time.monotonic() < deadline:
            time.sleep(0.2)
        assert owned.poll(sink).exit_codes == {0: 0}
        owned.stop_trainers()
        ends = [json.loads(line) for line in open(metrics[0]) if '"end"' in line]
        return ends[0]["batches"]

    p.check(spec, 3, tmp_path / "job")
    try:
        p.up(spec, dep, 1, sink)
        p.wait_ready(dep, sink)
        assert measure("point-1") == 20
        owned.scale(3, sink)
        workers = dep.by_role("worker")
        assert [w.index for w in workers] == [0, 1, 2] and all(w.state.ready for w in workers)
        assert len({w.address for w in workers}) == 3
        assert measure("point-3") == 20
        owned.scale(1, sink)
        assert [w.index for w in load_deployment(dep.run_dir).by_role("worker")] == [0]
        assert ("scaled", "removed 2 worker(s); 1 remain") in events
        assert cloud.counts() == {"instances": 2, "firewalls": 2, "tpus": 1}
    finally:
        owned.release(sink)
    # One trainer VM for both measurements; the workers in two bulk inserts (1, then 2 added).
    assert [k for k, _ in cloud.created].count("queued_resource") == 1
    assert len([path for m, path in cloud.calls if m == "POST" and path.endswith("/bulkInsert")]) == 2
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
    assert not load_deployment(run_dir).state.trainer_vms


def test_the_images_builtin_runs_on_the_cloud_with_its_data_in_cloud_storage(cloud, sshd, gcs_emulator, home, tmp_path):
    """The flagship example's pipeline: its TFRecords are generated here once, uploaded to the bucket, and the
    workers on other "VMs" read them from there with TensorFlow's own GCS filesystem (through a proxy that
    serves TensorFlow's fixed GCS endpoints from the emulator: gcs_proxy.py)."""
    from gcs_proxy import GcsProxy

    params = ("{builtin: images, params: {num_files: 2, images_per_file: 8, image_size: 32, crop_size: 24, "
              "batch_size: 4, epochs: 1, shuffle_buffer: 0}}")
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="n2-standard-8",
                    pipeline=params, mode="distributed_epoch")
    # Through the authorizing gate, as the workers' account: TensorFlow reads what that account may read.
    with GcsProxy(emulator_endpoint=cloud.gate.endpoint, workdir=tmp_path / "proxy",
                  upstream_token=cloud.issue_token(VM_ACCOUNT)) as proxy:
        sshd.set_env(proxy.env)  # every process started on a "VM" reaches Cloud Storage through the proxy
        try:
            first = JobRunner(load_spec(spec))
            summary = first.run()
            read_first = proxy.bytes_read(bucket=BUCKET, prefix="dsctl/data/images-")
            second = JobRunner(load_spec(spec))
            second.run()
        finally:
            sshd.set_env({})
    assert RunStore().get(first.run_id).status == "succeeded"
    assert summary["batches"] == 2 * 8 // 4  # distributed_epoch: every image once, 4 batches of 4
    # The workers read the TFRecords from the bucket (the trainer only read the manifest).
    assert read_first > 0
    names = [b.name for b in storage_client().list_blobs(BUCKET, prefix="dsctl/data/")]
    assert len([n for n in names if n.endswith(".tfrecord")]) == 2 and any(n.endswith("/manifest.json") for n in names)
    events = [e["message"] for e in RunStore().events(first.run_id)] + [e["message"] for e in RunStore().events(second.run_id)]
    assert any("images data in gs://" in m and "uploaded now" in m for m in events)
    assert any("images data in gs://" in m and "already there" in m for m in events)  # the second run reused it
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}


def storage_client():
    from conftest import owner_storage

    return owner_storage()


@pytest.mark.timed
def test_a_dead_fault_tolerant_dispatcher_is_restarted_on_its_vm(cloud, sshd, home, tmp_path):
    """SIGKILL of the dispatcher on its "VM" mid-job: dsctl restarts it at its address from its journal,
    the trainer carries on, and the record says so."""
    import threading
    import time

    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="n2-standard-8", epochs=1,
                    elements=2048, latency_ms=4)
    run_id = "dispatcher-killed-0001"
    result: dict = {}
    # The runner lives in its thread: its run store's SQLite connection belongs to the thread that made it.
    thread = threading.Thread(target=lambda: result.update(summary=JobRunner(load_spec(spec), run_id=run_id).run()))
    thread.start()
    run_dir = home / "runs" / run_id
    metrics = run_dir / "metrics" / "trainer-0.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"window"' in metrics.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = load_deployment(run_dir).by_role("dispatcher")[0]
    os.kill(victim.state.remote_pid, signal.SIGKILL)
    thread.join(timeout=240)
    assert not thread.is_alive()
    record = RunStore().get(run_id)
    assert record.status == "succeeded", record.error
    restarts = [e for e in RunStore().events(run_id) if e["kind"] == "dispatcher-restarted"]
    assert len(restarts) == 1 and victim.address in restarts[0]["message"]
    s = result["summary"]
    assert s["elements_duplicated"] == 0 and s["elements_received"] + s["elements_lost"] == 2048
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}
