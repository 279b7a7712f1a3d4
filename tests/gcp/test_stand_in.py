"""The stand-in itself (fake_gce.py), driven by the REAL client libraries the way production code calls them.

Each test takes one documented rule of Compute Engine v1, Cloud TPU v2 or Cloud Resource Manager v3 (the doc page
is cited beside the rule in fake_gce.py) and checks that the stand-in accepts the valid request and refuses the
invalid one with the documented HTTP status / error code. No sshd except the last test (the two listeners).
"""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import credentials_of
from fake_gce import FakeCloud, FakeGce, Faults, Timing
from google.api_core import exceptions as gx
from google.api_core.client_options import ClientOptions
from google.cloud import compute_v1 as c
from google.cloud import resourcemanager_v3 as rm
from google.cloud import tpu_v2

P, Z = "stand-in-project", "us-central1-b"
REGION = "us-central1"
DEBIAN = "projects/debian-cloud/global/images/family/debian-12"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
NET = f"projects/{P}/global/networks/default"


OWNER = "owner@example.com"  # the stand-in project's owner, whom these clients call as


class Api:
    """The clients production code builds: endpoint override, REST transport, a token the stand-in issued."""

    def __init__(self, cloud: FakeCloud, endpoint: str):
        self.cloud, self.endpoint = cloud, endpoint
        kw = dict(credentials=credentials_of(cloud, OWNER), client_options=ClientOptions(api_endpoint=endpoint))
        self.instances = c.InstancesClient(**kw)
        self.zone_ops = c.ZoneOperationsClient(**kw)
        self.region_ops = c.RegionOperationsClient(**kw)
        self.global_ops = c.GlobalOperationsClient(**kw)
        self.firewalls = c.FirewallsClient(**kw)
        self.machine_types = c.MachineTypesClient(**kw)
        self.accelerator_types = c.AcceleratorTypesClient(**kw)
        self.images = c.ImagesClient(**kw)
        self.networks = c.NetworksClient(**kw)
        self.subnetworks = c.SubnetworksClient(**kw)
        self.routers = c.RoutersClient(**kw)
        self.regions = c.RegionsClient(**kw)
        self.tpu = tpu_v2.TpuClient(transport="rest", **kw)
        self.projects = rm.ProjectsClient(transport="rest", **kw)

    # -- compute helpers ----------------------------------------------------------------------------------
    def wait(self, op, zone: str = Z):
        while op.status != c.Operation.Status.DONE:
            if op.zone:
                op = self.zone_ops.wait(project=P, zone=zone, operation=op.name)
            elif op.region:
                op = self.region_ops.wait(project=P, region=REGION, operation=op.name)
            else:
                op = self.global_ops.wait(project=P, operation=op.name)
        return op

    def insert(self, inst: c.Instance, zone: str = Z, request_id: str | None = None):
        req = c.InsertInstanceRequest(project=P, zone=zone, instance_resource=inst,
                                      request_id=request_id or str(uuid.uuid4()))
        return self.wait(self.instances.insert_unary(request=req), zone)

    def bulk(self, res: c.BulkInsertInstanceResource, zone: str = Z):
        req = c.BulkInsertInstanceRequest(project=P, zone=zone, bulk_insert_instance_resource_resource=res,
                                          request_id=str(uuid.uuid4()))
        return self.wait(self.instances.bulk_insert_unary(request=req), zone)

    def names(self, zone: str = Z) -> list[str]:
        return sorted(i.name for i in self.instances.list(project=P, zone=zone))

    def get(self, name: str, zone: str = Z):
        return self.instances.get(project=P, zone=zone, instance=name)

    def wait_status(self, name: str, status: str = "RUNNING", timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.get(name)
            if got.status == status:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{name} never {status}")

    # -- TPU helpers ----------------------------------------------------------------------------------------
    parent = f"projects/{P}/locations/{Z}"

    def qr_state(self, qr_id: str, zone: str = Z) -> str:
        return self.tpu.get_queued_resource(name=f"projects/{P}/locations/{zone}/queuedResources/{qr_id}").state.state.name

    def wait_qr(self, qr_id: str, state: str, zone: str = Z, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.qr_state(qr_id, zone) == state:
                return
            time.sleep(0.02)
        raise AssertionError(f"queued resource {qr_id} never {state} (is {self.qr_state(qr_id, zone)})")


@pytest.fixture
def api():
    cloud = FakeCloud(Faults(), Timing(op_s=0.02, provisioning_s=0.03, staging_s=0.03, stopping_s=0.05,
                                       tpu_creating_s=0.05, qr_waiting_s=0.05))
    cloud.define_project(P, owners=(OWNER,))
    with FakeGce(cloud) as server:
        yield Api(cloud, server.endpoint)


def vm(name: str, machine: str = "n2-standard-8", *, zone: str = Z, image: str = DEBIAN, disk_type: str | None = None,
       external: bool = False, **fields) -> c.Instance:
    disk_type = disk_type or f"zones/{zone}/diskTypes/pd-balanced"
    nic = c.NetworkInterface(network=NET)
    if external:
        nic.access_configs = [c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return c.Instance(name=name, machine_type=f"zones/{zone}/machineTypes/{machine}",
                      disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
                          source_image=image, disk_size_gb=50, disk_type=disk_type))],
                      network_interfaces=[nic], **fields)


def props(machine: str = "n2-standard-8", disk_type: str = "pd-balanced", **fields) -> c.InstanceProperties:
    boot = c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
        source_image=DEBIAN, disk_size_gb=50, disk_type=disk_type))
    return c.InstanceProperties(machine_type=machine, network_interfaces=[c.NetworkInterface(network=NET)],
                                disks=[boot], **fields)


def bulk_res(names: list[str] | None = None, *, count: int | None = None, min_count: int | None = None,
             pattern: str | None = None, **prop_fields) -> c.BulkInsertInstanceResource:
    names = names or []
    res = c.BulkInsertInstanceResource(count=count if count is not None else len(names),
                                       instance_properties=props(**prop_fields),
                                       per_instance_properties={n: c.BulkInsertInstanceResourcePerInstanceProperties()
                                                                for n in names})
    if min_count is not None:
        res.min_count = min_count
    if pattern:
        res.name_pattern = pattern
    return res


def errors(op) -> list[tuple[str, str]]:
    return [(e.code, e.message) for e in op.error.errors]


def reason(exc: gx.GoogleAPICallError) -> str:
    return (exc.errors[0] or {}).get("reason", "") if exc.errors else (exc.reason or "")


# =============================================================================================================
# 1. instances.insert
# =============================================================================================================
def test_insert_accepts_partial_and_full_urls_and_returns_a_real_looking_instance(api):
    assert not errors(api.insert(vm("vm-partial")))
    full = vm("vm-full")
    full.machine_type = f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/machineTypes/n2-standard-8"
    full.disks[0].initialize_params.source_image = "https://www.googleapis.com/compute/v1/projects/debian-cloud/global/images/debian-12-bookworm-v20250311"
    assert not errors(api.insert(full))
    got = api.wait_status("vm-partial")
    assert got.machine_type == f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/machineTypes/n2-standard-8"
    assert got.zone.endswith(f"/projects/{P}/zones/{Z}") and got.self_link.endswith(f"/zones/{Z}/instances/vm-partial")
    nic = got.network_interfaces[0]
    assert nic.network == f"https://www.googleapis.com/compute/v1/{NET}"
    assert nic.subnetwork.endswith(f"/projects/{P}/regions/{REGION}/subnetworks/default")
    assert got.disks[0].boot and got.disks[0].source.endswith(f"/zones/{Z}/disks/vm-partial")
    assert got.scheduling.on_host_maintenance == "MIGRATE" and got.scheduling.automatic_restart
    assert got.scheduling.provisioning_model == "STANDARD"


