"""A first `dsctl up` on projects as people have them: it runs end to end, or it refuses before anything is created.

Four projects, each as Google sets them up (fake_identity.py and fake_gce.py enforce what each has, citing Google's
pages), and for each `dsctl check gcp` and `dsctl up` reach the same verdict:

- a fresh personal project: no organization, only the APIs Google turns on in a new project
  (https://cloud.google.com/service-usage/docs/enabled-service#default): refused, naming the one `gcloud services
  enable` that fixes it; with them on, the run goes end to end with dsctl's own accounts, each with only what it needs;
- a free-trial project: 8 vCPUs in all regions, no GPU and no TPU quota (https://cloud.google.com/free/docs/free-
  cloud-features#free-trial): the smallest run fits and runs; a GPU trainer and a TPU trainer are refused by their
  quota, before anything is created;
- a company project under the security foundations baseline (no default network, no external addresses, OS Login and
  Shielded VM required, no roles for the default account, uniform bucket access: terraform-example-foundation's
  organization policies): the smoke spec as it comes is refused; a spec that keeps to them (its own network and
  subnet, internal addresses, Private Google Access) runs, every VM a Shielded VM with Secure Boot;
- a Shared VPC service project: the network is the host project's; where you may not make firewall rules there, the
  run is refused with the two standing rules a network administrator adds once; once they are there, it runs, using
  them and making no rules of its own.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from conftest import CALLER, SESSION, ZONE, act_as, changes, gcp_spec
from fake_identity import DEFAULT_SERVICES

from dsctl.orchestrator.handoff import HandOff
from dsctl.orchestrator.run import JobRunner
from dsctl.orchestrator.store import RunStore
from dsctl.specs import load_spec
from helpers import dsctl, wait_for

pytestmark = pytest.mark.slow

REGION = ZONE.rsplit("-", 1)[0]
NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}


def _spec(tmp_path, home, project: str, name: str = "smoke", trainer: str = "e2-standard-2", **gcp) -> object:
    """The smoke example's shape (one e2-standard-2 dispatcher, worker and trainer), in `project`, with a staging
    bucket of its own."""
    spec = gcp_spec(tmp_path / name, home=home, workers=1, trainer_machine=trainer, epochs=1, elements=128,
                    project=project, bucket=f"{project}-{uuid.uuid4().hex[:6]}", gcp=gcp or None,
                    service=", worker_machine: e2-standard-2, dispatcher_machine: e2-standard-2")
    return spec


def _verdicts(spec) -> tuple[dict, str]:
    """`dsctl check gcp` (its JSON), and where it refuses, `dsctl up --yes`'s refusal (stderr): the same first one.
    (Where it is ready, the test runs the job: _runs.)"""
    checked = dsctl("check", "gcp", spec, "--json")
    assert "Traceback" not in checked.stderr, checked.stderr
    report = json.loads(checked.stdout)
    if report["ok"]:
        assert checked.returncode == 0
        return report, ""
    up = dsctl("up", spec, "--yes")
    assert "Traceback" not in up.stderr, up.stderr
    assert checked.returncode == 2 and up.returncode == 2, (checked.returncode, up.returncode, up.stderr)
    first = next(c for c in report["checks"] if c["status"] == "fail")
    # The same first refusal: `up` says the check's paragraph (with the spec's file and line where it has one).
    assert " ".join(first["detail"].split())[:120] in " ".join(up.stderr.split()), (first, up.stderr)
    return report, " ".join(up.stderr.split())


def _runs(spec, monkeypatch, project: str) -> None:
    """The run, end to end on the stand-ins, handed over to its dispatcher VM (whose supervisor calls as its own
    account), and nothing left."""
    monkeypatch.setitem(SESSION, "account", f"dsctl-workers@{project}.iam.gserviceaccount.com")
    runner = JobRunner(load_spec(spec))
    handoff = HandOff(runner)
    handoff.start(attached=True)
    handoff.follow()
    record = RunStore().get(runner.run_id)
    assert record.status == "succeeded", record.error
    # Each VM ran as dsctl's own account for its kind, made in this project: no fallback to a wider account.
    cloud = SESSION["cloud"]
    ran_as = {re.search(r"-(dispatcher|trainer|worker)(-\d+)?$", b["name"]).group(1): b["serviceAccounts"][0]["email"]
              for kind, b in cloud.created if kind == "instance" and runner.run_id in b["name"]}
    assert ran_as == {"dispatcher": f"dsctl-supervisor@{project}.iam.gserviceaccount.com",
                      "trainer": f"dsctl-supervisor@{project}.iam.gserviceaccount.com",
                      "worker": f"dsctl-workers@{project}.iam.gserviceaccount.com"}, ran_as


def test_a_fresh_personal_project_needs_its_apis_on_then_runs(cloud, sshd, home, tmp_path, monkeypatch):
    project = "personal-proj-1"
    cloud.define_project(project, owners=(CALLER,), services=DEFAULT_SERVICES, organization=None)
    spec = _spec(tmp_path, home, project)
    report, refused = _verdicts(spec)
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["APIs"]
    assert {c["status"] for c in report["checks"][report["checks"].index(
        next(c for c in report["checks"] if c["name"] == "APIs")) + 1:]} == {"skip"}
    enable = (f"gcloud services enable compute.googleapis.com iam.googleapis.com cloudresourcemanager.googleapis.com "
              f"oslogin.googleapis.com orgpolicy.googleapis.com --project={project}")
    assert enable in refused and "Nothing was created" in refused
    assert cloud.counts() == NOTHING and not changes(cloud)
    for api in ("compute", "iam", "cloudresourcemanager", "oslogin", "orgpolicy"):
        cloud.enable_service(project, f"{api}.googleapis.com")
    report, _ = _verdicts(_spec(tmp_path, home, project, name="again"))
    assert report["ok"], report
    _runs(spec, monkeypatch, project)
    wait_for(lambda: cloud.counts() == NOTHING, timeout=60, what="the run's VMs and rules to be gone")
    # The workers ran as dsctl's workers' account, which holds nothing at the project level.
    workers = f"dsctl-workers@{project}.iam.gserviceaccount.com"
    assert cloud.roles_of(project, workers) == set()
    bodies = [b for kind, b in cloud.created if kind == "instance"]
    assert {b["serviceAccounts"][0]["email"] for b in bodies if "-worker-" in json.dumps(b)} == {workers}


def test_a_free_trial_project_runs_the_smallest_run_and_refuses_gpus_and_tpus(cloud, sshd, home, tmp_path,
                                                                            monkeypatch):
    project = "trial-proj-1"
    cloud.define_project(project, owners=(CALLER,), organization=None)
    cloud.set_quota("CPUS_ALL_REGIONS", 8)
    cloud.set_quota("GPUS_ALL_REGIONS", 0)
    cloud.set_tpu_quota("TPUV2sPerProjectPerZoneForTPUAPI", 0)
    gpu, refused = _verdicts(_spec(tmp_path, home, project, name="gpu", trainer="g2-standard-4"))
    assert not gpu["ok"] and "GPUS_ALL_REGIONS: 1 needed" in refused and "free-trial" in refused
    tpu, refused = _verdicts(_spec(tmp_path, home, project, name="tpu", trainer="tpu-v2-8"))
    assert not tpu["ok"] and "TPUV2sPerProjectPerZoneForTPUAPI" in refused
    assert cloud.counts() == NOTHING and not changes(cloud)
    spec = _spec(tmp_path, home, project)
    report, _ = _verdicts(spec)
    assert report["ok"], report
    _runs(spec, monkeypatch, project)  # 3 x 2 vCPUs: within the 8


def test_a_company_project_under_a_security_baseline(cloud, sshd, home, tmp_path, monkeypatch):
    project = "acme-ml-dev"
    for constraint in ("compute.skipDefaultNetworkCreation", "compute.requireOsLogin", "compute.requireShieldedVm",
                       "compute.disableSerialPortAccess", "iam.disableServiceAccountKeyCreation",
                       "iam.automaticIamGrantsForDefaultServiceAccounts", "storage.uniformBucketLevelAccess"):
        cloud.set_org_policy(constraint, [{"enforce": True}])
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    cloud.define_project(project, owners=(CALLER,))
    # As it comes (the default network, external addresses): refused at the first, before anything is created.
    report, refused = _verdicts(_spec(tmp_path, home, project, name="as-is"))
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    assert failed[0] == "organization policies" and "constraints/compute.vmExternalIpAccess" in refused
    assert "network" in failed and any("no network named default" in c["detail"] for c in report["checks"])
    # Its own network and subnet, internal addresses, Private Google Access to reach Cloud Storage: it runs.
    cloud.add_network(project, "ml-net")
    cloud.add_subnetwork(project, REGION, "ml-subnet", network="ml-net", private_ip_google_access=True)
    spec = _spec(tmp_path, home, project, network="ml-net", subnetwork="ml-subnet", public_ips="false")
    report, _ = _verdicts(spec)
    assert report["ok"], report
    assert cloud.counts() == NOTHING and not changes(cloud)
    _runs(spec, monkeypatch, project)
    machines = [b for kind, b in cloud.created if kind == "instance"]
    assert machines and all(b["shieldedInstanceConfig"]["enableSecureBoot"] for b in machines)
    assert all(not b["networkInterfaces"][0].get("accessConfigs") for b in machines)


def test_a_shared_vpc_service_project_uses_standing_rules_a_network_administrator_adds(cloud, sshd, home, tmp_path,
                                                                                     monkeypatch):
    from dsctl.provisioners.gcp import firewall

    host, project = "net-host-1", "team-svc-1"
    cloud.define_project(host, owners=("netadmin@example.com",), default_network=False)
    cloud.define_project(project, owners=(CALLER,), default_network=False)
    cloud.add_network(host, "shared-net")
    cloud.add_subnetwork(host, REGION, "shared-sub", network="shared-net", private_ip_google_access=True)
    cloud.share_vpc(host, project)
    subnet = f"projects/{host}/regions/{REGION}/subnetworks/shared-sub"
    # What a Shared VPC administrator grants a team: Network User on its subnet, Network Viewer on the host project.
    cloud.grant(CALLER, "roles/compute.networkUser", subnet)
    cloud.grant(CALLER, "roles/compute.networkViewer", f"projects/{host}")
    spec = _spec(tmp_path, home, project, network=f"projects/{host}/global/networks/shared-net",
                 subnetwork=subnet, public_ips="false")
    report, refused = _verdicts(spec)
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["network"]
    standing = firewall.standing_rules("shared-net", 0, 0)
    for command in firewall.commands(standing, host, "shared-net"):
        assert command in refused
    assert cloud.counts() == NOTHING and not changes(cloud)
    # The administrator adds them, as printed.
    with cloud.acting_as("netadmin@example.com"):
        for rule in standing:
            cloud.insert_firewall(host, {
                "name": rule.name, "network": f"projects/{host}/global/networks/shared-net", "priority": rule.priority,
                "targetTags": [rule.target_tag], **({"allowed": [{"IPProtocol": "tcp", "ports": list(rule.ports)}],
                                                    "sourceTags": [rule.source_tag]} if rule.allow else
                                                   {"denied": [{"IPProtocol": "tcp", "ports": list(rule.ports)}],
                                                    "sourceRanges": [rule.source_range]})}, None)
    report, _ = _verdicts(spec)
    assert report["ok"], report
    before = cloud.counts()["firewalls"]
    _runs(spec, monkeypatch, project)
    assert not [b for kind, b in cloud.created if kind == "firewall" and b["name"].startswith("dsctl-smoke")]
    assert cloud.counts() == {"instances": 0, "firewalls": before, "tpus": 0}
    machines = [b for kind, b in cloud.created if kind == "instance"]
    assert all(firewall.SHARED_TAG in b["tags"]["items"] for b in machines)
    assert all(b["networkInterfaces"][0]["subnetwork"].endswith(subnet) for b in machines)


def test_check_needs_no_spec_and_names_each_check(cloud, tmp_path, monkeypatch):
    """`dsctl check gcp --project P --zone Z` checks the smallest example run there; its table names every check."""
    out = dsctl("check", "gcp", "--project", "dsctl-test", "--zone", ZONE)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for name in ("credentials", "project", "APIs", "your permissions", "machines and images", "organization policies",
                 "network", "service accounts", "quota"):
        assert name in text
    assert "ready" in text and CALLER in text
    # Someone who may do nothing there: the verdict names what to grant.
    act_as(monkeypatch, cloud, "visitor@example.com", tmp_path)
    refused = dsctl("check", "gcp", "--project", "dsctl-test", "--zone", ZONE, "--json")
    assert refused.returncode == 2
    first = next(c for c in json.loads(refused.stdout)["checks"] if c["status"] == "fail")
    assert first["name"] == "project" and "roles/browser" in first["detail"]
