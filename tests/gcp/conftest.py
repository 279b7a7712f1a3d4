"""Fixtures for the Google Cloud provider: the Compute/TPU stand-in, a GCS emulator and a real sshd.

Nothing here is mocked that can run here: dsctl's GCP code uses the real client
libraries against loopback servers, and SSH reaches a real OpenSSH server
listening on the loopback addresses the stand-in gives its "VMs". Commands run
over SSH start real processes on this machine; deleting a stand-in VM stops the
processes started in its directory, as deleting a real VM would.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from fake_gce import FakeCloud, FakeGce, Faults, Timing
from guests import GuestStarters
from sshd import AuthorizedKeysWriter, Sshd, loopback_range, sshd_available

PROJECT = "dsctl-test"
ZONE = "us-central1-b"
BUCKET = "dsctl-test-staging"
CALLER = "tester@example.com"  # the account dsctl calls the stand-ins as (CLOUDSDK_CORE_ACCOUNT)
VM_ACCOUNT = f"vms@{PROJECT}.iam.gserviceaccount.com"  # who a process on a "VM" calls as (its sessions' account)
VM_ADDRESSES = 16  # sshd listens on 127.0.0.2 .. 127.0.0.17 (OpenSSH allows 16 listen sockets per process)
INTERNAL_FIRST, EXTERNAL_FIRST = "127.0.0.2", "127.0.1.2"  # the stand-in's internal / external address ranges


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not sshd_available():
        pytest.skip("OpenSSH server (/usr/sbin/sshd) is not installed; `apt-get install openssh-server`")
    # Two sshd processes on one port, one authorized_keys: internal addresses (networkIP) and external ones (natIP).
    server = Sshd(tmp_path_factory.mktemp("sshd"), loopback_range(INTERNAL_FIRST, VM_ADDRESSES),
                  external_addresses=loopback_range(EXTERNAL_FIRST, VM_ADDRESSES),
                  env={"CLOUDSDK_CORE_ACCOUNT": VM_ACCOUNT}).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_emulator():
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """An environment with no Application Default Credentials and no endpoint overrides."""
    for var in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT", "CLOUDSDK_COMPUTE_ZONE",
                "DSCTL_GCE_ENDPOINT", "DSCTL_TPU_ENDPOINT", "DSCTL_CRM_ENDPOINT", "DSCTL_IAM_ENDPOINT",
                "DSCTL_ORGPOLICY_ENDPOINT", "DSCTL_OSLOGIN_ENDPOINT", "CLOUDSDK_CORE_ACCOUNT", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # not on a GCE VM: do not probe the metadata server


def kill_vm_processes(resource: dict) -> None:
    """What deleting a VM does to its processes: every process started in that VM's directory dies."""
    name = resource.get("name", "").rsplit("/", 1)[-1]
    if not name:
        return
    marker = f"/{name}/"
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def vm_addresses(resource: dict) -> set[str]:
    nics = resource.get("networkInterfaces") or [{}]
    return {nics[0].get("networkIP")} | {ac.get("natIP") for ac in nics[0].get("accessConfigs") or []} - {None}


def drop_ssh_sessions(port: int):
    """What a VM that stops does to SSH sessions to it: the sshd processes serving them die with it."""
    def hook(resource: dict) -> None:
        addresses = vm_addresses(resource)
        for conn in psutil.net_connections(kind="tcp"):
            if conn.pid and conn.laddr and conn.laddr.port == port and conn.laddr.ip in addresses \
                    and conn.status == psutil.CONN_ESTABLISHED:
                try:
                    psutil.Process(conn.pid).kill()
                except psutil.Error:
                    pass
    return hook