@pytest.mark.parametrize("machine_type,why", [
    ("n2-standard-8", "The URL is malformed"),  # insert takes a (partial) URL, not a bare name
    (f"zones/{Z}/machineTypes/n2-standard-7", "does not exist in zone"),
    ("zones/us-east4-a/machineTypes/a2-highgpu-1g", "Cross-zone"),
    (f"zones/{Z}/machineTypes/a3-highgpu-8g", "does not exist in zone 'us-central1-b'"),  # no H100s in -b
])
def test_insert_refuses_a_machine_type_that_is_not_a_zonal_url_of_an_existing_type(api, machine_type, why):
    inst = vm("vm-bad")
    inst.machine_type = machine_type
    with pytest.raises(gx.BadRequest) as info:
        api.insert(inst)
    assert "Invalid value for field 'resource.machineType'" in info.value.message and why in info.value.message
    assert reason(info.value) == "invalid" and api.names() == []


@pytest.mark.parametrize("image,ok", [
    (DEBIAN, True), (DLVM, True), ("projects/debian-cloud/global/images/debian-12-bookworm-v20250311", True),
    ("projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", True),
    ("projects/debian-cloud/global/images/family/debian-99", False), ("debian-12", False), ("", False),
])
def test_insert_source_image_must_exist(api, image, ok):
    inst = vm("vm-img", image=image)
    if ok:
        assert not errors(api.insert(inst))
        return
    with pytest.raises(gx.BadRequest) as info:
        api.insert(inst)
    assert "resource.disks[0].initializeParams.sourceImage" in info.value.message


def test_insert_disk_type_is_a_zonal_url_and_the_disk_is_no_smaller_than_the_image(api):
    with pytest.raises(gx.BadRequest, match="diskType"):
        api.insert(vm("vm-a", disk_type="pd-balanced"))
    with pytest.raises(gx.BadRequest, match="does not exist"):
        api.insert(vm("vm-b", disk_type=f"zones/{Z}/diskTypes/pd-turbo"))
    small = vm("vm-c", image=DLVM)
    small.disks[0].initialize_params.disk_size_gb = 20
    with pytest.raises(gx.BadRequest, match=r"cannot be smaller than the image size \(50 GB\)"):
        api.insert(small)


@pytest.mark.parametrize("name,labels", [("Bad_Name", {}), ("-x", {}), ("ok", {"Team": "x"}), ("ok", {"k": "UPPER"})])
def test_insert_validates_names_and_labels(api, name, labels):
    with pytest.raises(gx.BadRequest):
        api.insert(vm(name, labels=labels))


def test_insert_same_name_is_409_and_the_same_request_id_is_one_operation(api):
    rid = str(uuid.uuid4())
    op1 = api.insert(vm("vm-1"), request_id=rid)
    op2 = api.insert(vm("vm-1"), request_id=rid)  # a retry: the same operation, nothing new
    assert op1.name == op2.name and op2.client_operation_id == rid and api.names() == ["vm-1"]
    with pytest.raises(gx.Conflict):
        api.insert(vm("vm-1"))
    with pytest.raises(gx.BadRequest, match="requestId"):
        api.insert(vm("vm-2"), request_id="not-a-uuid")


def test_unknown_zone_is_refused(api):
    with pytest.raises(gx.BadRequest, match="Unknown zone"):
        list(api.instances.list(project=P, zone="us-central1-z"))


# =============================================================================================================
# 2. instances.bulkInsert
# =============================================================================================================
def test_bulk_insert_takes_bare_names_and_creates_all(api):
    op = api.bulk(bulk_res(["w-0", "w-1", "w-2"]))
    assert not errors(op) and op.operation_type == "bulkInsert" and op.operation_group_id
    status = op.instances_bulk_insert_operation_metadata.per_location_status[f"zones/{Z}"]
    assert (status.target_vm_count, status.created_vm_count) == (3, 3)
    assert api.names() == ["w-0", "w-1", "w-2"]
    assert api.get("w-1").machine_type.endswith(f"/zones/{Z}/machineTypes/n2-standard-8")


def test_bulk_insert_machine_type_url_ends_in_internal_error_and_creates_nothing(api):
    # "If you use the machine type full or partial URL ... the request will result in an INTERNAL_ERROR."
    op = api.bulk(bulk_res(["w-0", "w-1"], machine=f"zones/{Z}/machineTypes/n2-standard-8"))
    assert errors(op)[0][0] == "INTERNAL_ERROR" and api.names() == []


@pytest.mark.parametrize("fields", [
    dict(disk_type=f"zones/{Z}/diskTypes/pd-balanced"),
    dict(machine="n1-standard-8", guest_accelerators=[c.AcceleratorConfig(
        accelerator_type=f"zones/{Z}/acceleratorTypes/nvidia-tesla-t4", accelerator_count=1)],
        scheduling=c.Scheduling(on_host_maintenance="TERMINATE")),
    dict(machine="n2-standard-7"),
])
def test_bulk_insert_refuses_urls_for_accelerator_and_disk_types_and_unknown_types(api, fields):
    with pytest.raises(gx.BadRequest) as info:
        api.bulk(bulk_res(["w-0"], **fields))
    assert "resource.instanceProperties" in info.value.message and api.names() == []


def test_bulk_insert_name_pattern_and_count_rules(api):
    assert not errors(api.bulk(bulk_res(count=2, pattern="w-####")))
    assert not errors(api.bulk(bulk_res(count=2, pattern="w-####")))  # numbers continue after the largest
    assert api.names() == ["w-0001", "w-0002", "w-0003", "w-0004"]
    with pytest.raises(gx.BadRequest, match="namePattern"):
        api.bulk(bulk_res(count=2))  # neither names nor a pattern
    with pytest.raises(gx.BadRequest, match="count"):
        api.bulk(bulk_res(["a-0", "a-1"], count=3))  # more than the names, no pattern
    with pytest.raises(gx.BadRequest, match="minCount"):
        api.bulk(bulk_res(["b-0", "b-1"], min_count=3))
    with pytest.raises(gx.BadRequest, match="namePattern"):
        api.bulk(bulk_res(count=2, pattern="w-##-##"))
    with pytest.raises(gx.Conflict):
        api.bulk(bulk_res(["w-0001"]))


