"""A company project as organizations set them up: OS Login enforced, external addresses forbidden.

The stand-in refuses any VM that turns OS Login off (constraints/compute.requireOsLogin) or asks for an
external address (constraints/compute.vmExternalIpAccess), and its "guest agent" (standins/sshd.py) lets
in, on a VM with OS Login on, only keys registered with the OS Login API, never `ssh-keys` metadata. A run
from inside the VPC (gcp.public_ips: false) must still go end to end, with its key in OS Login for the
caller only while the run lasts.
"""

from __future__ import annotations

import pytest
from conftest import CALLER, PROJECT, gcp_spec

from dsctl.orchestrator.handoff import HandOff, hands_off
from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.specs import load_spec
from helpers import wait_for

pytestmark = pytest.mark.slow

REGION = "us-central1"


def _metadata(body: dict) -> dict[str, str]:
    md = body.get("metadata") or body.get("instanceProperties", {}).get("metadata") or {}
    if "items" in md:
        return {i["key"]: i.get("value", "") for i in md["items"]}
    return dict(md)


def test_a_run_goes_end_to_end_with_os_login_enforced_and_no_external_addresses(cloud, sshd, home, tmp_path):
    """`dsctl up` as it runs a job on Google Cloud: handed over to its dispatcher VM, which starts the supervisor from
    Cloud Storage. The user's machine talks to the APIs and the bucket only: it never has a key any VM would let in
    (on OS Login VMs only keys in OS Login are, and none is ever registered for the caller)."""
    cloud.set_org_policy("compute.requireOsLogin", [{"enforce": True}])
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    cloud.set_private_google_access(PROJECT, REGION, "default", True)  # the VMs reach Cloud Storage without NAT
    spec = gcp_spec(tmp_path / "job", sshd=sshd, home=home, workers=2, trainer_machine="tpu-v2-8", epochs=1,
                    elements=256, gcp={"public_ips": "false"})
    supervisor = f"dsctl-supervisor@{PROJECT}.iam.gserviceaccount.com"  # the dispatcher VM's account (accounts.py)
    keys: dict[str, list[int]] = {CALLER: [], supervisor: []}  # how many keys each account had, at each change

    def seen() -> None:
        for account, counts in keys.items():
            counts.append(len(cloud.oslogin_profiles.get(account, {"keys": {}})["keys"]))

    cloud.on_oslogin_changed.append(seen)

    runner = JobRunner(load_spec(spec))
    assert hands_off(runner), "a run through the service on Google Cloud is supervised on its dispatcher VM"
    handoff = HandOff(runner)
    handoff.start(attached=True)
    handoff.follow()
    record = RunStore().get(runner.run_id)
    assert record.status == "succeeded", record.error
    wait_for(lambda: cloud.counts() == {"instances": 0, "firewalls": 0, "tpus": 0}, timeout=60,
             what="the supervisor's own VM to be deleted last")

    # Every VM and TPU VM was asked for with OS Login on and no key in its metadata.
    machines = [body for kind, body in cloud.created if kind in ("instance", "tpu", "queued_resource")]
    assert machines
    for body in machines:
        node = body.get("tpu", {}).get("nodeSpec", [{}])[0].get("node", {}) if "tpu" in body else body
        md = _metadata(node)
        assert md.get("enable-oslogin") == "TRUE" and "ssh-keys" not in md, md

    # The supervisor registered its own key, for its own account; this machine never had one a VM would take.
    assert max(keys[supervisor]) >= 1 and keys[CALLER] and max(keys[CALLER]) == 0, keys
    assert not (home / "runs" / runner.run_id / "ssh").exists(), "no SSH key of the run on the user's machine"
    assert cloud.oslogin_keys(sshd.user) == []
