"""What the stand-in VMs run on their own, as each VM's startup script starts it on a real VM: every VM's watchdog
(provisioners/gcp/watchdog.py), and a dispatcher VM's starter of a run handed over (provisioners/gcp/starter.py).

Hooked to the Compute/TPU stand-in (fake_gce.FakeCloud.on_created / on_deleted): for each VM or TPU node
created with a dsctl-watchdog metadata attribute, a metadata server of its own (metadata_server.py, on
loopback, serving that VM's attributes, name, zone and project) and the REAL watchdog program, run with
GCE_METADATA_HOST pointing at it, as that VM's process. Its command line names the VM's directory, so the
stand-in's deletion hook (conftest.vm_process_killer) ends it as deleting the VM would; its metadata server
stops then too. The boot path itself (systemd unit or nohup'd loop) is tested in a booted VM (test_vmboot.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from metadata_server import MetadataServer

from dsctl.provisioners.gcp import lifetime, watchdog
from dsctl.provisioners.gcp.starter import STARTER_KEY


def _metadata(resource: dict) -> dict[str, str]:
    md = resource.get("metadata") or {}
    if "items" in md or "kind" in md:  # a Compute Engine instance: {"items": [{"key", "value"}]}
        return {i["key"]: i.get("value", "") for i in md.get("items") or []}
    return dict(md)  # a TPU node: a map


def _account(resource: dict) -> str | None:
    """The service account a VM (serviceAccounts[0]) or TPU node (serviceAccount) runs as."""
    accounts = resource.get("serviceAccounts") or ([resource["serviceAccount"]] if resource.get("serviceAccount") else [])
    return accounts[0].get("email") if accounts else None


class _GuestPrograms:
    """One program per stand-in VM whose metadata holds `key`: a metadata server of its own, the program started
    with GCE_METADATA_HOST pointing at it and its output in `<workdir>/<VM>/<log_name>`, both ended with the VM.
    The program's last argument names the VM's directory (`/<name>/`), so the stand-in's deletion hook
    (conftest.vm_process_killer) ends it, and what it started there, as deleting the VM would."""

    key = ""
    log_name = ""

    def __init__(self, workdir: Path, cloud):
        """`cloud`: the stand-in (fake_gce.FakeCloud) that issues each VM's tokens, for its service account."""
        self.workdir = Path(workdir)
        self.cloud = cloud
        self.lock = threading.Lock()
        self.running: dict[str, tuple[MetadataServer, subprocess.Popen]] = {}

    def argv(self, vm_dir: Path) -> list[str]:
        raise NotImplementedError

    def environment(self, vm_dir: Path) -> dict[str, str]:
        return dict(os.environ)

    def created(self, resource: dict) -> None:
        attributes = _metadata(resource)
        if self.key not in attributes:
            return
        parts = resource["selfLink" if "selfLink" in resource else "name"].split("/")
        name = parts[-1]
        project = parts[parts.index("projects") + 1]
        zone = parts[parts.index("zones" if "zones" in parts else "locations") + 1]
        account = _account(resource)
        mds = MetadataServer(attributes=attributes, project_id=project, instance_name=name, zone=zone,
                             numeric_project_id=self.cloud.project_number(project), service_account=account,
                             token_issuer=self.cloud.issue_token).start()
        vm_dir = self.workdir / name
        vm_dir.mkdir(parents=True, exist_ok=True)
        # Google's client libraries reach the metadata server at GCE_METADATA_HOST, and ask GCE_METADATA_IP whether
        # they are on Compute Engine at all (google.auth.compute_engine._metadata).
        where = f"127.0.0.1:{mds.port}"
        env = {**self.environment(vm_dir), "GCE_METADATA_HOST": where, "GCE_METADATA_IP": where}
        log = open(vm_dir / self.log_name, "ab")
        proc = subprocess.Popen([*self.argv(vm_dir), f"{vm_dir}/"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        log.close()
        with self.lock:
            self.running[name] = (mds, proc)

    def deleted(self, resource: dict) -> None:
        name = resource.get("name", "").rsplit("/", 1)[-1]
        with self.lock:
            entry = self.running.pop(name, None)
        if entry is not None:
            mds, proc = entry
            proc.kill()
            proc.wait(10)
            mds.stop()

    def log(self, name: str) -> str:
        path = self.workdir / name / self.log_name
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        with self.lock:
            names = list(self.running)
        for name in names:
            self.deleted({"name": name})


class GuestWatchdogs(_GuestPrograms):
    """Each VM's and TPU VM's REAL watchdog (watchdog.PROGRAM), as its startup script starts it."""

    key = lifetime.WATCHDOG_KEY
    log_name = "watchdog.log"

    def argv(self, vm_dir: Path) -> list[str]:
        return [sys.executable, "-c", watchdog.PROGRAM]


class GuestStarters(_GuestPrograms):
    """The stand-in dispatcher VMs' starters: what a dispatcher VM's startup script starts once its software is in
    (provisioners/gcp/starter.py), which starts the run's supervisor from the hand-over in Cloud Storage: the REAL
    starter, with the environment a process on a "VM" has (`session_env`, as the sshd stand-in gives its sessions:
    the VM's own account). The supervisor it starts names the VM in its command line too."""

    key = STARTER_KEY
    log_name = "starter.log"

    def __init__(self, workdir: Path, cloud, session_env: dict[str, str]):
        super().__init__(workdir, cloud)
        self.session_env = dict(session_env)

    def argv(self, vm_dir: Path) -> list[str]:
        return [sys.executable, "-m", "dsctl.provisioners.gcp.starter"]

    def environment(self, vm_dir: Path) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(vm_dir), "LANG": "C.UTF-8",
                **self.session_env}
