"""The stand-in VMs' watchdogs: what each VM's startup script starts on a real VM (provisioners/gcp/watchdog.py).

Hooked to the Compute/TPU stand-in (fake_gce.FakeCloud.on_created / on_deleted): for each VM or TPU node
created with a dsctl-watchdog metadata attribute, a metadata server of its own (metadata_server.py, on
loopback, serving that VM's attributes, name, zone and project) and the REAL watchdog program, run with
GCE_METADATA_HOST pointing at it, as that VM's process. Its command line names the VM's directory, so the
stand-in's deletion hook (conftest.kill_vm_processes) ends it as deleting the VM would; its metadata server
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


def _metadata(resource: dict) -> dict[str, str]:
    md = resource.get("metadata") or {}
    if "items" in md or "kind" in md:  # a Compute Engine instance: {"items": [{"key", "value"}]}
        return {i["key"]: i.get("value", "") for i in md.get("items") or []}
    return dict(md)  # a TPU node: a map


class GuestWatchdogs:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.lock = threading.Lock()
        self.running: dict[str, tuple[MetadataServer, subprocess.Popen]] = {}

    def created(self, resource: dict) -> None:
        attributes = _metadata(resource)
        if lifetime.WATCHDOG_KEY not in attributes:
            return
        parts = resource["selfLink" if "selfLink" in resource else "name"].split("/")
        name = parts[-1]
        project = parts[parts.index("projects") + 1]
        zone = parts[parts.index("zones" if "zones" in parts else "locations") + 1]
        mds = MetadataServer(attributes=attributes, project_id=project, instance_name=name, zone=zone).start()
        vm_dir = self.workdir / name
        vm_dir.mkdir(parents=True, exist_ok=True)
        log = open(vm_dir / "watchdog.log", "ab")
        env = {**os.environ, "GCE_METADATA_HOST": f"127.0.0.1:{mds.port}"}
        # The argument names the VM's directory (`/<name>/`): the stand-in's deletion hook kills it with the VM.
        proc = subprocess.Popen([sys.executable, "-c", watchdog.PROGRAM, f"{vm_dir}/"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
        path = self.workdir / name / "watchdog.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        with self.lock:
            names = list(self.running)
        for name in names:
            self.deleted({"name": name})


class GuestStarters:
    """The stand-in dispatcher VMs' starters: what a dispatcher VM's startup script starts once its software is in
    (provisioners/gcp/starter.py), which starts the run's supervisor from the hand-over in Cloud Storage.

    Hooked to the stand-in like GuestWatchdogs: for each VM created with the starter's metadata attribute, a
    metadata server of its own and the REAL starter (`python -m dsctl.provisioners.gcp.starter`), with the
    environment a process on a "VM" has (`session_env`, as the sshd stand-in gives its sessions: the VM's own
    account) and GCE_METADATA_HOST pointing at that server. Its command line, and the supervisor's it starts,
    name the VM, so the stand-in's deletion hook ends both as deleting the VM would."""

    def __init__(self, workdir: Path, session_env: dict[str, str]):
        self.workdir = Path(workdir)
        self.session_env = dict(session_env)
        self.lock = threading.Lock()
        self.running: dict[str, tuple[MetadataServer, subprocess.Popen]] = {}

    def created(self, resource: dict) -> None:
        from dsctl.provisioners.gcp.starter import STARTER_KEY

        attributes = _metadata(resource)
        if STARTER_KEY not in attributes:
            return
        parts = resource["selfLink"].split("/")
        name, project, zone = parts[-1], parts[parts.index("projects") + 1], parts[parts.index("zones") + 1]
        mds = MetadataServer(attributes=attributes, project_id=project, instance_name=name, zone=zone).start()
        vm_dir = self.workdir / name
        vm_dir.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(vm_dir), "LANG": "C.UTF-8",
               **self.session_env, "GCE_METADATA_HOST": f"127.0.0.1:{mds.port}"}
        log = open(vm_dir / "starter.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "dsctl.provisioners.gcp.starter", f"{vm_dir}/"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
        path = self.workdir / name / "starter.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        with self.lock:
            names = list(self.running)
        for name in names:
            self.deleted({"name": name})