def test_bulk_insert_is_all_or_nothing_up_to_min_count(api):
    api.cloud.set_quota("N2_CPUS", 24)  # three n2-standard-8
    op = api.bulk(bulk_res([f"w-{i}" for i in range(4)]))  # minCount defaults to count
    codes = [code for code, _ in errors(op)]
    assert codes == ["VM_MIN_COUNT_NOT_REACHED", "QUOTA_EXCEEDED"]
    assert errors(op)[1][1] == "Quota 'N2_CPUS' exceeded.  Limit: 24.0 in region us-central1."
    assert op.http_error_status_code == 403 and api.names() == []
    op = api.bulk(bulk_res([f"w-{i}" for i in range(4)], min_count=2))
    assert not errors(op) and len(api.names()) == 3
    status = op.instances_bulk_insert_operation_metadata.per_location_status[f"zones/{Z}"]
    assert (status.created_vm_count, status.failed_to_create_vm_count) == (3, 1)


def test_fail_nth_instance_knob_insert_fails_its_operation_and_bulk_creates_none(api):
    api.cloud.faults.fail_nth_instance, api.cloud.faults.fail_label = 3, ("role", "w")
    op = api.bulk(bulk_res([f"w-{i}" for i in range(5)], labels={"role": "w"}))
    assert [e[0] for e in errors(op)] == ["VM_MIN_COUNT_NOT_REACHED", "QUOTA_EXCEEDED"]
    assert "Quota 'N2_CPUS' exceeded" in errors(op)[1][1] and api.names() == []
    api.cloud.faults.bulk_cause_first = True
    op = api.bulk(bulk_res([f"x-{i}" for i in range(2)], labels={"role": "w"}))
    assert [e[0] for e in errors(op)] == ["QUOTA_EXCEEDED", "VM_MIN_COUNT_NOT_REACHED"] and api.names() == []
    api.cloud.faults.fail_nth_instance = 1
    op = api.insert(vm("d-0", labels={"role": "w"}))
    assert errors(op)[0][0] == "QUOTA_EXCEEDED" and api.names() == []
    api.cloud.faults.error_code = "ZONE_RESOURCE_POOL_EXHAUSTED"
    op = api.insert(vm("d-1", labels={"role": "w"}))
    assert errors(op)[0][0] == "ZONE_RESOURCE_POOL_EXHAUSTED" and op.http_error_status_code == 503
    api.cloud.faults.fail_sync, api.cloud.faults.error_code = True, "QUOTA_EXCEEDED"
    with pytest.raises(gx.Forbidden) as info:
        api.bulk(bulk_res(["s-0", "s-1"], labels={"role": "w"}))
    assert reason(info.value) == "quotaExceeded" and api.names() == []


# =============================================================================================================
# 3. Quotas
# =============================================================================================================
def test_quota_error_shape_on_insert(api):
    api.cloud.set_quota("N2_CPUS", 8, region=REGION)
    assert not errors(api.insert(vm("vm-1")))
    op = api.insert(vm("vm-2"))
    err = op.error.errors[0]
    assert err.code == "QUOTA_EXCEEDED" and err.message == "Quota 'N2_CPUS' exceeded.  Limit: 8.0 in region us-central1."
    info = err.error_details[0].quota_info
    assert (info.metric_name, info.limit_name, dict(info.dimensions), info.limit) == (
        "compute.googleapis.com/n2_cpus", "N2-CPUS-per-project-region", {"region": REGION}, 8.0)
    assert op.http_error_status_code == 403 and api.names() == ["vm-1"]
    # Other regions and families are not limited.
    assert not errors(api.insert(vm("vm-3", "e2-standard-8")))
    assert not errors(api.insert(vm("vm-4", zone="europe-west4-a"), zone="europe-west4-a"))


def test_gpu_global_and_address_quotas(api):
    api.cloud.set_quota("NVIDIA_A100_GPUS", 1)
    gpu = dict(scheduling=c.Scheduling(on_host_maintenance="TERMINATE"), image=DLVM)
    assert not errors(api.insert(vm("g-1", "a2-highgpu-1g", **gpu)))
    op = api.insert(vm("g-2", "a2-highgpu-1g", **gpu))
    assert errors(op)[0] == ("QUOTA_EXCEEDED", "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 1.0 in region us-central1.")
    api.cloud.set_quota("IN_USE_ADDRESSES", 1)
    assert not errors(api.insert(vm("e-1", external=True)))
    assert not errors(api.insert(vm("i-1")))  # no external address: no IN_USE_ADDRESSES
    assert errors(api.insert(vm("e-2", external=True)))[0][1].startswith("Quota 'IN_USE_ADDRESSES' exceeded.")
    api.cloud.set_quota("CPUS_ALL_REGIONS", 40)
    op = api.insert(vm("n-1", "n2-standard-16"))
    assert errors(op)[0][1] == "Quota 'CPUS_ALL_REGIONS' exceeded.  Limit: 40.0 globally."
    assert not op.error.errors[0].error_details[0].quota_info.dimensions


def test_quota_usage_is_released_when_the_vm_is_gone_and_regions_get_reports_it(api):
    api.cloud.set_quota("N2_CPUS", 8)
    api.insert(vm("vm-1"))
    quotas = {q.metric: (q.limit, q.usage) for q in api.regions.get(project=P, region=REGION).quotas}
    assert quotas["N2_CPUS"] == (8.0, 8.0) and quotas["INSTANCES"][1] == 1.0
    api.wait(api.instances.delete_unary(request=c.DeleteInstanceRequest(project=P, zone=Z, instance="vm-1",
                                                                        request_id=str(uuid.uuid4()))))
    time.sleep(0.1)
    assert api.names() == [] and not errors(api.insert(vm("vm-2")))


def test_spot_vms_use_preemptible_quota_when_the_project_has_it(api):
    spot = c.Scheduling(provisioning_model="SPOT")
    # Not granted (limit 0, as regions.get lists it): a Spot VM's vCPUs count against its family's quota.
    api.cloud.set_quota("N2_CPUS", 8)
    assert not errors(api.insert(vm("s-0", scheduling=spot)))
    quotas = {q.metric: (q.limit, q.usage) for q in api.regions.get(project=P, region=REGION).quotas}
    assert quotas["PREEMPTIBLE_CPUS"] == (0.0, 0.0) and quotas["N2_CPUS"] == (8.0, 8.0)
    assert "'N2_CPUS'" in errors(api.insert(vm("s-1", scheduling=spot)))[0][1]
    # Granted: one PREEMPTIBLE_CPUS for every family's Spot vCPUs, which then leave the standard quotas alone.
    api.cloud.set_quota("PREEMPTIBLE_CPUS", 10)
    assert not errors(api.insert(vm("s-2", scheduling=spot)))
    assert "'PREEMPTIBLE_CPUS'" in errors(api.insert(vm("s-3", "e2-standard-4", scheduling=spot)))[0][1]
    assert "'N2_CPUS'" in errors(api.insert(vm("std-1")))[0][1]
    # GPUs: PREEMPTIBLE_<metric> per GPU type, likewise.
    gpu = dict(scheduling=c.Scheduling(provisioning_model="SPOT", on_host_maintenance="TERMINATE",
                                       automatic_restart=False), image=DLVM)
    api.cloud.set_quota("NVIDIA_A100_GPUS", 0)
    api.cloud.set_quota("PREEMPTIBLE_NVIDIA_A100_GPUS", 1)
    api.cloud.set_quota("PREEMPTIBLE_CPUS", 100)
    assert not errors(api.insert(vm("g-1", "a2-highgpu-1g", **gpu)))
    assert "'PREEMPTIBLE_NVIDIA_A100_GPUS'" in errors(api.insert(vm("g-2", "a2-highgpu-1g", **gpu)))[0][1]
    quotas = {q.metric: (q.limit, q.usage) for q in api.regions.get(project=P, region=REGION).quotas}
    assert quotas["PREEMPTIBLE_NVIDIA_A100_GPUS"] == (1.0, 1.0) and quotas["NVIDIA_A100_GPUS"] == (0.0, 0.0)
    assert quotas["PREEMPTIBLE_CPUS"] == (100.0, 8.0 + 12.0) and quotas["PREEMPTIBLE_NVIDIA_L4_GPUS"][0] == 0.0


