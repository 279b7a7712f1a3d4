"""A strict loopback stand-in for Compute Engine (v1), Cloud TPU (v2) and Cloud Resource Manager (v3).

It speaks the REST wire format the real client libraries use (google-cloud-compute,
google-cloud-tpu and google-cloud-resource-manager with transport="rest"), and every
rule it enforces is written from Google's API documentation; each rule carries the
page it comes from. Where the real service refuses a request, the stand-in refuses it
with the same HTTP status and error shape; what it creates looks like what the real
API returns (full resource URLs, kinds, defaults).

  Compute (zonal)    instances insert/bulkInsert/list/get/delete, machineTypes get/list,
                     acceleratorTypes get/list, diskTypes get/list, zoneOperations get/wait
  Compute (regional) subnetworks get/list/setPrivateIpGoogleAccess, routers get/list,
                     regions get (quotas with usage), regionOperations get/wait
  Compute (global)   firewalls insert/list/get/delete, networks get/list, images get/getFromFamily/list,
                     globalOperations get/wait
  Cloud TPU v2       nodes create/get/list/delete, queuedResources create/get/list/delete,
                     acceleratorTypes get/list, runtimeVersions get/list, operations get
  Resource Manager   projects.get, projects.testIamPermissions, projects.getIamPolicy/setIamPolicy (etags)
  IAM v1             serviceAccounts get/create, serviceAccounts getIamPolicy/setIamPolicy
  Org Policy v2      projects.policies.getEffectivePolicy (set by tests; a 403 mode)
  OS Login v1        users.importSshPublicKey, users.getLoginProfile, users.sshPublicKeys.delete

Addresses: the k-th live resource gets internal address 127.0.(2j).N and, when it asks
for an external one, 127.0.(2j+1).N, with j = k // 253 and N = 2 + k % 253 (so the first
253 are 127.0.0.N / 127.0.1.N: an sshd listening on both ranges stands in for the VMs).
The subnetworks still report their documented auto-mode ranges (10.128.0.0/20, ...).

Faults (see `Faults`): quota or capacity errors on the Nth instance carrying a label, bursts
of 503/429/403 rate limits, instances stuck in PROVISIONING, TPU capacity exhaustion,
latency per call. Quotas (`FakeCloud.set_quota`, `set_tpu_quota`) are unlimited by default, but for the
preemptible ones (PREEMPTIBLE_CPUS, PREEMPTIBLE_NVIDIA_*_GPUS), which a project has at 0 until granted.
Hooks let a test play the guest agent (ssh-keys metadata -> authorized_keys) and "lose" a
VM's processes when it is deleted.

Run standalone (for the benchmark):  python fake_gce.py --port 0 --latency-ms 200
"""

from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import ipaddress
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from fake_identity import GOOGLE_PROJECTS, ApiRefusal, IdentityApis, location_admitted, unauthenticated

COMPUTE = "https://www.googleapis.com/compute/v1"
COMPUTE_URL_PREFIXES = (COMPUTE + "/", "https://compute.googleapis.com/compute/v1/")
# Documented name rule for Compute Engine resources (RFC 1035), e.g. instances.insert "name":
# https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
NAME_REGEX_TEXT = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"


def _now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-07:00", time.localtime())


def _now_zulu() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


def _fingerprint(obj) -> str:
    import base64

    return base64.b64encode(hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).digest()[:8]).decode()


# ================================================================================================
# Catalogs (read-only; what the real APIs list), each from the page named beside it.
# ================================================================================================

# Compute Engine zones -> region. https://cloud.google.com/compute/docs/regions-zones
_ZONE_LETTERS = {
    "us-central1": "abcf", "us-east1": "bcd", "us-east4": "abc", "us-east5": "abc", "us-west1": "abc",
    "us-west4": "abc", "us-south1": "abc", "europe-west1": "bcd", "europe-west4": "abc", "asia-east1": "abc",
    "asia-northeast1": "abc", "asia-southeast1": "abc",
}
ZONES: dict[str, str] = {f"{r}-{letter}": r for r, letters in _ZONE_LETTERS.items() for letter in letters}
REGIONS = sorted(set(ZONES.values()))
# Auto mode VPC: one subnet named like the network in each region, with these documented ranges.
# https://cloud.google.com/vpc/docs/subnets#ip-ranges (auto mode IPv4 ranges)
AUTO_MODE_RANGES = {
    "us-central1": "10.128.0.0/20", "europe-west1": "10.132.0.0/20", "us-west1": "10.138.0.0/20",
    "asia-east1": "10.140.0.0/20", "us-east1": "10.142.0.0/20", "asia-northeast1": "10.146.0.0/20",
    "asia-southeast1": "10.148.0.0/20", "us-east4": "10.150.0.0/20", "europe-west4": "10.164.0.0/20",
    "us-west4": "10.182.0.0/20", "us-east5": "10.202.0.0/20", "us-south1": "10.206.0.0/20",
}


def _zones(spec: str) -> frozenset[str]:
    """'us-central1:abcf europe-west4:ab' -> the zones."""
    out = set()
    for part in spec.split():
        region, letters = part.split(":")
        out |= {f"{region}-{letter}" for letter in letters}
    return frozenset(out)


ALL_ZONES = frozenset(ZONES)

# GPU accelerator types and their zones: https://cloud.google.com/compute/docs/gpus/gpu-regions-zones
# quota metrics: https://cloud.google.com/compute/resource-usage#gpu_quota
GPU_TYPES: dict[str, dict] = {
    "nvidia-tesla-t4": dict(description="NVIDIA T4", max_cards=4, counts=(1, 2, 4), metric="NVIDIA_T4_GPUS",
                            zones=_zones("us-central1:abcf us-east1:cd us-east4:abc us-west1:ab us-west4:ab "
                                         "europe-west1:bcd europe-west4:abc asia-east1:ac asia-northeast1:ac "
                                         "asia-southeast1:abc")),
    "nvidia-tesla-v100": dict(description="NVIDIA V100", max_cards=8, counts=(1, 2, 4, 8), metric="NVIDIA_V100_GPUS",
                              zones=_zones("us-central1:abcf us-east1:c us-west1:ab europe-west4:abc asia-east1:c")),
    "nvidia-tesla-a100": dict(description="NVIDIA A100 40GB", max_cards=16, counts=(), metric="NVIDIA_A100_GPUS",
                              zones=_zones("us-central1:abcf us-east1:b us-west1:b europe-west4:ab "
                                           "asia-northeast1:ac asia-southeast1:bc")),
    "nvidia-a100-80gb": dict(description="NVIDIA A100 80GB", max_cards=8, counts=(), metric="NVIDIA_A100_80GB_GPUS",
                             zones=_zones("us-central1:ac us-east4:c us-east5:b europe-west4:a asia-southeast1:c")),
    "nvidia-l4": dict(description="NVIDIA L4", max_cards=8, counts=(), metric="NVIDIA_L4_GPUS",
                      zones=_zones("us-central1:abc us-east1:bcd us-east4:ac us-west1:abc us-west4:ac "
                                   "europe-west1:bc europe-west4:abc asia-east1:ac asia-northeast1:ac "
                                   "asia-southeast1:abc")),
    "nvidia-h100-80gb": dict(description="NVIDIA H100 80GB", max_cards=8, counts=(), metric="NVIDIA_H100_GPUS",
                             zones=_zones("us-central1:ac us-east4:abc us-east5:a europe-west4:bc asia-northeast1:b "
                                          "asia-southeast1:bc")),
}
# Only these can be attached to an N1 VM with guestAccelerators; A100/L4/H100 come with A2/G2/A3 machine types.
# https://cloud.google.com/compute/docs/gpus#gpus-list
N1_ATTACHABLE_GPUS = {"nvidia-tesla-t4", "nvidia-tesla-v100"}


def _machine_types() -> dict[str, dict]:
    """Machine types: https://cloud.google.com/compute/docs/general-purpose-machines and
    https://cloud.google.com/compute/docs/accelerator-optimized-machines (vCPUs, memory, attached GPUs)."""
    mt: dict[str, dict] = {}

    def add(name, cpus, mem_mb, family, zones=ALL_ZONES, gpus=None, shared=False):
        mt[name] = dict(cpus=cpus, memory_mb=int(mem_mb), family=family, zones=zones, gpus=gpus, shared=shared)

    for n in (2, 4, 8, 16, 32, 48, 64, 80, 96, 128):
        add(f"n2-standard-{n}", n, n * 4096, "n2")
        add(f"n2-highmem-{n}", n, n * 8192, "n2")
    for n in (2, 4, 8, 16, 32, 48, 64, 80, 96):
        add(f"n2-highcpu-{n}", n, n * 1024, "n2")
    for n in (2, 4, 8, 16, 32):
        add(f"e2-standard-{n}", n, n * 4096, "e2")
        add(f"e2-highcpu-{n}", n, n * 1024, "e2")
    for n in (2, 4, 8, 16):
        add(f"e2-highmem-{n}", n, n * 8192, "e2")
    add("e2-micro", 2, 1024, "e2", shared=True)
    add("e2-small", 2, 2048, "e2", shared=True)
    add("e2-medium", 2, 4096, "e2", shared=True)
    for n in (1, 2, 4, 8, 16, 32, 64, 96):
        add(f"n1-standard-{n}", n, n * 3840, "n1")
    a2_40 = GPU_TYPES["nvidia-tesla-a100"]["zones"]
    for g in (1, 2, 4, 8):
        add(f"a2-highgpu-{g}g", 12 * g, 87040 * g, "a2", a2_40, ("nvidia-tesla-a100", g))
    add("a2-megagpu-16g", 96, 1392640, "a2", a2_40, ("nvidia-tesla-a100", 16))
    for g in (1, 2, 4, 8):
        add(f"a2-ultragpu-{g}g", 12 * g, 174080 * g, "a2", GPU_TYPES["nvidia-a100-80gb"]["zones"],
            ("nvidia-a100-80gb", g))
    l4 = GPU_TYPES["nvidia-l4"]["zones"]
    for cpus, gpus in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8)):
        add(f"g2-standard-{cpus}", cpus, cpus * 4096, "g2", l4, ("nvidia-l4", gpus))
    add("a3-highgpu-8g", 208, 1916928, "a3", GPU_TYPES["nvidia-h100-80gb"]["zones"], ("nvidia-h100-80gb", 8))
    return mt


MACHINE_TYPES = _machine_types()
# Regional CPU quota metric per machine family: https://cloud.google.com/compute/resource-usage#cpu_quota
CPU_METRIC = {"n1": "CPUS", "e2": "E2_CPUS", "n2": "N2_CPUS", "a2": "A2_CPUS", "g2": "G2_CPUS", "a3": "A3_CPUS"}
GLOBAL_METRICS = {"CPUS_ALL_REGIONS", "GPUS_ALL_REGIONS"}
# Preemptible quota (https://cloud.google.com/compute/quotas, "Preemptible quotas"; "To prevent Spot VMs from consuming
# your quotas for standard VMs' CPUs, GPUs, and disks, consider requesting preemptible quota for Spot VMs":
# https://cloud.google.com/compute/docs/instances/create-use-spot): one PREEMPTIBLE_CPUS for the vCPUs of every
# machine family, PREEMPTIBLE_<GPU metric> per GPU type (the metrics of regions.get's Quota.metric enum,
# https://cloud.google.com/compute/docs/reference/rest/v1/regions). A project that was not granted one has it at
# limit 0 in regions.get, and its Spot VMs count against the standard quotas.
PREEMPTIBLE_CPUS = "PREEMPTIBLE_CPUS"


def preemptible_twin(metric: str) -> str | None:
    """The preemptible quota a Spot VM uses instead of `metric` where the project has it; None: there is none."""
    if metric == "CPUS" or metric in CPU_METRIC.values():
        return PREEMPTIBLE_CPUS
    if metric.startswith("NVIDIA_") and metric.endswith("_GPUS"):
        return "PREEMPTIBLE_" + metric
    return None

# Disk types: https://cloud.google.com/compute/docs/disks#disk-types ; quota: SSD_TOTAL_GB / DISKS_TOTAL_GB
DISK_TYPES = {
    "pd-standard": dict(description="Standard Persistent Disk", default_gb=500, metric="DISKS_TOTAL_GB"),
    "pd-balanced": dict(description="Balanced Persistent Disk", default_gb=100, metric="SSD_TOTAL_GB"),
    "pd-ssd": dict(description="SSD Persistent Disk", default_gb=100, metric="SSD_TOTAL_GB"),
    "pd-extreme": dict(description="Extreme Persistent Disk", default_gb=1000, metric="SSD_TOTAL_GB"),
}

# Public images, by family: https://cloud.google.com/compute/docs/images/os-details and the Deep Learning VM
# image families: https://cloud.google.com/deep-learning-vm/docs/images
IMAGES: dict[tuple[str, str], dict] = {}


