"""The REAL startup script boots a fresh Debian 12 VM from Cloud Storage alone, and its worker serves.

A stand-in VM (vmboot.py): a Debian 12 root filesystem built from Debian's packages (python3,
no python3-venv, no pip, as on Google's debian-12 image), booted as root in its own network
namespace that reaches only a metadata-server stand-in and the Cloud Storage emulator. dsctl's
own code builds the wheelhouse for the VM's Python (pip download for another platform; cached
outside the repo), stages it and this dsctl's wheel as `dsctl up` does, and renders the startup
script; the stand-in runs it as the guest environment's script runner would. Then the VM runs
dsctl's dispatcher and worker from the installed venv, and a tf.data service client on this
machine reads a dataset through them, across the VM's network link.

The wheelhouse is downloaded with this machine's pip and package index, the same source `.ci/run`
installs from; the VM itself reaches nothing but the two stand-ins.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from dsctl.provisioners.gcp import software, starter, startup, wheelhouse
from dsctl.provisioners.gcp.settings import local_tensorflow_version
from dsctl.provisioners.gcp.wheel import build_wheel
from dsctl.specs import load_spec_text
from helpers import wait_for

pytestmark = pytest.mark.slow

BUCKET = "dsctl-test-staging"
DISPATCHER_PORT, WORKER_PORT = 5050, 5051

CLIENT = """
import sys, tensorflow as tf
ds = tf.data.Dataset.range(200).map(lambda x: x * 2)
ds = ds.apply(tf.data.experimental.service.distribute("distributed_epoch", sys.argv[1]))
print(sorted(int(x) for x in ds) == [2 * i for i in range(200)])
"""


@pytest.fixture(scope="session")
def cpu_software():
    spec = load_spec_text("name: b\nprovider: gcp\ntrainer: {machine: n2-standard-8, steps: 1}\n"
                          "pipeline: {builtin: synthetic}\ngcp: {project: acme-ml, zone: us-central1-b}\n").spec
    return software.resolve(spec, local_tensorflow_version())


@pytest.fixture(scope="session")
def cpu_wheelhouse(cpu_software):
    """The wheelhouse dsctl builds for Debian 12's Python (3.11) with this run's TensorFlow, and what the
    dispatcher VM's run supervisor needs: built once, cached."""
    return wheelhouse.build(wheelhouse.Recipe.for_kind(cpu_software.for_kind("cpu"), supervisor=True))