def test_regions_get_needs_compute_regions_get(api):
    api.cloud.deny(OWNER, "compute.regions.get", f"projects/{P}")  # a deny policy: whatever the owner's roles
    with pytest.raises(gx.Forbidden, match="compute.regions.get"):
        api.regions.get(project=P, region=REGION)


# =============================================================================================================
# 4. GPUs and Spot scheduling
# =============================================================================================================
def test_gpu_vms_must_terminate_on_host_maintenance(api):
    with pytest.raises(gx.BadRequest, match="do not support live migration"):
        api.insert(vm("a2", "a2-highgpu-1g", image=DLVM))
    with pytest.raises(gx.BadRequest, match="do not support live migration"):
        api.insert(vm("g2", "g2-standard-8", zone="us-central1-a", image=DLVM), zone="us-central1-a")
    term = c.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=True)
    assert not errors(api.insert(vm("a2", "a2-highgpu-1g", image=DLVM, scheduling=term)))
    got = api.get("a2")
    assert [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count) for a in got.guest_accelerators] == [
        ("nvidia-tesla-a100", 1)]
    # Attached GPUs: zonal URLs, N1 only, documented counts, and TERMINATE too.
    t4 = [c.AcceleratorConfig(accelerator_type=f"zones/{Z}/acceleratorTypes/nvidia-tesla-t4", accelerator_count=1)]
    with pytest.raises(gx.BadRequest, match="live migration"):
        api.insert(vm("n1", "n1-standard-8", guest_accelerators=t4))
    assert not errors(api.insert(vm("n1", "n1-standard-8", guest_accelerators=t4, scheduling=term)))
    with pytest.raises(gx.BadRequest, match="cannot be attached"):
        api.insert(vm("n2", "n2-standard-8", guest_accelerators=t4, scheduling=term))
    wrong = [c.AcceleratorConfig(accelerator_type=f"zones/{Z}/acceleratorTypes/nvidia-tesla-a100", accelerator_count=2)]
    with pytest.raises(gx.BadRequest, match="must match"):
        api.insert(vm("a2b", "a2-highgpu-1g", image=DLVM, guest_accelerators=wrong, scheduling=term))
    three = [c.AcceleratorConfig(accelerator_type=f"zones/{Z}/acceleratorTypes/nvidia-tesla-t4", accelerator_count=3)]
    with pytest.raises(gx.BadRequest, match="acceleratorCount"):
        api.insert(vm("n1c", "n1-standard-8", guest_accelerators=three, scheduling=term))


@pytest.mark.parametrize("sched,why", [
    (dict(provisioning_model="SPOT", automatic_restart=True), "automaticRestart"),
    (dict(provisioning_model="SPOT", on_host_maintenance="MIGRATE"), "onHostMaintenance"),
    (dict(provisioning_model="SPOT", instance_termination_action="HIBERNATE"), "instanceTerminationAction"),
    (dict(instance_termination_action="STOP"), "instanceTerminationAction"),
    (dict(provisioning_model="STANDARD", preemptible=True), "preemptible"),
])
def test_spot_constraints(api, sched, why):
    with pytest.raises(gx.BadRequest, match=why):
        api.insert(vm("spot", scheduling=c.Scheduling(**sched)))


@pytest.mark.parametrize("sched, why", [
    (dict(max_run_duration=c.Duration(seconds=3600)), "instanceTerminationAction"),
    (dict(max_run_duration=c.Duration(seconds=10), instance_termination_action="DELETE"), "between 30 seconds"),
    (dict(max_run_duration=c.Duration(seconds=121 * 86400), instance_termination_action="DELETE"), "120 days"),
])
def test_max_run_duration_needs_a_termination_action_and_a_sane_length(api, sched, why):
    with pytest.raises(gx.BadRequest, match=why):
        api.insert(vm("limited", scheduling=c.Scheduling(**sched)))
    assert not errors(api.insert(vm("ok", scheduling=c.Scheduling(max_run_duration=c.Duration(seconds=3600),
                                                                 instance_termination_action="DELETE"))))
    assert api.get("ok").scheduling.max_run_duration.seconds == 3600


def test_spot_defaults(api):
    assert not errors(api.insert(vm("spot", scheduling=c.Scheduling(provisioning_model="SPOT",
                                                                  instance_termination_action="DELETE"))))
    s = api.get("spot").scheduling
    assert (s.provisioning_model, s.on_host_maintenance, s.automatic_restart, s.instance_termination_action) == (
        "SPOT", "TERMINATE", False, "DELETE")
    api.cloud.preempt_instance(P, Z, "spot")  # DELETE: the preempted VM goes away
    time.sleep(0.1)
    assert api.names() == []


def test_stop_and_start_keep_the_internal_address_and_fire_the_hooks(api):
    """instances.stop: RUNNING -> TERMINATED ("allows you to restart the instance at a later time");
    instances.start: TERMINATED -> PROVISIONING -> STAGING -> RUNNING. Both take an empty body and a requestId."""
    stopped, started = [], []
    api.cloud.on_stopped.append(lambda r: stopped.append(r["name"]))
    api.cloud.on_started.append(lambda r: started.append(r["name"]))
    api.insert(vm("a", external=True))
    before = api.wait_status("a")
    rid = str(uuid.uuid4())
    op = api.wait(api.instances.stop_unary(request=c.StopInstanceRequest(project=P, zone=Z, instance="a", request_id=rid)))
    assert not errors(op) and api.get("a").status == "TERMINATED" and stopped == ["a"]
    again = api.instances.stop_unary(request=c.StopInstanceRequest(project=P, zone=Z, instance="a", request_id=rid))
    assert again.name == op.name, "the same request id is the same operation"
    api.wait(api.instances.stop_unary(project=P, zone=Z, instance="a"))  # stopping a stopped VM changes nothing
    assert stopped == ["a"]
    api.wait(api.instances.start_unary(project=P, zone=Z, instance="a"))
    assert api.get("a").status in ("PROVISIONING", "STAGING", "RUNNING")
    after = api.wait_status("a")
    assert started == ["a"]
    assert after.network_interfaces[0].network_i_p == before.network_interfaces[0].network_i_p
    api.wait(api.instances.start_unary(project=P, zone=Z, instance="a"))  # starting a running VM changes nothing
    assert started == ["a"] and api.get("a").status == "RUNNING"


