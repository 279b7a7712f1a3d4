"""A loopback stand-in for the Compute Engine and Cloud TPU REST APIs, for tests and benchmarks.

It speaks the wire format the real client libraries (google-cloud-compute,
google-cloud-tpu with transport="rest") use, so dsctl's GCP code runs unchanged
against it:

  Compute (zonal)   POST/GET .../zones/Z/instances, POST .../instances/bulkInsert,
                    GET/DELETE .../instances/NAME, GET .../operations/OP, POST .../operations/OP/wait
  Compute (global)  POST/GET .../global/firewalls, GET/DELETE .../global/firewalls/NAME,
                    GET .../global/operations/OP, POST .../global/operations/OP/wait
  Cloud TPU v2      POST .../locations/Z/nodes?nodeId=, GET .../nodes, GET/DELETE .../nodes/ID,
                    GET .../locations/Z/operations/ID

Instances go PROVISIONING -> STAGING -> RUNNING on a clock (and STOPPING -> gone
when deleted); operations go RUNNING -> DONE. Each instance gets a distinct
loopback address (127.0.0.2, 127.0.0.3, ...) as its networkIP, so an sshd
listening on those addresses can stand in for the VMs.

Faults (see `Faults`): a quota or capacity error on the Nth instance carrying a
label, bursts of 503 or 429, instances stuck in PROVISIONING, latency per call.
Hooks let a test play the guest agent (ssh-keys metadata -> authorized_keys) and
"lose" a VM's processes when it is deleted.

Run standalone (for the benchmark):  python fake_gce.py --port 0 --latency-ms 200
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlparse

COMPUTE = "https://www.googleapis.com/compute/v1"


# -- the list filter ----------------------------------------------------------------------
_TERM = re.compile(r'\s*\(?\s*([A-Za-z_][\w.\-]*)\s*(=|!=|:|\beq\b|\bne\b)\s*("([^"]*)"|\'([^\']*)\'|[^\s()]+)\s*\)?\s*')


def parse_filter(text: str | None) -> list[tuple[str, str, str]]:
    """`labels.dsctl-run = "r1" AND (status != "RUNNING")` -> [(key, op, value), ...].

    Compute Engine's list filter: comparisons joined by AND (or juxtaposed, each
    in parentheses); `eq`/`ne` take a regular expression. OR is not supported here.
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


# -- faults ------------------------------------------------------------------------------------
@dataclass
class Faults:
    latency_s: float = 0.0  # added to every API call
    # The Nth instance (1-based) carrying label key=value fails with `error_code`
    # (QUOTA_EXCEEDED or ZONE_RESOURCE_POOL_EXHAUSTED); instances before it stay created.
    fail_nth_instance: int | None = None
    fail_label: tuple[str, str] | None = None
    error_code: str = "QUOTA_EXCEEDED"
    fail_sync: bool = False  # refuse the insert call itself (HTTP 403 quotaExceeded) instead of failing its operation
    # Every `burst_every`-th API call starts a burst of `burst_length` errors with `burst_status`.
    burst_every: int | None = None
    burst_length: int = 0
    burst_status: int = 503
    # Instances whose name contains one of these never leave PROVISIONING.
    stuck_names: list[str] = field(default_factory=list)
    # TPU node creation fails with RESOURCE_EXHAUSTED.
    tpu_exhausted: bool = False


@dataclass
class Timing:
    op_s: float = 0.05  # an operation is DONE this long after it started
    provisioning_s: float = 0.1
    staging_s: float = 0.1
    stopping_s: float = 0.1  # a deleted instance lingers in STOPPING this long
    tpu_creating_s: float = 0.2


class ApiError(Exception):
    def __init__(self, status: int, message: str, reason: str = "invalid"):
        self.status, self.message, self.reason = status, message, reason