def _add_image(project: str, name: str, family: str, disk_gb: int, description: str, arch: str = "X86_64") -> None:
    IMAGES[(project, name)] = {
        "kind": "compute#image", "id": str(int(hashlib.sha1(name.encode()).hexdigest()[:15], 16)),
        "creationTimestamp": "2025-03-11T12:00:00.000-07:00", "name": name, "description": description,
        "sourceType": "RAW", "status": "READY", "archiveSizeBytes": str(disk_gb * 1024 ** 3 // 8),
        "diskSizeGb": str(disk_gb), "family": family, "architecture": arch,
        "selfLink": f"{COMPUTE}/projects/{project}/global/images/{name}",
        "labelFingerprint": "42WmSpB8rSM=", "storageLocations": ["us", "eu", "asia"],
        "guestOsFeatures": [{"type": t} for t in ("UEFI_COMPATIBLE", "VIRTIO_SCSI_MULTIQUEUE", "GVNIC", "SEV_CAPABLE")],
        "licenses": [f"{COMPUTE}/projects/{project}/global/licenses/{family}"],
    }


_add_image("debian-cloud", "debian-12-bookworm-v20250311", "debian-12", 10,
           "Debian, Debian GNU/Linux, 12 (bookworm), amd64 built on 20250311")
_add_image("debian-cloud", "debian-12-bookworm-arm64-v20250311", "debian-12-arm64", 10,
           "Debian, Debian GNU/Linux, 12 (bookworm), arm64 built on 20250311", "ARM64")
_add_image("debian-cloud", "debian-11-bullseye-v20250311", "debian-11", 10,
           "Debian, Debian GNU/Linux, 11 (bullseye), amd64 built on 20250311")
_add_image("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250312", "ubuntu-2204-lts", 10,
           "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image built on 2025-03-12")
_add_image("ubuntu-os-cloud", "ubuntu-2404-noble-amd64-v20250313", "ubuntu-2404-lts-amd64", 10,
           "Canonical, Ubuntu, 24.04 LTS, amd64 noble image built on 2025-03-13")
for _fam, _name in (("common-cu124-debian-11-py310", "common-cu124-v20250325-debian-11-py310"),
                    ("common-cu123-debian-11-py310", "common-cu123-v20250325-debian-11-py310"),
                    ("common-cu121-debian-11-py310", "common-cu121-v20250325-debian-11-py310"),
                    ("common-cpu-debian-11-py310", "common-cpu-v20250325-debian-11-py310")):
    _add_image("deeplearning-platform-release", _name, _fam, 50, f"Google, Deep Learning VM, {_fam}")
# Today's families (FRAMEWORK-CUDA-OS-nvidia-DRIVER; the image is the family and -vDATE), with the OS's own
# /usr/bin/python3 (Ubuntu 22.04: 3.10, 24.04: 3.12) beside the image's ML Python (3.12 in the cu129 families; 3.10 in
# cu128). Debian Deep Learning VM images are all deprecated.
for _fam in ("common-cu129-ubuntu-2404-nvidia-580", "common-cu129-ubuntu-2204-nvidia-580",
             "common-cu128-ubuntu-2204-nvidia-570", "pytorch-2-9-cu129-ubuntu-2204-nvidia-580"):
    _add_image("deeplearning-platform-release", f"{_fam}-v20260818", _fam, 50, f"Google, Deep Learning VM, {_fam}")

# Cloud TPU accelerator types and their zones: https://cloud.google.com/tpu/docs/regions-zones ;
# shapes (type/topology, cores or chips): https://cloud.google.com/tpu/docs/system-architecture-tpu-vm
# and https://cloud.google.com/tpu/docs/v5e , /v5p , /v6e. Quota units: TensorCores for v2/v3/v4/v5p,
# chips for v5e/v6e (https://cloud.google.com/tpu/docs/quota).
TPU_ZONE_REGION = {**ZONES, "us-central2-b": "us-central2"}
_V2_8 = _zones("us-central1:bc europe-west4:a asia-east1:c")
_V3_8 = _zones("us-central1:abf europe-west4:a")
_V4 = frozenset({"us-central2-b"})
_V5E = _zones("us-central1:a us-east5:abc us-south1:a us-west1:c us-west4:a europe-west4:b")
_V5P = _zones("us-central1:a us-east5:a europe-west4:b")
_V6E = _zones("us-central1:b us-east1:d us-east5:ab europe-west4:a asia-northeast1:b")
TPU_TYPES: dict[str, dict] = {}
for _name, _gen, _cfg, _topo, _units, _zs in (
    ("v2-8", "v2", "V2", "2x2", 8, _V2_8), ("v2-32", "v2", "V2", "4x4", 32, _zones("us-central1:a europe-west4:a")),
    ("v3-8", "v3", "V3", "2x2", 8, _V3_8), ("v3-32", "v3", "V3", "4x4", 32, _zones("europe-west4:a")),
    ("v4-8", "v4", "V4", "2x2x1", 8, _V4), ("v4-16", "v4", "V4", "2x2x2", 16, _V4), ("v4-32", "v4", "V4", "2x2x4", 32, _V4),
    ("v5litepod-1", "v5e", "V5LITE_POD", "1x1", 1, _V5E), ("v5litepod-4", "v5e", "V5LITE_POD", "2x2", 4, _V5E),
    ("v5litepod-8", "v5e", "V5LITE_POD", "2x4", 8, _V5E), ("v5litepod-16", "v5e", "V5LITE_POD", "4x4", 16, _V5E),
    ("v5p-8", "v5p", "V5P", "2x2x1", 8, _V5P),
    ("v6e-1", "v6e", "V6E", "1x1", 1, _V6E), ("v6e-4", "v6e", "V6E", "2x2", 4, _V6E), ("v6e-8", "v6e", "V6E", "2x4", 8, _V6E),
):
    TPU_TYPES[_name] = dict(generation=_gen, type=_cfg, topology=_topo, units=_units, zones=_zs)
# TPU quota IDs per generation (standard, preemptible/spot): https://cloud.google.com/tpu/docs/quota
TPU_QUOTA_IDS = {
    "v2": ("TPUV2sPerProjectPerZoneForTPUAPI", "TPUV2sPreemptiblePerProjectPerZoneForTPUAPI"),
    "v3": ("TPUV3sPerProjectPerZoneForTPUAPI", "TPUV3sPreemptiblePerProjectPerZoneForTPUAPI"),
    "v4": ("TPUV4PodPerProjectPerZoneForTPUAPI", "TPUV4PodPreemptiblePerProjectPerZoneForTPUAPI"),
    "v5e": ("TPUV5sLitepodPerProjectPerZoneForTPUAPI", "TPUV5sLitepodPreemptiblePerProjectPerZoneForTPUAPI"),
    "v5p": ("TPUV5PPerProjectPerZoneForTPUAPI", "TPUV5PPreemptiblePerProjectPerZoneForTPUAPI"),
    "v6e": ("TPUV6EPerProjectPerZoneForTPUAPI", "TPUV6EPreemptiblePerProjectPerZoneForTPUAPI"),
}


def _tpu_runtimes() -> dict[str, frozenset[str]]:
    """TPU software versions and the TPU generations each suits: https://cloud.google.com/tpu/docs/runtimes
    (PyTorch/JAX base images per generation; TensorFlow: tpu-vm-tf-x.y.z[-pod][-pjrt]; v5e and v5p only with
    TensorFlow 2.15.0 and later (PJRT), v6e from 2.16.1; for 2.18.0 one image for v5p and below, one for v5e and v6e)."""
    old, every = frozenset({"v2", "v3", "v4"}), frozenset({"v2", "v3", "v4", "v5e", "v5p", "v6e"})
    no_v6e = every - {"v6e"}
    rt: dict[str, frozenset[str]] = {
        "tpu-ubuntu2204-base": old, "tpu-vm-base": frozenset({"v2", "v3"}), "tpu-vm-v4-base": frozenset({"v4"}),
        "v2-alpha-tpuv5-lite": frozenset({"v5e"}), "v2-alpha-tpuv5": frozenset({"v5p"}),
        "v2-alpha-tpuv6e": frozenset({"v6e"}),
    }
    for pod in ("", "-pod"):
        rt[f"tpu-vm-tf-2.18.0{pod}-pjrt-v5p-and-below"] = old | {"v5p"}
        rt[f"tpu-vm-tf-2.18.0{pod}-pjrt-v5e-and-v6"] = frozenset({"v5e", "v6e"})
        for v in ("2.17.0", "2.16.1"):
            rt[f"tpu-vm-tf-{v}{pod}-pjrt"] = every
        for v in ("2.15.1", "2.15.0"):
            rt[f"tpu-vm-tf-{v}{pod}-pjrt"] = no_v6e
        for v in ("2.14.1", "2.14.0", "2.13.1", "2.13.0", "2.12.1", "2.12.0", "2.11.1", "2.11.0"):
            rt[f"tpu-vm-tf-{v}{pod}"] = old
            rt[f"tpu-vm-tf-{v}{pod}-pjrt"] = old
        rt[f"tpu-vm-tf-2.10.1{pod}"] = old
        rt[f"tpu-vm-tf-2.10.0{pod}"] = frozenset({"v2", "v3"})
        rt[f"tpu-vm-tf-2.10.0{pod}-v4"] = frozenset({"v4"})
    return rt


TPU_RUNTIMES = _tpu_runtimes()


# ================================================================================================
# The list filter
# ================================================================================================
_TERM = re.compile(r'\s*\(?\s*([A-Za-z_][\w.\-]*)\s*(=|!=|:|\beq\b|\bne\b)\s*("([^"]*)"|\'([^\']*)\'|[^\s()]+)\s*\)?\s*')


def parse_filter(text: str | None) -> list[tuple[str, str, str]]:
    """`labels.dsctl-run = "r1" AND (status != "RUNNING")` -> [(key, op, value), ...].

    Compute Engine's list filter (https://cloud.google.com/compute/docs/reference/rest/v1/instances/list,
    "filter"): comparisons joined by AND (or juxtaposed, each in parentheses); `eq`/`ne` take a regular
    expression. OR is not supported here.
    """
    if not text or not text.strip():
        return []
    terms = []
    parts = re.split(r"\)\s*(?:AND\s*)?\(|\s+AND\s+", text.strip(), flags=re.IGNORECASE)
    for part in parts:
        m = _TERM.fullmatch(part)
        if not m:
            raise ValueError(f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.")
        key, op, raw, dq, sq = m.groups()
        value = dq if dq is not None else sq if sq is not None else raw
        terms.append((key, op, value))
    return terms


def _lookup(obj: dict, dotted: str):
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def matches(obj: dict, terms: list[tuple[str, str, str]]) -> bool:
    for key, op, value in terms:
        got = _lookup(obj, key)
        got_s = None if got is None else str(got)
        if op == "=":
            ok = got_s == value
        elif op == "!=":
            ok = got_s != value
        elif op == ":":
            ok = got is not None and (value == "*" or value in got_s)
        elif op == "eq":
            ok = got_s is not None and re.fullmatch(value, got_s) is not None
        else:  # ne
            ok = got_s is None or re.fullmatch(value, got_s) is None
        if not ok:
            return False
    return True


# ================================================================================================
# Faults, timing, errors
# ================================================================================================
def api_of(path: str) -> str:
    """Which API a request path is for (the stand-ins answer several on one endpoint)."""
    if path.startswith("/compute/"):
        return "compute"
    if path.startswith(("/storage/", "/upload/", "/download/")):
        return "storage"
    if path.startswith("/v3/projects/"):
        return "resourcemanager"
    if path.startswith("/v1/users/"):
        return "oslogin"
    if "/serviceAccounts" in path:
        return "iam"
    if "/policies/" in path:
        return "orgpolicy"
    if path.endswith("services:batchGet"):
        return "serviceusage"
    if "/quotaInfos" in path:
        return "cloudquotas"
    if path.startswith("/v2/"):
        return "tpu"
    return "other"


@dataclass
class Faults:
    latency_s: float = 0.0  # added to every API call
    # The Nth instance (1-based) carrying label key=value fails with `error_code` (QUOTA_EXCEEDED or
    # ZONE_RESOURCE_POOL_EXHAUSTED). An insert's operation ends with that error; a bulkInsert creates
    # none of its instances (all or nothing up to minCount) and its operation ends with
    # VM_MIN_COUNT_NOT_REACHED followed by that error.
    fail_nth_instance: int | None = None
    fail_label: tuple[str, str] | None = None
    error_code: str = "QUOTA_EXCEEDED"
    # A failed bulkInsert's operation lists VM_MIN_COUNT_NOT_REACHED first, then the cause, as the service does;
    # True puts the cause (QUOTA_EXCEEDED, ZONE_RESOURCE_POOL_EXHAUSTED) first instead.
    bulk_cause_first: bool = False
    # Refuse the insert/bulkInsert call itself (HTTP 403 quotaExceeded, or 503 for capacity) instead of
    # failing its operation; applies to the fail_nth knob and to configured quotas alike.
    fail_sync: bool = False
    # Every `burst_every`-th call to one method and path starts a burst of `burst_length` errors with
    # `burst_status` (503 backendError, 429 or 403 rateLimitExceeded) on it; a tuple of them: the bursts take
    # them in turn, across paths. Counted per method and path, so a caller retrying one call meets at most
    # `burst_length` errors in a row however many other calls run at the same time (a global count would
    # fail concurrent retries far more often).
    burst_every: int | None = None
    burst_length: int = 0
    burst_status: int | tuple[int, ...] = 503
    # Instances whose name contains one of these never leave PROVISIONING.
    stuck_names: list[str] = field(default_factory=list)
    # The bursts reach Cloud Storage too (storage_gate.py), not only the APIs fake_gce serves.
    storage_bursts: bool = False
    # The first call to each method and path fails once, with these statuses in turn (every API meets each).
    first_call_statuses: tuple[int, ...] = ()
    # Cloud TPU has no capacity in any zone: nodes.create operations end with code 8 (RESOURCE_EXHAUSTED);
    # queued resources stay WAITING_FOR_RESOURCES (FAILED once their validUntil passes).
    tpu_exhausted: bool = False


@dataclass
class Timing:
    op_s: float = 0.05  # an operation is DONE this long after it started
    provisioning_s: float = 0.1
    staging_s: float = 0.1
    stopping_s: float = 0.1  # a deleted instance lingers in STOPPING this long
    tpu_creating_s: float = 0.2  # a TPU node is CREATING this long, then READY
    qr_waiting_s: float = 0.1  # a queued resource waits this long for resources before PROVISIONING


_GRPC_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                408: "DEADLINE_EXCEEDED", 502: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
                409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                503: "UNAVAILABLE"}


class ApiError(Exception):
    """An HTTP error. Compute Engine answers {"error": {code, message, errors: [{message, domain, reason}]}};
    Cloud TPU and Resource Manager answer the google.rpc.Status form {"error": {code, message, status, details}}
    (https://cloud.google.com/apis/design/errors#http_mapping)."""

    def __init__(self, status: int, message: str, reason: str = "invalid", *, grpc: str | None = None,
                 details: list | None = None, domain: str = "global"):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason
        self.grpc = grpc or _GRPC_STATUS.get(status, "UNKNOWN")
        self.details = details
        self.domain = domain

    def payload(self, style: str) -> dict:
        if style == "compute":
            err = {"code": self.status, "message": self.message,
                   "errors": [{"message": self.message, "domain": self.domain, "reason": self.reason}]}
            if self.details:  # Compute Engine answers with the google.rpc details too (ErrorInfo: SERVICE_DISABLED)
                err.update(status=self.grpc, details=self.details)
            return {"error": err}
        err = {"code": self.status, "message": self.message, "status": self.grpc}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def _invalid(field_name: str, value, why: str) -> ApiError:
    """Compute Engine's message for a bad field: "Invalid value for field 'resource.X': 'V'. Why"."""
    return ApiError(400, f"Invalid value for field '{field_name}': '{value if value is not None else ''}'. {why}")


def _grpc_invalid(message: str) -> ApiError:
    return ApiError(400, message, grpc="INVALID_ARGUMENT")


def _is_uuid(text: str) -> bool:
    try:
        return uuid.UUID(text) != uuid.UUID(int=0) and len(text) >= 32
    except (ValueError, TypeError):
        return False


# ================================================================================================
# Organization policies' list rules (the rest of identity: fake_identity.py)
# ================================================================================================
def _list_admits(rules: list[dict], value: str) -> bool:
    """Whether the rules of a list constraint's effective policy admit `value` (Organization Policy v2 PolicyRule:
    allowAll, denyAll, values.allowedValues / deniedValues, with the optional "is:" prefix;
    https://cloud.google.com/resource-manager/docs/reference/orgpolicy/rest/v2/organizations.policies#PolicyRule).
    No rule: all."""
    def bare(key: str) -> set[str]:
        return {v.removeprefix("is:") for r in rules for v in (r.get("values") or {}).get(key, [])}

    if value in bare("deniedValues"):
        return False
    if any(r.get("allowAll") for r in rules):
        return True
    if any(r.get("denyAll") for r in rules):
        return False
    allowed = bare("allowedValues")
    return not allowed or value in allowed



# ================================================================================================
# The cloud
# ================================================================================================
class FakeCloud(IdentityApis):
    """The state behind the stand-in: projects, networks, instances, firewalls, TPU nodes and queued
    resources, operations, quotas."""

    def __init__(self, faults: Faults | None = None, timing: Timing | None = None, first_ip: str = "127.0.0.2"):
        self.faults = faults or Faults()
        self.timing = timing or Timing()
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str, str], dict] = {}  # (project, zone, name)
        self.firewalls: dict[tuple[str, str], dict] = {}  # (project, name)
        self.tpus: dict[tuple[str, str, str], dict] = {}  # (project, zone, node id)
        self.queued: dict[tuple[str, str, str], dict] = {}  # (project, zone, queued resource id)
        self.networks: dict[tuple[str, str], dict] = {}
        self.subnetworks: dict[tuple[str, str, str], dict] = {}  # (project, region, name)
        self.routers: dict[tuple[str, str, str], dict] = {}  # (project, region, name)
        self.ops: dict[str, dict] = {}
        self.request_ids: dict[tuple, str] = {}  # (api, project, requestId) -> operation name
        self.projects: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path) of every API call
        self.callers: list[tuple[str, str, str | None]] = []  # (method, path, member) of every authenticated call
        self.errors_by_status: collections.Counter[int] = collections.Counter()  # injected by maybe_fail_call
        self.errors_by_api: collections.Counter[str] = collections.Counter()  # ... by the API that answered them
        # ("instance" | "firewall" | "tpu" | "queued_resource", request body as received (+ name)), for assertions
        self.created: list[tuple[str, dict]] = []
        # Quotas: (region or None, metric) -> limit; unset = unlimited. See set_quota.
        self.quota_limits: dict[tuple[str | None, str], float] = {}
        self.tpu_quota_limits: dict[tuple[str | None, str], float] = {}  # (zone or None, quota id)
        self._init_identity()  # who calls and what they may do; IAM, organization policies, OS Login (fake_identity)
        self.xpn_service_projects: dict[str, str] = {}  # Shared VPC: service project -> its host project (share_vpc)
        self.firewall_policies: list[dict] = []  # the organization's hierarchical firewall policies
        for project in GOOGLE_PROJECTS:  # "public images ... any authenticated user can use them"
            self.grant("allAuthenticatedUsers", "roles/compute.imageUser", f"projects/{project}")
        # The state a queued resource waits in before PROVISIONING. The documented state is
        # WAITING_FOR_RESOURCES, which replaced ACCEPTED (https://cloud.google.com/tpu/docs/queued-resources);
        # set "ACCEPTED" to play an older service.
        self.qr_waiting_state = "WAITING_FOR_RESOURCES"
        self.endpoint: str | None = None
        self._label_counts: dict[tuple[str, str], int] = {}
        self._ids = itertools.count(1000)
        self._addr_base = self._addr_index_of(first_ip)
        self._next_addr = 0
        self._free_addrs: list[int] = []
        self._bursts: dict[tuple[str, str], list[int]] = {}  # (method, path) -> [calls, errors left, status]
        self._bursts_started = 0
        self._pending_created: list[dict] = []  # made under the lock; their on_created hooks run after it
        self._pending_stopped: list[dict] = []  # stopped or preempted, likewise
        self._pending_started: list[dict] = []  # started again, likewise
        # Hooks: called with the instance (or TPU node) dict, outside the lock. A stopped VM's processes
        # die and its guest agent is gone (on_stopped); a started one boots again (on_started).
        self.on_created: list[Callable[[dict], None]] = []
        self.on_deleted: list[Callable[[dict], None]] = []
        self.on_stopped: list[Callable[[dict], None]] = []
        self.on_started: list[Callable[[dict], None]] = []

    # -- addresses ----------------------------------------------------------------------------------
    @staticmethod
    def _addr_index_of(ip: str) -> int:
        o = ipaddress.ip_address(ip).packed
        return (o[2] // 2) * 253 + (o[3] - 2)

    @staticmethod
    def addresses_of(k: int) -> tuple[str, str]:
        """(internal, external) loopback address pair of address slot k: 127.0.2j.N and 127.0.2j+1.N."""
        j, n = divmod(k, 253)
        return f"127.0.{2 * j}.{n + 2}", f"127.0.{2 * j + 1}.{n + 2}"

    def _alloc_addr(self) -> int:
        if self._free_addrs:
            return self._free_addrs.pop(0)
        k = self._next_addr
        self._next_addr += 1
        return self._addr_base + k

    def _release_addr(self, k: int | None) -> None:
        if k is not None:
            self._free_addrs.append(k)
            self._free_addrs.sort()

    # -- projects, networks -------------------------------------------------------------------------
    def project_number(self, project: str) -> str:
        return self._project(project)["projectNumber"]

    def _project(self, project: str) -> dict:
        """Every project exists on first use (as define_project describes it, if it did), with the default network a
        new project gets: an auto mode VPC named "default" (https://cloud.google.com/vpc/docs/vpc#default-network) and
        its pre-populated firewall rules (https://cloud.google.com/vpc/docs/firewalls#more_rules_default_vpc), unless
        it was made without one (compute.skipDefaultNetworkCreation: "skips the creation of the default network and
        related resources during Google Cloud project resource creation")."""
        p = self.projects.get(project)
        if p is not None:
            return p
        if project.isdigit():  # a project number names the project that has it
            for q in self.projects.values():
                if q["projectNumber"] == project:
                    return q
        number = str(100000000000 + int(hashlib.sha1(project.encode()).hexdigest()[:10], 16) % 900000000000)
        p = {"projectId": project, "projectNumber": number, "createTime": "2024-01-15T10:00:00.000Z"}
        self.projects[project] = p
        self._project_created(project)
        options = self.project_options.get(project, {})
        if not options.get("default_network", True) or (
                options.get("organization", True) and self.org_policy_enforced(project, "compute.skipDefaultNetworkCreation")):
            return p
        self._make_network(project, "default", auto=True, description="Default network for the project")
        for name, allowed, ranges, desc in (
            ("default-allow-internal", [{"IPProtocol": "tcp", "ports": ["0-65535"]},
                                        {"IPProtocol": "udp", "ports": ["0-65535"]}, {"IPProtocol": "icmp"}],
             ["10.128.0.0/9"], "Allow internal traffic on the default network"),
            ("default-allow-ssh", [{"IPProtocol": "tcp", "ports": ["22"]}], ["0.0.0.0/0"], "Allow SSH from anywhere"),
            ("default-allow-rdp", [{"IPProtocol": "tcp", "ports": ["3389"]}], ["0.0.0.0/0"], "Allow RDP from anywhere"),
            ("default-allow-icmp", [{"IPProtocol": "icmp"}], ["0.0.0.0/0"], "Allow ICMP from anywhere"),
        ):
            self.firewalls[(project, name)] = {
                "kind": "compute#firewall", "id": str(next(self._ids)), "creationTimestamp": _now_rfc3339(),
                "name": name, "description": desc, "network": f"{COMPUTE}/projects/{project}/global/networks/default",
                "priority": 65534, "sourceRanges": ranges, "allowed": allowed, "direction": "INGRESS",
                "logConfig": {"enable": False}, "disabled": False,
                "selfLink": f"{COMPUTE}/projects/{project}/global/firewalls/{name}", "_default": True,
            }
        return p

    def _make_network(self, project: str, name: str, *, auto: bool, description: str = "") -> dict:
        link = f"{COMPUTE}/projects/{project}/global/networks/{name}"
        net = {"kind": "compute#network", "id": str(next(self._ids)), "creationTimestamp": _now_rfc3339(),
               "name": name, "description": description, "selfLink": link, "autoCreateSubnetworks": auto,
               "subnetworks": [], "routingConfig": {"routingMode": "REGIONAL"},
               "networkFirewallPolicyEnforcementOrder": "AFTER_CLASSIC_FIREWALL"}
        self.networks[(project, name)] = net
        if auto:
            for region, cidr in AUTO_MODE_RANGES.items():
                self.add_subnetwork(project, region, name, network=name, ip_cidr_range=cidr)
        return net

    def add_network(self, project: str, name: str, auto: bool = False) -> dict:
        """A test's own VPC network (custom mode unless auto)."""
        with self.lock:
            self._project(project)
            return self._make_network(project, name, auto=auto)

    def add_subnetwork(self, project: str, region: str, name: str, *, network: str = "default",
                       ip_cidr_range: str = "10.0.0.0/20", private_ip_google_access: bool = False) -> dict:
        with self.lock:
            link = f"{COMPUTE}/projects/{project}/regions/{region}/subnetworks/{name}"
            net = f"{COMPUTE}/projects/{project}/global/networks/{network}"
            sub = {"kind": "compute#subnetwork", "id": str(next(self._ids)), "creationTimestamp": _now_rfc3339(),
                   "name": name, "network": net, "ipCidrRange": ip_cidr_range,
                   "gatewayAddress": str(ipaddress.ip_network(ip_cidr_range)[1]),
                   "region": f"{COMPUTE}/projects/{project}/regions/{region}", "selfLink": link,
                   "privateIpGoogleAccess": private_ip_google_access, "fingerprint": "x1kEWC2HGWE=",
                   "stackType": "IPV4_ONLY", "purpose": "PRIVATE"}
            self.subnetworks[(project, region, name)] = sub
            n = self.networks.get((project, network))
            if n is not None:
                n["subnetworks"].append(link)
            return sub

    def set_private_google_access(self, project: str, region: str, subnetwork: str, enabled: bool) -> None:
        with self.lock:
            self._project(project)
            self.subnetworks[(project, region, subnetwork)]["privateIpGoogleAccess"] = bool(enabled)

    def add_router(self, project: str, region: str, name: str, *, network: str = "default",
                   nats: list[dict] | None = None) -> dict:
        """A Cloud Router (with Cloud NAT configs in `nats`, as routers.insert takes them:
        https://cloud.google.com/compute/docs/reference/rest/v1/routers)."""
        with self.lock:
            self._project(project)
            router = {"kind": "compute#router", "id": str(next(self._ids)), "creationTimestamp": _now_rfc3339(),
                      "name": name, "region": f"{COMPUTE}/projects/{project}/regions/{region}",
                      "network": f"{COMPUTE}/projects/{project}/global/networks/{network}",
                      "selfLink": f"{COMPUTE}/projects/{project}/regions/{region}/routers/{name}",
                      "nats": copy.deepcopy(nats or [])}
            for nat in router["nats"]:
                nat.setdefault("natIpAllocateOption", "AUTO_ONLY")
                nat.setdefault("sourceSubnetworkIpRangesToNat", "ALL_SUBNETWORKS_ALL_IP_RANGES")
                nat.setdefault("enableEndpointIndependentMapping", False)
            self.routers[(project, region, name)] = router
            return router

    # -- quotas ---------------------------------------------------------------------------------------
    def set_quota(self, metric: str, limit: float, region: str | None = None) -> None:
        """Limit a Compute Engine quota metric (CPUS, N2_CPUS, E2_CPUS, A2_CPUS, G2_CPUS, NVIDIA_A100_GPUS,
        NVIDIA_L4_GPUS, IN_USE_ADDRESSES, SSD_TOTAL_GB, INSTANCES, ...) in `region` (every region when None), or a
        global one (CPUS_ALL_REGIONS, GPUS_ALL_REGIONS). Preemptible quotas (PREEMPTIBLE_CPUS, PREEMPTIBLE_NVIDIA_*_GPUS)
        are 0 (not granted) until set; the others are unlimited."""
        with self.lock:
            self.quota_limits[(None if metric in GLOBAL_METRICS else region, metric)] = float(limit)

    def set_tpu_quota(self, quota_id: str, limit: float, zone: str | None = None) -> None:
        """Limit a Cloud TPU quota (e.g. TPUV2sPerProjectPerZoneForTPUAPI, in TensorCores) in `zone` (every zone if None)."""
        with self.lock:
            self.tpu_quota_limits[(zone, quota_id)] = float(limit)

    def _limit(self, region: str | None, metric: str) -> float | None:
        if metric in GLOBAL_METRICS:
            return self.quota_limits.get((None, metric))
        got = self.quota_limits.get((region, metric))
        return got if got is not None else self.quota_limits.get((None, metric))

    def _usage(self, project: str) -> dict[tuple[str | None, str], float]:
        usage: dict[tuple[str | None, str], float] = {}
        for (p, zone, _), inst in self.instances.items():
            if p != project:
                continue
            region = ZONES[zone]
            for metric, amount in inst["_demand"]:
                key = (None if metric in GLOBAL_METRICS else region, metric)
                usage[key] = usage.get(key, 0.0) + amount
        return usage

    def _spot_metric(self, metric: str, region: str, spot: bool) -> str:
        """The quota a VM's `metric` is counted against: a Spot VM's goes to the preemptible quota where the project
        has one (a limit above 0; see preemptible_twin), else to the standard one."""
        twin = preemptible_twin(metric) if spot else None
        if twin and (self._limit(region, twin) or 0) > 0:
            return twin
        return metric

    def _quota_fit(self, project: str, region: str, demands: list[list[tuple[str, float]]]):
        """How many of `demands` (in order) fit the configured quotas: (count, None) or (count, (metric, region, limit))."""
        if not self.quota_limits:
            return len(demands), None
        usage = self._usage(project)
        for i, demand in enumerate(demands):
            for metric, amount in demand:
                key = (None if metric in GLOBAL_METRICS else region, metric)
                limit = self._limit(region, metric)
                if limit is not None and usage.get(key, 0.0) + amount > limit:
                    return i, (metric, None if metric in GLOBAL_METRICS else region, limit)
            for metric, amount in demand:
                key = (None if metric in GLOBAL_METRICS else region, metric)
                usage[key] = usage.get(key, 0.0) + amount
        return len(demands), None

    @staticmethod
    def quota_error(metric: str, region: str | None, limit: float) -> dict:
        """One operation error for an exceeded quota, as Compute Engine reports it: code QUOTA_EXCEEDED, the
        message "Quota 'N2_CPUS' exceeded.  Limit: 24.0 in region us-central1." and errorDetails with quotaInfo
        (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations#Operation:
        error.errors[].errorDetails[].quotaInfo, https://cloud.google.com/compute/docs/reference/rest/v1/QuotaExceededInfo)."""
        where = f"in region {region}" if region else "globally"
        message = f"Quota '{metric}' exceeded.  Limit: {float(limit)} {where}."
        limit_name = metric.replace("_", "-") + ("-per-project-region" if region else "-per-project")
        info = {"metricName": f"compute.googleapis.com/{metric.lower()}", "limitName": limit_name, "limit": limit}
        if region:
            info["dimensions"] = {"region": region}
        return {"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [
            {"quotaInfo": info},
            {"help": {"links": [{"description": "Request a quota increase",
                                 "url": "https://cloud.google.com/docs/quotas/help/request_increase"}]}},
        ]}

    # -- helpers ---------------------------------------------------------------------------------------
    def _new_op(self, scope: str, project: str, where: str | None, op_type: str, target: str,
                error: dict | None = None, done_after: float | None = None, request_id: str | None = None,
                extra: dict | None = None) -> dict:
        """A Compute Engine Operation (https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations)."""
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}"
        base = {"zone": f"projects/{project}/zones/{where}", "region": f"projects/{project}/regions/{where}",
                "global": f"projects/{project}/global"}[scope]
        op = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name, "operationType": op_type,
            "targetLink": target, "targetId": str(next(self._ids)), "status": "RUNNING", "progress": 0,
            "user": "user@example.com", "insertTime": _now_rfc3339(), "startTime": _now_rfc3339(),
            "selfLink": f"{COMPUTE}/{base}/operations/{name}",
            "_done_at": time.monotonic() + (self.timing.op_s if done_after is None else done_after),
            "_error": error, "_scope": scope, "_where": where, "_project": project,
        }
        if request_id:
            op["clientOperationId"] = request_id
        if scope == "zone":
            op["zone"] = f"{COMPUTE}/projects/{project}/zones/{where}"
        elif scope == "region":
            op["region"] = f"{COMPUTE}/projects/{project}/regions/{where}"
        if extra:
            op.update(extra)
        self.ops[name] = op
        if request_id:
            self.request_ids[("compute", project, request_id)] = name
        return op

    def _op_view(self, op: dict) -> dict:
        out = {k: v for k, v in op.items() if not k.startswith("_")}
        if time.monotonic() >= op["_done_at"]:
            out["status"] = "DONE"
            out["progress"] = 100
            out["endTime"] = _now_rfc3339()
            if op["_error"]:
                out.update(op["_error"])
            if "_bulk_done" in op:
                out["instancesBulkInsertOperationMetadata"] = op["_bulk_done"]
        return out

    def _instance_view(self, inst: dict) -> dict:
        now = time.monotonic()
        out = {k: copy.deepcopy(v) for k, v in inst.items() if not k.startswith("_")}
        if inst.get("_deleted_at") is not None:
            out["status"] = "STOPPING"
        elif inst.get("_terminated"):
            out["status"] = "TERMINATED"
        elif inst["_stuck"]:
            out["status"] = "PROVISIONING"
        else:
            age = now - inst.get("_started_at", inst["_created_at"])
            t = self.timing
            out["status"] = ("PROVISIONING" if age < t.provisioning_s else
                             "STAGING" if age < t.provisioning_s + t.staging_s else "RUNNING")
        if out["status"] == "RUNNING":
            out.setdefault("lastStartTimestamp", out["creationTimestamp"])
        return out

    def _reap(self) -> list[dict]:
        """Remove deleted instances and TPU nodes whose time has come; advance queued resources.
        Returns the resources now gone (for hooks); the created ones go to self._pending_created."""
        now = time.monotonic()
        gone = []
        for inst in self.instances.values():
            self._enforce_max_run(inst, now)
        for key, inst in list(self.instances.items()):
            if inst.get("_deleted_at") is not None and now >= inst["_deleted_at"] + self.timing.stopping_s:
                del self.instances[key]
                self._release_addr(inst["_addr"])
                gone.append(inst)
        for key, node in list(self.tpus.items()):
            if node.get("_deleted_at") is not None and now >= node["_deleted_at"] + self.timing.stopping_s:
                del self.tpus[key]
                self._release_addr(node["_addr"])
                gone.append(node)
        self._advance_queued(now)
        return gone

    def _enforce_max_run(self, inst: dict, now: float) -> None:
        """scheduling.maxRunDuration: "Compute Engine automatically stops or deletes the VM" (its
        instanceTerminationAction) once it has run that long, counted from when it was last started
        (https://cloud.google.com/compute/docs/instances/limit-vm-runtime)."""
        limit = (inst.get("scheduling") or {}).get("maxRunDuration")
        if not limit or inst.get("_deleted_at") is not None or inst.get("_terminated"):
            return
        running_since = inst.get("_started_at", inst["_created_at"]) + self.timing.provisioning_s + self.timing.staging_s
        if now - running_since < int(limit.get("seconds", 0)):
            return
        if inst["scheduling"].get("instanceTerminationAction") == "DELETE":
            inst["_deleted_at"] = now
        else:
            self._stop(inst)

    def _fire(self, hooks, items) -> None:
        for item in items:
            for hook in hooks:
                try:
                    hook(item)
                except Exception as exc:  # a hook must not break the API
                    print(f"fake_gce hook failed: {exc!r}")

    def tick(self) -> None:
        """Advance the clocks (deletions, queued resources) and run hooks; every API call does this."""
        with self.lock:
            gone = self._reap()
            created, self._pending_created = self._pending_created, []
            stopped, self._pending_stopped = self._pending_stopped, []
            started, self._pending_started = self._pending_started, []
        self._fire(self.on_created, created)
        self._fire(self.on_deleted, gone)
        self._fire(self.on_stopped, stopped)
        self._fire(self.on_started, started)

    # -- counts for assertions -------------------------------------------------------------------------
    def counts(self) -> dict:
        """instances; firewall rules made through the API (not the default network's own); TPU resources:
        nodes, plus queued resources that have no node."""
        self.tick()
        with self.lock:
            return {"instances": len(self.instances),
                    "firewalls": sum(1 for f in self.firewalls.values() if not f.get("_default")),
                    "tpus": len(self.tpus) + sum(1 for q in self.queued.values() if q.get("_node_key") not in self.tpus)}

    # -- faults --------------------------------------------------------------------------------------------
    @property
    def errors_injected(self) -> int:
        return sum(self.errors_by_status.values())

    def maybe_fail_call(self, method: str, path: str) -> None:
        """Bursts of errors. Rate limits are 403/429 with reason rateLimitExceeded
        (https://cloud.google.com/compute/api-quota#exceeded); never a quota error."""
        f = self.faults
        with self.lock:
            burst = self._bursts.setdefault((method, path), [0, 0, 0])
            burst[0] += 1
            if f.first_call_statuses and burst[0] == 1:
                burst[1], burst[2] = 0, f.first_call_statuses[self._bursts_started % len(f.first_call_statuses)]
                self._bursts_started += 1
            elif burst[1] > 0:
                burst[1] -= 1
            elif f.burst_every and burst[0] % f.burst_every == 0 and f.burst_length > 0:
                statuses = f.burst_status if isinstance(f.burst_status, tuple) else (f.burst_status,)
                burst[1], burst[2] = f.burst_length - 1, statuses[self._bursts_started % len(statuses)]
                self._bursts_started += 1
            else:
                return
            status = burst[2]
            self.errors_by_status[status] += 1
            self.errors_by_api[api_of(path)] += 1
        rate_details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
                         "domain": "googleapis.com", "metadata": {"service": "compute.googleapis.com"}}]
        if status == 429:
            raise ApiError(429, "Rate Limit Exceeded", "rateLimitExceeded", domain="usageLimits", details=rate_details)
        if status == 403:  # Compute Engine's per-minute API rate quota
            raise ApiError(403, "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
                                "'compute.googleapis.com'", "rateLimitExceeded", domain="usageLimits",
                           grpc="RESOURCE_EXHAUSTED", details=rate_details)
        # What a front end or backend answers when it fails for a moment (https://cloud.google.com/apis/design/errors:
        # INTERNAL 500, UNAVAILABLE 503, DEADLINE_EXCEEDED 504; a proxy's 502; a request that timed out, 408).
        said = {500: ("Internal error encountered.", "backendError", "INTERNAL"),
                502: ("Bad Gateway", "badGateway", "UNAVAILABLE"),
                504: ("Deadline exceeded.", "deadlineExceeded", "DEADLINE_EXCEEDED"),
                408: ("Request Timeout", "requestTimeout", "DEADLINE_EXCEEDED")}
        if status in said:
            message, reason, grpc = said[status]
            raise ApiError(status, message, reason, grpc=grpc)
        raise ApiError(503, "The service is currently unavailable.", "backendError")

    def _label_fault(self, project: str, zone: str, labels: dict, machine: str) -> dict | None:
        """The fail_nth_instance knob: one operation error for this instance, or None."""
        f = self.faults
        if f.fail_nth_instance is None or f.fail_label is None:
            return None
        key, value = f.fail_label
        if (labels or {}).get(key) != value:
            return None
        count = self._label_counts.get(f.fail_label, 0) + 1
        self._label_counts[f.fail_label] = count
        if count < f.fail_nth_instance:
            return None
        if f.error_code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED"):
            # https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability
            return {"code": f.error_code, "message": (
                f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to fulfill "
                "the request.  Try a different zone, or try again later.")}
        mt = MACHINE_TYPES.get(machine)
        metric = CPU_METRIC.get(mt["family"], "CPUS") if mt else "CPUS"
        cpus = mt["cpus"] if mt else 8
        return self.quota_error(metric, ZONES[zone], cpus * (count - 1))

    # ============================================================================================
    # Compute Engine: validation of one instance (insert: zonal URLs; bulk: bare names)
    # ============================================================================================
    def _zone_check(self, zone: str) -> None:
        if zone not in ZONES:
            raise _invalid("zone", zone, "Unknown zone.")

    def _region_check(self, region: str) -> None:
        if region not in REGIONS:
            raise _invalid("region", region, "Unknown region.")

    @staticmethod
    def _strip_compute(url: str) -> str:
        for prefix in COMPUTE_URL_PREFIXES:
            if url.startswith(prefix):
                return url[len(prefix):]
        return url

    def _zonal_ref(self, project: str, zone: str, value, kind: str, field_name: str, *, bare: bool) -> str:
        """A zonal resource reference -> its name. insert takes a full or partial URL (zones/Z/KIND/NAME);
        bulkInsert's instanceProperties takes ONLY the bare name (see the callers' doc links)."""
        if not isinstance(value, str) or not value:
            raise _invalid(field_name, value, "Must be specified.")
        if bare:
            if "/" in value:
                raise _invalid(field_name, value, f"Must be the name of the {kind[:-1]} (not a URL) in instance properties.")
            return value
        path = self._strip_compute(value)
        m = re.fullmatch(rf"(?:projects/([^/]+)/)?zones/([^/]+)/{kind}/([^/]+)", path)
        if not m:
            raise _invalid(field_name, value, "The URL is malformed.")
        if m.group(2) != zone:
            raise _invalid(field_name, value, "Cross-zone references are not allowed.")
        return m.group(3)

    def _image(self, project: str, value, field_name: str) -> dict:
        """sourceImage forms (https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert,
        disks[].initializeParams.sourceImage): projects/P/global/images/family/F, projects/P/global/images/NAME,
        global/images/NAME, global/images/family/F, or the full URL."""
        if not isinstance(value, str) or not value:
            raise _invalid(field_name, value, "Boot disk must have a source image (sourceImage) specified.")
        path = self._strip_compute(value)
        m = re.fullmatch(r"(?:projects/([^/]+)/)?global/images/(family/)?([^/]+)", path)
        if not m:
            raise _invalid(field_name, value, "The URL is malformed.")
        img_project, family, name = m.group(1) or project, m.group(2), m.group(3)
        found = self._image_from_family(img_project, name) if family else IMAGES.get((img_project, name))
        if found is None:
            raise _invalid(field_name, value, "The referenced image resource cannot be found.")
        return found

    @staticmethod
    def _image_from_family(project: str, family: str) -> dict | None:
        cands = [i for (p, _), i in IMAGES.items() if p == project and i["family"] == family]
        return max(cands, key=lambda i: i["name"]) if cands else None

    def _network_refs(self, project: str, zone: str, nic: dict, prefix: str) -> tuple[str, str]:
        """(network URL, subnetwork URL) of an interface. A network or subnetwork of another project is a Shared VPC
        host's, usable only by the host's attached service projects ("Service project admins ... can only use
        subnets in the host project ... shared with them", https://cloud.google.com/vpc/docs/shared-vpc)."""
        region = ZONES[zone]
        net_value = nic.get("network")
        net_project, net_name = project, "default"
        if net_value:
            m = re.fullmatch(r"(?:projects/([^/]+)/)?global/networks/([^/]+)", self._strip_compute(net_value))
            if not m:
                raise _invalid(f"{prefix}.network", net_value, "The URL is malformed.")
            net_project, net_name = m.group(1) or project, m.group(2)
        sub_value = nic.get("subnetwork")
        sub_project = net_project
        if sub_value:
            m = re.fullmatch(r"(?:projects/([^/]+)/)?(?:regions/([^/]+)/)?subnetworks/([^/]+)", self._strip_compute(sub_value))
            if not m:
                raise _invalid(f"{prefix}.subnetwork", sub_value, "The URL is malformed.")
            if m.group(2) and m.group(2) != region:
                raise _invalid(f"{prefix}.subnetwork", sub_value, f"Subnetwork must be in region {region}.")
            sub_project, sub_name = m.group(1) or project, m.group(3)
            if not net_value:
                net_project = sub_project
        for other, value, what in ((net_project, net_value, "network"), (sub_project, sub_value, "subnetwork")):
            if other != project and self.xpn_service_projects.get(project) != other:
                raise _invalid(f"{prefix}.{what}", value, f"Project {project} is not a Shared VPC service project of "
                               f"{other}, so it cannot use its {what}s.")
        if (net_project, net_name) not in self.networks:
            raise _invalid(f"{prefix}.network", net_value or net_name,
                           "The referenced network resource cannot be found.")
        if not sub_value:
            net = self.networks[(net_project, net_name)]
            if not net["autoCreateSubnetworks"]:
                raise _invalid(f"{prefix}.subnetwork", "",
                               "Subnetwork should be specified for custom subnetmode network.")
            sub_name = net_name
        sub = self.subnetworks.get((sub_project, region, sub_name))
        if sub is None:
            raise _invalid(f"{prefix}.subnetwork", sub_value or sub_name,
                           "The referenced subnetwork resource cannot be found.")
        if sub["network"] != f"{COMPUTE}/projects/{net_project}/global/networks/{net_name}":
            raise _invalid(f"{prefix}.subnetwork", sub_value, "Subnetwork does not belong to the network.")
        return f"{COMPUTE}/projects/{net_project}/global/networks/{net_name}", sub["selfLink"]

    def _build_instance(self, project: str, zone: str, body: dict, *, bare: bool, root: str) -> dict:
        """Validate one instance and build the resource as the API returns it (without address/status).

        Field rules: https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert (Instance) and, with
        bare=True, https://cloud.google.com/compute/docs/reference/rest/v1/instances/bulkInsert (InstanceProperties:
        "machineType ... only accepts a machine type name", acceleratorType and diskType names, not URLs)."""
        name = body.get("name") or ""
        if not NAME_RE.fullmatch(name):
            raise _invalid(f"{root}.name" if not bare else "resource.perInstanceProperties", name,
                           f"Must be a match of regex '{NAME_REGEX_TEXT}'")
        region = ZONES[zone]
        # -- machine type
        mt_field = f"{root}.machineType"
        raw_mt = body.get("machineType")
        if bare and isinstance(raw_mt, str) and "/" in raw_mt:
            raise _InternalError()  # documented: a URL here "will result in an INTERNAL_ERROR"
        mt_name = self._zonal_ref(project, zone, raw_mt, "machineTypes", mt_field, bare=bare)
        mt = MACHINE_TYPES.get(mt_name)
        if mt is None or zone not in mt["zones"]:
            raise _invalid(mt_field, raw_mt, f"Machine type with name '{mt_name}' does not exist in zone '{zone}'.")
        # -- labels (https://cloud.google.com/compute/docs/labeling-resources#requirements)
        labels = body.get("labels") or {}
        if len(labels) > 64:
            raise _invalid(f"{root}.labels", "", "A resource can have at most 64 labels.")
        for k, v in labels.items():
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v)):
                raise _invalid(f"{root}.labels", f"{k}={v}", "Label keys must start with a lowercase letter and "
                               "keys and values may contain only lowercase letters, digits, '_' and '-' (max 63).")
        # -- tags (network tags follow the RFC 1035 name rule)
        tags = (body.get("tags") or {}).get("items") or []
        for t in tags:
            if not NAME_RE.fullmatch(t):
                raise _invalid(f"{root}.tags.items", t, f"Must be a match of regex '{NAME_REGEX_TEXT}'")
        # -- disks: exactly one boot disk, created from an image
        disks = body.get("disks") or []
        if not disks:
            raise _invalid(f"{root}.disks", "", "At least one disk (the boot disk) must be specified.")
        boots = [d for d in disks if d.get("boot")]
        if len(boots) != 1 or not disks[0].get("boot"):
            raise _invalid(f"{root}.disks[0].boot", "", "Exactly one boot disk, the first, must be specified.")
        out_disks, disk_demand, image_projects = [], [], []
        for i, d in enumerate(disks):
            ip = d.get("initializeParams") or {}
            dfield = f"{root}.disks[{i}].initializeParams"
            if d.get("source"):
                raise _invalid(f"{root}.disks[{i}].source", d["source"], "The referenced disk resource cannot be found.")
            image = self._image(project, ip.get("sourceImage"), f"{dfield}.sourceImage") if d.get("boot") else None
            dt_raw = ip.get("diskType")
            dt_name = "pd-standard"
            if dt_raw:
                dt_name = self._zonal_ref(project, zone, dt_raw, "diskTypes", f"{dfield}.diskType", bare=bare)
            if dt_name not in DISK_TYPES:
                raise _invalid(f"{dfield}.diskType", dt_raw, f"Disk type '{dt_name}' does not exist in zone '{zone}'.")
            size = int(ip.get("diskSizeGb") or (image["diskSizeGb"] if image else DISK_TYPES[dt_name]["default_gb"]))
            if image and size < int(image["diskSizeGb"]):
                raise _invalid(f"{dfield}.diskSizeGb", size, "Requested disk size cannot be smaller than the image "
                               f"size ({image['diskSizeGb']} GB)")
            if image and image["architecture"] != "X86_64":
                raise _invalid(f"{dfield}.sourceImage", ip.get("sourceImage"),
                               f"The image architecture {image['architecture']} is not supported by machine type {mt_name}.")
            for k, v in (ip.get("labels") or {}).items():
                if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v)):
                    raise _invalid(f"{dfield}.labels", f"{k}={v}", "Invalid label.")
            disk_name = ip.get("diskName") or (name if i == 0 else f"{name}-{i}")
            disk_demand.append((DISK_TYPES[dt_name]["metric"], float(size)))
            out = {"kind": "compute#attachedDisk", "type": "PERSISTENT", "mode": "READ_WRITE",
                   "source": f"{COMPUTE}/projects/{project}/zones/{zone}/disks/{disk_name}",
                   "deviceName": d.get("deviceName") or f"persistent-disk-{i}", "index": i,
                   "boot": bool(d.get("boot")), "autoDelete": d.get("autoDelete", False),
                   "interface": "SCSI", "diskSizeGb": str(size), "architecture": "X86_64"}
            if image:
                out["licenses"] = image["licenses"]
                out["guestOsFeatures"] = image["guestOsFeatures"]
                image_projects.append(self._strip_compute(image["selfLink"]).split("/")[1])
            out_disks.append(out)
        # -- guest accelerators (https://cloud.google.com/compute/docs/gpus/create-vm-with-gpus)
        accs = body.get("guestAccelerators") or []
        out_accs = []
        for i, a in enumerate(accs):
            afield = f"{root}.guestAccelerators[{i}].acceleratorType"
            a_name = self._zonal_ref(project, zone, a.get("acceleratorType"), "acceleratorTypes", afield, bare=bare)
            gpu = GPU_TYPES.get(a_name)
            if gpu is None or zone not in gpu["zones"]:
                raise _invalid(afield, a.get("acceleratorType"),
                               f"Accelerator type '{a_name}' does not exist in zone '{zone}'.")
            n = int(a.get("acceleratorCount") or 0)
            if mt["gpus"]:  # accelerator-optimized: the GPUs come with the machine type and must match it
                if (a_name, n) != mt["gpus"]:
                    raise _invalid(afield, a.get("acceleratorType"), f"Machine type {mt_name} comes with "
                                   f"{mt['gpus'][1]} {mt['gpus'][0]}; guestAccelerators must match or be omitted.")
            elif mt["family"] != "n1" or a_name not in N1_ATTACHABLE_GPUS:
                raise _invalid(afield, a.get("acceleratorType"),
                               f"Accelerator type '{a_name}' cannot be attached to machine type '{mt_name}'.")
            elif n not in gpu["counts"]:
                raise _invalid(f"{root}.guestAccelerators[{i}].acceleratorCount", n,
                               f"Invalid number of accelerators for {a_name}; valid counts: {list(gpu['counts'])}.")
            out_accs.append((a_name, n))
        if mt["gpus"] and not out_accs:
            out_accs = [mt["gpus"]]
        has_gpu = bool(out_accs)
        # -- scheduling (https://cloud.google.com/compute/docs/reference/rest/v1/instances#scheduling,
        #    https://cloud.google.com/compute/docs/instances/spot, https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance)
        sched_in = dict(body.get("scheduling") or {})
        sfield = f"{root}.scheduling"
        model = sched_in.get("provisioningModel") or "STANDARD"
        if model not in ("STANDARD", "SPOT"):
            raise _invalid(f"{sfield}.provisioningModel", model,
                           "Only STANDARD and SPOT provisioning models are supported here (FLEX_START and "
                           "RESERVATION_BOUND need maxRunDuration and a reservation).")
        preemptible = bool(sched_in.get("preemptible", False))
        if preemptible and sched_in.get("provisioningModel") == "STANDARD":
            raise _invalid(f"{sfield}.preemptible", "true", "Preemptible instances must not use the STANDARD provisioning model.")
        interruptible = model == "SPOT" or preemptible
        ohm = sched_in.get("onHostMaintenance")
        if ohm is not None and ohm not in ("MIGRATE", "TERMINATE"):
            raise _invalid(f"{sfield}.onHostMaintenance", ohm, "Must be MIGRATE or TERMINATE.")
        auto = sched_in.get("automaticRestart")
        if interruptible:
            if auto is True:
                raise _invalid(f"{sfield}.automaticRestart", "true", "Spot and preemptible instances cannot be "
                               "automatically restarted (Scheduling must have automaticRestart be false).")
            if ohm == "MIGRATE":
                raise _invalid(f"{sfield}.onHostMaintenance", "MIGRATE", "Scheduling must have preemptible be false "
                               "when OnHostMaintenance isn't TERMINATE (Spot VMs cannot live migrate).")
            ohm, auto = "TERMINATE", False
        action = sched_in.get("instanceTerminationAction")
        mrd = sched_in.get("maxRunDuration")
        if mrd is not None:
            # https://cloud.google.com/compute/docs/instances/limit-vm-runtime: "between 30 seconds and 120 days",
            # and "you must also specify the termination action".
            try:
                seconds = int((mrd or {}).get("seconds", 0))
            except (TypeError, ValueError):
                seconds = -1
            if not 30 <= seconds <= 120 * 86400:
                raise _invalid(f"{sfield}.maxRunDuration.seconds", str((mrd or {}).get("seconds")),
                               "Must be between 30 seconds and 120 days.")
            if action is None:
                raise _invalid(f"{sfield}.instanceTerminationAction", "", "An instanceTerminationAction (STOP or "
                               "DELETE) is required with maxRunDuration.")
        if action is not None:
            if action not in ("STOP", "DELETE"):
                raise _invalid(f"{sfield}.instanceTerminationAction", action, "Must be STOP or DELETE.")
            # A standard VM has a termination action only with a limited run time:
            # https://cloud.google.com/compute/docs/instances/limit-vm-runtime
            if not interruptible and not sched_in.get("maxRunDuration") and not sched_in.get("terminationTime"):
                raise _invalid(f"{sfield}.instanceTerminationAction", action, "An instance termination action can "
                               "only be set for Spot VMs or VMs with a maxRunDuration or terminationTime.")
        if has_gpu and (ohm or "MIGRATE") != "TERMINATE":
            raise _invalid(f"{sfield}.onHostMaintenance", ohm or "MIGRATE",
                           "Instances with guest accelerators do not support live migration.")
        sched = {"onHostMaintenance": ohm or "MIGRATE", "automaticRestart": True if auto is None else bool(auto),
                 "preemptible": preemptible, "provisioningModel": model}
        if interruptible:
            sched["instanceTerminationAction"] = action or "STOP"
        elif action:
            sched["instanceTerminationAction"] = action
        for k in ("maxRunDuration", "terminationTime"):
            if k in sched_in:
                sched[k] = sched_in[k]
        # -- network interfaces (https://cloud.google.com/compute/docs/reference/rest/v1/instances#networkinterface)
        nics = body.get("networkInterfaces") or []
        if len(nics) != 1:
            raise _invalid(f"{root}.networkInterfaces", "", "Exactly one network interface is supported here.")
        nic_in = nics[0]
        network, subnetwork = self._network_refs(project, zone, nic_in, f"{root}.networkInterfaces[0]")
        acs = nic_in.get("accessConfigs") or []
        if len(acs) > 1:
            raise _invalid(f"{root}.networkInterfaces[0].accessConfigs", "", "At most one access config per network interface.")
        out_acs = []
        for ac in acs:
            if (ac.get("type") or "ONE_TO_ONE_NAT") != "ONE_TO_ONE_NAT":
                raise _invalid(f"{root}.networkInterfaces[0].accessConfigs[0].type", ac.get("type"),
                               "The only IPv4 access config type is ONE_TO_ONE_NAT.")
            if ac.get("natIP"):
                raise _invalid(f"{root}.networkInterfaces[0].accessConfigs[0].natIP", ac["natIP"],
                               "The referenced address resource cannot be found (no static addresses here).")
            out_acs.append({"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                            "name": ac.get("name") or "External NAT", "networkTier": ac.get("networkTier") or "PREMIUM"})
        # -- service accounts ("default" is the project's Compute Engine default service account)
        sas = []
        for sa in body.get("serviceAccounts") or []:
            email = sa.get("email") or "default"
            if email == "default":
                email = f"{self.project_number(project)}-compute@developer.gserviceaccount.com"
            elif "@" not in email:
                raise _invalid(f"{root}.serviceAccounts[0].email", email, "Invalid service account email.")
            sas.append({"email": email, "scopes": list(sa.get("scopes") or [])})
        # -- metadata
        items = (body.get("metadata") or {}).get("items") or []
        keys = [i.get("key") for i in items]
        if len(set(keys)) != len(keys):
            raise _invalid(f"{root}.metadata", "", "Duplicate metadata keys.")
        # -- quota demand (https://cloud.google.com/compute/resource-usage): the family CPU quota and CPUS_ALL_REGIONS,
        #    the GPU quota and GPUS_ALL_REGIONS, IN_USE_ADDRESSES for an ephemeral external IPv4 address, disk quotas,
        #    INSTANCES. A Spot VM's CPUs and GPUs count against PREEMPTIBLE_CPUS and PREEMPTIBLE_<GPU metric> where the
        #    project has that quota (https://cloud.google.com/compute/docs/instances/spot#quotas; _spot_metric).
        spot = interruptible
        demand = [(self._spot_metric(CPU_METRIC.get(mt["family"], "CPUS"), region, spot), float(mt["cpus"])),
                  ("CPUS_ALL_REGIONS", float(mt["cpus"])), ("INSTANCES", 1.0)]
        for a_name, n in out_accs:
            demand += [(self._spot_metric(GPU_TYPES[a_name]["metric"], region, spot), float(n)),
                       ("GPUS_ALL_REGIONS", float(n))]
        if out_acs:
            demand.append(("IN_USE_ADDRESSES", 1.0))
        demand += disk_demand

        self._authorize_instance(project, zone, name, body, subnetwork, bool(out_acs), sas, image_projects)
        z = f"{COMPUTE}/projects/{project}/zones/{zone}"
        inst = {
            "kind": "compute#instance", "name": name, "description": body.get("description", ""),
            "shieldedInstanceConfig": {"enableSecureBoot": False, "enableVtpm": True, "enableIntegrityMonitoring": True,
                                       **(body.get("shieldedInstanceConfig") or {})},
            "tags": {"items": list(tags), "fingerprint": _fingerprint(tags)},
            "machineType": f"{z}/machineTypes/{mt_name}", "zone": z, "canIpForward": bool(body.get("canIpForward")),
            "networkInterfaces": [{"kind": "compute#networkInterface", "network": network, "subnetwork": subnetwork,
                                   "name": "nic0", "stackType": "IPV4_ONLY", "fingerprint": _fingerprint(name),
                                   **({"accessConfigs": out_acs} if out_acs else {})}],
            "disks": out_disks,
            "metadata": {"kind": "compute#metadata", "fingerprint": _fingerprint(items), "items": copy.deepcopy(items)},
            "serviceAccounts": sas, "scheduling": sched, "cpuPlatform": "Intel Cascade Lake",
            "labels": dict(labels), "labelFingerprint": _fingerprint(labels), "startRestricted": False,
            "deletionProtection": bool(body.get("deletionProtection")), "fingerprint": _fingerprint([name, zone]),
            "selfLink": f"{z}/instances/{name}",
            "_demand": demand, "_spot": spot,
        }
        if out_accs:
            inst["guestAccelerators"] = [{"acceleratorType": f"{z}/acceleratorTypes/{a}", "acceleratorCount": n}
                                         for a, n in out_accs]
        if not sas:
            inst.pop("serviceAccounts")
        return inst

    def _authorize_instance(self, project: str, zone: str, name: str, body: dict, subnetwork: str, external: bool,
                            accounts: list[dict], image_projects: list[str]) -> None:
        """What creating this instance takes besides compute.instances.create, as instances.insert's reference lists
        it (https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert, "IAM Permissions", and
        https://cloud.google.com/compute/docs/access/iam#the_serviceaccountuser_role): the disks, the subnetwork (its
        own project's: a Shared VPC host's), an external address on it, metadata, tags, labels, and for a service
        account both setting it and acting as it (iam.serviceAccounts.actAs on that account)."""
        self.require("compute.disks.create", f"projects/{project}/zones/{zone}/disks/{name}")
        sub = self._strip_compute(subnetwork)
        self.require("compute.subnetworks.use", sub)
        if external:
            self.require("compute.subnetworks.useExternalIp", sub)
        if (body.get("metadata") or {}).get("items"):
            self.require("compute.instances.setMetadata", f"projects/{project}/zones/{zone}/instances/{name}")
        if (body.get("tags") or {}).get("items"):
            self.require("compute.instances.setTags", f"projects/{project}/zones/{zone}/instances/{name}")
        if body.get("labels"):
            self.require("compute.instances.setLabels", f"projects/{project}/zones/{zone}/instances/{name}")
        for sa in accounts:
            self.require("compute.instances.setServiceAccount", f"projects/{project}/zones/{zone}/instances/{name}")
            self.require("iam.serviceAccounts.actAs", self.account_resource(sa["email"]))
        for image_project in image_projects:
            self.require("compute.images.useReadOnly", f"projects/{image_project}")

    def _materialize(self, project: str, zone: str, inst: dict, request_body: dict) -> dict:
        """Give a validated instance its id, addresses and clocks, and store it."""
        k = self._alloc_addr()
        internal, external = self.addresses_of(k)
        nic = inst["networkInterfaces"][0]
        nic["networkIP"] = internal
        for ac in nic.get("accessConfigs") or []:
            ac["natIP"] = external
        inst.update(id=str(next(self._ids)), creationTimestamp=_now_rfc3339(), _addr=k,
                    _created_at=time.monotonic(), _stuck=any(s in inst["name"] for s in self.faults.stuck_names))
        self.instances[(project, zone, inst["name"])] = inst
        self.created.append(("instance", copy.deepcopy(request_body)))
        return inst

    def _check_request_id(self, request_id: str | None) -> None:
        # "The request ID must be a valid UUID with the exception that zero UUID is not supported"
        # (https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert, requestId)
        if request_id is not None and not _is_uuid(request_id):
            raise _invalid("requestId", request_id, "Must be a valid UUID (the zero UUID is not supported).")

    # -- compute: instances --------------------------------------------------------------------------------
    def insert_instance(self, project: str, zone: str, body: dict, request_id: str | None) -> dict:
        """instances.insert: https://cloud.google.com/compute/docs/reference/rest/v1/instances/insert"""
        with self.lock:
            self._zone_check(zone)
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            self._project(project)
            name = body.get("name") or ""
            if (project, zone, name) in self.instances:
                raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                               "alreadyExists")
            try:
                inst = self._build_instance(project, zone, body, bare=False, root="resource")
            except _InternalError:  # not reachable for insert (URLs are what it takes)
                raise ApiError(500, "Internal error.", "backendError") from None
            self._org_policy(project, zone, body, name)
            target = f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{name}"
            error = self._label_fault(project, zone, inst["labels"], inst["machineType"].rsplit("/", 1)[-1])
            if error is None:
                n, exceeded = self._quota_fit(project, ZONES[zone], [inst["_demand"]])
                if exceeded:
                    error = self.quota_error(*exceeded)
            if error is not None:
                self._sync_refusal(error)
                status = (503, "SERVICE UNAVAILABLE") if error["code"].startswith("ZONE_RESOURCE") else (403, "FORBIDDEN")
                op = self._new_op("zone", project, zone, "insert", target, request_id=request_id, error={
                    "error": {"errors": [error]}, "httpErrorStatusCode": status[0], "httpErrorMessage": status[1]})
                return self._op_view(op)
            self._materialize(project, zone, inst, body)
            self._pending_created = self._pending_created + [inst]
            op = self._new_op("zone", project, zone, "insert", target, request_id=request_id)
            op["targetId"] = inst["id"]
            return self._op_view(op)

    def _org_policy(self, project: str, zone: str, body: dict, name: str) -> None:
        """Refuse an instance the effective organization policies (set_org_policy; only for a project in the
        organization) forbid, synchronously, as Compute Engine does: HTTP 412, reason conditionNotMet, "Constraint
        constraints/NAME violated for project NUMBER. ..." (as public reports of real refusals quote it).

        - compute.vmExternalIpAccess: an access config on any interface where a rule denies all, or allowed values do
          not list the instance (projects/P/zones/Z/instances/N); its managed twin compute.managed.vmExternalIpAccess
          enforced: any access config (https://cloud.google.com/compute/docs/access/managed-constraints);
        - compute.requireOsLogin (and compute.managed.requireOsLogin) enforced: enable-oslogin set to false in the
          instance's metadata (https://cloud.google.com/compute/docs/oslogin/manage-oslogin-in-an-org; Google applies
          it to metadata set later too, which the stand-in does not implement);
        - compute.trustedImageProjects: a boot or data disk from an image of a project the policy does not allow;
        - compute.requireShieldedVm enforced: an instance without Secure Boot in shieldedInstanceConfig, or whose
          boot image is not Shielded VM compatible (UEFI_COMPATIBLE) ("requires all new Compute Engine VM instances
          to use Shielded disk images with Secure Boot, vTPM, and Integrity Monitoring options enabled",
          https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints);
        - gcp.resourceLocations: the instance's zone outside the allowed locations
          (https://cloud.google.com/resource-manager/docs/organization-policy/defining-locations)."""
        number = self.project_number(project)
        where = f"projects/{project}/zones/{zone}/instances/{name}"
        ips = self.org_rules(project, "compute.vmExternalIpAccess")
        allowed = [v for r in ips for v in (r.get("values") or {}).get("allowedValues", [])]
        external = any(nic.get("accessConfigs") for nic in body.get("networkInterfaces") or [])
        if external and (self.org_policy_enforced(project, "compute.managed.vmExternalIpAccess") or (
                not any(r.get("allowAll") for r in ips) and (
                    any(r.get("denyAll") for r in ips) or allowed and where not in allowed))):
            constraint = ("compute.managed.vmExternalIpAccess"
                          if self.org_policy_enforced(project, "compute.managed.vmExternalIpAccess")
                          else "compute.vmExternalIpAccess")
            raise ApiError(412, f"Constraint constraints/{constraint} violated for project {number}. Add "
                           f"instance {where} to the constraint to use external IP with it.", "conditionNotMet")
        items = (body.get("metadata") or {}).get("items") or []
        for constraint in ("compute.requireOsLogin", "compute.managed.requireOsLogin"):
            if self.org_policy_enforced(project, constraint) and any(
                    i.get("key") == "enable-oslogin" and str(i.get("value", "")).strip().lower() == "false"
                    for i in items):
                raise ApiError(412, f"Constraint constraints/{constraint} violated for project {number}. "
                               f"Instance {where} may not set metadata enable-oslogin to false.", "conditionNotMet")
        # compute.trustedImageProjects: a disk may be created from an image only if its project is one the policy
        # allows (https://cloud.google.com/compute/docs/images/restricting-image-access; values "projects/PROJECT",
        # also written "is:projects/PROJECT"); the message's second sentence as public reports of refusals quote it.
        trusted = self.org_rules(project, "compute.trustedImageProjects")
        images = []
        for disk in body.get("disks") or []:
            source = (disk.get("initializeParams") or {}).get("sourceImage")
            if not source:
                continue
            m = re.match(r"projects/([^/]+)/", self._strip_compute(source))
            image_project = m.group(1) if m else project  # global/images/...: the instance's own project
            images.append((image_project, source))
            if trusted and not _list_admits(trusted, f"projects/{image_project}"):
                raise ApiError(412, f"Constraint constraints/compute.trustedImageProjects violated for project "
                               f"{number}. Use of images from project {image_project} is prohibited.",
                               "conditionNotMet")
        if self.org_policy_enforced(project, "compute.requireShieldedVm"):
            shielded = body.get("shieldedInstanceConfig") or {}
            if not shielded.get("enableSecureBoot"):
                raise ApiError(412, f"Constraint constraints/compute.requireShieldedVm violated for project {number}. "
                               "Secure Boot is not enabled in the 'shielded_instance_config' field.", "conditionNotMet")
            for image_project, source in images:
                image = self._image(image_project, source, "disks[].initializeParams.sourceImage")
                if not any(f.get("type") == "UEFI_COMPATIBLE" for f in image.get("guestOsFeatures", [])):
                    raise ApiError(412, f"Constraint constraints/compute.requireShieldedVm violated for project "
                                   f"{number}. The boot image {image['name']} is not a Shielded VM image.",
                                   "conditionNotMet")
        self._check_location(project, zone, f"instance {where}")

    def _check_location(self, project: str, location: str, what: str) -> None:
        """gcp.resourceLocations: refuse a resource in a location the organization does not allow (412)."""
        rules = self.org_rules(project, "gcp.resourceLocations")
        if rules and not location_admitted(rules, location):
            raise ApiError(412, f"Constraint constraints/gcp.resourceLocations violated for project "
                           f"{self.project_number(project)}. Location {location} of {what} is not allowed by the "
                           "organization's resource location policy.", "conditionNotMet")

    def _sync_refusal(self, error: dict) -> None:
        """Faults.fail_sync: the call itself is refused (bulk API troubleshooting: HTTP 403 quotaExceeded,
        HTTP 503 insufficientCapacity; https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation)."""
        if not self.faults.fail_sync:
            return
        if error["code"] == "QUOTA_EXCEEDED":
            raise ApiError(403, error["message"], "quotaExceeded", domain="usageLimits")
        raise ApiError(503, error["message"], "insufficientCapacity")

    def bulk_insert(self, project: str, zone: str, body: dict, request_id: str | None) -> dict:
        """instances.bulkInsert: https://cloud.google.com/compute/docs/reference/rest/v1/instances/bulkInsert
        (BulkInsertInstanceResource: count, minCount, namePattern, perInstanceProperties;
        https://cloud.google.com/compute/docs/reference/rest/v1/BulkInsertInstanceResource)."""
        with self.lock:
            self._zone_check(zone)
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            self._project(project)
            target = f"{COMPUTE}/projects/{project}/zones/{zone}/instances"
            if body.get("sourceInstanceTemplate"):
                raise _invalid("resource.sourceInstanceTemplate", body["sourceInstanceTemplate"],
                               "The referenced instance template cannot be found.")
            props = body.get("instanceProperties")
            if not props:
                raise _invalid("resource.instanceProperties", "",
                               "instanceProperties is required if sourceInstanceTemplate is not provided.")
            try:
                count = int(body.get("count") or 0)
                min_count = int(body.get("minCount") or count)
            except (TypeError, ValueError):
                raise _invalid("resource.count", body.get("count"), "Must be an integer.") from None
            if count < 1:
                raise _invalid("resource.count", body.get("count", ""), "Must be greater than 0.")
            if not 1 <= min_count <= count:
                raise _invalid("resource.minCount", min_count, "Must be between 1 and count.")
            per = body.get("perInstanceProperties") or {}
            pattern = body.get("namePattern")
            if not per and not pattern:
                raise _invalid("resource.namePattern", "", "Either namePattern or perInstanceProperties must be set.")
            if len(per) > count:
                raise _invalid("resource.perInstanceProperties", "",
                               f"The number of per-instance properties ({len(per)}) exceeds count ({count}).")
            names = list(per.keys())
            if len(names) < count:
                if not pattern:
                    raise _invalid("resource.count", count, f"count ({count}) exceeds the number of per-instance "
                                   f"names ({len(names)}) and there is no namePattern to name the rest.")
                m = re.fullmatch(r"([^#]*)(#{1,18})([^#]*)", pattern)
                if not m:
                    raise _invalid("resource.namePattern", pattern, "The pattern must contain one continuous sequence "
                                   "of up to 18 placeholder hash characters (#).")
                pre, hashes, post = m.groups()
                # "If existing instances ... match the name pattern then the generated instance numbers start after
                # the biggest existing number."
                rx = re.compile(re.escape(pre) + rf"(\d{{{len(hashes)}}})" + re.escape(post))
                taken = [int(mm.group(1)) for (p, z, n) in self.instances if p == project and z == zone
                         for mm in [rx.fullmatch(n)] if mm]
                nxt = max(taken, default=0) + 1
                while len(names) < count:
                    names.append(f"{pre}{str(nxt).zfill(len(hashes))}{post}")
                    nxt += 1
            for n in names:
                if (project, zone, n) in self.instances:
                    raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/{n}' already exists",
                                   "alreadyExists")
            bodies = [{**copy.deepcopy(props), "name": n} for n in names]
            insts = []
            for b in bodies:
                try:
                    insts.append(self._build_instance(project, zone, b, bare=True, root="resource.instanceProperties"))
                except _InternalError:
                    # Documented: a machine type URL in instanceProperties "will result in an INTERNAL_ERROR".
                    op = self._new_op("zone", project, zone, "bulkInsert", target, request_id=request_id, error={
                        "error": {"errors": [{"code": "INTERNAL_ERROR", "message": "Internal error. Please try again "
                                              "or contact Google Support. (Code: '-1234567890')"}]},
                        "httpErrorStatusCode": 500, "httpErrorMessage": "INTERNAL SERVER ERROR"})
                    return self._op_view(op)
            for b in bodies:
                self._org_policy(project, zone, b, b["name"])
            # How many can be made: the fail_nth knob (per instance, in order), then configured quotas.
            error, fit = None, len(insts)
            for i, inst in enumerate(insts):
                e = self._label_fault(project, zone, inst["labels"], inst["machineType"].rsplit("/", 1)[-1])
                if e is not None:
                    error, fit = e, i
                    break
            n_quota, exceeded = self._quota_fit(project, ZONES[zone], [i["_demand"] for i in insts[:fit]])
            if exceeded and n_quota < fit:
                error, fit = self.quota_error(*exceeded), n_quota
            group = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
            loc = f"zones/{zone}"
            if fit < min_count:
                # All or nothing up to minCount: "If minCount instances cannot be created, then no instances will be
                # created and instances already created will be deleted." The operation reports the summary first,
                # then the cause (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation).
                self._sync_refusal(error)
                status = (503, "SERVICE UNAVAILABLE") if error["code"].startswith("ZONE_RESOURCE") else (403, "FORBIDDEN")
                op = self._new_op("zone", project, zone, "bulkInsert", target, request_id=request_id, error={
                    "error": {"errors": ([error] if self.faults.bulk_cause_first else []) + [
                        {"code": "VM_MIN_COUNT_NOT_REACHED",
                         "message": f"Requested minimum count of {min_count} VMs could not be created."}]
                        + ([] if self.faults.bulk_cause_first else [error])},
                    "httpErrorStatusCode": status[0], "httpErrorMessage": status[1]},
                    extra={"operationGroupId": group})
                op["_bulk_done"] = {"perLocationStatus": {loc: {
                    "status": "DONE", "targetVmCount": count, "createdVmCount": 0, "failedToCreateVmCount": count,
                    "deletedVmCount": fit}}}
                return self._op_view(op)
            made = []
            for b, inst in zip(bodies[:fit], insts[:fit]):
                made.append(self._materialize(project, zone, inst, b))
            self._pending_created = self._pending_created + made
            op = self._new_op("zone", project, zone, "bulkInsert", target, request_id=request_id,
                              extra={"operationGroupId": group})
            op["_bulk_done"] = {"perLocationStatus": {loc: {
                "status": "DONE", "targetVmCount": count, "createdVmCount": fit,
                "failedToCreateVmCount": count - fit, "deletedVmCount": 0}}}
            return self._op_view(op)

    def list_instances(self, project: str, zone: str, query: dict) -> dict:
        """instances.list: https://cloud.google.com/compute/docs/reference/rest/v1/instances/list"""
        with self.lock:
            self._zone_check(zone)
            terms = parse_filter(query.get("filter", [None])[0])
            items = [self._instance_view(i) for (p, z, _), i in sorted(self.instances.items()) if p == project and z == zone]
        items = [i for i in items if matches(i, terms)]
        return self._page(items, query, "compute#instanceList", f"projects/{project}/zones/{zone}/instances")

    @staticmethod
    def _page(items: list, query: dict, kind: str, link: str, key: str = "items") -> dict:
        max_results = int(query.get("maxResults", query.get("pageSize", ["500"]))[0] or 500)
        if not 0 <= max_results <= 500:  # "Acceptable values are 0 to 500, inclusive. (Default: 500)"
            raise _invalid("maxResults", max_results, "Must be between 0 and 500.")
        max_results = max_results or 500
        start = int(query.get("pageToken", ["0"])[0] or 0)
        page = items[start:start + max_results]
        out = {"kind": kind, "id": link, "selfLink": f"{COMPUTE}/{link}"}
        if page:
            out[key] = page
        if start + max_results < len(items):
            out["nextPageToken"] = str(start + max_results)
        return out

    def get_instance(self, project: str, zone: str, name: str) -> dict:
        with self.lock:
            self._zone_check(zone)
            inst = self.instances.get((project, zone, name))
            if inst is None:
                raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                               "notFound")
            return self._instance_view(inst)

    def delete_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict:
        """instances.delete: https://cloud.google.com/compute/docs/reference/rest/v1/instances/delete"""
        with self.lock:
            self._zone_check(zone)
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            inst = self.instances.get((project, zone, name))
            if inst is None:
                raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                               "notFound")
            if inst.get("deletionProtection"):
                raise ApiError(400, "Invalid resource usage: 'Resource cannot be deleted if it's protected against "
                                    "deletion.'.", "resourceInUseByAnotherResource")
            if inst.get("_deleted_at") is None:
                inst["_deleted_at"] = time.monotonic()
            op = self._new_op("zone", project, zone, "delete", inst["selfLink"], request_id=request_id,
                              done_after=self.timing.stopping_s + 0.01)
            return self._op_view(op)

    def _instance_for_change(self, project: str, zone: str, name: str, request_id: str | None, verb: str):
        """The instance a start or stop is for, or the operation a repeated request id already made."""
        self._zone_check(zone)
        self._check_request_id(request_id)
        if request_id and ("compute", project, request_id) in self.request_ids:
            return None, self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
        inst = self.instances.get((project, zone, name))
        if inst is None:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                           "notFound")
        if inst.get("_deleted_at") is not None:
            raise ApiError(400, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready",
                           "resourceNotReady")
        return inst, None

    def _stop(self, inst: dict) -> None:
        if not inst.get("_terminated"):
            inst["_terminated"] = True
            inst["lastStopTimestamp"] = _now_rfc3339()
            self._pending_stopped = self._pending_stopped + [inst]

    def stop_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict:
        """instances.stop: https://cloud.google.com/compute/docs/reference/rest/v1/instances/stop ("Stops a
        running instance, shutting it down cleanly, and allows you to restart the instance at a later time.
        Stopped instances do not incur VM usage charges while they are stopped"). The VM keeps its internal
        address; an ephemeral external address is kept here too. Stopping a stopped VM changes nothing."""
        with self.lock:
            inst, repeated = self._instance_for_change(project, zone, name, request_id, "stop")
            if repeated is not None:
                return repeated
            self._stop(inst)
            return self._op_view(self._new_op("zone", project, zone, "stop", inst["selfLink"], request_id=request_id,
                                              done_after=self.timing.stopping_s))

    def start_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict:
        """instances.start: https://cloud.google.com/compute/docs/reference/rest/v1/instances/start ("Starts an
        instance that was stopped using the instances().stop method"): TERMINATED -> PROVISIONING -> STAGING ->
        RUNNING, on the stand-in's clocks; the VM boots again (its processes are gone). Starting a VM that is
        not stopped changes nothing."""
        with self.lock:
            inst, repeated = self._instance_for_change(project, zone, name, request_id, "start")
            if repeated is not None:
                return repeated
            if inst.pop("_terminated", None):
                inst["_started_at"] = time.monotonic()
                inst["lastStartTimestamp"] = _now_rfc3339()
                self._pending_started = self._pending_started + [inst]
            return self._op_view(self._new_op("zone", project, zone, "start", inst["selfLink"], request_id=request_id))

    def preempt_instance(self, project: str, zone: str, name: str) -> None:
        """Play a Spot preemption: instanceTerminationAction STOP -> TERMINATED, DELETE -> deleted.
        https://cloud.google.com/compute/docs/instances/spot#preemption-process"""
        with self.lock:
            inst = self.instances[(project, zone, name)]
            if inst["scheduling"].get("instanceTerminationAction") == "DELETE":
                inst.setdefault("_deleted_at", time.monotonic())
            else:
                self._stop(inst)
        self.tick()

    # -- compute: operations ---------------------------------------------------------------------------------
    def get_op(self, project: str, scope: str, where: str | None, name: str, wait: bool = False) -> dict:
        """zoneOperations/regionOperations/globalOperations get and wait ("Waits for the specified Operation
        resource to return as DONE or for the request to approach the 2 minute deadline";
        https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/wait). Here: 2 s."""
        with self.lock:
            op = self.ops.get(name)
            if op is None or op.get("_scope") != scope or op.get("_project") != project or op.get("_where") != where:
                loc = {"zone": f"zones/{where}", "region": f"regions/{where}", "global": "global"}[scope]
                raise ApiError(404, f"The resource 'projects/{project}/{loc}/operations/{name}' was not found", "notFound")
        if wait:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < min(op["_done_at"], deadline):
                time.sleep(min(0.02, max(op["_done_at"] - time.monotonic(), 0.001)))
        with self.lock:
            return self._op_view(op)

    # -- compute: catalogs --------------------------------------------------------------------------------------
    def _machine_type_view(self, project: str, zone: str, name: str) -> dict:
        mt = MACHINE_TYPES[name]
        out = {"kind": "compute#machineType", "id": str(int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)),
               "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "name": name,
               "description": (f"{mt['cpus']} vCPUs, {mt['memory_mb'] / 1024:g} GB RAM" if not mt["shared"]
                               else f"{mt['cpus']} shared vCPUs, {mt['memory_mb'] / 1024:g} GB RAM"),
               "guestCpus": mt["cpus"], "memoryMb": mt["memory_mb"], "imageSpaceGb": 0,
               "maximumPersistentDisks": 128, "maximumPersistentDisksSizeGb": "263168", "zone": zone,
               "selfLink": f"{COMPUTE}/projects/{project}/zones/{zone}/machineTypes/{name}",
               "isSharedCpu": mt["shared"], "architecture": "X86_64"}
        if mt["gpus"]:
            out["accelerators"] = [{"guestAcceleratorType": mt["gpus"][0], "guestAcceleratorCount": mt["gpus"][1]}]
        return out

    def get_machine_type(self, project: str, zone: str, name: str) -> dict:
        """machineTypes.get: https://cloud.google.com/compute/docs/reference/rest/v1/machineTypes/get"""
        self._zone_check(zone)
        mt = MACHINE_TYPES.get(name)
        if mt is None or zone not in mt["zones"]:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/machineTypes/{name}' was not found", "notFound")
        return self._machine_type_view(project, zone, name)

    def list_machine_types(self, project: str, zone: str, query: dict) -> dict:
        self._zone_check(zone)
        terms = parse_filter(query.get("filter", [None])[0])
        items = [self._machine_type_view(project, zone, n) for n, mt in MACHINE_TYPES.items() if zone in mt["zones"]]
        return self._page([i for i in items if matches(i, terms)], query, "compute#machineTypeList",
                          f"projects/{project}/zones/{zone}/machineTypes")

    def _accelerator_view(self, project: str, zone: str, name: str) -> dict:
        g = GPU_TYPES[name]
        return {"kind": "compute#acceleratorType", "id": str(int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)),
                "creationTimestamp": "1969-12-31T16:00:00.000-08:00", "name": name, "description": g["description"],
                "zone": f"{COMPUTE}/projects/{project}/zones/{zone}", "maximumCardsPerInstance": g["max_cards"],
                "selfLink": f"{COMPUTE}/projects/{project}/zones/{zone}/acceleratorTypes/{name}"}

    def get_accelerator_type(self, project: str, zone: str, name: str) -> dict:
        """acceleratorTypes.get: https://cloud.google.com/compute/docs/reference/rest/v1/acceleratorTypes/get"""
        self._zone_check(zone)
        g = GPU_TYPES.get(name)
        if g is None or zone not in g["zones"]:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/acceleratorTypes/{name}' was not found",
                           "notFound")
        return self._accelerator_view(project, zone, name)

    def list_accelerator_types(self, project: str, zone: str, query: dict) -> dict:
        self._zone_check(zone)
        terms = parse_filter(query.get("filter", [None])[0])
        items = [self._accelerator_view(project, zone, n) for n, g in GPU_TYPES.items() if zone in g["zones"]]
        return self._page([i for i in items if matches(i, terms)], query, "compute#acceleratorTypeList",
                          f"projects/{project}/zones/{zone}/acceleratorTypes")

    def _disk_type_view(self, project: str, zone: str, name: str) -> dict:
        d = DISK_TYPES[name]
        return {"kind": "compute#diskType", "name": name, "description": d["description"], "validDiskSize": "10GB-65536GB",
                "zone": f"{COMPUTE}/projects/{project}/zones/{zone}", "defaultDiskSizeGb": str(d["default_gb"]),
                "selfLink": f"{COMPUTE}/projects/{project}/zones/{zone}/diskTypes/{name}"}

    def get_disk_type(self, project: str, zone: str, name: str) -> dict:
        """diskTypes.get: https://cloud.google.com/compute/docs/reference/rest/v1/diskTypes/get"""
        self._zone_check(zone)
        if name not in DISK_TYPES:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/diskTypes/{name}' was not found", "notFound")
        return self._disk_type_view(project, zone, name)

    def list_disk_types(self, project: str, zone: str, query: dict) -> dict:
        self._zone_check(zone)
        return self._page([self._disk_type_view(project, zone, n) for n in DISK_TYPES], query, "compute#diskTypeList",
                          f"projects/{project}/zones/{zone}/diskTypes")

    def get_image(self, project: str, name: str) -> dict:
        """images.get: https://cloud.google.com/compute/docs/reference/rest/v1/images/get"""
        img = IMAGES.get((project, name))
        if img is None:
            raise ApiError(404, f"The resource 'projects/{project}/global/images/{name}' was not found", "notFound")
        return copy.deepcopy(img)

    def get_image_from_family(self, project: str, family: str) -> dict:
        """images.getFromFamily ("the latest image that is part of an image family and is not deprecated"):
        https://cloud.google.com/compute/docs/reference/rest/v1/images/getFromFamily"""
        img = self._image_from_family(project, family)
        if img is None:
            raise ApiError(404, f"The resource 'projects/{project}/global/images/family/{family}' was not found", "notFound")
        return copy.deepcopy(img)

    def list_images(self, project: str, query: dict) -> dict:
        terms = parse_filter(query.get("filter", [None])[0])
        items = [copy.deepcopy(i) for (p, _), i in sorted(IMAGES.items()) if p == project]
        return self._page([i for i in items if matches(i, terms)], query, "compute#imageList",
                          f"projects/{project}/global/images")

    def get_network(self, project: str, name: str) -> dict:
        """networks.get: https://cloud.google.com/compute/docs/reference/rest/v1/networks/get"""
        with self.lock:
            self._project(project)
            net = self.networks.get((project, name))
            if net is None:
                raise ApiError(404, f"The resource 'projects/{project}/global/networks/{name}' was not found", "notFound")
            return copy.deepcopy(net)

    def list_networks(self, project: str, query: dict) -> dict:
        with self.lock:
            self._project(project)
            items = [copy.deepcopy(n) for (p, _), n in sorted(self.networks.items()) if p == project]
        return self._page(items, query, "compute#networkList", f"projects/{project}/global/networks")

    def get_subnetwork(self, project: str, region: str, name: str) -> dict:
        """subnetworks.get: https://cloud.google.com/compute/docs/reference/rest/v1/subnetworks/get"""
        with self.lock:
            self._region_check(region)
            self._project(project)
            sub = self.subnetworks.get((project, region, name))
            if sub is None:
                raise ApiError(404, f"The resource 'projects/{project}/regions/{region}/subnetworks/{name}' was not found",
                               "notFound")
            return copy.deepcopy(sub)

    def list_subnetworks(self, project: str, region: str, query: dict) -> dict:
        with self.lock:
            self._region_check(region)
            self._project(project)
            terms = parse_filter(query.get("filter", [None])[0])
            items = [copy.deepcopy(s) for (p, r, _), s in sorted(self.subnetworks.items()) if p == project and r == region]
        return self._page([i for i in items if matches(i, terms)], query, "compute#subnetworkList",
                          f"projects/{project}/regions/{region}/subnetworks")

    def set_private_ip_google_access(self, project: str, region: str, name: str, body: dict,
                                     request_id: str | None) -> dict:
        """subnetworks.setPrivateIpGoogleAccess:
        https://cloud.google.com/compute/docs/reference/rest/v1/subnetworks/setPrivateIpGoogleAccess"""
        with self.lock:
            self._region_check(region)
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            sub = self.get_subnetwork(project, region, name)
            if "privateIpGoogleAccess" not in body:
                raise _invalid("resource.privateIpGoogleAccess", "", "Required field is missing.")
            self.subnetworks[(project, region, name)]["privateIpGoogleAccess"] = bool(body["privateIpGoogleAccess"])
            op = self._new_op("region", project, region, "setPrivateIpGoogleAccess", sub["selfLink"],
                              request_id=request_id)
            return self._op_view(op)

    def get_router(self, project: str, region: str, name: str) -> dict:
        """routers.get: https://cloud.google.com/compute/docs/reference/rest/v1/routers/get"""
        with self.lock:
            self._region_check(region)
            r = self.routers.get((project, region, name))
            if r is None:
                raise ApiError(404, f"The resource 'projects/{project}/regions/{region}/routers/{name}' was not found",
                               "notFound")
            return copy.deepcopy(r)

    def list_routers(self, project: str, region: str, query: dict) -> dict:
        """routers.list (none by default): https://cloud.google.com/compute/docs/reference/rest/v1/routers/list"""
        with self.lock:
            self._region_check(region)
            terms = parse_filter(query.get("filter", [None])[0])
            items = [copy.deepcopy(r) for (p, rg, _), r in sorted(self.routers.items()) if p == project and rg == region]
        return self._page([i for i in items if matches(i, terms)], query, "compute#routerList",
                          f"projects/{project}/regions/{region}/routers")

    def get_region(self, project: str, region: str) -> dict:
        """regions.get, with the region's quotas as `{"metric", "limit", "usage"}`
        (https://cloud.google.com/compute/docs/reference/rest/v1/regions/get; Quota:
        https://cloud.google.com/compute/docs/reference/rest/v1/regions#Quota). Every CPU and GPU metric of the machine
        and GPU types the stand-in offers is listed, as a project's region lists them whether used or not; a
        preemptible quota the project was not granted is listed at limit 0 (as regions.get reports it, e.g.
        `PREEMPTIBLE_CPUS` limit 0.0), and a quota the test left unlimited with a large limit. Caller needs
        compute.regions.get."""
        with self.lock:
            self._region_check(region)
            self._project(project)
            usage = self._usage(project)
            standard = ({"CPUS", "IN_USE_ADDRESSES", "INSTANCES", "SSD_TOTAL_GB", "DISKS_TOTAL_GB"}
                        | set(CPU_METRIC.values()) | {g["metric"] for g in GPU_TYPES.values()})
            preemptible = {t for t in map(preemptible_twin, standard) if t}
            metrics = sorted(standard | preemptible
                             | {m for (r, m) in self.quota_limits if r in (None, region) and m not in GLOBAL_METRICS})
            quotas = []
            for m in metrics:
                lim = self._limit(region, m)
                if lim is None:
                    lim = 0.0 if m in preemptible else 1.0e6
                quotas.append({"metric": m, "limit": lim, "usage": usage.get((region, m), 0.0)})
            return {"kind": "compute#region", "id": str(1000 + REGIONS.index(region)), "name": region,
                    "description": region, "status": "UP", "quotas": quotas,
                    "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
                    "zones": [f"{COMPUTE}/projects/{project}/zones/{z}" for z, r in sorted(ZONES.items()) if r == region],
                    "selfLink": f"{COMPUTE}/projects/{project}/regions/{region}"}

    def test_subnet_permissions(self, project: str, region: str, name: str, body: dict) -> dict:
        """subnetworks.testIamPermissions: the caller's permissions on the subnet (its own policy, a Shared VPC
        administrator's grant of Compute Network User on one subnet, and what it inherits from its project)
        (https://cloud.google.com/compute/docs/reference/rest/v1/subnetworks/testIamPermissions)."""
        with self.lock:
            self._project(project)
            self.require_service(project, "compute.googleapis.com")
            if (project, region, name) not in self.subnetworks:
                raise ApiError(404, f"The resource 'projects/{project}/regions/{region}/subnetworks/{name}' was not "
                                    "found", "notFound")
            granted = self.test_permissions(f"projects/{project}/regions/{region}/subnetworks/{name}",
                                            list(body.get("permissions") or []))
            return {"permissions": granted}

    def get_compute_project(self, project: str) -> dict:
        """projects.get (Compute Engine): the project's global quotas (CPUS_ALL_REGIONS, GPUS_ALL_REGIONS, ...) with
        limit and usage, and its Shared VPC role (xpnProjectStatus HOST or UNSPECIFIED_XPN_PROJECT_STATUS)
        (https://cloud.google.com/compute/docs/reference/rest/v1/projects/get; global quotas:
        https://cloud.google.com/compute/quotas-limits#global_quotas). A global quota the test left unlimited is
        listed with a large limit."""
        with self.lock:
            p = self._project(project)
            usage = self._usage(project)
            quotas = [{"metric": m, "limit": self._limit(None, m) if self._limit(None, m) is not None else 1.0e6,
                       "usage": usage.get((None, m), 0.0)} for m in sorted(GLOBAL_METRICS)]
            host = project in set(self.xpn_service_projects.values())
            return {"kind": "compute#project", "id": p["projectNumber"], "name": project,
                    "creationTimestamp": "2024-01-15T02:00:00.000-08:00", "quotas": quotas,
                    "xpnProjectStatus": "HOST" if host else "UNSPECIFIED_XPN_PROJECT_STATUS",
                    "defaultServiceAccount": self._default_account(project),
                    "selfLink": f"{COMPUTE}/projects/{project}"}

    def share_vpc(self, host: str, service: str) -> None:
        """Make `host` a Shared VPC host project and attach `service` to it (what an administrator's `gcloud compute
        shared-vpc enable HOST` and `associated-projects add SERVICE --host-project HOST` do)."""
        with self.lock:
            self._project(host)
            self._project(service)
            self.xpn_service_projects[service] = host

    def get_xpn_host(self, project: str) -> dict:
        """projects.getXpnHost: the Shared VPC host project this service project is attached to, or an empty answer
        (https://cloud.google.com/compute/docs/reference/rest/v1/projects/getXpnHost)."""
        with self.lock:
            self._project(project)
            host = self.xpn_service_projects.get(project)
            if host is None:
                return {}
            return {"kind": "compute#project", "name": host, "id": self.project_number(host),
                    "xpnProjectStatus": "HOST", "selfLink": f"{COMPUTE}/projects/{host}"}

    def add_firewall_policy(self, name: str, rules: list[dict], *, short_name: str = "") -> None:
        """A hierarchical firewall policy on the organization (rules: {priority, direction, action allow|deny|
        goto_next, match: {srcIpRanges, layer4Configs: [{ipProtocol, ports}]}}); evaluated before the network's own
        rules (https://cloud.google.com/firewall/docs/firewall-policies-overview#rule-evaluation)."""
        with self.lock:
            self.firewall_policies.append({"name": name, "shortName": short_name or name, "type": "HIERARCHY",
                                           "rules": copy.deepcopy(rules)})

    def effective_firewalls(self, project: str, network: str) -> dict:
        """networks.getEffectiveFirewalls: the network's VPC rules and the firewall policies that apply to it, the
        organization's hierarchical policies first (https://cloud.google.com/compute/docs/reference/rest/v1/networks/
        getEffectiveFirewalls). Only projects in the organization get its policies."""
        with self.lock:
            self._project(project)
            if (project, network) not in self.networks:
                raise ApiError(404, f"The resource 'projects/{project}/global/networks/{network}' was not found",
                               "notFound")
            link = f"{COMPUTE}/projects/{project}/global/networks/{network}"
            rules = [self._public(f) for (p, _), f in sorted(self.firewalls.items()) if p == project
                     and f["network"] == link]
            policies = copy.deepcopy(self.firewall_policies) if self.organization_of(project) else []
            return {"firewalls": rules, "firewallPolicys": policies}

    def quota_infos(self, project: str, service: str, query: dict) -> dict:
        """Cloud Quotas quotaInfos.list for tpu.googleapis.com: each TPU quota (in TensorCores or chips, per zone)
        with its limit per zone in dimensionsInfos; -1 is unlimited (https://cloud.google.com/docs/quotas/reference/
        rest/v1/projects.locations.services.quotaInfos). Usage is not part of it."""
        with self.lock:
            self._project(project)
            infos = []
            if service == "tpu.googleapis.com":
                for standard, preemptible in TPU_QUOTA_IDS.values():
                    for qid in (standard, preemptible):
                        dims = [{"dimensions": {"zone": z}, "details": {"value": str(int(v))},
                                 "applicableLocations": [z]} for (z, q), v in self.tpu_quota_limits.items()
                                if q == qid and z is not None]
                        default = self.tpu_quota_limits.get((None, qid))
                        dims.append({"dimensions": {}, "details": {"value": str(int(default)) if default is not None
                                                                            else "-1"}})
                        infos.append({"name": f"projects/{project}/locations/global/services/{service}/quotaInfos/"
                                              f"{qid}", "quotaId": qid, "service": service, "metric": f"{service}/{qid}",
                                      "containerType": "PROJECT", "dimensions": ["zone"], "isPrecise": True,
                                      "dimensionsInfos": dims})
            return {"quotaInfos": infos}

    # -- compute: firewalls ----------------------------------------------------------------------------------
    def insert_firewall(self, project: str, body: dict, request_id: str | None) -> dict:
        """firewalls.insert: https://cloud.google.com/compute/docs/reference/rest/v1/firewalls/insert (Firewall fields)
        and https://cloud.google.com/firewall/docs/firewalls (rule components)."""
        with self.lock:
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            self._project(project)
            name = body.get("name") or ""
            if not NAME_RE.fullmatch(name):
                raise _invalid("resource.name", name, f"Must be a match of regex '{NAME_REGEX_TEXT}'")
            if (project, name) in self.firewalls:
                raise ApiError(409, f"The resource 'projects/{project}/global/firewalls/{name}' already exists", "alreadyExists")
            fw = self._validate_firewall(project, body)
            # "compute.firewalls.create on the project, compute.networks.updatePolicy on the network"
            # (https://cloud.google.com/compute/docs/reference/rest/v1/firewalls/insert, IAM Permissions)
            self.require("compute.networks.updatePolicy", self._strip_compute(fw["network"]))
            fw.update(kind="compute#firewall", id=str(next(self._ids)), creationTimestamp=_now_rfc3339(),
                      selfLink=f"{COMPUTE}/projects/{project}/global/firewalls/{name}")
            self.firewalls[(project, name)] = fw
            self.created.append(("firewall", copy.deepcopy(body)))
            op = self._new_op("global", project, None, "insert", fw["selfLink"], request_id=request_id)
            return self._op_view(op)

    def _validate_firewall(self, project: str, body: dict) -> dict:
        allowed, denied = body.get("allowed"), body.get("denied")
        if bool(allowed) == bool(denied):  # exactly one of allowed / denied
            raise _invalid("resource.allowed" if not allowed else "resource.denied", "",
                           "Exactly one of allowed or denied must be specified.")
        rules_field = "resource.allowed" if allowed else "resource.denied"
        for i, rule in enumerate(allowed or denied):
            proto = str(rule.get("IPProtocol") or "")
            if not (proto in ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
                    or (proto.isdigit() and 0 <= int(proto) <= 255)):
                raise _invalid(f"{rules_field}[{i}].IPProtocol", proto, "Must be tcp, udp, icmp, esp, ah, sctp, ipip, "
                               "all, or an IP protocol number.")
            ports = rule.get("ports") or []
            if ports and proto not in ("tcp", "udp", "sctp", "6", "17", "132"):
                raise _invalid(f"{rules_field}[{i}].ports", ports[0], "Ports can only be specified for tcp, udp or sctp.")
            for p in ports:
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", str(p))
                if not m or int(m.group(1)) > 65535 or (m.group(2) and not int(m.group(1)) <= int(m.group(2)) <= 65535):
                    raise _invalid(f"{rules_field}[{i}].ports", p, "Must be a port (0-65535) or a range like 1024-65535.")
        priority = body.get("priority", 1000)
        if not isinstance(priority, int) or not 0 <= priority <= 65535:
            raise _invalid("resource.priority", priority, "Must be between 0 and 65535.")
        direction = body.get("direction") or "INGRESS"
        if direction not in ("INGRESS", "EGRESS"):
            raise _invalid("resource.direction", direction, "Must be INGRESS or EGRESS.")
        for key in ("sourceRanges", "destinationRanges"):
            for r in body.get(key) or []:
                try:
                    ipaddress.ip_network(r, strict=False)
                except ValueError:
                    raise _invalid(f"resource.{key}", r, "Must be a CIDR range.") from None
        for key in ("sourceTags", "targetTags"):
            for t in body.get(key) or []:
                if not NAME_RE.fullmatch(t):
                    raise _invalid(f"resource.{key}", t, f"Must be a match of regex '{NAME_REGEX_TEXT}'")
        if body.get("sourceServiceAccounts") and (body.get("sourceTags") or body.get("targetTags")):
            raise _invalid("resource.sourceServiceAccounts", "", "Service accounts cannot be used together with tags.")
        if body.get("targetServiceAccounts") and body.get("targetTags"):
            raise _invalid("resource.targetServiceAccounts", "", "targetServiceAccounts and targetTags cannot both be set.")
        if direction == "EGRESS" and (body.get("sourceTags") or body.get("sourceServiceAccounts")):
            raise _invalid("resource.sourceTags", "", "Source tags and service accounts apply to ingress rules only.")
        net_value = body.get("network") or "global/networks/default"
        m = re.fullmatch(r"(?:projects/([^/]+)/)?global/networks/([^/]+)", self._strip_compute(net_value))
        if not m or (m.group(1) and m.group(1) != project) or (project, m.group(2)) not in self.networks:
            raise _invalid("resource.network", net_value, "The referenced network resource cannot be found.")
        fw = copy.deepcopy({k: v for k, v in body.items() if k not in ("kind", "id", "selfLink", "creationTimestamp")})
        fw.update(network=f"{COMPUTE}/projects/{project}/global/networks/{m.group(2)}", priority=priority,
                  direction=direction, disabled=bool(body.get("disabled")),
                  logConfig=body.get("logConfig") or {"enable": False})
        if direction == "INGRESS" and not any(body.get(k) for k in ("sourceRanges", "sourceTags", "sourceServiceAccounts")):
            # An ingress rule without a source applies to any IPv4 source, an egress rule without a destination to
            # any IPv4 destination (https://cloud.google.com/firewall/docs/firewalls#sources-for-rules, #destinations).
            fw["sourceRanges"] = ["0.0.0.0/0"]
        if direction == "EGRESS" and not body.get("destinationRanges"):
            fw["destinationRanges"] = ["0.0.0.0/0"]
        return fw

    def list_firewalls(self, project: str, query: dict) -> dict:
        """firewalls.list: https://cloud.google.com/compute/docs/reference/rest/v1/firewalls/list"""
        with self.lock:
            self._project(project)
            terms = parse_filter(query.get("filter", [None])[0])
            items = [self._public(f) for (p, _), f in sorted(self.firewalls.items()) if p == project]
        items = [i for i in items if matches(i, terms)]
        return self._page(items, query, "compute#firewallList", f"projects/{project}/global/firewalls")

    @staticmethod
    def _public(res: dict) -> dict:
        return {k: copy.deepcopy(v) for k, v in res.items() if not k.startswith("_")}

    def get_firewall(self, project: str, name: str) -> dict:
        with self.lock:
            self._project(project)
            fw = self.firewalls.get((project, name))
            if fw is None:
                raise ApiError(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found", "notFound")
            return self._public(fw)

    def delete_firewall(self, project: str, name: str, request_id: str | None) -> dict:
        with self.lock:
            self._check_request_id(request_id)
            if request_id and ("compute", project, request_id) in self.request_ids:
                return self._op_view(self.ops[self.request_ids[("compute", project, request_id)]])
            self._project(project)
            fw = self.firewalls.get((project, name))
            if fw is None:
                raise ApiError(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found", "notFound")
            self.require("compute.networks.updatePolicy", self._strip_compute(fw["network"]))
            del self.firewalls[(project, name)]
            op = self._new_op("global", project, None, "delete", fw["selfLink"], request_id=request_id)
            return self._op_view(op)

    # ============================================================================================
    # Cloud TPU v2
    # ============================================================================================
    def _tpu_zone(self, project: str, zone: str) -> None:
        if zone not in TPU_ZONE_REGION:
            raise ApiError(403, f"Permission denied on 'locations/{zone}' (or it may not exist).", grpc="PERMISSION_DENIED")
        self._project(project)

    def _tpu_op(self, project: str, zone: str, verb: str, target: str, response: dict | None, error: dict | None,
                done_after: float, request_id: str | None = None) -> dict:
        op_id = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}"
        op = {"name": f"projects/{project}/locations/{zone}/operations/{op_id}", "_done_at": time.monotonic() + done_after,
              "_response": response, "_error": error, "_verb": verb, "_target": target, "_created": _now_zulu()}
        self.ops[op["name"]] = op
        if request_id:
            self.request_ids[("tpu", project, request_id)] = op["name"]
        return op

    def _tpu_op_view(self, op: dict) -> dict:
        """google.longrunning.Operation with google.cloud.tpu.v2.OperationMetadata
        (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.operations)."""
        out = {"name": op["name"], "metadata": {
            "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata", "createTime": op["_created"],
            "target": op["_target"], "verb": op["_verb"], "cancelRequested": False, "apiVersion": "v2"}}
        if time.monotonic() >= op["_done_at"]:
            out["done"] = True
            out["metadata"]["endTime"] = _now_zulu()
            if op["_error"]:
                out["error"] = op["_error"]
            else:
                resp = op["_response"]
                if resp is not None and resp.get("@type", "").endswith(".Node"):
                    node = self.tpus.get(tuple(resp["name"].split("/")[i] for i in (1, 3, 5)))
                    resp = {"@type": resp["@type"], **(self._tpu_view(node) if node else {})}
                elif resp is not None and resp.get("@type", "").endswith(".QueuedResource"):
                    qr = self.queued.get(tuple(resp["name"].split("/")[i] for i in (1, 3, 5)))
                    resp = {"@type": resp["@type"], **(self._qr_view(qr) if qr else {})}
                out["response"] = resp or {"@type": "type.googleapis.com/google.protobuf.Empty"}
        else:
            out["done"] = False
        return out

    def _tpu_view(self, node: dict) -> dict:
        out = {k: copy.deepcopy(v) for k, v in node.items() if not k.startswith("_")}
        if node.get("_deleted_at") is not None:
            out["state"] = "DELETING"
        elif node.get("_preempted"):
            out["state"] = "PREEMPTED"
        else:
            out["state"] = "READY" if time.monotonic() - node["_created_at"] >= self.timing.tpu_creating_s else "CREATING"
        return out

    def _tpu_quota(self, project: str, zone: str, accelerator: str, spot: bool, extra: float = 0.0):
        """None, or (quota id, limit) for a node that would exceed a configured TPU quota."""
        t = TPU_TYPES[accelerator]
        qid = TPU_QUOTA_IDS[t["generation"]][1 if spot else 0]
        limit = self.tpu_quota_limits.get((zone, qid), self.tpu_quota_limits.get((None, qid)))
        if limit is None:
            return None
        used = 0.0
        for (p, z, _), n in self.tpus.items():
            if p == project and z == zone and n["_quota_id"] == qid:
                used += TPU_TYPES[n["acceleratorType"]]["units"]
        for (p, z, _), q in self.queued.items():
            if p == project and z == zone and q.get("_node_key") not in self.tpus and q.get("_quota_id") == qid \
                    and q["_state"] not in ("FAILED", "SUSPENDED"):
                used += q["_units"]
        return (qid, limit) if used + t["units"] + extra > limit else None

    def _validate_node(self, project: str, zone: str, node_id: str, body: dict, where: str = "node") -> dict:
        """Node fields: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#Node
        (acceleratorType or acceleratorConfig, runtimeVersion required, networkConfig, schedulingConfig).
        Accelerator types per zone: https://cloud.google.com/tpu/docs/regions-zones ; software versions per TPU
        generation: https://cloud.google.com/tpu/docs/runtimes."""
        if not NAME_RE.fullmatch(node_id or ""):
            raise _grpc_invalid(f"Invalid node ID '{node_id}': must be 1-63 lowercase letters, digits or hyphens, "
                                "starting with a letter and not ending with a hyphen.")
        acc = body.get("acceleratorType")
        cfg = body.get("acceleratorConfig")
        if acc and cfg:
            raise _grpc_invalid("Only one of acceleratorType and acceleratorConfig may be specified.")
        if cfg:
            acc = next((n for n, t in TPU_TYPES.items()
                        if t["type"] == cfg.get("type") and t["topology"] == cfg.get("topology")), None)
            if acc is None:
                raise _grpc_invalid(f"Unsupported accelerator config {cfg}.")
        if not acc:
            raise _grpc_invalid("Either acceleratorType or acceleratorConfig must be specified.")
        t = TPU_TYPES.get(acc)
        if t is None or zone not in t["zones"]:
            raise _grpc_invalid(
                "Cloud TPU received a bad request. The requested accelerator configuration for accelerator type, "
                f"\"{acc}\", could not be found in the zonal accelerator configurations for \"{zone}\".; the "
                f"accelerator {acc} was not found in zone {zone}")
        rv = body.get("runtimeVersion")
        if not rv:
            raise _grpc_invalid(f"{where}.runtimeVersion is required.")
        gens = TPU_RUNTIMES.get(rv)
        if gens is None:
            raise _grpc_invalid(f"Runtime version \"{rv}\" was not found in zone {zone}; see "
                                "https://cloud.google.com/tpu/docs/runtimes for the TPU software versions.")
        if t["generation"] not in gens:
            raise _grpc_invalid(f"Runtime version \"{rv}\" is not supported for accelerator type \"{acc}\" "
                                f"(TPU {t['generation']}).")
        if body.get("networkConfig") and body.get("networkConfigs"):
            raise _grpc_invalid("networkConfig and networkConfigs are mutually exclusive.")
        net = dict(body.get("networkConfig") or {})
        net_project, net_name = self._tpu_ref(project, net.get("network") or "default", "networks")
        if (net_project, net_name) not in self.networks:
            raise _grpc_invalid(f"Network \"{net.get('network')}\" was not found.")
        region = TPU_ZONE_REGION[zone]
        sub_project, sub_name = self._tpu_ref(project, net.get("subnetwork") or net_name, "subnetworks")
        if net.get("subnetwork") and (sub_project, region, sub_name) not in self.subnetworks:
            raise _grpc_invalid(f"Subnetwork \"{net.get('subnetwork')}\" was not found in region {region}.")
        account = (body.get("serviceAccount") or {}).get("email")
        if account:  # a node that runs as a service account: its creator acts as it (Cloud TPU's IAM page)
            self.require("iam.serviceAccounts.actAs", self.account_resource(account))
        for k, v in (body.get("labels") or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v)):
                raise _grpc_invalid(f"Invalid label {k}={v}.")
        sc = body.get("schedulingConfig") or {}
        if sc.get("spot") and sc.get("preemptible"):
            raise _grpc_invalid("schedulingConfig.spot and schedulingConfig.preemptible cannot both be set.")
        return {"accelerator": acc, "type": t, "net_name": net_name, "sub_name": sub_name, "region": region,
                "net_project": net_project, "sub_project": sub_project,
                "spot": bool(sc.get("spot") or sc.get("preemptible"))}

    def _tpu_ref(self, project: str, value: str, kind: str) -> tuple[str, str]:
        """(project, name) a node's network or subnetwork names: a bare name is the node's project's, a path may
        name a Shared VPC host this project is attached to."""
        m = re.match(r"projects/([^/]+)/", self._strip_compute(value))
        other = m.group(1) if m else project
        if other != project and self.xpn_service_projects.get(project) != other:
            raise _grpc_invalid(f"Project {project} is not a Shared VPC service project of {other}; its {kind} cannot "
                                "be used.")
        return other, value.rsplit("/", 1)[-1]

    def _make_node(self, project: str, zone: str, node_id: str, body: dict, v: dict, queued_resource: str | None = None,
                   spot: bool = False) -> dict:
        node = copy.deepcopy({k: val for k, val in body.items() if k not in ("name", "state", "id", "networkEndpoints")})
        k = self._alloc_addr()
        internal, external = self.addresses_of(k)
        net = dict(node.get("networkConfig") or {})
        ext = bool(net.get("enableExternalIps"))
        net.update(network=f"projects/{v['net_project']}/global/networks/{v['net_name']}",
                   subnetwork=f"projects/{v['sub_project']}/regions/{v['region']}/subnetworks/{v['sub_name']}",
                   enableExternalIps=ext)
        ep = {"ipAddress": internal, "port": 8470}
        if ext:  # "Indicates that external IP addresses would be associated with the TPU workers."
            ep["accessConfig"] = {"externalIp": external}
        sa = dict(node.get("serviceAccount") or {})
        if not sa.get("email") or sa.get("email") == "default":
            sa["email"] = f"{self.project_number(project)}-compute@developer.gserviceaccount.com"
        sched = dict(node.get("schedulingConfig") or {})
        if spot:
            sched["spot"] = True
        t = v["type"]
        node.update(name=f"projects/{project}/locations/{zone}/nodes/{node_id}", id=str(next(self._ids)),
                    acceleratorType=v["accelerator"], networkConfig=net, networkEndpoints=[ep], serviceAccount=sa,
                    schedulingConfig=sched, cidrBlock=AUTO_MODE_RANGES.get(v["region"], "10.0.0.0/20"),
                    health="HEALTHY", apiVersion="V2", createTime=_now_zulu(),
                    acceleratorConfig={"type": t["type"], "topology": t["topology"]},
                    _created_at=time.monotonic(), _addr=k,
                    _quota_id=TPU_QUOTA_IDS[t["generation"]][1 if (spot or sched.get("spot") or sched.get("preemptible")) else 0])
        if queued_resource:
            node["queuedResource"] = queued_resource
        self.tpus[(project, zone, node_id)] = node
        self.created.append(("tpu", copy.deepcopy(body)))
        self._pending_created = self._pending_created + [node]
        return node

    @staticmethod
    def _quota_exhausted(qid: str, limit: float, zone: str) -> ApiError:
        """How Cloud TPU refuses a request over quota: RESOURCE_EXHAUSTED naming the quota
        (https://cloud.google.com/tpu/docs/quota, https://cloud.google.com/apis/design/errors)."""
        return ApiError(429, f"Quota '{qid}' exhausted. Limit {int(limit)} in zone {zone}", grpc="RESOURCE_EXHAUSTED",
                        details=[{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                                  "violations": [{"subject": f"quota/{qid}", "description": f"Quota '{qid}' exhausted."}]},
                                 {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RESOURCE_EXHAUSTED",
                                  "domain": "tpu.googleapis.com", "metadata": {"quota_limit": qid, "zone": zone}}])

    def create_tpu(self, project: str, zone: str, node_id: str | None, body: dict) -> dict:
        """nodes.create: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/create"""
        with self.lock:
            self._tpu_zone(project, zone)
            if not node_id:
                raise _grpc_invalid("nodeId is required.")
            if (project, zone, node_id) in self.tpus:
                raise ApiError(409, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists",
                               grpc="ALREADY_EXISTS")
            v = self._validate_node(project, zone, node_id, body)
            target = f"projects/{project}/locations/{zone}/nodes/{node_id}"
            over = self._tpu_quota(project, zone, v["accelerator"], v["spot"])
            if over:
                # A quota failure ends the create operation with RESOURCE_EXHAUSTED (code 8) naming the quota.
                op = self._tpu_op(project, zone, "create", target, None, {
                    "code": 8, "message": f"Quota '{over[0]}' exhausted. Limit {int(over[1])} in zone {zone}"}, self.timing.op_s)
                return self._tpu_op_view(op)
            if self.faults.tpu_exhausted:
                op = self._tpu_op(project, zone, "create", target, None, {"code": 8, "message": (
                    f"There is no more capacity in the zone \"{zone}\"; you can try in another zone where Cloud TPU "
                    "Nodes are offered (see https://cloud.google.com/tpu/docs/regions-zones) [EID: 0x1]")}, self.timing.op_s)
                return self._tpu_op_view(op)
            node = self._make_node(project, zone, node_id, body, v)
            op = self._tpu_op(project, zone, "create", target,
                              {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", "name": node["name"]}, None,
                              self.timing.tpu_creating_s)
            return self._tpu_op_view(op)

    def list_tpus(self, project: str, zone: str, query: dict) -> dict:
        """nodes.list: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/list"""
        with self.lock:
            self._tpu_zone(project, zone)
            items = [self._tpu_view(n) for (p, z, _), n in sorted(self.tpus.items()) if p == project and z == zone]
        return self._grpc_page(items, query, "nodes")

    @staticmethod
    def _grpc_page(items: list, query: dict, key: str) -> dict:
        size = int((query.get("pageSize") or ["0"])[0] or 0) or 1000
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        out = {}
        if items[start:start + size]:
            out[key] = items[start:start + size]
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    def get_tpu(self, project: str, zone: str, node_id: str) -> dict:
        with self.lock:
            self._tpu_zone(project, zone)
            node = self.tpus.get((project, zone, node_id))
            if node is None:
                raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found",
                               grpc="NOT_FOUND")
            return self._tpu_view(node)

    def delete_tpu(self, project: str, zone: str, node_id: str) -> dict:
        """nodes.delete: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/delete"""
        with self.lock:
            self._tpu_zone(project, zone)
            node = self.tpus.get((project, zone, node_id))
            if node is None:
                raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found",
                               grpc="NOT_FOUND")
            node.setdefault("_deleted_at", time.monotonic())
            op = self._tpu_op(project, zone, "delete", node["name"], {"@type": "type.googleapis.com/google.protobuf.Empty"},
                              None, self.timing.stopping_s + 0.01)
            return self._tpu_op_view(op)

    def preempt_tpu(self, project: str, zone: str, node_id: str) -> None:
        """Play a Spot TPU preemption: the node is PREEMPTED (its queued resource SUSPENDED)."""
        with self.lock:
            self.tpus[(project, zone, node_id)]["_preempted"] = True

    def get_tpu_op(self, name: str) -> dict:
        """operations.get: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.operations/get"""
        with self.lock:
            op = self.ops.get(name)
            if op is None or "_verb" not in op:
                raise ApiError(404, f"Operation '{name}' was not found", grpc="NOT_FOUND")
            return self._tpu_op_view(op)

    # -- TPU: queued resources -------------------------------------------------------------------------------
    def create_queued_resource(self, project: str, zone: str, qr_id: str | None, body: dict,
                               request_id: str | None) -> dict:
        """queuedResources.create: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/create
        (QueuedResource: tpu.nodeSpec[], spot | guaranteed, queueingPolicy;
        https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources). requestId:
        "Idempotent request UUID": the same requestId returns the same operation and creates nothing more."""
        with self.lock:
            self._tpu_zone(project, zone)
            if request_id is not None and not _is_uuid(request_id):
                raise _grpc_invalid(f"requestId '{request_id}' must be a valid UUID.")
            if request_id and ("tpu", project, request_id) in self.request_ids:
                return self._tpu_op_view(self.ops[self.request_ids[("tpu", project, request_id)]])
            if qr_id is None:
                qr_id = f"qr-{uuid.uuid4().hex[:12]}"
            if not re.fullmatch(r"[A-Za-z0-9_.~+%-]+", qr_id):
                raise _grpc_invalid(f"queuedResourceId '{qr_id}' must match ^[A-Za-z0-9_.~+%-]+$.")
            name = f"projects/{project}/locations/{zone}/queuedResources/{qr_id}"
            if (project, zone, qr_id) in self.queued:
                raise ApiError(409, f"Resource '{name}' already exists", grpc="ALREADY_EXISTS")
            if "spot" in body and "guaranteed" in body:
                raise _grpc_invalid("Only one tier (spot or guaranteed) may be set.")
            specs = ((body.get("tpu") or {}).get("nodeSpec")) or []
            if len(specs) != 1:
                raise _grpc_invalid("tpu.nodeSpec must contain exactly one node spec (multislice is not supported here).")
            spec = specs[0]
            parent = f"projects/{project}/locations/{zone}"
            if spec.get("parent") != parent:
                raise _grpc_invalid(f"tpu.nodeSpec[0].parent must be \"{parent}\", got \"{spec.get('parent', '')}\".")
            if spec.get("multisliceParams"):
                raise _grpc_invalid("multisliceParams is not supported here.")
            node_id = spec.get("nodeId")
            if not node_id:
                raise _grpc_invalid("tpu.nodeSpec[0].nodeId is required for a single node.")
            node_body = spec.get("node") or {}
            if not node_body:
                raise _grpc_invalid("tpu.nodeSpec[0].node is required.")
            if (project, zone, node_id) in self.tpus or any(
                    q["_node_key"] == (project, zone, node_id) and q["_state"] != "DELETING" for q in self.queued.values()):
                raise ApiError(409, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' already exists",
                               grpc="ALREADY_EXISTS")
            v = self._validate_node(project, zone, node_id, node_body, "tpu.nodeSpec[0].node")
            spot = "spot" in body or v["spot"]
            over = self._tpu_quota(project, zone, v["accelerator"], spot)
            if over:
                raise self._quota_exhausted(over[0], over[1], zone)
            policy = body.get("queueingPolicy") or {}
            qr = {k: copy.deepcopy(val) for k, val in body.items() if k not in ("name", "state", "createTime")}
            qr.update(name=name, createTime=_now_zulu(), _created_at=time.monotonic(), _state="CREATING",
                      _node_id=node_id, _node_key=(project, zone, node_id), _validated=v, _spot=spot,
                      _units=v["type"]["units"], _quota_id=TPU_QUOTA_IDS[v["type"]["generation"]][1 if spot else 0],
                      _valid_until=self._deadline(policy, "validUntilDuration", "validUntilTime"),
                      _valid_after=self._deadline(policy, "validAfterDuration", "validAfterTime"))
            self.queued[(project, zone, qr_id)] = qr
            self.created.append(("queued_resource", copy.deepcopy(body)))
            op = self._tpu_op(project, zone, "create", name,
                              {"@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource", "name": name}, None,
                              self.timing.op_s, request_id=request_id)
            return self._tpu_op_view(op)

    @staticmethod
    def _deadline(policy: dict, dur_key: str, time_key: str) -> float | None:
        """queueingPolicy durations ("3.5s") as monotonic deadlines; absolute times are not modelled."""
        d = policy.get(dur_key)
        if d:
            m = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(d))
            if not m:
                raise _grpc_invalid(f"queueingPolicy.{dur_key} must be a duration like \"3600s\".")
            return time.monotonic() + float(m.group(1))
        if policy.get(time_key):
            raise _grpc_invalid(f"queueingPolicy.{time_key} is not supported here; use {dur_key}.")
        return None

    def _advance_queued(self, now: float) -> None:
        """Move queued resources along: CREATING -> WAITING_FOR_RESOURCES -> PROVISIONING (node CREATING)
        -> ACTIVE (node READY); FAILED when validUntil passes while waiting; SUSPENDING/SUSPENDED when the node is
        deleted or preempted; DELETING -> gone. (QueuedResourceState:
        https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#State)"""
        t = self.timing
        for key, qr in list(self.queued.items()):
            st = qr["_state"]
            node = self.tpus.get(qr["_node_key"])
            if st == "DELETING":
                if node is None and now >= qr["_deleting_since"] + t.stopping_s:
                    del self.queued[key]
                continue
            if st == "CREATING" and now >= qr["_created_at"] + t.op_s:
                qr["_state"], qr["_waiting_since"] = "WAITING", now
                st = "WAITING"
            if st == "WAITING":
                if qr["_valid_until"] is not None and now >= qr["_valid_until"]:
                    qr["_state"] = "FAILED"
                    qr["_error"] = {"code": 8, "message": "The queued resource could not be provisioned before its "
                                    "validUntil time: there is not enough capacity in the zone."}
                    continue
                ready = now >= qr["_waiting_since"] + t.qr_waiting_s and (qr["_valid_after"] is None or now >= qr["_valid_after"])
                if ready and not self.faults.tpu_exhausted:
                    v = qr["_validated"]
                    spec = qr["tpu"]["nodeSpec"][0]
                    self._make_node(key[0], key[1], qr["_node_id"], spec["node"], v, queued_resource=qr["name"],
                                    spot=qr["_spot"])
                    qr["_state"] = "PROVISIONING"
                continue
            if st in ("PROVISIONING", "ACTIVE"):
                if node is None or node.get("_deleted_at") is not None or node.get("_preempted"):
                    qr["_state"] = "SUSPENDING" if node is not None else "SUSPENDED"
                    qr["_initiator"] = "USER" if node is None or node.get("_deleted_at") else "SERVICE"
                elif st == "PROVISIONING" and now >= node["_created_at"] + t.tpu_creating_s:
                    qr["_state"] = "ACTIVE"
                continue
            if st == "SUSPENDING" and (node is None or node.get("_preempted")):
                qr["_state"] = "SUSPENDED"

    def _qr_view(self, qr: dict) -> dict:
        out = {k: copy.deepcopy(v) for k, v in qr.items() if not k.startswith("_")}
        st = {"WAITING": self.qr_waiting_state}.get(qr["_state"], qr["_state"])
        state = {"state": st}
        data_key = {"CREATING": "creatingData", "ACCEPTED": "acceptedData", "PROVISIONING": "provisioningData",
                    "FAILED": "failedData", "DELETING": "deletingData", "ACTIVE": "activeData",
                    "SUSPENDING": "suspendingData", "SUSPENDED": "suspendedData"}.get(st)
        if data_key:
            state[data_key] = {"error": qr["_error"]} if st == "FAILED" else {}
        if st in ("SUSPENDING", "SUSPENDED", "DELETING"):
            state["stateInitiator"] = qr.get("_initiator", "USER")
        out["state"] = state
        return out

    def get_queued_resource(self, project: str, zone: str, qr_id: str) -> dict:
        """queuedResources.get: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/get"""
        with self.lock:
            self._tpu_zone(project, zone)
            qr = self.queued.get((project, zone, qr_id))
            if qr is None:
                raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}' was not found",
                               grpc="NOT_FOUND")
            return self._qr_view(qr)

    def list_queued_resources(self, project: str, zone: str, query: dict) -> dict:
        with self.lock:
            self._tpu_zone(project, zone)
            items = [self._qr_view(q) for (p, z, _), q in sorted(self.queued.items()) if p == project and z == zone]
        return self._grpc_page(items, query, "queuedResources")

    def delete_queued_resource(self, project: str, zone: str, qr_id: str, force: bool, request_id: str | None) -> dict:
        """queuedResources.delete: "force: If set to true, all running nodes belonging to this queued resource will be
        deleted first and then the queued resource will be deleted. Otherwise (i.e. force=false), the queued resource
        will only be deleted if its nodes have already been deleted or the queued resource is in the ACCEPTED, FAILED,
        or SUSPENDED state." https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete"""
        with self.lock:
            self._tpu_zone(project, zone)
            if request_id is not None and not _is_uuid(request_id):
                raise _grpc_invalid(f"requestId '{request_id}' must be a valid UUID.")
            if request_id and ("tpu", project, request_id) in self.request_ids:
                return self._tpu_op_view(self.ops[self.request_ids[("tpu", project, request_id)]])
            qr = self.queued.get((project, zone, qr_id))
            if qr is None:
                raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/queuedResources/{qr_id}' was not found",
                               grpc="NOT_FOUND")
            node = self.tpus.get(qr["_node_key"])
            live_node = node is not None and node.get("_deleted_at") is None
            deletable = qr["_state"] in ("CREATING", "WAITING", "FAILED", "SUSPENDED", "DELETING") or not live_node
            if not force and not deletable:
                raise ApiError(400, f"Queued resource '{qr['name']}' is {qr['_state']} and still has node "
                               f"'{node['name']}'; delete the node first or set force=true.", grpc="FAILED_PRECONDITION")
            if live_node:
                node["_deleted_at"] = time.monotonic()
            if qr["_state"] != "DELETING":
                qr["_state"], qr["_deleting_since"], qr["_initiator"] = "DELETING", time.monotonic(), "USER"
            op = self._tpu_op(project, zone, "delete", qr["name"], {"@type": "type.googleapis.com/google.protobuf.Empty"},
                              None, self.timing.stopping_s + 0.02, request_id=request_id)
            return self._tpu_op_view(op)

    # -- TPU: catalogs ----------------------------------------------------------------------------------------
    def list_tpu_accelerator_types(self, project: str, zone: str, query: dict) -> dict:
        """acceleratorTypes.list: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.acceleratorTypes/list"""
        self._tpu_zone(project, zone)
        flt = (query.get("filter") or [""])[0]
        items = [self._tpu_acc_view(project, zone, n) for n, t in TPU_TYPES.items() if zone in t["zones"]]
        if flt:
            m = re.fullmatch(r"\s*(\w+)\s*=\s*\"?([^\"]*)\"?\s*", flt)
            if not m:
                raise _grpc_invalid(f"Invalid filter: {flt}")
            items = [i for i in items if str(i.get(m.group(1))) == m.group(2)]
        return self._grpc_page(items, query, "acceleratorTypes")

    @staticmethod
    def _tpu_acc_view(project: str, zone: str, name: str) -> dict:
        t = TPU_TYPES[name]
        return {"name": f"projects/{project}/locations/{zone}/acceleratorTypes/{name}", "type": name,
                "acceleratorConfigs": [{"type": t["type"], "topology": t["topology"]}]}

    def get_tpu_accelerator_type(self, project: str, zone: str, name: str) -> dict:
        self._tpu_zone(project, zone)
        t = TPU_TYPES.get(name)
        if t is None or zone not in t["zones"]:
            raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/acceleratorTypes/{name}' was not found",
                           grpc="NOT_FOUND")
        return self._tpu_acc_view(project, zone, name)

    def _zone_runtimes(self, zone: str) -> list[str]:
        gens = {t["generation"] for t in TPU_TYPES.values() if zone in t["zones"]}
        return sorted(v for v, g in TPU_RUNTIMES.items() if g & gens)

    def list_runtime_versions(self, project: str, zone: str, query: dict) -> dict:
        """runtimeVersions.list: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.runtimeVersions/list"""
        self._tpu_zone(project, zone)
        items = [{"name": f"projects/{project}/locations/{zone}/runtimeVersions/{v}", "version": v}
                 for v in self._zone_runtimes(zone)]
        return self._grpc_page(items, query, "runtimeVersions")

    def get_runtime_version(self, project: str, zone: str, version: str) -> dict:
        self._tpu_zone(project, zone)
        if version not in self._zone_runtimes(zone):
            raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/runtimeVersions/{version}' was not found",
                           grpc="NOT_FOUND")
        return {"name": f"projects/{project}/locations/{zone}/runtimeVersions/{version}", "version": version}

    # ============================================================================================
    # Cloud Resource Manager v3
    # ============================================================================================
    def crm_get_project(self, ident: str) -> dict:
        """projects.get (name: projects/{project_id_or_number}), which needs resourcemanager.projects.get:
        https://cloud.google.com/resource-manager/reference/rest/v3/projects/get. A project the caller may not see
        (or that does not exist) is 403 PERMISSION_DENIED, the same answer for both."""
        with self.lock:
            p = self._project(ident)
            project = p["projectId"]
            self.require_service(project, "cloudresourcemanager.googleapis.com")
            self.require("resourcemanager.projects.get", f"projects/{project}",
                         message="The caller does not have permission")
            org = self.organization_of(project)
            out = {"name": f"projects/{p['projectNumber']}", "projectId": project, "state": p.get("state", "ACTIVE"),
                   "displayName": project, "createTime": p["createTime"], "updateTime": p["createTime"],
                   "etag": f"W/\"{_fingerprint(p)}\"", "labels": {}}
            if org:
                out["parent"] = org
            return out

    def crm_test_permissions(self, ident: str, body: dict) -> dict:
        """projects.testIamPermissions: "Returns permissions that a caller has on the specified Project" (the
        project's and its organization's allow policies, never what is granted below it);
        https://cloud.google.com/resource-manager/reference/rest/v3/projects/testIamPermissions."""
        with self.lock:
            p = self._project(ident)
            self.require_service(p["projectId"], "cloudresourcemanager.googleapis.com")
            granted = self.test_permissions(f"projects/{p['projectId']}", list(body.get("permissions") or []))
            return {"permissions": granted} if granted else {}


