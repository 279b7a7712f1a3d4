"""The Google Cloud provider keeps the provider contract (tests/contract/suite.py), on the stand-ins.

The suite drives a GcpProvider through one deployment's whole life against the loopback Compute Engine
stand-in, the Cloud Storage emulator and a real sshd: its "VMs" are loopback addresses, their servers and trainer
real processes on this machine started over SSH (below DSCTL_HOME/vms/<vm name>/). A crash is a SIGKILL of the
server's pid on its VM; what is left after `down` is what still bills on the stand-in (instances, firewall rules,
TPU VMs, the run's staging objects in the bucket) and what still runs of the run's VMs.
"""

from __future__ import annotations

import os
import signal
import sys

import psutil
import pytest
from conftest import BUCKET, PROJECT, ZONE, owner_storage

from contract.suite import ProviderContract
from dsctl.provisioners import Deployment
from dsctl.provisioners.gcp import GcpProvider
from dsctl.provisioners.gcp.state import gcp

pytestmark = pytest.mark.slow


class TestGcpContract(ProviderContract):
    spec_provider = "gcp"

    @pytest.fixture(autouse=True)
    def _stand_in(self, cloud, sshd, home):
        """The stand-in cloud and sshd for this test, and the spec's gcp: section pointing the run at them: no
        bootstrap (this machine's Python has everything), the VMs' folders below DSCTL_HOME, ports chosen on the
        VMs."""
        self.cloud = cloud
        self.vms = home / "vms"
        self.extra_spec = "\n".join([
            "gcp:",
            f"  project: {PROJECT}",
            f"  zone: {ZONE}",
            f"  bucket: {BUCKET}",
            "  bootstrap: false",
            f"  python: {sys.executable}",
            f"  remote_dir: {self.vms}",
            "  dispatcher_port: 0",
            "  worker_port: 0",
            "  running_timeout_s: 20",
            "  ssh_timeout_s: 20",
            "  ready_timeout_s: 120",
            ""])
        self.made: list[GcpProvider] = []
        yield
        # The suite's first instance is left as `kill -9` of `dsctl up` would leave it, but this process lives on:
        # its watcher (a thread reading the deleted VMs over SSH) and its connections go with the test.
        for p in self.made:
            if p._ctx is not None:
                if p._ctx.watcher is not None:
                    p._ctx.watcher.stop()
                if p._ctx.has_ssh:
                    p._ctx.ssh.close()

    def provider(self):
        self.made.append(GcpProvider())
        return self.made[-1]

    def kill(self, dep: Deployment, role: str, index: int) -> None:
        node = next(n for n in dep.by_role(role) if n.index == index)
        os.kill(gcp(node).remote_pid, signal.SIGKILL)  # the "VM" is this machine: its pid is one here

    def leftovers(self, dep: Deployment) -> list[str]:
        billing = [f"{count} {kind}" for kind, count in self.cloud.counts().items() if count]
        running = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if f"{self.vms}/" in cmd and p.status() != psutil.STATUS_ZOMBIE:
                    running.append(f"pid {p.pid}: {cmd[:160]}")
            except psutil.Error:
                pass
        staged = [b.name for b in owner_storage().list_blobs(BUCKET, prefix=f"dsctl/runs/{dep.run_id}/staging/")]
        return billing + running + [f"staging object {name}" for name in staged]