def test_the_real_startup_script_boots_debian_12_from_cloud_storage_and_its_worker_serves(
        tmp_path, cpu_software, cpu_wheelhouse, capsys):
    """Booted as the dispatcher VM: with the run supervisor's extra, whose command must run there too."""
    import vmboot

    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    kind = cpu_software.for_kind("cpu")
    run_prefix = "dsctl/runs/boot-test/staging/"
    wheel = build_wheel(tmp_path / "dist")
    with vmboot.BootedVm(tmp_path / "vm", bucket=BUCKET) as vm:
        client = vm.storage_client()
        assert wheelhouse.stage(client, BUCKET, cpu_wheelhouse) == cpu_wheelhouse.size
        client.bucket(BUCKET).blob(run_prefix + wheel.name).upload_from_filename(str(wheel))
        script = startup.script(kind=kind, tf_version=cpu_software.tensorflow_version, bucket=BUCKET,
                                wheelhouse_prefix=cpu_wheelhouse.prefix, dsctl_prefix=run_prefix,
                                dsctl_wheel=wheel.name, storage_host=vm.gcs_endpoint, supervisor=True)
        vm.metadata.set_attribute("startup-script", script)
        # A run handed over to this VM: its starter (starter.py), started by the script once everything is in,
        # takes the hand-over from Cloud Storage and starts the run's supervisor from it, as root.
        sup_dir = starter.supervisor_dir("/var/tmp/dsctl", "boot-test", "vm")
        vm.metadata.set_attribute(starter.STARTER_KEY, starter.StarterConfig(
            run_id="boot-test", bucket=BUCKET, storage=vm.gcs_endpoint, dir=sup_dir,
            python=startup.VENV + "/bin/python", wait_s=600).to_json())
        handed = {"spec.json": b"{}", "handoff.json": b"{}"}  # not a run: the supervisor it starts refuses it
        for name, data in handed.items():
            client.bucket(BUCKET).blob(starter.handoff_prefix("boot-test") + name).upload_from_string(data)
        client.bucket(BUCKET).blob(starter.handoff_prefix("boot-test") + starter.MANIFEST).upload_from_string(
            json.dumps({"files": sorted(handed)}))
        # The image as Google ships it: a Python, but no venv package and no pip.
        assert vm.exec(["python3", "-c", "import ensurepip"]).exit_code != 0
        assert vm.exec(["python3", "-m", "pip", "--version"]).exit_code != 0

        with vm.capture_to_vm() as by_source:  # every frame sent to the VM over its one link, by source
            result = vm.run_startup_script(timeout_s=900)
        assert result.ok, vm.exec(["tail", "-n", "40", startup.LOG]).stdout  # the script writes its own log
        marker = json.loads(vm.exec(["cat", startup.MARKER]).check().stdout)
        assert marker["ok"] and marker["tensorflow"] == cpu_software.tensorflow_version, marker
        served = vm.bytes_served()
        # Everything it installed came from Cloud Storage: the wheelhouse and the dsctl wheel, nothing else.
        assert marker["storage_bytes"] == cpu_wheelhouse.size + wheel.stat().st_size + _manifest_size(cpu_wheelhouse)
        assert served.storage >= marker["storage_bytes"]
        stand_ins = {f"ip {vm.gateway_ip}", "ip 169.254.169.254"}  # Cloud Storage; metadata server and resolver
        elsewhere = {k: v for k, v in by_source.items() if k.startswith("ip ") and k not in stand_ins}
        assert elsewhere == {}, elsewhere
        # A second boot finds the marker and does nothing.
        again = vm.run_startup_script(timeout_s=60)
        assert again.ok and again.seconds < 5

        # The starter wrote the hand-over into the supervisor's run folder, readable by root only, and started
        # `dsctl supervise` there (which ended: this hand-over is no run).
        run_dir = starter.supervisor_run_dir(sup_dir, "boot-test")
        wait_for(lambda: "started the run's supervisor" in vm.exec(["cat", starter.LOG]).stdout, timeout=120,
                 what="the starter to start the supervisor")
        listed = vm.exec(["stat", "-c", "%a %U %n", f"{run_dir}/spec.json", f"{run_dir}/handoff.json"]).check().stdout
        assert listed.split() == ["600", "root", f"{run_dir}/spec.json", "600", "root", f"{run_dir}/handoff.json"]
        wait_for(lambda: vm.exec(["test", "-s", f"{sup_dir}/rc"]).exit_code == 0, timeout=120,
                 what="the supervisor started from the hand-over to end")
        # The run's supervisor can start there: `dsctl supervise` and the Google Cloud provider import.
        python = startup.VENV + "/bin/python"
        helped = vm.exec([python, "-m", "dsctl.cli.main", "supervise", "--help"], timeout_s=120)
        assert helped.exit_code == 0 and "handed over" in helped.stdout, helped
        # dsctl's runtime, from the venv the script made, serves a client on this machine across the VM's link.
        vm.spawn([python, "-m", "dsctl.runtime.dispatcher", "--port", str(DISPATCHER_PORT),
                  "--ready-file", "/tmp/dispatcher.json"], name="dispatcher")
        vm.spawn([python, "-m", "dsctl.runtime.worker", "--dispatcher", f"localhost:{DISPATCHER_PORT}",
                  "--host", vm.ip, "--port", str(WORKER_PORT), "--ready-file", "/tmp/worker.json"], name="worker")
        wait_for(lambda: vm.exec(["test", "-s", "/tmp/worker.json"]).exit_code == 0, timeout=120,
                 what="the worker in the VM to serve")
        read = subprocess.run([sys.executable, "-c", textwrap.dedent(CLIENT), f"grpc://{vm.ip}:{DISPATCHER_PORT}"],
                              capture_output=True, text=True, timeout=180)
        assert read.stdout.strip().splitlines()[-1:] == ["True"], read.stderr[-2000:]

    phases = ", ".join(f"{k} {v:.1f} s" for k, v in marker["phases_s"].items())
    missed = by_source.get("dropped packets", 0)
    with capsys.disabled():
        print(f"\n[vm boot] measured here: the worker's bootstrap took {marker['seconds']:.1f} s ({phases}); "
              f"{marker['storage_bytes'] / 1e6:.1f} MB from Cloud Storage, {served.metadata + served.dns} bytes of "
              f"metadata-server and resolver answers, 0 bytes from anywhere else"
              + (f" (link capture missed {missed} packets)" if missed else ""))


def _manifest_size(house) -> int:
    return (house.dir / wheelhouse.MANIFEST).stat().st_size