class _InternalError(Exception):
    """A request the documentation says ends in INTERNAL_ERROR."""


# ================================================================================================
# HTTP
# ================================================================================================
_P = r"([^/:]+)"
ROUTES: list[tuple[str, str, str]] = [
    # Compute Engine (zonal)
    ("POST", rf"/compute/v1/projects/{_P}/zones/{_P}/instances/bulkInsert", "bulk_insert"),
    ("POST", rf"/compute/v1/projects/{_P}/zones/{_P}/instances", "insert_instance"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/instances", "list_instances"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/instances/{_P}", "get_instance"),
    ("DELETE", rf"/compute/v1/projects/{_P}/zones/{_P}/instances/{_P}", "delete_instance"),
    ("POST", rf"/compute/v1/projects/{_P}/zones/{_P}/instances/{_P}/start", "start_instance"),
    ("POST", rf"/compute/v1/projects/{_P}/zones/{_P}/instances/{_P}/stop", "stop_instance"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/operations/{_P}", "zone_op"),
    ("POST", rf"/compute/v1/projects/{_P}/zones/{_P}/operations/{_P}/wait", "zone_op_wait"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/machineTypes", "list_machine_types"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/machineTypes/{_P}", "get_machine_type"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/acceleratorTypes", "list_accelerator_types"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/acceleratorTypes/{_P}", "get_accelerator_type"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/diskTypes", "list_disk_types"),
    ("GET", rf"/compute/v1/projects/{_P}/zones/{_P}/diskTypes/{_P}", "get_disk_type"),
    # Compute Engine (regional)
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}", "get_region"),
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}/subnetworks", "list_subnetworks"),
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}/subnetworks/{_P}", "get_subnetwork"),
    ("POST", rf"/compute/v1/projects/{_P}/regions/{_P}/subnetworks/{_P}/setPrivateIpGoogleAccess", "set_pga"),
    ("POST", rf"/compute/v1/projects/{_P}/regions/{_P}/subnetworks/{_P}/testIamPermissions", "subnet_test"),
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}/routers", "list_routers"),
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}/routers/{_P}", "get_router"),
    ("GET", rf"/compute/v1/projects/{_P}/regions/{_P}/operations/{_P}", "region_op"),
    ("POST", rf"/compute/v1/projects/{_P}/regions/{_P}/operations/{_P}/wait", "region_op_wait"),
    # Compute Engine (global)
    ("POST", rf"/compute/v1/projects/{_P}/global/firewalls", "insert_firewall"),
    ("GET", rf"/compute/v1/projects/{_P}/global/firewalls", "list_firewalls"),
    ("GET", rf"/compute/v1/projects/{_P}/global/firewalls/{_P}", "get_firewall"),
    ("DELETE", rf"/compute/v1/projects/{_P}/global/firewalls/{_P}", "delete_firewall"),
    ("GET", rf"/compute/v1/projects/{_P}/global/networks", "list_networks"),
    ("GET", rf"/compute/v1/projects/{_P}/global/networks/{_P}", "get_network"),
    ("GET", rf"/compute/v1/projects/{_P}/global/images", "list_images"),
    ("GET", rf"/compute/v1/projects/{_P}/global/images/family/{_P}", "get_image_from_family"),
    ("GET", rf"/compute/v1/projects/{_P}/global/images/{_P}", "get_image"),
    ("GET", rf"/compute/v1/projects/{_P}/global/operations/{_P}", "global_op"),
    ("POST", rf"/compute/v1/projects/{_P}/global/operations/{_P}/wait", "global_op_wait"),
    # Cloud TPU v2
    ("POST", rf"/v2/projects/{_P}/locations/{_P}/nodes", "create_tpu"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/nodes", "list_tpus"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/nodes/{_P}", "get_tpu"),
    ("DELETE", rf"/v2/projects/{_P}/locations/{_P}/nodes/{_P}", "delete_tpu"),
    ("POST", rf"/v2/projects/{_P}/locations/{_P}/queuedResources", "create_qr"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/queuedResources", "list_qr"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/queuedResources/{_P}", "get_qr"),
    ("DELETE", rf"/v2/projects/{_P}/locations/{_P}/queuedResources/{_P}", "delete_qr"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/acceleratorTypes", "list_tpu_acc"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/acceleratorTypes/{_P}", "get_tpu_acc"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/runtimeVersions", "list_rv"),
    ("GET", rf"/v2/projects/{_P}/locations/{_P}/runtimeVersions/{_P}", "get_rv"),
    ("GET", r"/v2/(projects/[^/]+/locations/[^/]+/operations/[^/:]+)", "tpu_op"),
    # Compute Engine (project)
    ("GET", rf"/compute/v1/projects/{_P}", "compute_project"),
    ("GET", rf"/compute/v1/projects/{_P}/getXpnHost", "xpn_host"),
    ("GET", rf"/compute/v1/projects/{_P}/global/networks/{_P}/getEffectiveFirewalls", "effective_firewalls"),
    # Cloud Resource Manager v3
    ("GET", rf"/v3/projects/{_P}", "crm_get"),
    ("POST", rf"/v3/projects/{_P}:testIamPermissions", "crm_test"),
    ("POST", rf"/v3/projects/{_P}:getIamPolicy", "crm_get_policy"),
    ("POST", rf"/v3/projects/{_P}:setIamPolicy", "crm_set_policy"),
    # IAM v1, Organization Policy v2, OS Login v1 (IdentityApis)
    ("GET", rf"/v1/projects/{_P}/serviceAccounts/{_P}", "iam_get"),
    ("POST", rf"/v1/projects/{_P}/serviceAccounts", "iam_create"),
    ("POST", rf"/v1/projects/{_P}/serviceAccounts/{_P}:getIamPolicy", "iam_get_policy"),
    ("POST", rf"/v1/projects/{_P}/serviceAccounts/{_P}:setIamPolicy", "iam_set_policy"),
    ("POST", rf"/v1/projects/{_P}/serviceAccounts/{_P}:testIamPermissions", "iam_test"),
    # Service Usage v1, Cloud Quotas v1
    ("GET", rf"/v1/projects/{_P}/services:batchGet", "su_batch_get"),
    ("GET", rf"/v1/projects/{_P}/locations/global/services/{_P}/quotaInfos", "quota_infos"),
    ("GET", rf"/v2/projects/{_P}/policies/{_P}:getEffectivePolicy", "org_effective"),
    ("POST", rf"/v1/users/{_P}:importSshPublicKey", "oslogin_import"),
    ("GET", rf"/v1/users/{_P}/loginProfile", "oslogin_profile"),
    ("DELETE", rf"/v1/users/{_P}/sshPublicKeys/{_P}", "oslogin_delete"),
]
_COMPILED = [(m, re.compile(p + r"/?"), h) for m, p, h in ROUTES]


