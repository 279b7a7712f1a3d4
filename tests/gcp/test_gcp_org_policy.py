"""An organization policy that forbids what a run asks for: the stand-in refuses as Compute Engine does, and dsctl says
which constraint, what it forbids and what to change (exit 2), leaving nothing behind.

Google's refusal is HTTP 412, reason conditionNotMet, "Constraint constraints/NAME violated for project NUMBER. ..."
(the message as public reports of real refusals quote it); fake_gce.py enforces the effective policies a test sets
with `set_org_policy`.
"""

from __future__ import annotations

import uuid

import pytest
from conftest import CALLER, PROJECT, credentials_of, gcp_spec
from fake_gce import FakeCloud, FakeGce
from google.api_core import exceptions as gx

from dsctl.errors import EXIT_BAD_INPUT
from dsctl.provisioners.gcp import errors
from dsctl.specs import SpecError
from helpers import dsctl

NOTHING = {"instances": 0, "firewalls": 0, "tpus": 0}
ZONE = "us-central1-b"
URL = f"POST http://127.0.0.1:4242/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"


# -- what dsctl makes of a refusal -------------------------------------------------------------------------------------
def _api_error(message: str) -> gx.GoogleAPICallError:
    """The exception google-api-core raises for Compute Engine's 412 answer (its REST transport puts the request line
    before the API's message)."""
    return gx.from_http_status(412, f"{URL}: {message}", errors=[{"message": message, "domain": "global",
                                                                 "reason": "conditionNotMet"}])


# Messages as real refusals gave them (public issue threads), and what dsctl must say about each.
@pytest.mark.parametrize("message, constraint, says", [
    ("Constraint constraints/compute.vmExternalIpAccess violated for project 346696193484. Add instance "
     f"projects/{PROJECT}/zones/{ZONE}/instances/x-worker-0 to the constraint to use external IP with it.",
     "compute.vmExternalIpAccess", ("on project 346696193484", "VMs with external IP addresses", "gcp.public_ips: false")),
    ("Constraint constraints/compute.requireShieldedVm violated for project projects/myproject. The boot disk's "
     "'initialize_params.source_image' field specifies a non-Shielded image: projects/acme/global/images/custom. See "
     "https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints for more information.",
     "compute.requireShieldedVm", ("on project myproject", "Secure Boot", "gcp.image")),
    ("Constraint constraints/compute.requireOsLogin violated for project 123. Instance x may not set metadata "
     "enable-oslogin to false.", "compute.requireOsLogin", ("enable-oslogin: FALSE", "OS Login on")),
    ("Constraint constraints/compute.trustedImageProjects violated for project 123. Use of images from project "
     "acme is prohibited.", "compute.trustedImageProjects", ("projects the policy does not trust", "gcp.gpu_image")),
    ("Constraint constraints/gcp.resourceLocations violated for project 123. Permitted locations are in:eu-locations.",
     "gcp.resourceLocations", ("gcp.zone", "gcp.bucket")),
    ("Constraint constraints/iam.automaticIamGrantsForDefaultServiceAccounts violated for project 123.",
     "iam.automaticIamGrantsForDefaultServiceAccounts", ("gcp.service_account",)),
    # One dsctl has no advice for: named, with how to read it.
    ("Constraint constraints/compute.restrictVpcPeering violated for project 123.", "compute.restrictVpcPeering",
     ("gcloud org-policies describe compute.restrictVpcPeering --effective",)),
])
def test_a_constraint_refusal_names_the_constraint_what_it_forbids_and_the_fix(message, constraint, says):
    refused = errors.from_api_error(_api_error(message), doing="creating 2 worker VMs", resource="n2 worker VM",
                                    zone=ZONE, count=2)
    text = str(refused)
    assert isinstance(refused, errors.PolicyRefused) and refused.constraint == constraint
    # A problem of the spec for this project, not a passing failure: exit 2, through the orchestrator as SpecError.
    assert isinstance(refused, SpecError) and isinstance(refused, errors.GcpError)
    assert refused.exit_code == EXIT_BAD_INPUT
    assert "\n" not in text and text.startswith("Google Cloud refused creating 2 worker VMs: ")
    assert f"organization policy constraint constraints/{constraint} is enforced" in text
    for part in says:
        assert part in text, (part, text)
    # Google's own words come too, without the request line the client library put before them.
    assert message.rstrip(".") in text and "POST http" not in text and "PreconditionFailed" not in text
    # The same failure reported by an operation (a queued TPU, a managed group) reads the same.
    op = errors.from_operation_error("CONDITION_NOT_MET", message, resource="n2 worker VM", zone=ZONE, count=2)
    assert isinstance(op, errors.PolicyRefused) and op.constraint == constraint and "to create 2 n2 worker VMs" in str(op)


def test_a_412_that_names_no_constraint_is_not_taken_for_a_policy():
    other = errors.from_api_error(_api_error("Condition not met: the fingerprint is stale."), doing="updating a VM")
    assert not isinstance(other, errors.PolicyRefused) and other.exit_code == 1
    assert errors.policy_refusal("Constraint checking failed", doing="x") is None


