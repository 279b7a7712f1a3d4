"""Checks against the live project before anything is created: each refusal is exit 2, one paragraph, zero resources.

Against the stand-in (real client libraries, loopback): the caller's permissions, the machine
types and images the spec names, SSH into the network, the way out to Cloud Storage for VMs
with internal addresses only, and what the network's own firewall rules would have opened.
"""

from __future__ import annotations

import pytest
from conftest import CALLER, PROJECT, ZONE, act_as, changes, gcp_spec

from dsctl.orchestrator.run import JobRunner
from dsctl.specs import SpecError, load_spec
from helpers import dsctl

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
REGION = ZONE.rsplit("-", 1)[0]


def _check(spec_path):
    from dsctl.provisioners.gcp import GcpProvider

    GcpProvider().check(load_spec(spec_path).spec, 1, spec_path.parent)


def _refusal(spec_path) -> str:
    """`dsctl up --yes` refuses: exit 2, no traceback, nothing created; returns the one-paragraph message."""
    proc = dsctl("up", spec_path, "--yes")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    return " ".join(proc.stderr.split())


def test_internal_only_vms_need_a_way_to_cloud_storage(cloud, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", home=home, gcp={"public_ips": "false"})
    message = _refusal(spec)
    assert "gcp.public_ips" in message and "job.yaml:" in message
    assert f"subnet default (region {REGION}) has neither Private Google Access nor a Cloud NAT" in message
    assert f"gcloud compute networks subnets update default --region {REGION} --enable-private-ip-google-access" in message
    assert "gcloud compute routers nats create" in message
    assert cloud.counts() == NOTHING
    # Either way out is enough: Private Google Access on the subnet ...
    cloud.set_private_google_access(PROJECT, REGION, "default", True)
    _check(spec)
    # ... or a Cloud NAT on the region's router for this network (not another network's).
    cloud.set_private_google_access(PROJECT, REGION, "default", False)
    cloud.add_network(PROJECT, "other", auto=True)
    cloud.add_router(PROJECT, REGION, "elsewhere", network="other", nats=[{"name": "n"}])
    with pytest.raises(SpecError, match="neither Private Google Access nor a Cloud NAT"):
        _check(spec)
    cloud.add_router(PROJECT, REGION, "nat", nats=[{"name": "n"}])
    _check(spec)
    assert cloud.counts() == NOTHING


def test_missing_permissions_are_named_before_anything_is_created(cloud, home, tmp_path, monkeypatch):
    """Someone an administrator gave Compute Instance Admin, Service Account User and Storage Admin on the project,
    but not TPU Admin: a TPU run is refused, naming the TPU permissions and the role that has them."""
    from dsctl.provisioners.gcp.preflight import required_permissions

    spec = gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8")
    wanted = required_permissions(load_spec(spec).spec)
    assert "tpu.queuedResources.create" in wanted and "compute.instances.setServiceAccount" in wanted
    for role in ("roles/compute.instanceAdmin.v1", "roles/compute.securityAdmin", "roles/iam.serviceAccountUser",
                 "roles/storage.admin", "roles/compute.osLogin", "roles/iam.serviceAccountAdmin",
                 "roles/resourcemanager.projectIamAdmin", "roles/browser", "roles/serviceusage.serviceUsageConsumer"):
        cloud.grant("user:engineer@example.com", role, f"projects/{PROJECT}")
    act_as(monkeypatch, cloud, "engineer@example.com", tmp_path)
    message = _refusal(spec)
    assert "engineer@example.com" in message and "tpu.queuedResources.create" in message
    assert "roles/tpu.admin" in message and f"project {PROJECT}" in message
    assert cloud.counts() == NOTHING and not changes(cloud)
    cloud.grant("user:engineer@example.com", "roles/tpu.admin", f"projects/{PROJECT}")
    _check(spec)


def test_what_the_spec_names_must_exist_in_the_zone(cloud, home, tmp_path):
    bad_machine = gcp_spec(tmp_path / "a", home=home, trainer_machine="a2-highgpu-1g")
    bad_machine.write_text(bad_machine.read_text().replace(f"zone: {ZONE}", "zone: europe-west1-b"))
    message = _refusal(bad_machine)
    assert "a2-highgpu-1g is not offered in zone europe-west1-b" in message and "trainer.machine" in message
    bad_image = gcp_spec(tmp_path / "b", home=home, gcp={"image": "projects/debian-cloud/global/images/family/debian-99",
                                                         "image_python_version": "'3.11'"})
    message = _refusal(bad_image)
    assert "the boot image projects/debian-cloud/global/images/family/debian-99 does not exist" in message
    assert "gcp.image" in message
    assert cloud.counts() == NOTHING


def test_a_network_without_ssh_is_refused_and_wider_rules_are_reported(cloud, home, tmp_path):
    from dsctl.provisioners.gcp import GcpProvider

    spec = gcp_spec(tmp_path / "job", home=home)
    p = GcpProvider()
    p.check(load_spec(spec).spec, 1, spec.parent)
    # The default network's default-allow-internal admits every port from 10.128.0.0/9: the run's deny rule
    # (priority 910) closes the service ports to it, and the plan says so.
    notes = " ".join(p._findings.notes)
    assert "default-allow-internal (priority 65534, from 10.128.0.0/9)" in notes and "deny rule" in notes
    # A rule ahead of the deny rule would keep them open: a warning, not a silent hole.
    from google.cloud import compute_v1 as c

    from dsctl.provisioners.gcp import operations
    from dsctl.provisioners.gcp.clients import Clients

    clients = Clients(p._clients.settings)

    def done(op):
        operations.wait(clients, op, doing="a test's firewall change", timeout_s=30)

    done(clients.firewalls.insert_unary(project=PROJECT, firewall_resource=c.Firewall(
        name="wide-open", network=f"projects/{PROJECT}/global/networks/default", priority=100, direction="INGRESS",
        allowed=[c.Allowed(I_p_protocol="tcp")], source_ranges=["0.0.0.0/0"])))
    q = GcpProvider()
    q.check(load_spec(spec).spec, 1, spec.parent)
    assert any(n.startswith("WARNING: the network's rule wide-open (priority 100") for n in q._findings.notes)
    done(clients.firewalls.delete_unary(project=PROJECT, firewall="wide-open"))
    # Without any rule admitting tcp:22, a run supervised from here could not reach its VMs: refused before
    # anything is created.
    done(clients.firewalls.delete_unary(project=PROJECT, firewall="default-allow-ssh"))
    here = gcp_spec(tmp_path / "here", home=home, gcp={"supervisor": "here"})
    message = _refusal(here)
    assert "no firewall rule of network default admits SSH (tcp:22)" in message and "gcp.network" in message
    assert cloud.counts() == NOTHING
    # A run handed over to its dispatcher VM is reached from there only, through the run's own rule: SSH between
    # the run's VMs, whatever the network's rules say.
    handed = GcpProvider()
    handed.prepare_hand_off(load_spec(spec).spec)
    handed.check(load_spec(spec).spec, 1, spec.parent)
    from dsctl.provisioners.gcp import firewall, naming

    allow, deny = firewall.run_rules("r", naming.network_tag("r"), 5050, 5051)
    assert "22" in allow.ports and allow.source_tag == allow.target_tag and "22" not in deny.ports


def test_the_flagship_example_plans_with_only_project_and_zone(no_credentials, tmp_path):
    """`dsctl up specs/examples/gcp-resnet50.yaml --dry-run`: no credentials, no edits but project and zone."""
    from helpers import EXAMPLES

    text = (EXAMPLES / "gcp-resnet50.yaml").read_text().replace("my-project", "acme-ml").replace(
        "us-central1-b", "us-central1-c")
    (tmp_path / "job.yaml").write_text(text)
    proc = dsctl("up", tmp_path / "job.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "project acme-ml, zone us-central1-c" in out and "dry run: nothing was created" in out
    assert "n2-standard-8 (VM) 16 Spot 0.0800" in out and "tpu-v2-8 (TPU VM) 1 on-demand 4.5000" in out
    assert "at least $40.59" in out and "TensorFlow 2.18.0 on every VM" in out


def test_a_run_refused_by_preflight_records_nothing_billable(cloud, home, tmp_path):
    spec = gcp_spec(tmp_path / "job", home=home, gcp={"public_ips": "false"})
    with pytest.raises(SpecError):
        JobRunner(load_spec(spec)).run()
    assert cloud.counts() == NOTHING
    assert not changes(cloud)


def _own_accounts(loaded, spec_path):
    """dsctl's own accounts made and granted, as `dsctl up` does before any VM: (provider, supervisor, workers)."""
    from dsctl.provisioners.gcp import GcpProvider, accounts

    p = GcpProvider()
    p.check(loaded, 2, spec_path.parent)
    accounts.ensure(p._clients, p._findings.accounts, lambda kind, msg: None)
    emails = p._clients.settings.vm_accounts
    return p, emails[accounts.SUPERVISOR], emails[accounts.WORKERS]


@pytest.mark.parametrize("autoscale, tpu", [(False, False), (True, True)])
def test_the_supervisor_checks_its_own_permissions_on_each_resource(cloud, home, tmp_path, autoscale, tpu, monkeypatch):
    """On the dispatcher VM the supervisor calls as its own account. With exactly what dsctl granted it (roles on the
    project, Service Account User on the workers' account and on its own, Storage Object Admin on the bucket) it
    passes: a project-level test could not see the grants on the account and the bucket. What it lacks is named on
    the resource it is granted on, with the command that grants it, before it starts, stops or deletes anything."""
    from dsctl.provisioners import Deployment
    from dsctl.provisioners.gcp import GcpDeployment, GcpError, GcpProvider
    from dsctl.provisioners.gcp.preflight import supervisor_needs

    extra = "\nautoscale: {policy: cachew, max_workers: 4}\n" if autoscale else ""
    path = gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8" if tpu else "n2-standard-8",
                    mode="parallel_epochs", epochs=None)
    path.write_text(path.read_text() + extra)
    loaded = load_spec(path).spec
    p, supervisor, workers = _own_accounts(loaded, path)
    needs = supervisor_needs(loaded, p._clients.settings)
    wanted = [perm for perms in needs.values() for perm in perms]
    assert ("compute.instances.create" in wanted) == autoscale and ("tpu.nodes.delete" in wanted) == tpu
    assert {w.kind for w in needs} == {"project", "bucket", "account"}
    dep = Deployment(run_id="perm-run", provider="gcp", run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    dep.state = GcpDeployment(settings=p._clients.settings)
    act_as(monkeypatch, cloud, supervisor, tmp_path)  # on the dispatcher VM: its own account calls
    GcpProvider().check_supervisor(dep, loaded)  # everything granted, each where it lives: nothing to say
    # The grant on the workers' account, and the one on the bucket, are each missed, and named where they live.
    cloud.revoke(supervisor, "roles/iam.serviceAccountUser", f"projects/{PROJECT}/serviceAccounts/{workers}")
    cloud.revoke(supervisor, "roles/storage.objectAdmin", f"projects/_/buckets/{p._clients.settings.bucket}")
    with pytest.raises(GcpError) as info:
        GcpProvider().check_supervisor(dep, loaded)
    message = " ".join(str(info.value).split())
    assert f"iam.serviceAccounts.actAs on service account {workers}" in message
    assert f"on bucket gs://{p._clients.settings.bucket}" in message and "storage.objects.create" in message
    assert (f"gcloud iam service-accounts add-iam-policy-binding {workers} --member=serviceAccount:{supervisor} "
            "--role=roles/iam.serviceAccountUser") in message
    assert (f"gcloud storage buckets add-iam-policy-binding gs://{p._clients.settings.bucket} "
            f"--member=serviceAccount:{supervisor} --role=roles/storage.objectAdmin") in message
    assert "gcp.supervisor: here" in message and "compute." not in message.split("lacks", 1)[1].split("Grant")[0]
    assert cloud.counts() == NOTHING


def test_the_supervisor_waits_for_the_grants_dsctl_just_made(cloud, home, tmp_path, monkeypatch):
    """Grants take a while to be in effect (the stand-in: grant_delay_s). Right after dsctl granted them, the
    supervisor's first check would fail; it probes again until they are, and says it waits."""
    import time

    from dsctl.provisioners import Deployment
    from dsctl.provisioners.gcp import GcpDeployment, GcpProvider

    cloud.grant_delay_s = 3.0
    path = gcp_spec(tmp_path / "job", home=home, trainer_machine="n2-standard-8")
    loaded = load_spec(path).spec
    granted = time.time()
    p, supervisor, _ = _own_accounts(loaded, path)
    dep = Deployment(run_id="wait-run", provider="gcp", run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    dep.state = GcpDeployment(settings=p._clients.settings, granted_at=granted)
    act_as(monkeypatch, cloud, supervisor, tmp_path)
    events = []
    GcpProvider().check_supervisor(dep, loaded, lambda kind, msg: events.append(msg))
    assert time.time() - granted >= 3.0 and any("waiting for the grants" in e for e in events), events


# -- the VMs' service accounts (accounts.py) and the organization's policies (orgpolicy.py) -------------------------
def _cpu_spec(tmp_path, home, **gcp):
    return gcp_spec(tmp_path / "job", home=home, trainer_machine="n2-standard-8", gcp=gcp or None)


def _engineer(cloud, monkeypatch, tmp_path, *extra: str) -> None:
    """A caller with what runs need on the project, but who may not make service accounts or change the project's
    policy (roles an administrator gave): the case where dsctl cannot make its own accounts."""
    for role in ("roles/compute.instanceAdmin.v1", "roles/compute.securityAdmin", "roles/iam.serviceAccountUser",
                 "roles/storage.admin", "roles/compute.osLogin", "roles/viewer", *extra):
        cloud.grant("user:engineer@example.com", role, f"projects/{PROJECT}")
    act_as(monkeypatch, cloud, "engineer@example.com", tmp_path)


def test_a_default_account_without_roles_is_refused_when_dsctl_may_not_make_its_own(cloud, home, tmp_path, monkeypatch):
    """Secure by default (organizations since May 2024): the Compute Engine default account has no role. A caller
    who may not create service accounts is told, before anything is created, which roles on which resource, and the
    commands that grant each there."""
    from dsctl.provisioners.gcp.accounts import default_account

    cloud.secure_by_default = True
    spec = _cpu_spec(tmp_path, home)
    _engineer(cloud, monkeypatch, tmp_path)
    message = _refusal(spec)
    account = default_account(cloud.project_number(PROJECT))
    assert f"the run's supervisor and workers VMs would run as {account} (the Compute Engine default account)" in message
    member = f"--member=serviceAccount:{account}"
    for command in (f"gcloud projects add-iam-policy-binding {PROJECT} {member} --role=roles/compute.instanceAdmin.v1",
                    f"gcloud storage buckets add-iam-policy-binding gs://dsctl-test-staging {member} "
                    "--role=roles/storage.objectAdmin",
                    f"gcloud iam service-accounts add-iam-policy-binding {account} {member} "
                    "--role=roles/iam.serviceAccountUser"):
        assert command in message
    assert "roles/tpu.admin" not in message  # a CPU trainer: no TPU role asked for
    assert "iam.serviceAccounts.create" in message and "gcp.service_account" in message
    assert cloud.counts() == NOTHING and not changes(cloud)
    # Granted what the message says, each where it says, the same account passes.
    for role in ("roles/compute.instanceAdmin.v1", "roles/compute.securityAdmin", "roles/compute.osLogin"):
        cloud.grant(f"serviceAccount:{account}", role, f"projects/{PROJECT}")
    cloud.grant(f"serviceAccount:{account}", "roles/storage.objectAdmin", "projects/_/buckets/dsctl-test-staging")
    cloud.grant(f"serviceAccount:{account}", "roles/iam.serviceAccountUser",
                f"projects/{PROJECT}/serviceAccounts/{account}")
    _check(spec)
    # An account the spec names is checked the same way, and never changed by dsctl.
    named = _cpu_spec(tmp_path / "named", home, service_account=f"ml-runner@{PROJECT}.iam.gserviceaccount.com")
    message = _refusal(named)
    assert f"ml-runner@{PROJECT}.iam.gserviceaccount.com (gcp.service_account)" in message
    assert "roles/compute.instanceAdmin.v1" in message and not changes(cloud)


def test_dsctl_makes_its_own_accounts_once_each_with_exactly_its_grants(cloud, home, tmp_path):
    """The supervisor's account gets its roles on the project, Service Account User on the workers' account and its
    own, Storage Object Admin on the bucket; the workers' account gets Storage Object Viewer on the bucket and nothing
    at the project. The VMs run as them; a second run changes nothing; a TPU run adds TPU Admin, only that."""
    from dsctl.provisioners.gcp import GcpProvider, accounts, compute
    from dsctl.provisioners.gcp.clients import Clients

    cloud.secure_by_default = True
    spec = _cpu_spec(tmp_path, home)
    loaded = load_spec(spec).spec
    p = GcpProvider()
    p.check(loaded, 1, spec.parent)
    supervisor, workers = accounts.own_account("supervisor", PROJECT), accounts.own_account("workers", PROJECT)
    assert [(q.email, q.create) for q in p._findings.accounts.plans] == [(supervisor, True), (workers, True)]
    assert not changes(cloud)  # check only reads: the accounts are made in `up`, after the plan was confirmed
    events = []
    accounts.ensure(p._clients, p._findings.accounts, lambda kind, msg: events.append(msg))
    bucket = f"projects/_/buckets/{p._clients.settings.bucket}"
    assert cloud.roles_of(PROJECT, supervisor) == {"roles/compute.instanceAdmin.v1", "roles/compute.securityAdmin",
                                                   "roles/compute.osLogin"}
    assert cloud.roles_on(f"projects/{PROJECT}/serviceAccounts/{workers}", supervisor) == {"roles/iam.serviceAccountUser"}
    assert cloud.roles_on(f"projects/{PROJECT}/serviceAccounts/{supervisor}", supervisor) == {
        "roles/iam.serviceAccountUser"}
    assert cloud.roles_on(bucket, supervisor) == {"roles/storage.objectAdmin"}
    assert cloud.roles_of(PROJECT, workers) == set() and cloud.roles_on(bucket, workers) == {"roles/storage.objectViewer"}
    assert [kind for kind, _ in cloud.created] == ["service_account", "service_account"]
    assert any("created the supervisor VMs' service account" in e for e in events)
    # The VMs are created with them.
    vm = compute.VmConfig(machine="e2-standard-2", labels={}, tag="t", metadata={},
                          image="projects/debian-cloud/global/images/family/debian-12", service_account=workers)
    compute.insert(Clients(p._clients.settings), "sa-probe", vm)
    assert cloud.get_instance(PROJECT, ZONE, "sa-probe")["serviceAccounts"][0]["email"] == workers
    # A second run finds the accounts and their roles: nothing is made or granted again.
    before = len(changes(cloud))
    q = GcpProvider()
    q.check(loaded, 1, spec.parent)
    assert not any(a.create or a.grant for a in q._findings.accounts.plans)
    accounts.ensure(q._clients, q._findings.accounts, lambda kind, msg: None)
    assert len(changes(cloud)) == before and [kind for kind, _ in cloud.created].count("service_account") == 2
    # A TPU run adds the one role it needs more, and only that.
    tpu = load_spec(gcp_spec(tmp_path / "tpu", home=home, trainer_machine="tpu-v2-8")).spec
    r = GcpProvider()
    r.check(tpu, 1, spec.parent)
    assert [(g.role, g.scope) for a in r._findings.accounts.plans for g in a.grant] == [("roles/tpu.admin", "project")]
    accounts.ensure(r._clients, r._findings.accounts, lambda kind, msg: None)
    assert cloud.roles_of(PROJECT, supervisor) >= {"roles/tpu.admin"} and cloud.roles_of(PROJECT, workers) == set()


def test_the_workers_account_may_read_the_runs_objects_and_nothing_else(cloud, home, tmp_path, monkeypatch):
    """Asked of the stand-in as the workers' account: it reads the run's objects, and may not list, create or delete
    VMs, touch firewall rules, or read another bucket's objects."""
    from google.api_core import exceptions as gx
    from google.cloud import compute_v1 as c

    from dsctl.provisioners.gcp.clients import Clients

    spec = _cpu_spec(tmp_path, home)
    loaded = load_spec(spec).spec
    p, _, workers = _own_accounts(loaded, spec)
    settings = p._clients.settings
    owner = Clients(settings)
    owner.storage.bucket(settings.bucket).blob("dsctl/runs/r/staging/spec.json").upload_from_string(b"{}")
    owner.storage.create_bucket("someone-elses-data", location=settings.region)
    owner.storage.bucket("someone-elses-data").blob("secret").upload_from_string(b"x")
    from dsctl.provisioners.gcp import compute

    compute.insert(owner, "bystander", compute.VmConfig(machine="e2-standard-2", labels={}, tag="t", metadata={},
                                                        image="projects/debian-cloud/global/images/family/debian-12"))
    act_as(monkeypatch, cloud, workers, tmp_path)
    worker = Clients(settings)
    assert worker.storage.bucket(settings.bucket).blob("dsctl/runs/r/staging/spec.json").download_as_bytes() == b"{}"
    with pytest.raises(gx.Forbidden):
        worker.storage.bucket("someone-elses-data").blob("secret").download_as_bytes()
    with pytest.raises(gx.Forbidden):
        worker.storage.bucket(settings.bucket).blob("dsctl/runs/r/staging/spec.json").upload_from_string(b"evil")
    with pytest.raises(gx.Forbidden):
        list(worker.instances.list(project=PROJECT, zone=ZONE))
    with pytest.raises(gx.Forbidden):
        worker.instances.delete(project=PROJECT, zone=ZONE, instance="bystander")
    with pytest.raises(gx.Forbidden):
        compute.insert(worker, "evil", compute.VmConfig(machine="e2-standard-2", labels={}, tag="t", metadata={},
                                                        image="projects/debian-cloud/global/images/family/debian-12"))
    with pytest.raises(gx.Forbidden):
        list(worker.firewalls.list(request=c.ListFirewallsRequest(project=PROJECT)))
    with pytest.raises(gx.Forbidden):
        worker.firewalls.delete(project=PROJECT, firewall="default-allow-ssh")
    assert cloud.counts()["instances"] == 1


def test_organization_policies_refuse_before_anything_is_created(cloud, home, tmp_path, monkeypatch):
    from dsctl.provisioners.gcp import GcpProvider

    spec = _cpu_spec(tmp_path, home)
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    message = _refusal(spec)
    assert "constraints/compute.vmExternalIpAccess" in message and "gcp.public_ips: false" in message
    assert "job.yaml:" in message and cloud.counts() == NOTHING and not changes(cloud)
    # A list of allowed instances cannot name VMs that do not exist yet: still refused; allowAll passes.
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"values": {"allowedValues": [
        f"projects/{PROJECT}/zones/{ZONE}/instances/bastion"]}}])
    with pytest.raises(SpecError, match="vmExternalIpAccess"):
        _check(spec)
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"allowAll": True}])
    _check(spec)
    # Boot images from a project the organization does not trust.
    cloud.set_org_policy("compute.trustedImageProjects", [{"values": {"allowedValues": ["projects/ubuntu-os-cloud"]}}])
    message = _refusal(spec)
    assert "constraints/compute.trustedImageProjects" in message and "projects/debian-cloud" in message
    assert "gcp.image" in message and cloud.counts() == NOTHING
    cloud.set_org_policy("compute.trustedImageProjects", [{"values": {"allowedValues": ["is:projects/debian-cloud"]}}])
    _check(spec)
    # A caller who may not read the policies: a warning in the plan, and the run goes on.
    cloud.set_org_policy("compute.trustedImageProjects", None)
    _engineer(cloud, monkeypatch, tmp_path, "roles/iam.serviceAccountAdmin", "roles/resourcemanager.projectIamAdmin")
    cloud.revoke("user:engineer@example.com", "roles/viewer", f"projects/{PROJECT}")
    p = GcpProvider()
    p.check(load_spec(spec).spec, 1, spec.parent)
    assert any("organization's policies could not be read" in n and n.startswith("WARNING") for n in p._findings.notes)