class FakeCloud:
    """The state behind the stand-in: instances, firewalls, TPU nodes, operations."""

    def __init__(self, faults: Faults | None = None, timing: Timing | None = None,
                 first_ip: str = "127.0.0.2"):
        self.faults = faults or Faults()
        self.timing = timing or Timing()
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str, str], dict] = {}  # (project, zone, name)
        self.firewalls: dict[tuple[str, str], dict] = {}
        self.tpus: dict[tuple[str, str, str], dict] = {}
        self.ops: dict[str, dict] = {}
        self.request_ids: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path) of every API call
        self.errors_injected = 0
        self.created: list[tuple[str, dict]] = []  # ("instance" | "firewall" | "tpu", body as created), for assertions
        self._label_counts: dict[tuple[str, str], int] = {}
        self._ids = itertools.count(1000)
        self._next_ip = int(ipaddress.ip_address(first_ip))
        self._free_ips: list[int] = []
        self._burst_left = 0
        # Hooks: called with the instance (or TPU node) dict, outside the lock.
        self.on_created: list[Callable[[dict], None]] = []
        self.on_deleted: list[Callable[[dict], None]] = []

    # -- helpers --------------------------------------------------------------
    def _ip(self) -> str:
        n = self._free_ips.pop(0) if self._free_ips else self._next_ip
        if n == self._next_ip:
            self._next_ip += 1
        return str(ipaddress.ip_address(n))

    def _release_ip(self, ip: str | None) -> None:
        if ip:
            self._free_ips.append(int(ipaddress.ip_address(ip)))
            self._free_ips.sort()

    def _new_op(self, scope: str, project: str, where: str | None, op_type: str, target: str,
                error: dict | None = None, done_after: float | None = None) -> dict:
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}"
        if scope == "zone":
            self_link = f"{COMPUTE}/projects/{project}/zones/{where}/operations/{name}"
        else:
            self_link = f"{COMPUTE}/projects/{project}/global/operations/{name}"
        op = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name, "operationType": op_type,
            "targetLink": target, "status": "RUNNING", "progress": 0, "selfLink": self_link,
            "insertTime": time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime()),
            "_done_at": time.monotonic() + (self.timing.op_s if done_after is None else done_after),
            "_error": error, "_scope": scope,
        }
        if scope == "zone":
            op["zone"] = f"{COMPUTE}/projects/{project}/zones/{where}"
        self.ops[name] = op
        return op

    def _op_view(self, op: dict) -> dict:
        out = {k: v for k, v in op.items() if not k.startswith("_")}
        if time.monotonic() >= op["_done_at"]:
            out["status"] = "DONE"
            out["progress"] = 100
            if op["_error"]:
                out.update(op["_error"])
        return out

    def _instance_view(self, inst: dict) -> dict:
        now = time.monotonic()
        out = {k: v for k, v in inst.items() if not k.startswith("_")}
        if inst.get("_deleted_at") is not None:
            out["status"] = "STOPPING"
        elif inst["_stuck"]:
            out["status"] = "PROVISIONING"
        else:
            age = now - inst["_created_at"]
            t = self.timing
            out["status"] = ("PROVISIONING" if age < t.provisioning_s else
                             "STAGING" if age < t.provisioning_s + t.staging_s else "RUNNING")
        return out

    def _reap(self) -> list[dict]:
        """Remove deleted instances and TPU nodes whose time has come; returns them (for hooks)."""
        now = time.monotonic()
        gone = []
        for key, inst in list(self.instances.items()):
            if inst.get("_deleted_at") is not None and now >= inst["_deleted_at"] + self.timing.stopping_s:
                del self.instances[key]
                self._release_ip(inst["networkInterfaces"][0].get("networkIP"))
                gone.append(inst)
        for key, node in list(self.tpus.items()):
            if node.get("_deleted_at") is not None and now >= node["_deleted_at"] + self.timing.stopping_s:
                del self.tpus[key]
                self._release_ip(node["networkEndpoints"][0]["ipAddress"])
                gone.append(node)
        return gone

    # -- counts for assertions ------------------------------------------------------
    def counts(self) -> dict:
        with self.lock:
            gone = self._reap()
            out = {"instances": len(self.instances), "firewalls": len(self.firewalls), "tpus": len(self.tpus)}
        self._fire(self.on_deleted, gone)
        return out

    def _fire(self, hooks, items) -> None:
        for item in items:
            for hook in hooks:
                try:
                    hook(item)
                except Exception as exc:  # a hook must not break the API
                    print(f"fake_gce hook failed: {exc!r}")

    # -- faults ------------------------------------------------------------------
    def maybe_fail_call(self) -> None:
        f = self.faults
        with self.lock:
            n = len(self.calls)
            if self._burst_left > 0:
                self._burst_left -= 1
            elif f.burst_every and n % f.burst_every == 0 and f.burst_length > 0:
                self._burst_left = f.burst_length - 1
            else:
                return
            self.errors_injected += 1
        if f.burst_status == 429:
            raise ApiError(429, "Rate Limit Exceeded", "rateLimitExceeded")
        if f.burst_status == 403:  # Compute Engine's per-minute API quota
            raise ApiError(403, "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'",
                           "rateLimitExceeded")
        raise ApiError(503, "The service is currently unavailable.", "backendError")

    def _instance_fault(self, project: str, zone: str, body: dict) -> dict | None:
        f = self.faults
        if f.fail_nth_instance is None or f.fail_label is None:
            return None
        key, value = f.fail_label
        if (body.get("labels") or {}).get(key) != value:
            return None
        count = self._label_counts.get(f.fail_label, 0) + 1
        self._label_counts[f.fail_label] = count
        if count < f.fail_nth_instance:
            return None
        if f.error_code == "ZONE_RESOURCE_POOL_EXHAUSTED":
            message = (f"The zone 'projects/{project}/zones/{zone}' does not have enough resources available to "
                       "fulfill the request.  Try a different zone, or try again later.")
            status, http = 503, "SERVICE UNAVAILABLE"
        else:
            region = zone.rsplit("-", 1)[0]
            message = f"Quota 'N2_CPUS' exceeded.  Limit: {8 * (count - 1)}.0 in region {region}."
            status, http = 403, "FORBIDDEN"
        return {"error": {"errors": [{"code": f.error_code, "message": message}]},
                "httpErrorStatusCode": status, "httpErrorMessage": http}

    # -- compute: instances ------------------------------------------------------------
    def _make_instance(self, project: str, zone: str, body: dict) -> dict:
        name = body.get("name") or ""
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise ApiError(400, f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                                "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
        if (project, zone, name) in self.instances:
            raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                           "alreadyExists")
        for k, v in (body.get("labels") or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", v):
                raise ApiError(400, f"Invalid value for field 'resource.labels': '{k}={v}'")
        inst = json.loads(json.dumps(body))
        nics = inst.get("networkInterfaces") or [{}]
        nics[0]["networkIP"] = self._ip()
        nics[0].setdefault("network", f"{COMPUTE}/projects/{project}/global/networks/default")
        for ac in nics[0].get("accessConfigs") or []:
            ac["natIP"] = nics[0]["networkIP"]  # "external" address: the same loopback address
        inst["networkInterfaces"] = nics
        inst.update(
            kind="compute#instance", id=str(next(self._ids)),
            zone=f"{COMPUTE}/projects/{project}/zones/{zone}",
            selfLink=f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{name}",
            creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime()),
            _created_at=time.monotonic(), _stuck=any(s in name for s in self.faults.stuck_names),
        )
        self.instances[(project, zone, name)] = inst
        self.created.append(("instance", inst))
        return inst

    def insert_instance(self, project: str, zone: str, body: dict, request_id: str | None) -> dict:
        created = []
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self._op_view(self.ops[self.request_ids[request_id]])
            target = f"{COMPUTE}/projects/{project}/zones/{zone}/instances/{body.get('name')}"
            error = self._instance_fault(project, zone, body)
            if error and self.faults.fail_sync:
                raise ApiError(403, error["error"]["errors"][0]["message"], "quotaExceeded")
            if error is None:
                created.append(self._make_instance(project, zone, body))
            op = self._new_op("zone", project, zone, "insert", target, error)
            if request_id:
                self.request_ids[request_id] = op["name"]
            view = self._op_view(op)
        self._fire(self.on_created, created)
        return view

    def bulk_insert(self, project: str, zone: str, body: dict, request_id: str | None) -> dict:
        created = []
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self._op_view(self.ops[self.request_ids[request_id]])
            props = body.get("instanceProperties") or {}
            count = int(body.get("count") or 0)
            names = list((body.get("perInstanceProperties") or {}).keys())
            pattern = body.get("namePattern")
            if not names and pattern:
                m = re.search(r"#+", pattern)
                if not m:
                    raise ApiError(400, "Invalid value for field 'resource.namePattern'")
                width = len(m.group())
                names = [pattern[:m.start()] + str(i).zfill(width) + pattern[m.end():] for i in range(1, count + 1)]
            if count and len(names) != count:
                raise ApiError(400, f"count ({count}) must equal the number of per-instance names ({len(names)})")
            error = None
            for name in names:
                inst_body = {**json.loads(json.dumps(props)), "name": name}
                inst_body["machineType"] = f"{COMPUTE}/projects/{project}/zones/{zone}/machineTypes/{props.get('machineType', '')}"
                error = self._instance_fault(project, zone, inst_body)
                if error and self.faults.fail_sync:
                    raise ApiError(403, error["error"]["errors"][0]["message"], "quotaExceeded")
                if error:
                    break  # instances created before the failing one stay (dsctl must clean them up)
                created.append(self._make_instance(project, zone, inst_body))
            op = self._new_op("zone", project, zone, "bulkInsert",
                              f"{COMPUTE}/projects/{project}/zones/{zone}/instances", error)
            if request_id:
                self.request_ids[request_id] = op["name"]
            view = self._op_view(op)
        self._fire(self.on_created, created)
        return view

    def list_instances(self, project: str, zone: str, query: dict) -> dict:
        with self.lock:
            gone = self._reap()
            terms = parse_filter(query.get("filter", [None])[0])
            items = [self._instance_view(i) for (p, z, _), i in sorted(self.instances.items()) if p == project and z == zone]
        self._fire(self.on_deleted, gone)
        items = [i for i in items if matches(i, terms)]
        return self._page(items, query, "compute#instanceList", f"projects/{project}/zones/{zone}/instances")

    @staticmethod
    def _page(items: list, query: dict, kind: str, link: str, key: str = "items") -> dict:
        max_results = int(query.get("maxResults", query.get("pageSize", ["500"]))[0] or 500)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        page = items[start:start + max_results]
        out = {"kind": kind, "id": link, key: page, "selfLink": f"{COMPUTE}/{link}"}
        if start + max_results < len(items):
            out["nextPageToken"] = str(start + max_results)
        return out

    def get_instance(self, project: str, zone: str, name: str) -> dict:
        with self.lock:
            gone = self._reap()
            inst = self.instances.get((project, zone, name))
            view = self._instance_view(inst) if inst else None
        self._fire(self.on_deleted, gone)
        if view is None:
            raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found", "notFound")
        return view

    def delete_instance(self, project: str, zone: str, name: str, request_id: str | None) -> dict:
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self._op_view(self.ops[self.request_ids[request_id]])
            inst = self.instances.get((project, zone, name))
            if inst is None:
                raise ApiError(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found", "notFound")
            if inst.get("_deleted_at") is None:
                inst["_deleted_at"] = time.monotonic()
            op = self._new_op("zone", project, zone, "delete", inst["selfLink"],
                              done_after=self.timing.stopping_s + 0.01)
            if request_id:
                self.request_ids[request_id] = op["name"]
            return self._op_view(op)

    # -- compute: operations -------------------------------------------------------------
    def get_op(self, name: str, wait: bool = False) -> dict:
        with self.lock:
            op = self.ops.get(name)
        if op is None:
            raise ApiError(404, f"The resource 'operation {name}' was not found", "notFound")
        if wait:  # like the real wait: return when DONE, or after a while anyway
            deadline = time.monotonic() + 2.0
            while time.monotonic() < min(op["_done_at"], deadline):
                time.sleep(min(0.02, max(op["_done_at"] - time.monotonic(), 0.001)))
        with self.lock:
            gone = self._reap()
            view = self._op_view(op)
        self._fire(self.on_deleted, gone)
        return view

    # -- compute: firewalls ----------------------------------------------------------------
    def insert_firewall(self, project: str, body: dict, request_id: str | None) -> dict:
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self._op_view(self.ops[self.request_ids[request_id]])
            name = body.get("name") or ""
            if (project, name) in self.firewalls:
                raise ApiError(409, f"The resource 'projects/{project}/global/firewalls/{name}' already exists", "alreadyExists")
            if not body.get("allowed") and not body.get("denied"):
                raise ApiError(400, "Invalid value for field 'resource.allowed': ''. Must specify at least one of allowed or denied.")
            fw = {**json.loads(json.dumps(body)), "kind": "compute#firewall", "id": str(next(self._ids)),
                  "selfLink": f"{COMPUTE}/projects/{project}/global/firewalls/{name}"}
            self.firewalls[(project, name)] = fw
            self.created.append(("firewall", fw))
            op = self._new_op("global", project, None, "insert", fw["selfLink"])
            if request_id:
                self.request_ids[request_id] = op["name"]
            return self._op_view(op)

    def list_firewalls(self, project: str, query: dict) -> dict:
        terms = parse_filter(query.get("filter", [None])[0])
        with self.lock:
            items = [dict(f) for (p, _), f in sorted(self.firewalls.items()) if p == project]
        items = [i for i in items if matches(i, terms)]
        return self._page(items, query, "compute#firewallList", f"projects/{project}/global/firewalls")

    def get_firewall(self, project: str, name: str) -> dict:
        with self.lock:
            fw = self.firewalls.get((project, name))
        if fw is None:
            raise ApiError(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found", "notFound")
        return fw

    def delete_firewall(self, project: str, name: str, request_id: str | None) -> dict:
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self._op_view(self.ops[self.request_ids[request_id]])
            fw = self.firewalls.pop((project, name), None)
            if fw is None:
                raise ApiError(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found", "notFound")
            op = self._new_op("global", project, None, "delete", fw["selfLink"])
            if request_id:
                self.request_ids[request_id] = op["name"]
            return self._op_view(op)

    # -- cloud tpu -------------------------------------------------------------------------
    def _tpu_op(self, project: str, zone: str, response: dict | None, error: dict | None, done_after: float) -> dict:
        op_id = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
        op = {"name": f"projects/{project}/locations/{zone}/operations/{op_id}", "_done_at": time.monotonic() + done_after,
              "_response": response, "_error": error}
        self.ops[op["name"]] = op
        return op

    def _tpu_op_view(self, op: dict) -> dict:
        out = {"name": op["name"], "metadata": {
            "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
            "createTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "verb": "create", "apiVersion": "v2"}}
        if time.monotonic() >= op["_done_at"]:
            out["done"] = True
            if op["_error"]:
                out["error"] = op["_error"]
            else:
                resp = op["_response"]
                if resp is not None and resp.get("@type", "").endswith("Node"):
                    key = tuple(resp["name"].split("/")[i] for i in (1, 3, 5))
                    node = self.tpus.get(key)
                    resp = {"@type": resp["@type"], **(self._tpu_view(node) if node else {})}
                out["response"] = resp or {"@type": "type.googleapis.com/google.protobuf.Empty"}
        else:
            out["done"] = False
        return out

    def _tpu_view(self, node: dict) -> dict:
        out = {k: v for k, v in node.items() if not k.startswith("_")}
        if node.get("_deleted_at") is not None:
            out["state"] = "DELETING"
        else:
            out["state"] = "READY" if time.monotonic() - node["_created_at"] >= self.timing.tpu_creating_s else "CREATING"
        return out

    def create_tpu(self, project: str, zone: str, node_id: str, body: dict) -> dict:
        created = []
        with self.lock:
            if (project, zone, node_id) in self.tpus:
                raise ApiError(409, f"node {node_id} already exists", "alreadyExists")
            if self.faults.tpu_exhausted:
                op = self._tpu_op(project, zone, None, {"code": 8, "message": (
                    f"There is no more capacity in the zone \"{zone}\"; you can try in another zone where Cloud TPU "
                    "Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1]")}, self.timing.op_s)
                return self._tpu_op_view(op)
            node = json.loads(json.dumps(body))
            ip = self._ip()
            node.update(name=f"projects/{project}/locations/{zone}/nodes/{node_id}", id=str(next(self._ids)),
                        networkEndpoints=[{"ipAddress": ip, "port": 8470}], health="HEALTHY", apiVersion="V2",
                        createTime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), _created_at=time.monotonic())
            self.tpus[(project, zone, node_id)] = node
            self.created.append(("tpu", node))
            created.append(node)
            op = self._tpu_op(project, zone, {"@type": "type.googleapis.com/google.cloud.tpu.v2.Node", "name": node["name"]},
                              None, self.timing.tpu_creating_s)
            view = self._tpu_op_view(op)
        self._fire(self.on_created, created)
        return view

    def list_tpus(self, project: str, zone: str, query: dict) -> dict:
        with self.lock:
            gone = self._reap()
            items = [self._tpu_view(n) for (p, z, _), n in sorted(self.tpus.items()) if p == project and z == zone]
        self._fire(self.on_deleted, gone)
        page = self._page(items, query, "", "", key="nodes")
        return {k: v for k, v in page.items() if k in ("nodes", "nextPageToken")}

    def get_tpu(self, project: str, zone: str, node_id: str) -> dict:
        with self.lock:
            gone = self._reap()
            node = self.tpus.get((project, zone, node_id))
            view = self._tpu_view(node) if node else None
        self._fire(self.on_deleted, gone)
        if view is None:
            raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found", "notFound")
        return view

    def delete_tpu(self, project: str, zone: str, node_id: str) -> dict:
        with self.lock:
            node = self.tpus.get((project, zone, node_id))
            if node is None:
                raise ApiError(404, f"Resource 'projects/{project}/locations/{zone}/nodes/{node_id}' was not found", "notFound")
            node.setdefault("_deleted_at", time.monotonic())
            op = self._tpu_op(project, zone, {"@type": "type.googleapis.com/google.protobuf.Empty"}, None,
                              self.timing.stopping_s + 0.01)
            return self._tpu_op_view(op)

    def get_tpu_op(self, name: str) -> dict:
        with self.lock:
            gone = self._reap()
            op = self.ops.get(name)
            view = self._tpu_op_view(op) if op else None
        self._fire(self.on_deleted, gone)
        if view is None:
            raise ApiError(404, f"operation {name} not found", "notFound")
        return view


# -- HTTP ------------------------------------------------------------------------------------------
ROUTES = [
    ("POST", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/bulkInsert", "bulk_insert"),
    ("POST", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances", "insert_instance"),
    ("GET", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances", "list_instances"),
    ("GET", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", "get_instance"),
    ("DELETE", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", "delete_instance"),
    ("GET", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)", "zone_op"),
    ("POST", r"/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)/wait", "zone_op_wait"),
    ("POST", r"/compute/v1/projects/([^/]+)/global/firewalls", "insert_firewall"),
    ("GET", r"/compute/v1/projects/([^/]+)/global/firewalls", "list_firewalls"),
    ("GET", r"/compute/v1/projects/([^/]+)/global/firewalls/([^/]+)", "get_firewall"),
    ("DELETE", r"/compute/v1/projects/([^/]+)/global/firewalls/([^/]+)", "delete_firewall"),
    ("GET", r"/compute/v1/projects/([^/]+)/global/operations/([^/]+)", "global_op"),
    ("POST", r"/compute/v1/projects/([^/]+)/global/operations/([^/]+)/wait", "global_op_wait"),
    ("POST", r"/v2/projects/([^/]+)/locations/([^/]+)/nodes", "create_tpu"),
    ("GET", r"/v2/projects/([^/]+)/locations/([^/]+)/nodes", "list_tpus"),
    ("GET", r"/v2/projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)", "get_tpu"),
    ("DELETE", r"/v2/projects/([^/]+)/locations/([^/]+)/nodes/([^/]+)", "delete_tpu"),
    ("GET", r"/v2/(projects/[^/]+/locations/[^/]+/operations/[^/]+)", "tpu_op"),
]
_COMPILED = [(m, re.compile(p + r"/?"), h) for m, p, h in ROUTES]


def _dispatch(cloud: FakeCloud, method: str, path: str, query: dict, body: dict):
    if path == "/_fake/stats":  # for benchmarks running the stand-in in another process
        with cloud.lock:
            return {"calls": len(cloud.calls), "errors_injected": cloud.errors_injected, **{
                "instances": len(cloud.instances), "firewalls": len(cloud.firewalls), "tpus": len(cloud.tpus)}}
    rid = (query.get("requestId") or [None])[0]
    for m, pattern, handler in _COMPILED:
        if m != method:
            continue
        match = pattern.fullmatch(path)
        if not match:
            continue
        a = match.groups()
        if handler == "insert_instance":
            return cloud.insert_instance(a[0], a[1], body, rid)
        if handler == "bulk_insert":
            return cloud.bulk_insert(a[0], a[1], body, rid)
        if handler == "list_instances":
            return cloud.list_instances(a[0], a[1], query)
        if handler == "get_instance":
            return cloud.get_instance(*a)
        if handler == "delete_instance":
            return cloud.delete_instance(*a, rid)
        if handler in ("zone_op", "zone_op_wait"):
            return cloud.get_op(a[2], wait=handler.endswith("wait"))
        if handler == "insert_firewall":
            return cloud.insert_firewall(a[0], body, rid)
        if handler == "list_firewalls":
            return cloud.list_firewalls(a[0], query)
        if handler == "get_firewall":
            return cloud.get_firewall(*a)
        if handler == "delete_firewall":
            return cloud.delete_firewall(*a, rid)
        if handler in ("global_op", "global_op_wait"):
            return cloud.get_op(a[1], wait=handler.endswith("wait"))
        if handler == "create_tpu":
            node_id = (query.get("nodeId") or [None])[0]
            if not node_id:
                raise ApiError(400, "nodeId is required")
            return cloud.create_tpu(a[0], a[1], node_id, body)
        if handler == "list_tpus":
            return cloud.list_tpus(a[0], a[1], query)
        if handler == "get_tpu":
            return cloud.get_tpu(*a)
        if handler == "delete_tpu":
            return cloud.delete_tpu(*a)
        if handler == "tpu_op":
            return cloud.get_tpu_op(a[0])
    raise ApiError(404, f"no such API: {method} {path}", "notFound")


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
        with cloud.lock:
            cloud.calls.append((method, url.path))
        if cloud.faults.latency_s:
            time.sleep(cloud.faults.latency_s)
        try:
            cloud.maybe_fail_call()
            body = json.loads(raw) if raw else {}
            status, payload = 200, _dispatch(cloud, method, url.path, query, body)
        except ApiError as exc:
            status = exc.status
            payload = {"error": {"code": exc.status, "message": exc.message,
                                 "errors": [{"message": exc.message, "domain": "global", "reason": exc.reason}]}}
        except ValueError as exc:
            status = 400
            payload = {"error": {"code": 400, "message": str(exc), "errors": [{"message": str(exc), "reason": "invalid"}]}}
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


class FakeGce:
    """The stand-in server on 127.0.0.1, in a thread. `endpoint` is what DSCTL_GCE_ENDPOINT/DSCTL_TPU_ENDPOINT take."""

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

    def __enter__(self) -> "FakeGce":
        self.thread.start()
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