def test_a_boot_that_cannot_fetch_its_wheelhouse_says_so_in_its_marker(tmp_path, cpu_software):
    """Nothing staged (or no route to Cloud Storage): the script ends quickly with a marker naming what failed,
    which dsctl reads over SSH and shows; it does not hang, and it installs nothing from anywhere else."""
    import vmboot

    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    kind = cpu_software.for_kind("cpu")
    with vmboot.BootedVm(tmp_path / "vm", bucket=BUCKET) as vm:
        vm.metadata.set_attribute("startup-script", startup.script(
            kind=kind, tf_version=cpu_software.tensorflow_version, bucket=BUCKET,
            wheelhouse_prefix="dsctl/wheelhouses/missing/", dsctl_prefix="dsctl/runs/r/staging/",
            dsctl_wheel="dsctl-0.1.0+g0-py3-none-any.whl", storage_host=vm.gcs_endpoint))
        result = vm.run_startup_script(timeout_s=120)
        assert result.exit_code != 0 and result.seconds < 60
        marker = json.loads(vm.exec(["cat", startup.MARKER]).check().stdout)
        assert marker["ok"] is False
        assert f"could not download the wheelhouse gs://{BUCKET}/dsctl/wheelhouses/missing/" in marker["error"]
        assert vm.exec(["test", "-e", startup.VENV]).exit_code != 0  # nothing was installed


def test_on_a_tpu_runtime_image_the_script_adds_dsctl_beside_the_images_own_tensorflow(tmp_path, cpu_software,
                                                                                      cpu_wheelhouse):
    """A TensorFlow TPU VM runtime comes with TensorFlow in its system Python: the TPU script installs only
    dsctl and its few dependencies (a wheelhouse without TensorFlow) into a venv that sees the system's
    packages, and checks the TensorFlow it finds there. The stand-in image gets TensorFlow in its system
    Python first, as the runtime image has it (installed from the wheels on this machine, mounted read-only)."""
    import dataclasses

    import vmboot

    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    tf = cpu_software.tensorflow_version
    # The TPU kind as software.py makes it, for this image's Python (3.11; the real runtimes have 3.10).
    tpu = dataclasses.replace(cpu_software.for_kind("cpu"), kind="tpu", image=f"tpu-vm-tf-{tf}-pjrt", tensorflow=None)
    house = wheelhouse.build(wheelhouse.Recipe.for_kind(tpu))
    assert not [f for f in house.files if f["name"].startswith("tensorflow")]
    run_prefix = "dsctl/runs/tpu-test/staging/"
    wheel = build_wheel(tmp_path / "dist")
    pip = next(f["name"] for f in cpu_wheelhouse.files if f["name"].startswith("pip-"))
    with vmboot.BootedVm(tmp_path / "vm", bucket=BUCKET, binds={cpu_wheelhouse.dir: "/opt/image-wheels"}) as vm:
        vm.exec(["python3", f"/opt/image-wheels/{pip}/pip", "install", "--no-index", "--find-links",
                 "/opt/image-wheels", "--break-system-packages", "--quiet", f"tensorflow-cpu=={tf}"],
                timeout_s=600).check()
        client = vm.storage_client()
        wheelhouse.stage(client, BUCKET, house)
        client.bucket(BUCKET).blob(run_prefix + wheel.name).upload_from_filename(str(wheel))
        vm.metadata.set_attribute("startup-script", startup.script(
            kind=tpu, tf_version=tf, bucket=BUCKET, wheelhouse_prefix=house.prefix, dsctl_prefix=run_prefix,
            dsctl_wheel=wheel.name, storage_host=vm.gcs_endpoint))
        result = vm.run_startup_script(timeout_s=600)
        assert result.ok, result.log[-4000:]
        marker = json.loads(vm.exec(["cat", startup.MARKER]).check().stdout)
        assert marker["ok"] and marker["tensorflow"] == tf
        where = vm.exec([startup.VENV + "/bin/python", "-c", "import tensorflow, dsctl.runtime.trainer; "
                         "print(tensorflow.__file__)"]).check().stdout.strip()
        assert where.startswith("/usr/") and startup.VENV not in where  # the image's TensorFlow, not a copy
        assert marker["storage_bytes"] < 20e6  # dsctl and its dependencies only


def test_no_value_in_the_startup_script_is_read_by_the_shell(tmp_path, cpu_software):
    """A hostile bucket or prefix (the spec refuses such a bucket name; this renders one anyway) ends in a plain
    error message: nothing in it is run, in the script or in its messages."""
    import vmboot

    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    evil = "b$(touch /tmp/pwned)`touch /tmp/pwned`\n touch /tmp/pwned #"
    with vmboot.BootedVm(tmp_path / "vm", bucket=BUCKET) as vm:
        vm.metadata.set_attribute("startup-script", startup.script(
            kind=cpu_software.for_kind("cpu"), tf_version=cpu_software.tensorflow_version, bucket=evil,
            wheelhouse_prefix=evil, dsctl_prefix=evil, dsctl_wheel=evil, storage_host=vm.gcs_endpoint))
        result = vm.run_startup_script(timeout_s=120)
        assert result.exit_code != 0
        marker = json.loads(vm.exec(["cat", startup.MARKER]).check().stdout)
        assert marker["ok"] is False and "$(touch /tmp/pwned)" in marker["error"]
        assert vm.exec(["test", "-e", "/tmp/pwned"]).exit_code != 0