def test_a_policy_against_new_service_accounts_falls_back_to_checking_the_default_account(cloud, home, tmp_path):
    cloud.secure_by_default = True
    cloud.set_org_policy("iam.disableServiceAccountCreation", [{"enforce": True}])
    message = _refusal(_cpu_spec(tmp_path, home))
    assert "constraints/iam.disableServiceAccountCreation" in message and "-compute@developer" in message
    assert not changes(cloud)


# -- Compute Engine quota in the region (quota.py) ------------------------------------------------------------------
def test_vcpu_quota_is_checked_for_the_whole_run_before_anything_is_created(cloud, home, tmp_path):
    """Dispatcher, workers and CPU trainers add up by quota metric and are compared with limit - usage."""
    spec = _cpu_spec(tmp_path, home)  # 1 dispatcher, 2 workers, 1 trainer: 4 x n2-standard-8 = 32 N2 vCPUs
    cloud.set_quota("N2_CPUS", 24, region=REGION)
    message = _refusal(spec)
    assert "\n" not in message and "job.yaml:" in message and "service.workers" in message
    assert (f"the run needs more Compute Engine quota in region {REGION} than project {PROJECT} has free: N2_CPUS: 32 "
            "needed (1 n2-standard-8 (dispatcher) x 8 vCPUs; 2 n2-standard-8 (workers) x 8 vCPUs; 1 n2-standard-8 "
            "(trainers) x 8 vCPUs), 24 available (limit 24, 0 in use). Nothing was created.") in message
    assert "IAM & Admin > Quotas" in message
    assert (f"gcloud quotas preferences create --service=compute.googleapis.com --project={PROJECT} "
            f"--quota-id=N2-CPUS-per-project-region --dimensions=region={REGION} --preferred-value=32") in message
    assert cloud.counts() == NOTHING and not changes(cloud)
    # Enough: it passes. What other VMs of the project use is not free: refused again, the usage named.
    from dsctl.provisioners.gcp import GcpProvider, compute
    from dsctl.provisioners.gcp.clients import Clients
    from dsctl.provisioners.gcp.settings import resolve

    loaded = load_spec(spec).spec
    cloud.set_quota("N2_CPUS", 32, region=REGION)
    GcpProvider().check(loaded, 2, spec.parent)
    compute.insert(Clients(resolve(loaded)), "someone-elses", compute.VmConfig(
        machine="n2-standard-4", labels={}, tag="t", metadata={}, image="projects/debian-cloud/global/images/family/debian-12"))
    with pytest.raises(SpecError, match=r"N2_CPUS: 32 needed .*, 28 available \(limit 32, 4 in use\)"):
        GcpProvider().check(loaded, 2, spec.parent)


