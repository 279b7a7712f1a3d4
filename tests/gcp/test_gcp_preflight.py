"""Checks against the live project before anything is created: each refusal is exit 2, one paragraph, zero resources.

Against the stand-in (real client libraries, loopback): the caller's permissions, the machine
types and images the spec names, SSH into the network, the way out to Cloud Storage for VMs
with internal addresses only, and what the network's own firewall rules would have opened.
"""

from __future__ import annotations

import pytest
from conftest import PROJECT, ZONE, gcp_spec

from dsctl.orchestrator.run import JobRunner
from dsctl.specs import SpecError, load_spec
from helpers import dsctl

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
REGION = ZONE.rsplit("-", 1)[0]


def _check(spec_path):
    from dsctl.provisioners.gcp import GcpProvisioner

    GcpProvisioner().check(load_spec(spec_path).spec, 1, spec_path.parent)


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


def test_missing_permissions_are_named_before_anything_is_created(cloud, home, tmp_path):
    from dsctl.provisioners.gcp.preflight import required_permissions

    spec = gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8")
    wanted = required_permissions(load_spec(spec).spec, public_ips=True)
    assert "tpu.queuedResources.create" in wanted and "compute.subnetworks.useExternalIp" in wanted
    cloud.granted_permissions = set(wanted) - {"compute.firewalls.create", "tpu.queuedResources.create"}
    message = _refusal(spec)
    assert "lack 2 permission(s)" in message and "compute.firewalls.create" in message
    assert "tpu.queuedResources.create" in message and "TPU Admin" in message and "Compute Security Admin" in message
    assert cloud.counts() == NOTHING
    cloud.granted_permissions = set(wanted)
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
    from dsctl.provisioners.gcp import GcpProvisioner

    spec = gcp_spec(tmp_path / "job", home=home)
    p = GcpProvisioner()
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
    q = GcpProvisioner()
    q.check(load_spec(spec).spec, 1, spec.parent)
    assert any(n.startswith("WARNING: the network's rule wide-open (priority 100") for n in q._findings.notes)
    done(clients.firewalls.delete_unary(project=PROJECT, firewall="wide-open"))
    # Without any rule admitting tcp:22, dsctl could not reach the VMs: refused before anything is created.
    done(clients.firewalls.delete_unary(project=PROJECT, firewall="default-allow-ssh"))
    message = _refusal(spec)
    assert "no firewall rule of network default admits SSH (tcp:22)" in message and "gcp.network" in message
    assert cloud.counts() == NOTHING


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
    assert not [c for c in cloud.calls if c[0] in ("POST", "DELETE", "PATCH") and not c[1].endswith(":testIamPermissions")]


@pytest.mark.parametrize("autoscale, tpu", [(False, False), (True, True)])
def test_the_supervisor_checks_its_own_permissions_before_it_touches_anything(cloud, home, tmp_path, autoscale, tpu):
    """On the dispatcher VM, the run's supervisor acts as the VMs' service account: what it lacks is named,
    with the roles that grant it, before it starts, stops or deletes anything."""
    from dsctl.provisioners import Deployment
    from dsctl.provisioners.gcp import GcpDeployment, GcpError, GcpProvisioner
    from dsctl.provisioners.gcp.preflight import supervisor_permissions
    from dsctl.provisioners.gcp.settings import resolve

    extra = "\nautoscale: {policy: cachew, max_workers: 4}\n" if autoscale else ""
    path = gcp_spec(tmp_path / "job", home=home, trainer_machine="tpu-v2-8" if tpu else "n2-standard-8",
                    mode="parallel_epochs", epochs=None)
    path.write_text(path.read_text() + extra)
    spec = load_spec(path).spec
    wanted = supervisor_permissions(spec, public_ips=True)
    assert ("compute.instances.create" in wanted) == autoscale and ("tpu.nodes.delete" in wanted) == tpu
    assert "compute.instances.start" in wanted and "storage.objects.create" in wanted
    dep = Deployment(run_id="perm-run", provider="gcp", run_dir=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    dep.state = GcpDeployment(settings=resolve(spec))
    cloud.granted_permissions = set(wanted)
    GcpProvisioner().check_supervisor(dep, spec)  # everything granted: nothing to say
    cloud.granted_permissions = set(wanted) - {"compute.instances.start", "storage.objects.create"}
    with pytest.raises(GcpError) as info:
        GcpProvisioner().check_supervisor(dep, spec)
    message = str(info.value)
    assert "lacks 2 permission(s)" in message and "compute.instances.start" in message
    assert "roles/compute.instanceAdmin.v1" in message and "gcp.supervisor: here" in message
    assert cloud.counts() == NOTHING