def test_the_known_constraints_each_say_what_they_forbid_and_a_fix():
    for name, c in errors.CONSTRAINTS.items():
        assert c.forbids and c.fix, name
    assert set(errors.CONSTRAINTS) >= {"compute.requireOsLogin", "compute.vmExternalIpAccess",
                                       "compute.trustedImageProjects", "compute.requireShieldedVm",
                                       "iam.automaticIamGrantsForDefaultServiceAccounts", "gcp.resourceLocations"}


# -- the stand-in enforces them as Compute Engine does -----------------------------------------------------------------
@pytest.fixture
def compute():
    from google.api_core.client_options import ClientOptions
    from google.cloud import compute_v1

    cloud = FakeCloud()
    cloud.define_project(PROJECT, owners=(CALLER,))
    with FakeGce(cloud) as server:
        kw = dict(credentials=credentials_of(cloud), client_options=ClientOptions(api_endpoint=server.endpoint))
        yield server.cloud, Instances(compute_v1.InstancesClient(**kw), compute_v1.ZoneOperationsClient(**kw))


class Instances:
    """instances.insert and bulkInsert as production code calls them: the call, then a wait on its operation."""

    def __init__(self, client, ops):
        self.client, self.ops = client, ops

    def _done(self, op) -> None:
        op = self.ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
        assert not op.error.errors, op.error

    def insert(self, vm) -> None:
        from google.cloud import compute_v1 as c

        self._done(self.client.insert_unary(request=c.InsertInstanceRequest(
            project=PROJECT, zone=ZONE, instance_resource=vm, request_id=str(uuid.uuid4()))))

    def bulk_insert(self, bulk) -> None:
        from google.cloud import compute_v1 as c

        self._done(self.client.bulk_insert_unary(request=c.BulkInsertInstanceRequest(
            project=PROJECT, zone=ZONE, bulk_insert_instance_resource_resource=bulk, request_id=str(uuid.uuid4()))))

    def names(self) -> list[str]:
        return sorted(i.name for i in self.client.list(project=PROJECT, zone=ZONE))


def _vm(name: str, *, external: bool = True, oslogin: str | None = None,
        image: str = "projects/debian-cloud/global/images/family/debian-12"):
    from google.cloud import compute_v1 as c

    nic = c.NetworkInterface(network="global/networks/default",
                             access_configs=[c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")] if external else [])
    metadata = c.Metadata(items=[c.Items(key="enable-oslogin", value=oslogin)] if oslogin is not None else [])
    disk = c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
        source_image=image))
    return c.Instance(name=name, machine_type=f"zones/{ZONE}/machineTypes/e2-small", network_interfaces=[nic],
                      metadata=metadata, disks=[disk])


def _refusal(call) -> gx.GoogleAPICallError:
    with pytest.raises(gx.PreconditionFailed) as info:
        call()
    exc = info.value
    assert exc.code == 412 and exc.errors[0]["reason"] == "conditionNotMet"
    return exc


def test_the_stand_in_refuses_external_addresses_where_the_policy_denies_them(compute):
    cloud, api = compute
    number = cloud.project_number(PROJECT)
    api.insert(_vm("before"))  # no policy: allowed
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"denyAll": True}])
    exc = _refusal(lambda: api.insert(_vm("open")))
    assert (f"Constraint constraints/compute.vmExternalIpAccess violated for project {number}. Add instance "
            f"projects/{PROJECT}/zones/{ZONE}/instances/open to the constraint to use external IP with it.") in exc.message
    api.insert(_vm("internal", external=False))  # no access config: allowed
    # A bulk insert is refused whole: none of its VMs is made.
    from google.cloud import compute_v1 as c

    bulk = c.BulkInsertInstanceResource(count=2, name_pattern="bulk-#", instance_properties=c.InstanceProperties(
        machine_type="e2-small", network_interfaces=_vm("x").network_interfaces, disks=_vm("x").disks))
    _refusal(lambda: api.bulk_insert(bulk))
    assert api.names() == ["before", "internal"]
    # A list policy that names the instance lets it have one; allowAll lets every one.
    cloud.set_org_policy("compute.vmExternalIpAccess",
                         [{"values": {"allowedValues": [f"projects/{PROJECT}/zones/{ZONE}/instances/listed"]}}])
    api.insert(_vm("listed"))
    _refusal(lambda: api.insert(_vm("unlisted")))
    cloud.set_org_policy("compute.vmExternalIpAccess", [{"allowAll": True}])
    api.insert(_vm("any"))


def test_the_stand_in_refuses_a_vm_that_turns_os_login_off_where_it_is_required(compute):
    cloud, api = compute
    api.insert(_vm("off-before", oslogin="FALSE"))  # not enforced: allowed
    cloud.set_org_policy("compute.requireOsLogin", [{"enforce": True}])
    for value in ("FALSE", "false", "False"):
        vm = _vm(f"off-{value.lower()}", oslogin=value)
        exc = _refusal(lambda: api.insert(vm))  # noqa: B023 (called at once)
        assert f"Constraint constraints/compute.requireOsLogin violated for project {cloud.project_number(PROJECT)}." \
            in exc.message
    api.insert(_vm("on", oslogin="TRUE"))
    api.insert(_vm("unset"))
    cloud.set_org_policy("compute.requireOsLogin", [{"enforce": False}])
    api.insert(_vm("off-after", oslogin="FALSE"))


