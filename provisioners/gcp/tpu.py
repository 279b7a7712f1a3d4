"""TPU VMs through Cloud TPU (tpu_v2, REST transport so an endpoint override works everywhere).

A TPU trainer (trainer.machine tpu-v2-8) is one TPU VM, asked for as a queued resource
(`queuedResources.create`): that call takes a request id, so a create retried after a lost
answer is not done twice, and a validity window (gcp.tpu_timeout_s), after which Cloud TPU
stops trying; TPUs take minutes, so they have their own timeout. The queued resource and its
node share one name; deleting the queued resource with force deletes the node. The VM runs
a TensorFlow TPU runtime (software.py), gets an external address unless gcp.public_ips is
false, and is reached over SSH at its network endpoint. Cloud TPU's list has no filter, so a
run's nodes are picked out by their labels here.
"""

from __future__ import annotations

import threading
import time
import uuid

from . import compute
from .clients import Clients
from .errors import CloudTimeout, GcpError, OperationFailed, from_api_error, from_operation_error
from .naming import LABEL_RUN, label_value
from .retry import Cancelled, call, sleep

POLL_S = 5.0


def parent(clients: Clients) -> str:
    s = clients.settings
    return f"projects/{s.project}/locations/{s.zone}"


def node_body(clients: Clients, accelerator: str, runtime_version: str, labels: dict, tag: str, metadata: dict,
              service_account: str | None = None):
    from google.cloud import tpu_v2

    s = clients.settings
    net = tpu_v2.NetworkConfig(
        network=s.network if "/" in s.network else f"projects/{s.project}/global/networks/{s.network}",
        enable_external_ips=s.public_ips,
    )
    if s.subnetwork:
        net.subnetwork = (s.subnetwork if "/" in s.subnetwork
                          else f"projects/{s.project}/regions/{s.region}/subnetworks/{s.subnetwork}")
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version=runtime_version, network_config=net,
                       labels=dict(labels), tags=compute.tags(s, tag), metadata=dict(metadata))
    # What the TPU VM runs as (accounts.py); an empty email is the project's default Compute Engine service account.
    node.service_account = tpu_v2.ServiceAccount(email=service_account or "",
                                                 scope=["https://www.googleapis.com/auth/cloud-platform"])
    return node


def create(clients: Clients, node_id: str, node, *, spot: bool, timeout_s: float,
           cancel: threading.Event | None = None) -> None:
    """Ask for the TPU VM as a queued resource (same id as the node), with a request id and a validity window."""
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=parent(clients), node_id=node_id, node=node)]),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=int(timeout_s))),
    )
    if spot:
        qr.spot = tpu_v2.QueuedResource.Spot()
    request = tpu_v2.CreateQueuedResourceRequest(parent=parent(clients), queued_resource_id=node_id,
                                                 queued_resource=qr, request_id=str(uuid.uuid4()))
    # The call returns a long-running operation that ends once the request is accepted; the TPU
    # itself is waited for by its queued resource's state (wait_ready).
    call(clients.tpu.create_queued_resource, request=request, doing=f"asking for TPU VM {node_id}", cancel=cancel)


def _failure(clients: Clients, qr, node_id: str, accelerator: str) -> GcpError:
    err = qr.state.failed_data.error if qr.state.failed_data else None
    message = (err.message if err else "") or f"queued resource {node_id} is {qr.state.state.name}"
    code = err.code if err else 0
    lowered = message.lower()
    kind = ("QUOTA_EXCEEDED" if "quota" in lowered else
            "RESOURCE_EXHAUSTED" if code in (8, 14) or "capacity" in lowered or "resources" in lowered else
            f"error code {code}")
    return from_operation_error(kind, message, resource=f"TPU {accelerator} VM", zone=clients.settings.zone, count=1)