def test_autoscaling_counts_its_most_workers(cloud, home, tmp_path):
    path = gcp_spec(tmp_path / "job", home=home, workers=1, trainer_machine="e2-standard-2", mode="parallel_epochs",
                    epochs=None)
    path.write_text(path.read_text() + "\nautoscale: {policy: cachew, min_workers: 1, max_workers: 6}\n")
    cloud.set_quota("N2_CPUS", 40, region=REGION)  # 1 + 1 workers fit; the dispatcher and 6 workers (56) do not
    message = _refusal(path)
    assert "N2_CPUS: 56 needed (1 n2-standard-8 (dispatcher) x 8 vCPUs; 6 n2-standard-8 (workers) x 8 vCPUs)" in message
    assert "E2_CPUS" not in message and cloud.counts() == NOTHING


def test_gpu_quota_by_type_and_spot_vms_on_preemptible_quota(cloud, home, tmp_path):
    """An a2-highgpu-1g trainer needs 1 A100 of NVIDIA_A100_GPUS (and 12 A2 vCPUs); Spot VMs count against the
    preemptible quota where the project has it (limit above 0), else against the standard one."""
    gpu = gcp_spec(tmp_path / "gpu", home=home, trainer_machine="a2-highgpu-1g")
    cloud.set_quota("NVIDIA_A100_GPUS", 0, region=REGION)
    message = _refusal(gpu)
    assert ("NVIDIA_A100_GPUS: 1 needed (1 a2-highgpu-1g (trainers) x 1 nvidia-tesla-a100), 0 available (limit 0, 0 in "
            "use)") in message and "trainer.machine" in message and "A2_CPUS" not in message
    assert "--quota-id=NVIDIA-A100-GPUS-per-project-region" in message and cloud.counts() == NOTHING
    # As Spot VMs: no preemptible A100 quota granted (limit 0), so they would count against the standard one.
    spot_gpu = gcp_spec(tmp_path / "spot-gpu", home=home, trainer_machine="a2-highgpu-1g")
    spot_gpu.write_text(spot_gpu.read_text().replace("trainer: {", "trainer: {provisioning: spot, "))
    with pytest.raises(SpecError, match=r"NVIDIA_A100_GPUS: 1 needed \(1 Spot a2-highgpu-1g"):
        _check(spot_gpu)
    cloud.set_quota("PREEMPTIBLE_NVIDIA_A100_GPUS", 4, region=REGION)
    _check(spot_gpu)
    # Spot workers: PREEMPTIBLE_CPUS, once granted, holds them; the dispatcher, which runs the run's supervisor, is
    # on-demand and stays on N2_CPUS.
    from dsctl.provisioners.gcp import GcpProvider

    spot = gcp_spec(tmp_path / "spot", home=home, workers=4, trainer_machine="tpu-v2-8",
                    service=", provisioning: spot")
    loaded = load_spec(spot).spec

    def handed_over() -> GcpProvider:  # as `dsctl up` checks a run its dispatcher VM will supervise
        p = GcpProvider()
        p.prepare_hand_off(loaded)
        p.check(loaded, 4, spot.parent)
        return p

    cloud.set_quota("N2_CPUS", 8, region=REGION)
    with pytest.raises(SpecError, match=r"N2_CPUS: 40 needed \(1 n2-standard-8 \(dispatcher\) x 8 vCPUs; 4 Spot "):
        handed_over()
    cloud.set_quota("PREEMPTIBLE_CPUS", 24, region=REGION)
    with pytest.raises(SpecError, match=r"PREEMPTIBLE_CPUS: 32 needed \(4 Spot n2-standard-8 \(workers\) x 8 vCPUs\), "
                                        r"24 available") as info:
        handed_over()
    assert "N2_CPUS:" not in str(info.value)
    cloud.set_quota("PREEMPTIBLE_CPUS", 32, region=REGION)
    p = handed_over()
    # A TPU trainer's quota is Cloud TPU's, read from Cloud Quotas (limits only: the plan says its usage is not read);
    # a limit too small for the TPU VM is refused before anything is made.
    assert any("TPU quota TPUV2sPerProjectPerZoneForTPUAPI in zone" in n and "not read" in n for n in p._findings.notes)
    cloud.set_tpu_quota("TPUV2sPerProjectPerZoneForTPUAPI", 0, zone=ZONE)
    with pytest.raises(SpecError, match=r"need 8 TensorCores of TPU quota TPUV2sPerProjectPerZoneForTPUAPI in zone "
                                        rf"{ZONE}, and project {PROJECT}'s limit there is 0") as info:
        handed_over()
    assert "--service=tpu.googleapis.com" in str(info.value) and info.value.field == "trainer.machine"
    assert cloud.counts() == NOTHING


