"""TPU VMs through Cloud TPU (tpu_v2, REST transport so an endpoint override works everywhere).

A TPU trainer (trainer.machine tpu-v2-8) is one TPU node; its host is the VM
dsctl reaches over SSH at the node's network endpoint. Cloud TPU's list has no
filter, so a run's nodes are picked out by their labels here.
"""

from __future__ import annotations

import threading
import time

from .clients import Clients
from .errors import CloudTimeout, GcpError, from_api_error, from_operation_error
from .naming import LABEL_RUN, label_value
from .retry import Cancelled, call


def parent(clients: Clients) -> str:
    s = clients.settings
    return f"projects/{s.project}/locations/{s.zone}"


def node_body(clients: Clients, accelerator: str, labels: dict, tag: str, metadata: dict):
    from google.cloud import tpu_v2

    s = clients.settings
    net = tpu_v2.NetworkConfig(
        network=s.network if "/" in s.network else f"projects/{s.project}/global/networks/{s.network}",
        enable_external_ips=s.public_ips,
    )
    if s.subnetwork:
        net.subnetwork = (s.subnetwork if "/" in s.subnetwork
                          else f"projects/{s.project}/regions/{s.region}/subnetworks/{s.subnetwork}")
    node = tpu_v2.Node(accelerator_type=accelerator, runtime_version=s.tpu_runtime_version, network_config=net,
                       labels=dict(labels), tags=[tag], metadata=dict(metadata))
    if s.service_account != "none":
        node.service_account = tpu_v2.ServiceAccount(email=s.service_account or "default",
                                                     scope=["https://www.googleapis.com/auth/cloud-platform"])
    return node


def create(clients: Clients, node_id: str, node, cancel: threading.Event | None = None):
    """Start creating a TPU node; returns the long-running operation."""
    return call(clients.tpu.create_node, parent=parent(clients), node_id=node_id, node=node,
                doing=f"creating TPU VM {node_id}", cancel=cancel)


def wait_created(clients: Clients, lro, node_id: str, accelerator: str, *, timeout_s: float,
                 cancel: threading.Event | None = None):
    """Wait for the create operation; classify its failure (capacity, quota) for this TPU.

    The operation's own error (done, with an error status) is told apart from a
    failed poll (429/503 on the GET), which is retried with backoff.
    """
    import concurrent.futures

    from google.api_core import exceptions as gx

    from .retry import ATTEMPTS, MAX_WAIT_S, _retryable, base_wait_s, sleep

    deadline = time.monotonic() + timeout_s
    failures = 0
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        left = deadline - time.monotonic()
        if left <= 0:
            raise CloudTimeout(f"TPU VM {node_id} ({accelerator}) was not READY within {timeout_s:.0f} s.")
        try:
            return lro.result(timeout=min(left, 10.0))
        except concurrent.futures.TimeoutError:
            continue
        except Exception as exc:
            op = lro.operation
            if op.done and op.HasField("error"):
                code = "QUOTA_EXCEEDED" if "quota" in op.error.message.lower() else (
                    "RESOURCE_EXHAUSTED" if op.error.code in (8, 14) else f"error code {op.error.code}")
                raise from_operation_error(code, op.error.message, resource=f"TPU {accelerator} VM",
                                           zone=clients.settings.zone, count=1) from exc
            if _retryable(exc, timeouts=True) and failures < ATTEMPTS:
                failures += 1
                sleep(min(base_wait_s() * 2 ** (failures - 1), MAX_WAIT_S), cancel)
                continue
            if isinstance(exc, gx.GoogleAPICallError):
                raise from_api_error(exc, doing=f"waiting for TPU VM {node_id}") from exc
            raise


def list_nodes(clients: Clients, run_id: str, cancel: threading.Event | None = None) -> list:
    """The run's TPU nodes (by label), in any state."""
    want = label_value(run_id)
    out = []
    token = ""
    while True:
        from google.cloud import tpu_v2

        request = tpu_v2.ListNodesRequest(parent=parent(clients), page_size=500, page_token=token)
        page = call(lambda **kw: next(iter(clients.tpu.list_nodes(**kw).pages)), request=request,
                    doing="listing the run's TPU VMs", cancel=cancel)
        out.extend(n for n in page.nodes if n.labels.get(LABEL_RUN) == want)
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


def delete(clients: Clients, node_id: str, cancel: threading.Event | None = None):
    """Start deleting a TPU node; None if it does not exist."""
    from google.api_core import exceptions as gx

    try:
        return call(clients.tpu.delete_node, name=f"{parent(clients)}/nodes/{node_id}",
                    doing=f"deleting TPU VM {node_id}", cancel=cancel)
    except gx.NotFound:
        return None


def address(node) -> str | None:
    eps = list(node.network_endpoints)
    if not eps:
        return None
    ep = eps[0]
    ext = getattr(ep, "access_config", None)
    return ep.ip_address or (ext.external_ip if ext else None)


def short_id(node) -> str:
    return node.name.rsplit("/", 1)[-1]


__all__ = ["GcpError", "create", "delete", "get", "list_nodes", "node_body", "wait_created"]