def test_stop_and_start_refuse_missing_and_deleting_vms_and_bad_request_ids(api):
    with pytest.raises(gx.NotFound):
        api.instances.start_unary(project=P, zone=Z, instance="nope")
    with pytest.raises(gx.NotFound):
        api.instances.stop_unary(project=P, zone=Z, instance="nope")
    api.insert(vm("gone"))
    api.cloud.timing.stopping_s = 60.0  # still deleting when start comes, however slow this machine is
    api.instances.delete_unary(project=P, zone=Z, instance="gone")
    with pytest.raises(gx.BadRequest, match="not ready"):
        api.instances.start_unary(project=P, zone=Z, instance="gone")
    api.insert(vm("b"))
    with pytest.raises(gx.BadRequest, match="UUID"):
        api.instances.stop_unary(request=c.StopInstanceRequest(project=P, zone=Z, instance="b", request_id="x"))


def test_a_preempted_spot_vm_stops_and_can_be_started_again(api):
    api.insert(vm("s", scheduling=c.Scheduling(provisioning_model="SPOT", instance_termination_action="STOP")))
    api.wait_status("s")
    api.cloud.preempt_instance(P, Z, "s")
    assert api.get("s").status == "TERMINATED" and api.get("s").last_stop_timestamp
    api.wait(api.instances.start_unary(project=P, zone=Z, instance="s"))
    api.wait_status("s")


# =============================================================================================================
# 5. External addresses
# =============================================================================================================
def test_external_address_only_with_one_to_one_nat(api):
    api.insert(vm("int-only"))
    api.insert(vm("public", external=True))
    internal = api.get("int-only").network_interfaces[0]
    assert internal.network_i_p.startswith("127.0.0.") and not list(internal.access_configs)
    nic = api.get("public").network_interfaces[0]
    (ac,) = nic.access_configs
    assert ac.type_ == "ONE_TO_ONE_NAT" and ac.network_tier == "PREMIUM"
    assert nic.network_i_p.startswith("127.0.0.") and ac.nat_i_p.startswith("127.0.1.")
    assert ac.nat_i_p.rsplit(".", 1)[1] == nic.network_i_p.rsplit(".", 1)[1] and ac.nat_i_p != nic.network_i_p
    bad = vm("two-nat", external=True)
    bad.network_interfaces[0].access_configs = [c.AccessConfig(type_="DIRECT_IPV6")]
    with pytest.raises(gx.BadRequest, match="ONE_TO_ONE_NAT"):
        api.insert(bad)


def test_address_pairs_beyond_one_range():
    assert FakeCloud.addresses_of(0) == ("127.0.0.2", "127.0.1.2")
    assert FakeCloud.addresses_of(252) == ("127.0.0.254", "127.0.1.254")
    assert FakeCloud.addresses_of(253) == ("127.0.2.2", "127.0.3.2")


# =============================================================================================================
# 6. Read-only catalogs
# =============================================================================================================
def test_machine_types(api):
    mt = api.machine_types.get(project=P, zone=Z, machine_type="n2-standard-8")
    assert (mt.guest_cpus, mt.memory_mb, mt.zone, mt.is_shared_cpu) == (8, 32768, Z, False)
    a2 = api.machine_types.get(project=P, zone=Z, machine_type="a2-highgpu-2g")
    assert [(a.guest_accelerator_type, a.guest_accelerator_count) for a in a2.accelerators] == [("nvidia-tesla-a100", 2)]
    with pytest.raises(gx.NotFound):
        api.machine_types.get(project=P, zone=Z, machine_type="a3-highgpu-8g")
    assert api.machine_types.get(project=P, zone="us-central1-a", machine_type="a3-highgpu-8g").guest_cpus == 208
    names = {m.name for m in api.machine_types.list(project=P, zone="europe-west4-a")}
    assert {"n2-standard-2", "n2-standard-128", "n2-highmem-8", "e2-medium", "n1-standard-4", "a2-highgpu-8g",
            "g2-standard-96"} <= names and "a3-highgpu-8g" not in names
    filtered = c.ListMachineTypesRequest(project=P, zone=Z, filter='name = "n2-standard-4"')
    assert [m.name for m in api.machine_types.list(request=filtered)] == ["n2-standard-4"]


def test_accelerator_types(api):
    t4 = api.accelerator_types.get(project=P, zone=Z, accelerator_type="nvidia-tesla-t4")
    assert t4.maximum_cards_per_instance == 4 and t4.description == "NVIDIA T4"
    assert "nvidia-h100-80gb" not in {a.name for a in api.accelerator_types.list(project=P, zone=Z)}
    with pytest.raises(gx.NotFound):
        api.accelerator_types.get(project=P, zone=Z, accelerator_type="nvidia-h100-80gb")


def test_images(api):
    img = api.images.get_from_family(project="debian-cloud", family="debian-12")
    assert img.family == "debian-12" and img.status == "READY" and img.self_link.endswith(f"/images/{img.name}")
    assert api.images.get(project="debian-cloud", image=img.name).name == img.name
    dl = api.images.get_from_family(project="deeplearning-platform-release", family="common-cu124-debian-11-py310")
    assert dl.disk_size_gb == 50
    with pytest.raises(gx.NotFound):
        api.images.get_from_family(project="debian-cloud", family="debian-99")


def test_networks_subnetworks_and_routers(api):
    net = api.networks.get(project=P, network="default")
    assert net.auto_create_subnetworks and any(s.endswith(f"/regions/{REGION}/subnetworks/default") for s in net.subnetworks)
    sub = api.subnetworks.get(project=P, region=REGION, subnetwork="default")
    assert sub.ip_cidr_range == "10.128.0.0/20" and sub.private_ip_google_access is False
    api.cloud.set_private_google_access(P, REGION, "default", True)
    assert api.subnetworks.get(project=P, region=REGION, subnetwork="default").private_ip_google_access
    req = c.SetPrivateIpGoogleAccessSubnetworkRequest(
        project=P, region=REGION, subnetwork="default", request_id=str(uuid.uuid4()),
        subnetworks_set_private_ip_google_access_request_resource=c.SubnetworksSetPrivateIpGoogleAccessRequest(
            private_ip_google_access=False))
    assert not errors(api.wait(api.subnetworks.set_private_ip_google_access_unary(request=req)))
    assert api.subnetworks.get(project=P, region=REGION, subnetwork="default").private_ip_google_access is False
    with pytest.raises(gx.NotFound):
        api.networks.get(project=P, network="nope")
    assert list(api.routers.list(project=P, region=REGION)) == []
    api.cloud.add_router(P, REGION, "nat-router", nats=[{
        "name": "nat", "sourceSubnetworkIpRangesToNat": "LIST_OF_SUBNETWORKS",
        "subnetworks": [{"name": sub.self_link, "sourceIpRangesToNat": ["ALL_IP_RANGES"]}]}])
    (router,) = api.routers.list(project=P, region=REGION)
    assert router.nats[0].source_subnetwork_ip_ranges_to_nat == "LIST_OF_SUBNETWORKS"
    assert router.nats[0].subnetworks[0].name == sub.self_link and router.network.endswith("/networks/default")
    # An instance on a custom-mode network must name its subnetwork.
    api.cloud.add_network(P, "custom")
    inst = vm("on-custom")
    inst.network_interfaces[0].network = f"projects/{P}/global/networks/custom"
    with pytest.raises(gx.BadRequest, match="subnetwork"):
        api.insert(inst)