@pytest.fixture
def cloud(request, gcs_emulator, monkeypatch, home):
    """A fresh stand-in cloud (Compute + TPU + Resource Manager) with the environment pointing dsctl at it.

    With sshd installed, the stand-in also plays the guest agent for it; tests that SSH into
    the "VMs" ask for the `sshd` fixture themselves (and are skipped without it).
    """
    fake = FakeCloud(Faults(), Timing(op_s=0.05, provisioning_s=0.1, staging_s=0.1, stopping_s=0.1, tpu_creating_s=0.2))
    fake.on_deleted.append(kill_vm_processes)
    if sshd_available():
        server_sshd = request.getfixturevalue("sshd")
        # OS Login: every identity logs in as the sshd's one local user (an administrator's POSIX username).
        for account in (CALLER, VM_ACCOUNT):
            fake.posix_usernames[account] = server_sshd.user
        keys = AuthorizedKeysWriter(server_sshd, oslogin_keys=fake.oslogin_keys)
        fake.on_oslogin_changed.append(keys.refresh)
        fake.on_created.append(keys.created)
        fake.on_deleted.append(keys.deleted)
        # A stopped VM answers no SSH, then its processes are gone: in that order, so no reading over SSH
        # ever sees them dead on a VM that still answers (a real VM stops all at once).
        fake.on_stopped.append(keys.deleted)
        fake.on_stopped.append(drop_ssh_sessions(server_sshd.port))
        fake.on_started.append(keys.created)
        monkeypatch.setenv("DSCTL_SSH_PORT", str(server_sshd.port))
    fake.on_stopped.append(kill_vm_processes)
    # A dispatcher VM of a run to be handed over starts the run's supervisor from Cloud Storage (starter.py).
    starters = GuestStarters(home.parent / "starters", session_env={"CLOUDSDK_CORE_ACCOUNT": VM_ACCOUNT})
    fake.on_created.append(starters.created)
    fake.on_deleted.append(starters.deleted)
    with FakeGce(fake) as server:
        monkeypatch.setenv("DSCTL_GCE_ENDPOINT", server.endpoint)
        monkeypatch.setenv("DSCTL_TPU_ENDPOINT", server.endpoint)
        monkeypatch.setenv("DSCTL_CRM_ENDPOINT", server.endpoint)
        for api in ("IAM", "ORGPOLICY", "OSLOGIN"):  # IAM, Organization Policy, OS Login: the same stand-in
            monkeypatch.setenv(f"DSCTL_{api}_ENDPOINT", server.endpoint)
        monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", CALLER)  # anonymous credentials do not say who calls
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
        monkeypatch.setenv("DSCTL_GCP_RETRY_BASE_S", "0.05")
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        monkeypatch.delenv("CLOUDSDK_COMPUTE_ZONE", raising=False)
        fake.endpoint = server.endpoint
        yield fake
        # Whatever a test leaves, the stand-in's VMs go (and with them their processes).
        for hooks in (fake.on_created, fake.on_deleted, fake.on_stopped, fake.on_started, fake.on_oslogin_changed):
            hooks.clear()
        with fake.lock:
            leftovers = list(fake.instances.values()) + list(fake.tpus.values())
        for r in leftovers:
            kill_vm_processes(r)
        starters.close()


def gcp_spec(dir: Path, *, sshd: Sshd | None = None, home: Path, name: str = "gcpjob", workers: int = 2,
             trainer_machine: str = "tpu-v2-8", steps: int = 100000, epochs: int | None = 1, elements: int = 256,
             python: str | None = None, gcp: dict | None = None, latency_ms: float = 1,
             mode: str = "distributed_epoch", pipeline: str | None = None, model: str = "{step_time_ms: 1}",
             duration_s: float | None = None, service: str = "") -> Path:
    """A provider: gcp job spec for the stand-ins: no bootstrap (this machine's Python has everything)."""
    dir.mkdir(parents=True, exist_ok=True)
    path = dir / "job.yaml"
    epochs_s = "null" if epochs is None else str(epochs)
    synthetic = (f"{{builtin: synthetic, params: {{elements: {elements}, batch_size: 16, latency_ms: {latency_ms}, "
                 f"epochs: {epochs_s}}}}}")
    settings = {"bootstrap": "false", "python": python or sys.executable, "remote_dir": home / "vms",
                "dispatcher_port": 0, "worker_port": 0, "running_timeout_s": 20, "ssh_timeout_s": 20,
                "ready_timeout_s": 120, **(gcp or {})}
    extra = "".join(f"\n          {k}: {v}" for k, v in settings.items())
    length = f"duration_s: {duration_s}" if duration_s is not None else f"steps: {steps}"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        provider: gcp
        service: {{workers: {workers}, processing_mode: {mode}{service}}}
        trainer: {{machine: {trainer_machine}, model: {model}, {length}, warmup_batches: 2}}
        pipeline: {pipeline or synthetic}
        gcp:
          project: {PROJECT}
          zone: {ZONE}
          bucket: {BUCKET}{extra}
        """))
    return path
