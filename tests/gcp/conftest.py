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
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from fake_gce import FakeCloud, FakeGce, Faults, Timing
from guests import GuestStarters
from metadata_server import MetadataServer
from sshd import AuthorizedKeysWriter, Sshd, loopback_range, sshd_available
from storage_gate import StorageGate

PROJECT = "dsctl-test"
ZONE = "us-central1-b"
BUCKET = "dsctl-test-staging"
CALLER = "tester@example.com"  # the user dsctl calls the stand-ins as (its credentials file; CLOUDSDK_CORE_ACCOUNT)
# Who a process in a "VM"'s SSH session calls as: the least privileged of the run's accounts, the workers' (dsctl's
# own: accounts.py), so nothing done over SSH on any VM relies on more. One sshd serves every stand-in VM, so a
# session cannot tell which VM it is on; the programs a VM runs by itself (its watchdog, a dispatcher VM's starter and
# the supervisor) call as their own VM's account, through a metadata server of their own (guests.py).
VM_ACCOUNT = f"dsctl-workers@{PROJECT}.iam.gserviceaccount.com"
SESSION = {"cloud": None, "account": VM_ACCOUNT}  # what the sessions' metadata server issues tokens from, and for
VM_ADDRESSES = 16  # sshd listens on 127.0.0.2 .. 127.0.0.17 (OpenSSH allows 16 listen sockets per process)
INTERNAL_FIRST, EXTERNAL_FIRST = "127.0.0.2", "127.0.1.2"  # the stand-in's internal / external address ranges


# The APIs whose endpoint dsctl reads from DSCTL_<API>_ENDPOINT (provisioners/gcp/settings.py).
ENDPOINT_APIS = ("GCE", "TPU", "CRM", "IAM", "ORGPOLICY", "OSLOGIN", "SERVICEUSAGE", "QUOTAS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_token(account: str) -> str:
    cloud = SESSION["cloud"]
    if cloud is None:
        raise RuntimeError("no stand-in cloud is up to issue a token")
    return cloud.issue_token(SESSION["account"])


@pytest.fixture(scope="session")
def session_metadata():
    """The metadata server processes in the stand-in VMs' SSH sessions reach: tokens for SESSION["account"], issued by
    the stand-in of the test that runs."""
    with MetadataServer(project_id=PROJECT, service_account=VM_ACCOUNT, token_issuer=_session_token) as mds:
        yield mds


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, session_metadata):
    if not sshd_available():
        pytest.skip("OpenSSH server (/usr/sbin/sshd) is not installed; `apt-get install openssh-server`")
    # Two sshd processes on one port, one authorized_keys: internal addresses (networkIP) and external ones (natIP).
    where = f"127.0.0.1:{session_metadata.port}"
    server = Sshd(tmp_path_factory.mktemp("sshd"), loopback_range(INTERNAL_FIRST, VM_ADDRESSES),
                  external_addresses=loopback_range(EXTERNAL_FIRST, VM_ADDRESSES),
                  env={"CLOUDSDK_CORE_ACCOUNT": VM_ACCOUNT, "GCE_METADATA_HOST": where, "GCE_METADATA_IP": where}
                  ).start()
    yield server
    server.stop()