# =============================================================================================================
# 7. Firewalls
# =============================================================================================================
def fw(name: str = "dsctl-r-svc", **fields) -> c.Firewall:
    base = dict(name=name, network=NET, direction="INGRESS", priority=1000, source_tags=["dsctl-r"],
                target_tags=["dsctl-r"], allowed=[c.Allowed(I_p_protocol="tcp", ports=["1024-65535"])])
    base.update(fields)
    return c.Firewall(**base)


def insert_fw(api, rule: c.Firewall):
    req = c.InsertFirewallRequest(project=P, firewall_resource=rule, request_id=str(uuid.uuid4()))
    return api.wait(api.firewalls.insert_unary(request=req))


def test_default_network_rules_are_listed(api):
    rules = {f.name: f for f in api.firewalls.list(project=P)}
    assert set(rules) == {"default-allow-internal", "default-allow-ssh", "default-allow-rdp", "default-allow-icmp"}
    assert list(rules["default-allow-internal"].source_ranges) == ["10.128.0.0/9"]
    assert rules["default-allow-ssh"].allowed[0].ports == ["22"] and rules["default-allow-ssh"].priority == 65534
    assert api.cloud.counts()["firewalls"] == 0  # only rules made through the API are counted


@pytest.mark.parametrize("fields,why", [
    (dict(denied=[c.Denied(I_p_protocol="tcp")]), "Exactly one of allowed or denied"),
    (dict(allowed=[]), "Exactly one of allowed or denied"),
    (dict(priority=70000), "priority"),
    (dict(allowed=[c.Allowed(I_p_protocol="icmp", ports=["22"])]), "Ports can only be specified"),
    (dict(allowed=[c.Allowed(I_p_protocol="tcp", ports=["70000"])]), "ports"),
    (dict(source_tags=["Bad_Tag"]), "sourceTags"),
    (dict(direction="EGRESS"), "Source tags"),
    (dict(source_ranges=["10.0.0.0/33"]), "CIDR"),
    (dict(network=f"projects/{P}/global/networks/missing"), "network"),
])
def test_firewall_validation(api, fields, why):
    with pytest.raises(gx.BadRequest, match=why):
        insert_fw(api, fw(**fields))


def test_firewall_insert_list_delete(api):
    assert not errors(insert_fw(api, fw()))
    got = api.firewalls.get(project=P, firewall="dsctl-r-svc")
    assert got.network == f"https://www.googleapis.com/compute/v1/{NET}" and got.self_link.endswith("/firewalls/dsctl-r-svc")
    with pytest.raises(gx.Conflict):
        insert_fw(api, fw())
    listed = api.firewalls.list(request=c.ListFirewallsRequest(project=P, filter='name = "dsctl-r-svc"'))
    assert [f.name for f in listed] == ["dsctl-r-svc"] and api.cloud.counts()["firewalls"] == 1
    for name in ("dsctl-r-svc", "default-allow-rdp"):  # the default network's own rules are deletable too
        req = c.DeleteFirewallRequest(project=P, firewall=name, request_id=str(uuid.uuid4()))
        assert not errors(api.wait(api.firewalls.delete_unary(request=req)))
    assert api.cloud.counts()["firewalls"] == 0
    with pytest.raises(gx.NotFound):
        api.firewalls.get(project=P, firewall="dsctl-r-svc")


# =============================================================================================================
# 8. Rate limits are not quota
# =============================================================================================================
@pytest.mark.parametrize("status,exc", [(429, gx.TooManyRequests), (403, gx.Forbidden), (503, gx.ServiceUnavailable)])
def test_rate_limit_bursts(api, status, exc):
    api.cloud.faults.burst_every, api.cloud.faults.burst_length, api.cloud.faults.burst_status = 1, 1, status
    api.cloud.calls.clear()
    with pytest.raises(exc) as info:
        api.firewalls.get(project=P, firewall="default-allow-ssh", retry=None)  # the client retries 503s itself
    assert reason(info.value) == ("backendError" if status == 503 else "rateLimitExceeded")
    with pytest.raises(exc) as info:  # the TPU API's form: google.rpc.Status with an ErrorInfo
        list(api.tpu.list_nodes(parent=api.parent, retry=None))
    if status != 503:
        assert info.value.reason == "RATE_LIMIT_EXCEEDED"


# =============================================================================================================
# 9. Cloud TPU queued resources
# =============================================================================================================
def tpu_node(accelerator: str = "v2-8", runtime: str = "tpu-vm-tf-2.17.0-pjrt", external: bool = False, **fields):
    return tpu_v2.Node(accelerator_type=accelerator, runtime_version=runtime,
                       network_config=tpu_v2.NetworkConfig(network=NET, enable_external_ips=external),
                       labels={"dsctl-run": "r"}, **fields)


def queued(node_id: str = "tpu-1", node=None, zone: str = Z, **fields) -> tpu_v2.QueuedResource:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=f"projects/{P}/locations/{zone}", node_id=node_id,
                                              node=node or tpu_node())
    return tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]), **fields)


def create_qr(api, qr_id: str, qr: tpu_v2.QueuedResource, request_id: str | None = None, zone: str = Z):
    req = tpu_v2.CreateQueuedResourceRequest(parent=f"projects/{P}/locations/{zone}", queued_resource_id=qr_id,
                                             queued_resource=qr, request_id=request_id or str(uuid.uuid4()))
    return api.tpu.create_queued_resource(request=req)


def test_queued_resource_lifecycle(api):
    lro = create_qr(api, "qr-1", queued(spot=tpu_v2.QueuedResource.Spot()))
    created = lro.result(timeout=5)
    assert created.name == f"{api.parent}/queuedResources/qr-1" and "spot" in tpu_v2.QueuedResource.to_dict(created)
    api.wait_qr("qr-1", "ACTIVE")
    node = api.tpu.get_node(name=f"{api.parent}/nodes/tpu-1")
    assert node.state.name == "READY" and node.queued_resource == f"{api.parent}/queuedResources/qr-1"
    assert node.scheduling_config.spot and node.accelerator_type == "v2-8"
    assert [q.name.rsplit("/", 1)[1] for q in api.tpu.list_queued_resources(parent=api.parent)] == ["qr-1"]
    assert api.cloud.counts()["tpus"] == 1


def test_queued_resource_states_progress_through_provisioning(api):
    api.cloud.timing.qr_waiting_s, api.cloud.timing.tpu_creating_s = 0.3, 0.3
    create_qr(api, "qr-1", queued()).result(timeout=5)
    seen = []
    deadline = time.monotonic() + 5
    while "ACTIVE" not in seen and time.monotonic() < deadline:
        st = api.qr_state("qr-1")
        if not seen or seen[-1] != st:
            seen.append(st)
        time.sleep(0.02)
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    api.cloud.qr_waiting_state = "ACCEPTED"  # an older service's name for the same state
    create_qr(api, "qr-2", queued("tpu-2")).result(timeout=5)
    assert api.qr_state("qr-2") == "ACCEPTED"


