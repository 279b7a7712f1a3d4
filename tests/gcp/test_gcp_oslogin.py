"""A company project as organizations set them up: OS Login enforced, external addresses forbidden.

The stand-in refuses any VM that turns OS Login off (constraints/compute.requireOsLogin) or asks for an
external address (constraints/compute.vmExternalIpAccess), and its "guest agent" (tests/gcp/sshd.py) lets
in, on a VM with OS Login on, only keys registered with the OS Login API, never `ssh-keys` metadata. A run
from inside the VPC (gcp.public_ips: false) must still go end to end, with its key in OS Login for the
caller only while the run lasts.
"""

from __future__ import annotations

import pytest
from conftest import CALLER, PROJECT, gcp_spec

from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment
from dsctl.specs import load_spec

pytestmark = pytest.mark.slow

REGION = "us-central1"


def _metadata(body: dict) -> dict[str, str]:
    md = body.get("metadata") or body.get("instanceProperties", {}).get("metadata") or {}
    if "items" in md:
        return {i["key"]: i.get("value", "") for i in md["items"]}
    return dict(md)


def test_a_run_goes_end_to_end_with_os_login_enforced_and_no_external_addresses(cloud, sshd, home, tmp_path):
    cloud.set_org_policy("compute.requireOsLogin", [{"enforce": True}])
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    cloud.set_private_google_access(PROJECT, REGION, "default", True)  # the VMs reach Cloud Storage without NAT
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="tpu-v2-8", epochs=1,
                    elements=256, gcp={"public_ips": "false"})
    registered: list[list[str]] = []
    cloud.on_oslogin_changed.append(lambda: registered.append(cloud.oslogin_keys(sshd.user)))

    runner = JobRunner(load_spec(spec))
    runner.run()
    record = RunStore().get(runner.run_id)
    assert record.status == "succeeded", record.error
    assert cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}

    # Every VM and TPU VM was asked for with OS Login on and no key in its metadata.
    machines = [body for kind, body in cloud.created if kind in ("instance", "tpu", "queued_resource")]
    assert machines
    for body in machines:
        node = body.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}) if "tpu" in body else body
        md = _metadata(node)
        assert md.get("enable-oslogin") == "TRUE" and "ssh-keys" not in md, md

    # The key that reached the VMs was the run's own, registered for the caller, and is gone from OS Login now.
    public = (Deployment.load(runner.run_dir).run_dir + "/ssh/id_ed25519.pub")
    key = open(public).read().strip()
    assert any(key in keys for keys in registered)
    assert cloud.oslogin_keys(sshd.user) == []
    assert not cloud.oslogin_profiles.get(CALLER, {"keys": {}})["keys"]