# What each call needs, where the handler does not check it itself: (service, permission, resource of the groups).
# Permissions from each method's "IAM Permissions" in Compute Engine's reference
# (https://cloud.google.com/compute/docs/reference/rest/v1) and Cloud TPU's roles page
# (https://cloud.google.com/tpu/docs/tpu-iam-admin); calls on a project's resources are checked on that resource,
# whose policy inherits the project's and the organization's.
_C, _T = "compute.googleapis.com", "tpu.googleapis.com"


def _project_res(a):
    return f"projects/{a[0]}"


def _zonal(kind):
    return lambda a: f"projects/{a[0]}/zones/{a[1]}/{kind}/{a[2]}"


def _regional(kind):
    return lambda a: f"projects/{a[0]}/regions/{a[1]}/{kind}/{a[2]}"


def _global(kind):
    return lambda a: f"projects/{a[0]}/global/{kind}/{a[1]}"


def _located(kind):
    return lambda a: f"projects/{a[0]}/locations/{a[1]}/{kind}/{a[2]}"


AUTH: dict[str, tuple[str, str, Callable[[tuple], str]]] = {
    "insert_instance": (_C, "compute.instances.create", _project_res),
    "bulk_insert": (_C, "compute.instances.create", _project_res),
    "list_instances": (_C, "compute.instances.list", _project_res),
    "get_instance": (_C, "compute.instances.get", _zonal("instances")),
    "delete_instance": (_C, "compute.instances.delete", _zonal("instances")),
    "start_instance": (_C, "compute.instances.start", _zonal("instances")),
    "stop_instance": (_C, "compute.instances.stop", _zonal("instances")),
    "zone_op": (_C, "compute.zoneOperations.get", _zonal("operations")),
    "zone_op_wait": (_C, "compute.zoneOperations.get", _zonal("operations")),
    "region_op": (_C, "compute.regionOperations.get", _regional("operations")),
    "region_op_wait": (_C, "compute.regionOperations.get", _regional("operations")),
    "global_op": (_C, "compute.globalOperations.get", _global("operations")),
    "global_op_wait": (_C, "compute.globalOperations.get", _global("operations")),
    "list_machine_types": (_C, "compute.machineTypes.list", _project_res),
    "get_machine_type": (_C, "compute.machineTypes.get", _zonal("machineTypes")),
    "list_accelerator_types": (_C, "compute.acceleratorTypes.list", _project_res),
    "get_accelerator_type": (_C, "compute.acceleratorTypes.get", _zonal("acceleratorTypes")),
    "list_disk_types": (_C, "compute.diskTypes.list", _project_res),
    "get_disk_type": (_C, "compute.diskTypes.get", _zonal("diskTypes")),
    "get_region": (_C, "compute.regions.get", lambda a: f"projects/{a[0]}/regions/{a[1]}"),
    "list_subnetworks": (_C, "compute.subnetworks.list", _project_res),
    "get_subnetwork": (_C, "compute.subnetworks.get", _regional("subnetworks")),
    "set_pga": (_C, "compute.subnetworks.setPrivateIpGoogleAccess", _regional("subnetworks")),
    "list_routers": (_C, "compute.routers.list", _project_res),
    "get_router": (_C, "compute.routers.get", _regional("routers")),
    "insert_firewall": (_C, "compute.firewalls.create", _project_res),
    "list_firewalls": (_C, "compute.firewalls.list", _project_res),
    "get_firewall": (_C, "compute.firewalls.get", _global("firewalls")),
    "delete_firewall": (_C, "compute.firewalls.delete", _global("firewalls")),
    "list_networks": (_C, "compute.networks.list", _project_res),
    "get_network": (_C, "compute.networks.get", _global("networks")),
    "effective_firewalls": (_C, "compute.networks.getEffectiveFirewalls", _global("networks")),
    "list_images": (_C, "compute.images.list", _project_res),
    "get_image": (_C, "compute.images.get", _global("images")),
    "get_image_from_family": (_C, "compute.images.getFromFamily", _project_res),
    "compute_project": (_C, "compute.projects.get", _project_res),
    "xpn_host": (_C, "compute.projects.get", _project_res),
    "create_tpu": (_T, "tpu.nodes.create", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "list_tpus": (_T, "tpu.nodes.list", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "get_tpu": (_T, "tpu.nodes.get", _located("nodes")),
    "delete_tpu": (_T, "tpu.nodes.delete", _located("nodes")),
    "create_qr": (_T, "tpu.queuedResources.create", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "list_qr": (_T, "tpu.queuedResources.list", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "get_qr": (_T, "tpu.queuedResources.get", _located("queuedResources")),
    "delete_qr": (_T, "tpu.queuedResources.delete", _located("queuedResources")),
    "list_tpu_acc": (_T, "tpu.acceleratortypes.list", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "get_tpu_acc": (_T, "tpu.acceleratortypes.get", _located("acceleratorTypes")),
    "list_rv": (_T, "tpu.runtimeversions.list", lambda a: f"projects/{a[0]}/locations/{a[1]}"),
    "get_rv": (_T, "tpu.runtimeversions.get", _located("runtimeVersions")),
    "tpu_op": (_T, "tpu.operations.get", lambda a: a[0]),
    "quota_infos": ("cloudquotas.googleapis.com", "cloudquotas.quotas.get", _project_res),
}


def _authorize(cloud: FakeCloud, handler: str, a: tuple) -> None:
    """401 without a caller; 403 SERVICE_DISABLED where the API is off in the project; 403 without the permission."""
    if cloud.caller is None:
        raise unauthenticated()
    rule = AUTH.get(handler)
    if rule is None:
        return  # the handler checks (IAM, Resource Manager, Organization Policy, OS Login, Service Usage)
    service, permission, resource = rule
    name = resource(a)
    project = name.split("/")[1]
    cloud.require_service(project, service)
    cloud.require(permission, name)


def _q(query: dict, key: str) -> str | None:
    return (query.get(key) or [None])[0]


def _dispatch(cloud: FakeCloud, method: str, path: str, query: dict, body: dict):
    if path == "/_fake/stats":  # for benchmarks running the stand-in in another process
        counts = cloud.counts()
        with cloud.lock:
            return {"calls": len(cloud.calls), "errors_injected": cloud.errors_injected, **counts}
    rid = _q(query, "requestId")
    for m, pattern, h in _COMPILED:
        if m != method:
            continue
        match = pattern.fullmatch(path)
        if not match:
            continue
        a = match.groups()
        c = cloud
        table: dict[str, Callable[[], dict]] = {
            "insert_instance": lambda: c.insert_instance(a[0], a[1], body, rid),
            "bulk_insert": lambda: c.bulk_insert(a[0], a[1], body, rid),
            "list_instances": lambda: c.list_instances(a[0], a[1], query),
            "get_instance": lambda: c.get_instance(*a),
            "delete_instance": lambda: c.delete_instance(*a, rid),
            "start_instance": lambda: c.start_instance(*a, rid),
            "stop_instance": lambda: c.stop_instance(*a, rid),
            "zone_op": lambda: c.get_op(a[0], "zone", a[1], a[2]),
            "zone_op_wait": lambda: c.get_op(a[0], "zone", a[1], a[2], wait=True),
            "region_op": lambda: c.get_op(a[0], "region", a[1], a[2]),
            "region_op_wait": lambda: c.get_op(a[0], "region", a[1], a[2], wait=True),
            "global_op": lambda: c.get_op(a[0], "global", None, a[1]),
            "global_op_wait": lambda: c.get_op(a[0], "global", None, a[1], wait=True),
            "list_machine_types": lambda: c.list_machine_types(a[0], a[1], query),
            "get_machine_type": lambda: c.get_machine_type(*a),
            "list_accelerator_types": lambda: c.list_accelerator_types(a[0], a[1], query),
            "get_accelerator_type": lambda: c.get_accelerator_type(*a),
            "list_disk_types": lambda: c.list_disk_types(a[0], a[1], query),
            "get_disk_type": lambda: c.get_disk_type(*a),
            "get_region": lambda: c.get_region(*a),
            "list_subnetworks": lambda: c.list_subnetworks(a[0], a[1], query),
            "get_subnetwork": lambda: c.get_subnetwork(*a),
            "set_pga": lambda: c.set_private_ip_google_access(*a, body, rid),
            "subnet_test": lambda: c.test_subnet_permissions(*a, body),
            "list_routers": lambda: c.list_routers(a[0], a[1], query),
            "get_router": lambda: c.get_router(*a),
            "insert_firewall": lambda: c.insert_firewall(a[0], body, rid),
            "list_firewalls": lambda: c.list_firewalls(a[0], query),
            "get_firewall": lambda: c.get_firewall(*a),
            "delete_firewall": lambda: c.delete_firewall(*a, rid),
            "list_networks": lambda: c.list_networks(a[0], query),
            "get_network": lambda: c.get_network(*a),
            "list_images": lambda: c.list_images(a[0], query),
            "get_image": lambda: c.get_image(*a),
            "get_image_from_family": lambda: c.get_image_from_family(*a),
            "create_tpu": lambda: c.create_tpu(a[0], a[1], _q(query, "nodeId"), body),
            "list_tpus": lambda: c.list_tpus(a[0], a[1], query),
            "get_tpu": lambda: c.get_tpu(*a),
            "delete_tpu": lambda: c.delete_tpu(*a),
            "create_qr": lambda: c.create_queued_resource(a[0], a[1], _q(query, "queuedResourceId"), body, rid),
            "list_qr": lambda: c.list_queued_resources(a[0], a[1], query),
            "get_qr": lambda: c.get_queued_resource(*a),
            "delete_qr": lambda: c.delete_queued_resource(*a, (_q(query, "force") or "").lower() == "true", rid),
            "list_tpu_acc": lambda: c.list_tpu_accelerator_types(a[0], a[1], query),
            "get_tpu_acc": lambda: c.get_tpu_accelerator_type(*a),
            "list_rv": lambda: c.list_runtime_versions(a[0], a[1], query),
            "get_rv": lambda: c.get_runtime_version(*a),
            "tpu_op": lambda: c.get_tpu_op(a[0]),
            "crm_get": lambda: c.crm_get_project(a[0]),
            "crm_test": lambda: c.crm_test_permissions(a[0], body),
            "crm_get_policy": lambda: c.crm_get_iam_policy(a[0]),
            "crm_set_policy": lambda: c.crm_set_iam_policy(a[0], body),
            "iam_get": lambda: c.iam_get_account(*a),
            "iam_create": lambda: c.iam_create_account(a[0], body),
            "iam_get_policy": lambda: c.iam_get_account_policy(*a),
            "iam_set_policy": lambda: c.iam_set_account_policy(*a, body),
            "iam_test": lambda: c.iam_test_account_permissions(*a, body),
            "su_batch_get": lambda: c.service_usage_batch_get(a[0], query),
            "quota_infos": lambda: c.quota_infos(a[0], a[1], query),
            "compute_project": lambda: c.get_compute_project(a[0]),
            "xpn_host": lambda: c.get_xpn_host(a[0]),
            "effective_firewalls": lambda: c.effective_firewalls(*a),
            "org_effective": lambda: c.orgpolicy_effective(*a),
            "oslogin_import": lambda: c.oslogin_import_key(a[0], query, body),
            "oslogin_profile": lambda: c.oslogin_get_profile(a[0], query),
            "oslogin_delete": lambda: c.oslogin_delete_key(*a),
        }
        _authorize(cloud, h, a)
        return table[h]()
    if path.startswith("/compute/"):
        raise ApiError(404, f"The requested URL {path} was not found on this server.", "notFound")
    raise ApiError(404, f"Method not found: {method} {path}", grpc="NOT_FOUND")


def _refused_as_api(fn, *args):
    """fn(*args), with fake_identity's refusals in the ApiError shape every API here answers in."""
    try:
        return fn(*args)
    except ApiRefusal as r:
        raise ApiError(r.status, r.message, r.reason, grpc=r.grpc, details=r.details) from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cloud: FakeCloud  # set on the subclass

    def log_message(self, *args) -> None:  # quiet
        pass

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        cloud = self.cloud
        style = "compute" if url.path.startswith("/compute/") else "google"
        with cloud.lock:
            cloud.calls.append((method, url.path))
        if cloud.faults.latency_s:
            time.sleep(cloud.faults.latency_s)
        try:
            if method == "POST" and url.path == "/token":  # the stand-in's OAuth 2.0 token endpoint
                status, payload = 200, _refused_as_api(cloud.token_endpoint, raw)
            else:
                cloud.maybe_fail_call(method, url.path)
                _refused_as_api(cloud.authenticate, self.headers.get("Authorization"), style)
                with cloud.lock:
                    cloud.callers.append((method, url.path, cloud.caller))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    raise ApiError(400, "Invalid JSON payload received.", "parseError") from None
                cloud.tick()
                status, payload = 200, _refused_as_api(_dispatch, cloud, method, url.path, query, body)
                cloud.tick()
        except ApiError as exc:
            status, payload = exc.status, exc.payload(style)
        except ValueError as exc:
            status, payload = 400, ApiError(400, str(exc)).payload(style)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")


class FakeGce:
    """The stand-in server on 127.0.0.1, in a thread. `endpoint` is what DSCTL_GCE_ENDPOINT, DSCTL_TPU_ENDPOINT and
    DSCTL_CRM_ENDPOINT take (one server answers all three APIs)."""

    def __init__(self, cloud: FakeCloud | None = None, host: str = "127.0.0.1", port: int = 0):
        self.cloud = cloud or FakeCloud()
        handler = type("Handler", (_Handler,), {"cloud": self.cloud})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 1024
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeGce:
        self.thread.start()
        self.cloud.endpoint = self.endpoint
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--op-ms", type=float, default=50.0)
    ap.add_argument("--provisioning-ms", type=float, default=100.0)
    ap.add_argument("--stopping-ms", type=float, default=100.0)
    args = ap.parse_args()
    cloud = FakeCloud(Faults(latency_s=args.latency_ms / 1000),
                      Timing(op_s=args.op_ms / 1000, provisioning_s=args.provisioning_ms / 1000,
                             staging_s=args.provisioning_ms / 1000, stopping_s=args.stopping_ms / 1000))
    with FakeGce(cloud, port=args.port) as fake:
        print(fake.endpoint, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