def test_queued_resource_request_id_and_already_exists(api):
    rid = str(uuid.uuid4())
    op1 = create_qr(api, "qr-1", queued(), request_id=rid)
    op2 = create_qr(api, "qr-1", queued(), request_id=rid)  # a retry: the same operation
    assert op1.operation.name == op2.operation.name
    assert len(list(api.tpu.list_queued_resources(parent=api.parent))) == 1
    with pytest.raises(gx.Conflict):
        create_qr(api, "qr-1", queued())
    with pytest.raises(gx.BadRequest):
        create_qr(api, "qr-2", queued("tpu-2"), request_id="not-a-uuid")
    with pytest.raises(gx.BadRequest, match="parent"):
        create_qr(api, "qr-3", queued("tpu-3", zone="us-central1-c"))


def test_queued_resource_delete_needs_force_while_it_has_a_node(api):
    create_qr(api, "qr-1", queued()).result(timeout=5)
    api.wait_qr("qr-1", "ACTIVE")
    name = f"{api.parent}/queuedResources/qr-1"
    with pytest.raises(gx.BadRequest) as info:  # HTTP 400, status FAILED_PRECONDITION
        api.tpu.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name))
    assert info.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    api.tpu.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True)).result(timeout=5)
    deadline = time.monotonic() + 5
    while api.cloud.counts()["tpus"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(api.tpu.list_queued_resources(parent=api.parent)) == [] and list(api.tpu.list_nodes(parent=api.parent)) == []
    # Still waiting (no node): no force needed.
    api.cloud.faults.tpu_exhausted = True
    create_qr(api, "qr-2", queued("tpu-2")).result(timeout=5)
    api.tpu.delete_queued_resource(name=f"{api.parent}/queuedResources/qr-2").result(timeout=5)


def test_queued_resource_without_capacity_waits_then_fails_at_valid_until(api):
    api.cloud.faults.tpu_exhausted = True
    create_qr(api, "qr-1", queued()).result(timeout=5)
    policy = tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration={"seconds": 0, "nanos": 300_000_000})
    create_qr(api, "qr-2", queued("tpu-2", queueing_policy=policy)).result(timeout=5)
    api.wait_qr("qr-2", "FAILED")
    failed = api.tpu.get_queued_resource(name=f"{api.parent}/queuedResources/qr-2").state
    assert failed.failed_data.error.code == 8
    assert api.qr_state("qr-1") == "WAITING_FOR_RESOURCES" and list(api.tpu.list_nodes(parent=api.parent)) == []


def test_nodes_create_get_list_delete_still_work(api):
    lro = api.tpu.create_node(parent=api.parent, node_id="tpu-n", node=tpu_node())
    node = lro.result(timeout=5)
    assert node.state.name == "READY" and node.network_endpoints[0].ip_address.startswith("127.0.0.")
    assert [n.name.rsplit("/", 1)[1] for n in api.tpu.list_nodes(parent=api.parent)] == ["tpu-n"]
    with pytest.raises(gx.Conflict):
        api.tpu.create_node(parent=api.parent, node_id="tpu-n", node=tpu_node())
    api.tpu.delete_node(name=node.name).result(timeout=5)
    with pytest.raises(gx.NotFound):
        api.tpu.get_node(name=node.name)