def test_what_the_quota_check_cannot_tell_is_a_note_not_a_guess(cloud, home, tmp_path):
    from dsctl.provisioners.gcp import GcpProvider

    # A machine family whose quota metric dsctl does not know (A3): its vCPUs are not checked, its H100s are.
    a3 = gcp_spec(tmp_path / "a3", home=home, trainer_machine="a3-highgpu-8g")
    a3.write_text(a3.read_text().replace(f"zone: {ZONE}", f"zone: {REGION}-a"))
    p = GcpProvider()
    p.check(load_spec(a3).spec, 2, a3.parent)
    assert any("vCPUs of a3-highgpu-8g (trainers) was not checked" in n and "a3 family" in n for n in p._findings.notes)
    cloud.set_quota("NVIDIA_H100_GPUS", 4, region=REGION)
    with pytest.raises(SpecError, match=r"NVIDIA_H100_GPUS: 8 needed"):
        GcpProvider().check(load_spec(a3).spec, 2, a3.parent)
    # Quotas the caller may not read (compute.regions.get): a note, and the run goes on.
    cloud.deny(CALLER, "compute.regions.get", f"projects/{PROJECT}")
    q = GcpProvider()
    q.check(load_spec(a3).spec, 2, a3.parent)
    assert any(f"quotas of region {REGION} could not be read" in n for n in q._findings.notes)
    assert cloud.counts() == NOTHING


def test_vms_without_a_service_account_are_refused(cloud, home, tmp_path):
    """`gcp.service_account: none` would make VMs whose watchdog has no token: nothing could end a TPU VM."""
    spec = gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8", gcp={"service_account": "none"})
    message = _refusal(spec)
    assert "\n" not in message and "job.yaml:" in message and "gcp.service_account" in message
    assert "watchdog" in message and "no maxRunDuration" in message and "Nothing was created" in message
    assert "Leave gcp.service_account out" in message
    assert cloud.counts() == NOTHING and not changes(cloud)