# -- dsctl up on a project that forbids external addresses --------------------------------------------------------------
def test_up_where_external_addresses_are_forbidden_exits_2_naming_the_constraint_and_leaves_nothing(cloud, home,
                                                                                                  tmp_path):
    """The caller may not read organization policies (orgpolicy.policy.get, which many users lack), so the plan cannot
    see this one (orgpolicy.py): Compute Engine refuses the VMs when they are created, and that refusal is explained."""
    message = _up_refused_by_a_policy_it_could_not_read(cloud, home, tmp_path, "compute.vmExternalIpAccess",
                                                         [{"denyAll": True}])
    assert "constraints/compute.vmExternalIpAccess" in message and "gcp.public_ips: false" in message
    assert "POST http" not in message and "PreconditionFailed" not in message
    # The stand-in refused every VM that asked for an external address; the firewall rules made beside them went.
    assert [b for k, b in cloud.created if k == "firewall"]


def _up_refused_by_a_policy_it_could_not_read(cloud, home, tmp_path, constraint: str, rules: list[dict]) -> str:
    """`dsctl up --yes` where `constraint` has `rules` and the caller may not read policies: exit 2, no traceback,
    no VM made, everything made deleted; the one-paragraph message."""
    cloud.set_org_policy(constraint, rules)
    cloud.deny(CALLER, "orgpolicy.policy.get", f"projects/{PROJECT}")
    spec = gcp_spec(tmp_path / "job", home=home, workers=2, trainer_machine="n2-standard-8")
    proc = dsctl("up", spec, "--yes")
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Everything the run had created was deleted." in message
    assert not [b for k, b in cloud.created if k == "instance"] and cloud.counts() == NOTHING
    return message


def test_the_stand_in_refuses_boot_images_from_projects_the_policy_does_not_trust(compute):
    """compute.trustedImageProjects, enforced where Compute Engine enforces it: on the instance's create (insert and
    bulkInsert), for the project of each disk's source image."""
    from google.cloud import compute_v1 as c

    cloud, api = compute
    number = cloud.project_number(PROJECT)
    api.insert(_vm("before"))  # no policy: any image project
    cloud.set_org_policy("compute.trustedImageProjects", [{"values": {"allowedValues": ["projects/ubuntu-os-cloud"]}}])
    exc = _refusal(lambda: api.insert(_vm("debian")))
    assert exc.message.endswith(f"Constraint constraints/compute.trustedImageProjects violated for project {number}. "
                                "Use of images from project debian-cloud is prohibited.")
    # What dsctl makes of it: the constraint named, and which fields to change.
    refused = errors.from_api_error(exc, doing="creating VM debian")
    assert isinstance(refused, errors.PolicyRefused) and refused.constraint == "compute.trustedImageProjects"
    ubuntu = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
    api.insert(_vm("ubuntu", image=ubuntu))
    # A bulk insert is refused whole.
    bulk = c.BulkInsertInstanceResource(count=2, name_pattern="bulk-#", instance_properties=c.InstanceProperties(
        machine_type="e2-small", network_interfaces=_vm("x").network_interfaces, disks=_vm("x").disks))
    _refusal(lambda: api.bulk_insert(bulk))
    assert api.names() == ["before", "ubuntu"]
    # "is:" as Google writes values; a denied value or denyAll refuses; allowAll trusts every project.
    cloud.set_org_policy("compute.trustedImageProjects", [{"values": {"allowedValues": ["is:projects/debian-cloud"]}}])
    api.bulk_insert(bulk)
    cloud.set_org_policy("compute.trustedImageProjects", [{"values": {"deniedValues": ["projects/debian-cloud"]}}])
    _refusal(lambda: api.insert(_vm("denied")))
    api.insert(_vm("ubuntu-2", image=ubuntu))
    cloud.set_org_policy("compute.trustedImageProjects", [{"denyAll": True}])
    _refusal(lambda: api.insert(_vm("none-trusted")))
    cloud.set_org_policy("compute.trustedImageProjects", [{"allowAll": True}])
    api.insert(_vm("all-trusted"))


def test_up_with_untrusted_images_it_could_not_see_exits_2_naming_the_constraint_and_leaves_nothing(cloud, home,
                                                                                                   tmp_path):
    """Policies unreadable to the caller: the stand-in refuses the VMs' images when they are created, and that refusal
    is explained (exit 2) after everything made was deleted."""
    message = _up_refused_by_a_policy_it_could_not_read(
        cloud, home, tmp_path, "compute.trustedImageProjects",
        [{"values": {"allowedValues": ["projects/ubuntu-os-cloud"]}}])
    assert "constraints/compute.trustedImageProjects" in message and "gcp.image" in message
    assert "Use of images from project debian-cloud is prohibited" in message