# =============================================================================================================
# 10. TPU node validation, catalogs, addresses, spot, quota, capacity
# =============================================================================================================
@pytest.mark.parametrize("accelerator,runtime,zone,ok", [
    ("v2-8", "tpu-ubuntu2204-base", Z, True),
    ("v2-8", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", Z, True),
    ("v2-8", "tpu-vm-tf-2.16.1-pjrt", Z, True),
    ("v2-8", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", Z, False),  # that image is for v5e and v6e
    ("v2-8", "tpu-vm-tf-9.9.9", Z, False),
    ("v5litepod-4", "v2-alpha-tpuv5-lite", Z, False),  # no v5e in us-central1-b
    ("v5litepod-4", "v2-alpha-tpuv5-lite", "us-central1-a", True),
    ("v5litepod-4", "tpu-vm-tf-2.14.1", "us-central1-a", False),  # v5e needs TensorFlow 2.15+ (PJRT)
    ("v5litepod-8", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", "us-central1-a", True),
    ("v6e-4", "v2-alpha-tpuv6e", "us-east5-b", True),
    ("v6e-8", "tpu-ubuntu2204-base", "us-east5-b", False),
    ("v6e-4", "tpu-vm-tf-2.15.0-pjrt", "us-east5-b", False),
    ("v6e-4", "tpu-vm-tf-2.17.0-pjrt", "us-east5-b", True),
    ("v4-8", "tpu-ubuntu2204-base", "us-central2-b", True),
    ("v3-8", "tpu-vm-tf-2.17.0-pjrt", "us-central1-a", True),
])
def test_node_accelerator_type_and_runtime_version(api, accelerator, runtime, zone, ok):
    parent = f"projects/{P}/locations/{zone}"
    node = tpu_node(accelerator, runtime)
    node.network_config = tpu_v2.NetworkConfig(network=NET)
    if ok:
        assert api.tpu.create_node(parent=parent, node_id="t", node=node).result(timeout=5).state.name == "READY"
    else:
        with pytest.raises(gx.BadRequest):
            api.tpu.create_node(parent=parent, node_id="t", node=node)
        with pytest.raises(gx.BadRequest):  # the same node inside a queued resource
            create_qr(api, "qr", queued("t", node, zone=zone), zone=zone)


def test_node_ids_and_missing_runtime(api):
    with pytest.raises(gx.BadRequest):
        api.tpu.create_node(parent=api.parent, node_id="Bad_Id", node=tpu_node())
    with pytest.raises(gx.BadRequest, match="runtimeVersion"):
        api.tpu.create_node(parent=api.parent, node_id="t", node=tpu_v2.Node(accelerator_type="v2-8"))


def test_tpu_catalogs(api):
    types = {a.type_: a for a in api.tpu.list_accelerator_types(parent=api.parent)}
    assert {"v2-8", "v3-8", "v6e-1", "v6e-4", "v6e-8"} <= set(types) and "v5litepod-4" not in types
    assert types["v2-8"].accelerator_configs[0].type_.name == "V2"
    v6 = api.tpu.get_accelerator_type(name=f"{api.parent}/acceleratorTypes/v6e-8")
    assert v6.accelerator_configs[0].topology == "2x4"
    with pytest.raises(gx.NotFound):
        api.tpu.get_accelerator_type(name=f"{api.parent}/acceleratorTypes/v5p-8")
    versions = {v.version for v in api.tpu.list_runtime_versions(parent=api.parent)}
    assert {"tpu-ubuntu2204-base", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6",
            "tpu-vm-tf-2.17.0-pjrt", "tpu-vm-tf-2.16.1-pjrt", "v2-alpha-tpuv6e"} <= versions
    assert "v2-alpha-tpuv5-lite" not in versions  # no v5e in this zone
    got = api.tpu.get_runtime_version(name=f"{api.parent}/runtimeVersions/tpu-vm-tf-2.17.0-pjrt")
    assert got.version == "tpu-vm-tf-2.17.0-pjrt"
    with pytest.raises(gx.NotFound):
        api.tpu.get_runtime_version(name=f"{api.parent}/runtimeVersions/tpu-vm-tf-9.9.9")
    with pytest.raises(gx.Forbidden):
        list(api.tpu.list_nodes(parent=f"projects/{P}/locations/mars-north1-a"))


def test_tpu_external_ips_and_spot(api):
    ext = api.tpu.create_node(parent=api.parent, node_id="ext", node=tpu_node(external=True)).result(timeout=5)
    ep = ext.network_endpoints[0]
    assert ep.access_config.external_ip.startswith("127.0.1.") and ep.ip_address.startswith("127.0.0.")
    assert ep.access_config.external_ip.rsplit(".", 1)[1] == ep.ip_address.rsplit(".", 1)[1]
    internal = api.tpu.create_node(parent=api.parent, node_id="int", node=tpu_node()).result(timeout=5)
    assert not internal.network_endpoints[0].access_config.external_ip
    spot = api.tpu.create_node(parent=api.parent, node_id="spot", node=tpu_node(
        scheduling_config=tpu_v2.SchedulingConfig(spot=True))).result(timeout=5)
    assert spot.scheduling_config.spot


def test_tpu_quota_and_capacity(api):
    api.cloud.set_tpu_quota("TPUV2sPerProjectPerZoneForTPUAPI", 8)
    api.tpu.create_node(parent=api.parent, node_id="t-1", node=tpu_node()).result(timeout=5)
    lro = api.tpu.create_node(parent=api.parent, node_id="t-2", node=tpu_node())
    with pytest.raises(gx.GoogleAPICallError):
        lro.result(timeout=5)
    assert lro.operation.error.code == 8 and "TPUV2sPerProjectPerZoneForTPUAPI" in lro.operation.error.message
    with pytest.raises(gx.TooManyRequests) as info:  # RESOURCE_EXHAUSTED, naming the quota
        create_qr(api, "qr-1", queued("t-3"))
    assert "Quota 'TPUV2sPerProjectPerZoneForTPUAPI' exhausted. Limit 8 in zone us-central1-b" in info.value.message
    # Spot capacity has its own quota.
    create_qr(api, "qr-2", queued("t-4", spot=tpu_v2.QueuedResource.Spot())).result(timeout=5)
    api.cloud.faults.tpu_exhausted = True
    lro = api.tpu.create_node(parent=api.parent, node_id="t-5", node=tpu_node(
        "v2-8", "tpu-ubuntu2204-base", scheduling_config=tpu_v2.SchedulingConfig(preemptible=True)))
    with pytest.raises(gx.GoogleAPICallError):
        lro.result(timeout=5)
    assert lro.operation.error.code == 8 and "no more capacity" in lro.operation.error.message


# =============================================================================================================
# 11. Cloud Resource Manager
# =============================================================================================================
def test_resource_manager_projects_get(api):
    proj = api.projects.get_project(name=f"projects/{P}")
    assert proj.project_id == P and proj.state.name == "ACTIVE" and proj.name.startswith("projects/")
    number = proj.name.split("/")[1]
    assert number.isdigit() and api.projects.get_project(name=proj.name).project_id == P
    with pytest.raises(gx.Forbidden):  # a project the caller holds no role on: 403 PERMISSION_DENIED
        api.projects.get_project(name="projects/someone-elses")


def test_resource_manager_test_iam_permissions_answers_from_the_project_and_above_only(api):
    """What the caller holds on the project: its roles there (and the organization's), never a role granted on a
    service account or a bucket below it; grants take effect after the propagation delay."""
    asked = ["compute.instances.create", "tpu.nodes.create", "iam.serviceAccounts.actAs"]
    got = api.projects.test_iam_permissions(request={"resource": f"projects/{P}", "permissions": asked})
    assert list(got.permissions) == asked  # the owner
    dev = "dev@example.com"
    as_dev = rm.ProjectsClient(transport="rest", credentials=credentials_of(api.cloud, dev),
                               client_options=ClientOptions(api_endpoint=api.endpoint))

    def tested() -> list[str]:
        return list(as_dev.test_iam_permissions(request={"resource": f"projects/{P}", "permissions": asked}).permissions)

    assert tested() == []
    api.cloud.grant(dev, "roles/iam.serviceAccountUser", f"projects/{P}/serviceAccounts/runner@{P}.iam.gserviceaccount.com")
    assert tested() == []  # granted on an account: not seen at the project
    api.cloud.grant(dev, "roles/compute.instanceAdmin.v1", "organizations/123456789012")
    assert tested() == ["compute.instances.create"]  # inherited from the organization
    api.cloud.grant_delay_s = 60.0
    api.cloud.grant(dev, "roles/tpu.admin", f"projects/{P}", delayed=True)
    assert tested() == ["compute.instances.create"]  # not yet in effect
    with pytest.raises(gx.BadRequest):
        api.projects.test_iam_permissions(request={"resource": f"projects/{P}", "permissions": ["compute.*"]})


def test_an_api_that_is_off_answers_service_disabled_in_googles_error_shape(api):
    api.cloud.disable_service(P, "compute.googleapis.com")
    with pytest.raises(gx.Forbidden) as info:
        api.regions.get(project=P, region=REGION)
    assert info.value.reason == "SERVICE_DISABLED" and info.value.metadata["service"] == "compute.googleapis.com"
    assert "Compute Engine API has not been used in project" in info.value.message
    api.cloud.enable_service(P, "compute.googleapis.com")
    assert api.regions.get(project=P, region=REGION).name == REGION


# =============================================================================================================
# The SSH side: two listeners (internal, external) on one port, one authorized_keys, SetEnv
# =============================================================================================================
def test_sshd_listens_on_internal_and_external_ranges_with_extra_env(tmp_path):
    import subprocess

    from sshd import Sshd, loopback_range, sshd_available

    if not sshd_available():
        pytest.skip("OpenSSH server (/usr/sbin/sshd) is not installed")
    import paramiko

    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    server = Sshd(tmp_path / "sshd", loopback_range("127.0.0.2", 2), external_addresses=loopback_range("127.0.1.2", 2),
                  env={"DSCTL_TEST_PROXY": "http://127.0.0.1:9/x y"}).start()
    try:
        server.authorized_keys.write_text((tmp_path / "id.pub").read_text())

        def run(host: str, cmd: str) -> str:
            client = paramiko.SSHClient()
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            client.connect(host, port=server.port, username=server.user, key_filename=str(key), look_for_keys=False,
                           allow_agent=False, timeout=10)
            try:
                _, out, _ = client.exec_command(cmd)
                return out.read().decode().strip()
            finally:
                client.close()

        assert run("127.0.0.3", 'echo "$DSCTL_TEST_PROXY"') == "http://127.0.0.1:9/x y"
        assert run("127.0.1.3", 'echo "$DSCTL_TEST_PROXY|$HOME"') == f"http://127.0.0.1:9/x y|{server.home}"
        server.set_env({"DSCTL_TEST_PROXY": "changed"})
        assert run("127.0.1.2", 'echo "$DSCTL_TEST_PROXY"') == "changed"
        assert set(server.procs) == {"internal", "external"}
    finally:
        server.stop()