def wait_ready(clients: Clients, node_id: str, accelerator: str, *, timeout_s: float,
               cancel: threading.Event | None = None):
    """Wait until the queued resource is ACTIVE and its node READY; returns the node. Failures are classified.

    Cloud TPU itself gives up at the end of the queued resource's validity window (FAILED, with the
    reason); this waits a little longer so that reason, not a bare timeout, is what the user reads.
    """
    from google.api_core import exceptions as gx

    deadline = time.monotonic() + timeout_s + min(60.0, timeout_s)
    poll = min(POLL_S, max(timeout_s / 20, 0.1))
    name = f"{parent(clients)}/queuedResources/{node_id}"
    last = "not listed"
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        try:
            qr = call(clients.tpu.get_queued_resource, name=name, doing=f"waiting for TPU VM {node_id}", cancel=cancel)
        except gx.GoogleAPICallError as exc:
            raise from_api_error(exc, doing=f"waiting for TPU VM {node_id}") from exc
        state = qr.state.state.name
        last = state
        if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
            raise _failure(clients, qr, node_id, accelerator)
        if state == "ACTIVE":
            node = get(clients, node_id, cancel)
            if node is not None:
                last = f"ACTIVE, node {node.state.name}"
                if node.state.name == "READY":
                    return node
                if node.state.name in ("PREEMPTED", "TERMINATED", "STOPPED"):
                    raise OperationFailed(f"TPU VM {node_id} ({accelerator}) is {node.state.name} instead of READY.")
        left = deadline - time.monotonic()
        if left <= 0:
            raise CloudTimeout(
                f"TPU VM {node_id} ({accelerator}) was not READY within {timeout_s:.0f} s (gcp.tpu_timeout_s) in zone "
                f"{clients.settings.zone}; its queued resource is {last}. TPUs can wait for capacity: try again, "
                "another zone (gcp.zone), or a longer gcp.tpu_timeout_s.")
        sleep(min(poll, left), cancel)


def list_nodes(clients: Clients, run_id: str, cancel: threading.Event | None = None) -> list:
    """The run's TPU nodes (by label), in any state."""
    from google.cloud import tpu_v2

    want = label_value(run_id)
    out: list = []
    token = ""
    while True:
        request = tpu_v2.ListNodesRequest(parent=parent(clients), page_size=500, page_token=token)
        page = call(lambda **kw: next(iter(clients.tpu.list_nodes(**kw).pages)), request=request,
                    doing="listing the run's TPU VMs", cancel=cancel)
        out.extend(n for n in page.nodes if n.labels.get(LABEL_RUN) == want)
        token = page.next_page_token
        if not token:
            return out


def list_queued(clients: Clients, name_prefix: str, cancel: threading.Event | None = None) -> list[str]:
    """Ids of the queued resources whose id starts with the run's name prefix (they carry no labels)."""
    from google.cloud import tpu_v2

    out: list[str] = []
    token = ""
    while True:
        request = tpu_v2.ListQueuedResourcesRequest(parent=parent(clients), page_size=500, page_token=token)
        page = call(lambda **kw: next(iter(clients.tpu.list_queued_resources(**kw).pages)), request=request,
                    doing="listing the run's queued TPU resources", cancel=cancel)
        out.extend(short_id(qr) for qr in page.queued_resources if short_id(qr).startswith(name_prefix + "-"))
        token = page.next_page_token
        if not token:
            return out


def get(clients: Clients, node_id: str, cancel: threading.Event | None = None):
    from google.api_core import exceptions as gx

    try:
        return call(clients.tpu.get_node, name=f"{parent(clients)}/nodes/{node_id}", doing=f"reading TPU VM {node_id}",
                    cancel=cancel)
    except gx.NotFound:
        return None


def delete(clients: Clients, node_id: str, timeout_s: float) -> None:
    """Delete the TPU VM: its queued resource with force (which deletes the node), else the bare node."""
    from google.api_core import exceptions as gx
    from google.cloud import tpu_v2

    try:
        lro = call(clients.tpu.delete_queued_resource,
                   request=tpu_v2.DeleteQueuedResourceRequest(name=f"{parent(clients)}/queuedResources/{node_id}",
                                                              force=True, request_id=str(uuid.uuid4())),
                   doing=f"deleting TPU VM {node_id}")
    except gx.NotFound:
        try:
            lro = call(clients.tpu.delete_node, name=f"{parent(clients)}/nodes/{node_id}",
                       doing=f"deleting TPU VM {node_id}")
        except gx.NotFound:
            return
    lro.result(timeout=timeout_s)


def addresses(node) -> tuple[str | None, str | None]:
    """(internal, external) address of a TPU VM: the network endpoint, and its access config's external IP."""
    eps = list(node.network_endpoints)
    if not eps:
        return None, None
    ext = eps[0].access_config.external_ip if eps[0].access_config else ""
    return eps[0].ip_address or None, ext or None


def short_id(resource) -> str:
    return resource.name.rsplit("/", 1)[-1]
