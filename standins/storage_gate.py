"""Cloud Storage that authorizes as Google does: a gate on loopback in front of gcp-storage-emulator.

The emulator stores objects faithfully but lets every caller do everything (its IAM endpoints only
store a policy; testPermissions grants all). The gate answers what Cloud Storage decides itself and
forwards the rest:

* who calls: the request's OAuth 2.0 access token, one the stand-in issued (fake_identity.py);
  none is an anonymous caller, refused (401) on anything not public
  (https://cloud.google.com/storage/docs/authentication);
* what they may do: the permission each JSON API method needs
  (https://cloud.google.com/storage/docs/access-control/iam-json), on the bucket or object, from
  the bucket's own allow policy and what it inherits from its project and organization
  (https://cloud.google.com/storage/docs/access-control/iam). Overwriting an object needs
  storage.objects.delete too ("storage.objects.delete ... is also needed to overwrite existing
  objects", https://cloud.google.com/storage/docs/access-control/iam-permissions);
* buckets' IAM policies (`b/BUCKET/iam`, `iam/testPermissions`), kept in the stand-in's identity
  state, with a new bucket's convenience-value bindings;
* a bucket's project, recorded at create (its policy inherits that project's), and the
  organization policies a create must meet: gcp.resourceLocations on its location,
  storage.uniformBucketLevelAccess (https://cloud.google.com/storage/docs/org-policy-constraints);
* the Cloud Storage API must be on in the bucket's project (403 SERVICE_DISABLED otherwise).

TensorFlow's GCS filesystem reaches it through gcs_proxy.py (its media host's `/<bucket>/<object>`
form, read as objects.get). A resumable upload's later requests are authorized by their session
URI, as on Cloud Storage. Faults.storage_bursts lets the stand-in's error bursts reach storage too.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

from fake_identity import ApiRefusal, location_admitted

STORAGE = "storage.googleapis.com"
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
        "proxy-authenticate"}


def _object_name(raw: bytes, query: dict) -> str | None:
    """The object an upload creates: `name` in the query, or in the JSON metadata (resumable initiation, or the
    first part of a multipart/related body)."""
    if query.get("name"):
        return query["name"][0]
    text = raw[:65536].decode("utf-8", "replace")
    m = re.search(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    return json.loads(f'"{m.group(1)}"') if m else None


class StorageGate:
    """The gate on 127.0.0.1, in a thread: set STORAGE_EMULATOR_HOST to `endpoint`."""

    def __init__(self, cloud, emulator: str, *, default_project: str):
        self.cloud = cloud
        split = urlsplit(emulator)
        self.upstream = (split.hostname or "127.0.0.1", split.port or 80)
        cloud.default_bucket_project = default_project
        handler = type("Handler", (_Handler,), {"gate": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.refused: list[tuple[str, str, int]] = []  # (member, what, status) of every refusal, for assertions

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StorageGate:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what a request needs ------------------------------------------------------------------------------
    def decide(self, method: str, path: str, query: dict, raw: bytes) -> tuple[str, str, str] | None:
        """(permission, resource, bucket) the request needs; None for a resumable upload's continuation."""
        m = re.fullmatch(r"/(?:upload/|download/)?storage/v1/b(?:/([^/]+)(/.*)?)?", path)
        if not m:  # TensorFlow's media host: /<bucket>/<object>
            parts = path.lstrip("/").split("/", 1)
            if method not in ("GET", "HEAD") or len(parts) != 2:
                raise ApiRefusal(400, f"The stand-in does not serve {method} {path}.", "INVALID_ARGUMENT", "invalid")
            bucket, obj = parts[0], unquote(parts[1])
            return "storage.objects.get", f"projects/_/buckets/{bucket}/objects/{obj}", bucket
        bucket, rest = m.group(1), m.group(2) or ""
        if bucket is None:
            project = (query.get("project") or [""])[0]
            return ("storage.buckets.create" if method == "POST" else "storage.buckets.list"), f"projects/{project}", ""
        bucket = unquote(bucket)
        res = f"projects/_/buckets/{bucket}"
        if rest == "":
            return {"GET": "storage.buckets.get", "PATCH": "storage.buckets.update", "PUT": "storage.buckets.update",
                    "DELETE": "storage.buckets.delete"}.get(method, "storage.buckets.get"), res, bucket
        if rest in ("/iam", "/iam/testPermissions"):  # answered by the gate itself (_iam), which checks them
            return "storage.buckets.getIamPolicy", res, bucket
        if rest == "/o":
            if path.startswith("/upload/"):
                if "upload_id" in query:
                    return None
                return "storage.objects.create", f"{res}/objects/{_object_name(raw, query) or ''}", bucket
            return "storage.objects.list", res, bucket
        om = re.fullmatch(r"/o/([^/]+)(/.*)?", rest)
        if om:
            obj = unquote(om.group(1))
            if om.group(2):  # compose, copyTo, rewriteTo: a new object
                return "storage.objects.create", f"{res}/objects/{obj}", bucket
            verb = {"GET": "get", "HEAD": "get", "DELETE": "delete", "PATCH": "update", "PUT": "update"}[method]
            return f"storage.objects.{verb}", f"{res}/objects/{obj}", bucket
        raise ApiRefusal(400, f"The stand-in does not serve {method} {path}.", "INVALID_ARGUMENT", "invalid")

    def exists(self, bucket: str, obj: str) -> bool:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.request("GET", f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(obj, safe='')}")
            return conn.getresponse().status == 200
        finally:
            conn.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    gate: StorageGate

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, r: ApiRefusal) -> None:
        self.gate.refused.append((self.gate.cloud.caller or "anonymous", self.path, r.status))
        error = {"code": r.status, "message": r.message,
                 "errors": [{"message": r.message, "domain": "global", "reason": r.reason}]}
        if r.details:
            error["details"] = r.details
        self._answer(r.status, {"error": error})

    def _handle(self, method: str) -> None:
        gate, cloud = self.gate, self.gate.cloud
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            if cloud.faults.storage_bursts:
                cloud.maybe_fail_call(method, url.path)
            cloud.authenticate(self.headers.get("Authorization"), "storage")
            decided = gate.decide(method, url.path, query, raw)
            if decided is not None:
                permission, resource, bucket = decided
                if cloud.caller is None:
                    what = "object" if "/objects/" in resource else "bucket"
                    raise ApiRefusal(401, f"Anonymous caller does not have {permission} access to the Google Cloud "
                                     f"Storage {what}. Permission '{permission}' denied on resource (or it may not "
                                     "exist).", "UNAUTHENTICATED", "required")
                project = resource.split("/")[1] if not bucket else cloud.bucket_project(bucket)
                cloud.require_service(project, STORAGE)
                if permission == "storage.buckets.create":
                    self._create_bucket(resource.split("/")[1], raw)
                if url.path.endswith("/iam") or url.path.endswith("/iam/testPermissions"):
                    return self._iam(method, url.path, query, raw, bucket)
                cloud.require(permission, resource)
                if permission == "storage.objects.create" and "/objects/" in resource:
                    obj = resource.split("/objects/", 1)[1]
                    if obj and gate.exists(bucket, obj):
                        cloud.require("storage.objects.delete", resource)
        except ApiRefusal as r:
            return self._refuse(r)
        except Exception as exc:  # noqa: BLE001 - fake_gce's ApiError (an injected burst)
            status = getattr(exc, "status", 500)
            return self._answer(status, {"error": {"code": status, "message": str(exc),
                                                   "errors": [{"message": str(exc), "domain": "global",
                                                               "reason": getattr(exc, "reason", "backendError")}]}})
        self._forward(method, raw)

    def _create_bucket(self, project: str, raw: bytes) -> None:
        """What a bucket's create must meet besides storage.buckets.create: the organization's location and uniform
        access policies; the bucket then belongs to `project`."""
        cloud = self.gate.cloud
        cloud.require("storage.buckets.create", f"projects/{project}")
        body = json.loads(raw or b"{}")
        location = (body.get("location") or "US").lower()
        rules = cloud.org_rules(project, "gcp.resourceLocations")
        if rules and not location_admitted(rules, location):
            raise ApiRefusal(412, f"'{location}' violates constraint 'constraints/gcp.resourceLocations'",
                             "FAILED_PRECONDITION", "conditionNotMet")
        ubla = ((body.get("iamConfiguration") or {}).get("uniformBucketLevelAccess") or {}).get("enabled")
        if cloud.org_policy_enforced(project, "storage.uniformBucketLevelAccess") and not ubla:
            raise ApiRefusal(412, "Request violates constraint 'constraints/storage.uniformBucketLevelAccess'",
                             "FAILED_PRECONDITION", "conditionNotMet")
        if body.get("name"):
            with cloud.lock:  # a new bucket: its own policy, with its project's convenience values
                cloud.bucket_projects[body["name"]] = project
                cloud.policies.pop(f"projects/_/buckets/{body['name']}", None)

    def _iam(self, method: str, path: str, query: dict, raw: bytes, bucket: str) -> None:
        cloud = self.gate.cloud
        resource = f"projects/_/buckets/{bucket}"
        if path.endswith("/testPermissions"):
            granted = cloud.test_permissions(resource, query.get("permissions") or [])
            return self._answer(200, {"kind": "storage#testIamPermissionsResponse", "permissions": granted})
        if method == "GET":
            cloud.require("storage.buckets.getIamPolicy", resource)
            with cloud.lock:
                view = cloud._policy(resource).view()
        else:
            cloud.require("storage.buckets.setIamPolicy", resource)
            with cloud.lock:
                view = cloud._set_policy(resource, {"policy": json.loads(raw or b"{}")})
        return self._answer(200, {"kind": "storage#policy", "resourceId": resource, **view,
                                  "bindings": view.get("bindings", [])})

    def _forward(self, method: str, raw: bytes) -> None:
        conn = http.client.HTTPConnection(*self.gate.upstream, timeout=300)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "content-length"}
            headers["Content-Length"] = str(len(raw))
            conn.request(method, self.path, body=raw, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)
        finally:
            conn.close()

    def _any(self) -> None:
        self._handle(self.command)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any