def write_credentials(path: Path, cloud: FakeCloud, account: str) -> Path:
    """An Application Default Credentials file for `account`, of the kind `gcloud auth application-default login
    --login-config` writes (external_account_authorized_user, a refresh token and the token endpoint that exchanges
    it), its token endpoint the stand-in's: google-auth refreshes it there as it would at Google's."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "type": "external_account_authorized_user",
        "audience": "//iam.googleapis.com/locations/global/workforcePools/dsctl-test/provisioners/stand-in",
        "refresh_token": cloud.sign_in(account), "token_url": f"{cloud.endpoint}/token",
        "client_id": "dsctl-test", "client_secret": "stand-in", "universe_domain": "googleapis.com"}))
    return path


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
                "DSCTL_ORGPOLICY_ENDPOINT", "DSCTL_OSLOGIN_ENDPOINT", "DSCTL_SERVICEUSAGE_ENDPOINT",
                "DSCTL_QUOTAS_ENDPOINT", "CLOUDSDK_CORE_ACCOUNT", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # not on a GCE VM: do not probe the metadata server


def vm_process_killer(scope: Path) -> Callable[[dict], None]:
    """What deleting a VM does to its processes: every process started in that VM's directory dies.

    Only processes below `scope` (the test's own folder): tests on other xdist workers may use the same run id, and
    so the same VM names, and their "VMs" are not this stand-in's to end."""
    def kill(resource: dict) -> None:
        name = resource.get("name", "").rsplit("/", 1)[-1]
        if not name:
            return
        marker, root = f"/{name}/", str(scope)
        for p in psutil.process_iter(["cmdline", "cwd"]):
            try:
                text = " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or "") + "/"
                if p.pid != os.getpid() and marker in text and root in text:
                    p.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    return kill


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
    # A project dsctl has been run in: its APIs on, the caller its owner (as on a personal project).
    fake.define_project(PROJECT, owners=(CALLER,))
    kill_vm_processes = vm_process_killer(home.parent)
    fake.on_deleted.append(kill_vm_processes)
    if sshd_available():
        server_sshd = request.getfixturevalue("sshd")
        # OS Login: every identity logs in as the sshd's one local user (an administrator's POSIX username).
        fake.every_posix_username = server_sshd.user
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
    starters = GuestStarters(home.parent / "starters", fake, session_env={})
    fake.on_created.append(starters.created)
    fake.on_deleted.append(starters.deleted)
    with FakeGce(fake) as server, StorageGate(fake, gcs_emulator, default_project=PROJECT) as gate:
        for api in ENDPOINT_APIS:  # one stand-in answers them all
            monkeypatch.setenv(f"DSCTL_{api}_ENDPOINT", server.endpoint)
        # Who calls: the credentials file names the user's refresh token (the stand-in knows the account from its
        # tokens); CLOUDSDK_CORE_ACCOUNT says the account where credentials do not (OS Login keys are registered for it).
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(write_credentials(home.parent / "adc.json", fake,
                                                                                  CALLER)))
        monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", CALLER)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gate.endpoint)
        monkeypatch.setenv("DSCTL_GCP_RETRY_BASE_S", "0.05")
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        monkeypatch.delenv("CLOUDSDK_COMPUTE_ZONE", raising=False)
        fake.gate = gate
        SESSION.update(cloud=fake, account=VM_ACCOUNT)
        yield fake
        SESSION["cloud"] = None
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
             duration_s: float | None = None, service: str = "", project: str = PROJECT,
             bucket: str = BUCKET) -> Path:
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
          project: {project}
          zone: {ZONE}
          bucket: {bucket}{extra}
        """))
    return path


def act_as(monkeypatch, cloud: FakeCloud, account: str, where: Path) -> None:
    """From now on this test's dsctl (Clients made after this, `dsctl` subprocesses) calls as `account`: a credentials
    file of its own, and CLOUDSDK_CORE_ACCOUNT naming it."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(write_credentials(where / f"adc-{account}.json", cloud,
                                                                              account)))
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", account)


def changes(cloud: FakeCloud) -> list[tuple[str, str]]:
    """Every call that would change the project (creates of VMs, rules, TPUs, accounts; policy writes): not reads,
    permission tests or the token exchange."""
    return [c for c in cloud.calls if c[0] in ("POST", "DELETE", "PATCH") and c[1] != "/token"
            and not c[1].endswith(("testIamPermissions", ":getIamPolicy"))]


def credentials_of(cloud: FakeCloud, account: str = CALLER):
    """Credentials of `account` for a test's own Google client: an access token the stand-in issued (valid an hour),
    as a credentials file would have fetched."""
    from google.oauth2.credentials import Credentials

    return Credentials(token=cloud.issue_token(account))


def owner_storage():
    """A Cloud Storage client (at STORAGE_EMULATOR_HOST: the stand-in's gate) calling as the project's owner, for a
    test to look at the bucket."""
    from google.cloud import storage

    return storage.Client(project=PROJECT, credentials=credentials_of(SESSION["cloud"]))
