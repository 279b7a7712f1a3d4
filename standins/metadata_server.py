"""A stand-in for the Compute Engine metadata server, for tests that boot a "VM" (see vmboot.py).

It serves the documented ``/computeMetadata/v1/`` tree a boot uses, from one in-memory dict, and
enforces the two request rules of the real server:

* every request under ``/computeMetadata/`` must carry ``Metadata-Flavor: Google``; without it the
  answer is ``403 Forbidden`` ("Your client does not have permission ... Missing Metadata-Flavor:Google
  header."). Every answer, errors included, carries ``Metadata-Flavor: Google`` (clients such as
  google-auth check that header to decide they are on Compute Engine).
* a request carrying ``X-Forwarded-For`` is refused with ``403``, whatever its other headers: the
  server only answers the VM itself, never a proxy relaying for someone else.

Sources: Compute Engine's "Storing and retrieving instance metadata" page,
https://cloud.google.com/compute/docs/storing-retrieving-metadata (the header requirement; its
section https://cloud.google.com/compute/docs/storing-retrieving-metadata#x-forwarded-for_header
is the one Envoy's GCP metadata clients cite for "metadata server rejects X-Forwarded-For
requests", and why proxies such as k8s-metadata-proxy strip that header), and the troubleshooting
page https://cloud.google.com/compute/docs/troubleshooting/troubleshoot-metadata-server (403 when
a request fails the security checks). The guest agent's own client (GoogleCloudPlatform/guest-agent,
metadata/metadata.go) always sends ``Metadata-Flavor: Google`` to http://169.254.169.254/computeMetadata/v1/.

Paths (all GET; ``<sa>`` is ``default`` or the service account's e-mail)::

    /computeMetadata/v1/instance/attributes/<key>      instance metadata (startup-script, ...)
    /computeMetadata/v1/instance/attributes/?recursive=true   all of them as one JSON object
                                                        (what google_metadata_script_runner asks for)
    /computeMetadata/v1/instance/service-accounts/<sa>/token   {"access_token","expires_in","token_type"}
    /computeMetadata/v1/instance/service-accounts/<sa>/email   the service account
    /computeMetadata/v1/instance/service-accounts/<sa>/scopes  one scope a line
    /computeMetadata/v1/instance/network-interfaces/0/ip       the VM's address (also gateway, mtu, ...)
    /computeMetadata/v1/instance/{hostname,id,name,zone,machine-type}
    /computeMetadata/v1/project/project-id, project/numeric-project-id, project/attributes/<key>

As on the real server: a directory path ending in ``/`` lists its entries (sub-directories with a
trailing ``/``); without the ``/`` it redirects (301) to it, unless ``recursive=true``, which answers
the whole sub-tree as JSON (built-in keys camelCased, attribute keys as set); ``alt=json`` on a leaf
answers a JSON string; a missing path is 404. Not modelled: ``wait_for_change`` (answered at once),
identity tokens, guest attributes, v1beta1/0.1 endpoints.

Tokens are random strings (``ya29.dsctl-test-...``) the server remembers, so a Cloud Storage
stand-in can insist on one it issued (:meth:`MetadataServer.token_is_valid`).

Counting: every answer is recorded (client address, method, path, status, bytes written including
the status line and headers): :meth:`request_count`, :meth:`bytes_served`, :attr:`requests`.

Usage (standalone, e.g. on loopback)::

    with MetadataServer(attributes={"startup-script": "#!/bin/bash\\necho hi"}) as mds:
        urllib.request.urlopen(urllib.request.Request(
            mds.url + "/computeMetadata/v1/instance/attributes/startup-script",
            headers={"Metadata-Flavor": "Google"}))

``vmboot.BootedVm`` runs one inside the VM's gateway namespace at 169.254.169.254:80.
"""

from __future__ import annotations

import io
import json
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

FLAVOR = ("Metadata-Flavor", "Google")
_PREFIX = "/computeMetadata/"
_V1 = "/computeMetadata/v1"
# Directories whose children are user-chosen keys: never camelCased in recursive JSON.
_VERBATIM_DIRS = {"attributes", "service-accounts"}


@dataclass(frozen=True)
class Served:
    """One answer: who asked, what, the status and the bytes written to the client."""

    client: str
    method: str
    path: str
    status: int
    bytes: int
    at: float


class _Token:
    """Marks the dynamic token leaf in the tree."""


def _camel(key: str) -> str:
    head, *rest = key.split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class ThreadedService:
    """An HTTP server run from its own thread, stoppable with its idle connections. Subclasses give
    `_make_httpd()` and keep `host`, `port`, `_lock` and `_connections` (sockets of open connections)."""

    _httpd = None
    _thread = None

    def _make_httpd(self):
        raise NotImplementedError

    def start(self, prepare_thread: Callable[[], None] | None = None):
        """Bind and serve from a thread. ``prepare_thread`` runs first in that thread (before the
        socket is created): vmboot uses it to enter the gateway network namespace."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            try:
                if prepare_thread:
                    prepare_thread()
                httpd = self._make_httpd()
                self._httpd = httpd
                self.port = httpd.server_address[1]
            except BaseException as e:  # reported to start()'s caller
                failure.append(e)
                ready.set()
                return
            ready.set()
            httpd.serve_forever(poll_interval=0.05)

        self._thread = threading.Thread(target=serve, name=type(self).__name__, daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        # Idle keep-alive connections would otherwise keep their sockets (and the network
        # namespace they live in) open until the client goes away.
        with self._lock:
            conns = list(self._connections)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread:
            self._thread.join(timeout=5)


class MetadataServer(ThreadedService):
    """The metadata server stand-in. Thread-safe; attributes may change while it runs."""

    def __init__(
        self,
        *,
        attributes: dict[str, str] | None = None,
        project_attributes: dict[str, str] | None = None,
        project_id: str = "dsctl-test",
        numeric_project_id: str = "123456789012",
        instance_name: str = "dsctl-vm",
        instance_id: str | None = None,
        zone: str = "us-central1-b",
        machine_type: str = "e2-standard-4",
        network_ip: str = "10.128.0.2",
        gateway_ip: str = "10.128.0.1",
        subnet_mask: str = "255.255.240.0",
        mtu: int = 1460,
        mac: str = "42:01:0a:80:00:02",
        service_account: str | None = None,
        scopes: Iterable[str] = ("https://www.googleapis.com/auth/cloud-platform",),
        token_lifetime_s: int = 3599,
        host: str = "127.0.0.1",
        port: int = 0,
        token_issuer: Callable[[str], str] | None = None,
    ):
        """`token_issuer(account)`: where the VM's tokens come from (the Compute/TPU stand-in, whose APIs then know
        who calls: fake_identity.IdentityApis.issue_token); without it the server makes and remembers its own."""
        self.host, self.port = host, port
        self._token_issuer = token_issuer
        self.project_id = project_id
        self.service_account = service_account or f"{numeric_project_id}-compute@developer.gserviceaccount.com"
        self.token_lifetime_s = token_lifetime_s
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}
        self._served: list[Served] = []
        self._instance_attributes = dict(attributes or {})
        self._project_attributes = dict(project_attributes or {})
        zone_path = f"projects/{numeric_project_id}/zones/{zone}"
        sa_entry = {"aliases": "default", "email": self.service_account,
                    "scopes": "".join(s + "\n" for s in scopes), "token": _Token()}
        self._tree = {
            "instance": {
                "attributes": self._instance_attributes,
                "hostname": f"{instance_name}.{zone}.c.{project_id}.internal",
                "id": instance_id or str(secrets.randbelow(9 * 10**18) + 10**18),
                "name": instance_name,
                "zone": zone_path,
                "machine-type": f"projects/{numeric_project_id}/machineTypes/{machine_type}",
                "cpu-platform": "Intel Broadwell",
                "network-interfaces": {"0": {
                    "ip": network_ip, "gateway": gateway_ip, "subnetmask": subnet_mask, "mtu": str(mtu),
                    "mac": mac, "network": f"projects/{numeric_project_id}/networks/default",
                    "access-configs": {}, "forwarded-ips": {}, "ip-aliases": {}, "dns-servers": {}}},
                "service-accounts": {"default": sa_entry, self.service_account: sa_entry},
                "scheduling": {"automatic-restart": "TRUE", "on-host-maintenance": "MIGRATE",
                               "preemptible": "FALSE"},
                "tags": "[]",
                "image": "projects/debian-cloud/global/images/debian-12-bookworm-v20260101",
            },
            "project": {
                "project-id": project_id,
                "numeric-project-id": numeric_project_id,
                "attributes": self._project_attributes,
            },
        }
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set = set()

    # ---- configuration ---------------------------------------------------------------------
    def set_attribute(self, key: str, value: str | None, *, project: bool = False) -> None:
        """Set (or with None remove) an instance (or project) attribute while serving."""
        target = self._project_attributes if project else self._instance_attributes
        with self._lock:
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value

    @property
    def attributes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._instance_attributes)

    # ---- tokens ----------------------------------------------------------------------------
    def issue_token(self) -> str:
        if self._token_issuer is not None:
            return self._token_issuer(self.service_account)
        token = "ya29.dsctl-test-" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.time() + self.token_lifetime_s
        return token

    def token_is_valid(self, token: str) -> bool:
        with self._lock:
            expiry = self._tokens.get(token)
        return expiry is not None and expiry > time.time()

    # ---- statistics ------------------------------------------------------------------------
    @property
    def requests(self) -> list[Served]:
        with self._lock:
            return list(self._served)

    def request_count(self, client: str | None = None) -> int:
        return sum(1 for s in self.requests if client is None or s.client == client)

    def bytes_served(self, client: str | None = None) -> int:
        return sum(s.bytes for s in self.requests if client is None or s.client == client)

    def _record(self, served: Served) -> None:
        with self._lock:
            self._served.append(served)

    # ---- serving ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _make_httpd(self):
        httpd = _Httpd((self.host, self.port), _Handler)
        httpd.mds = self
        return httpd

    def __enter__(self) -> MetadataServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the tree --------------------------------------------------------------------------
    def _lookup(self, parts: list[str]):
        node = self._tree
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def _to_json(self, node, key: str | None = None):
        if isinstance(node, _Token):
            return None  # tokens are never part of a recursive listing (as on the real server)
        if not isinstance(node, dict):
            return node
        verbatim = key in _VERBATIM_DIRS
        out = {}
        for k, v in node.items():
            if isinstance(v, _Token):
                continue
            out[k if verbatim else _camel(k)] = self._to_json(v, k)
        return out


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    mds: MetadataServer


class _Handler(BaseHTTPRequestHandler):
    server: _Httpd
    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections

    def version_string(self) -> str:  # the real server's Server header
        return "Metadata Server for VM"

    def log_message(self, *args) -> None:  # quiet: tests read .requests instead
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.mds._lock:
            self.server.mds._connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.mds._lock:
                self.server.mds._connections.discard(self.connection)

    # ---- dispatch --------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._handle(body=True)

    def do_HEAD(self) -> None:
        self._handle(body=False)

    def _not_allowed(self) -> None:
        self._answer(HTTPStatus.METHOD_NOT_ALLOWED, "Method not allowed\n", body=True)

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def _handle(self, body: bool) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/":
            return self._answer(HTTPStatus.OK, "computeMetadata/\n", body=body)
        if self.headers.get("X-Forwarded-For") is not None:
            return self._answer(HTTPStatus.FORBIDDEN, self._forbidden(
                "Request contains an X-Forwarded-For header: the metadata server does not answer "
                "proxied requests."), body=body, html=True)
        if path.startswith(_PREFIX) and self.headers.get(FLAVOR[0]) != FLAVOR[1]:
            return self._answer(HTTPStatus.FORBIDDEN, self._forbidden(
                "Missing Metadata-Flavor:Google header."), body=body, html=True)
        if path in ("/computeMetadata", _PREFIX):
            return self._answer(HTTPStatus.OK, "v1/\n", body=body)
        if not (path == _V1 or path.startswith(_V1 + "/")):
            return self._answer(HTTPStatus.NOT_FOUND, "Not Found\n", body=body)
        rel = path[len(_V1):]
        trailing = rel.endswith("/") or rel == ""
        parts = [p for p in rel.split("/") if p]
        mds = self.server.mds
        with mds._lock:
            node = mds._lookup(parts)
            if isinstance(node, dict):
                node = _snapshot(node)
        if node is None:
            return self._answer(HTTPStatus.NOT_FOUND, "Not Found\n", body=body)
        recursive = query.get("recursive", "").lower() == "true"
        alt = query.get("alt", "json" if recursive else "text")
        if isinstance(node, _Token):
            token = mds.issue_token()
            return self._answer(HTTPStatus.OK, json.dumps(
                {"access_token": token, "expires_in": mds.token_lifetime_s, "token_type": "Bearer"}),
                body=body, content_type="application/json")
        if isinstance(node, dict):
            if recursive:
                return self._answer(HTTPStatus.OK, json.dumps(mds._to_json(node, parts[-1] if parts else None)),
                                    body=body, content_type="application/json")
            if not trailing:
                self._location = path + "/" + (("?" + url.query) if url.query else "")
                return self._answer(HTTPStatus.MOVED_PERMANENTLY, "", body=body)
            listing = "".join(k + ("/" if isinstance(v, dict) else "") + "\n" for k, v in node.items())
            return self._answer(HTTPStatus.OK, listing, body=body)
        if alt == "json":
            return self._answer(HTTPStatus.OK, json.dumps(node), body=body, content_type="application/json")
        return self._answer(HTTPStatus.OK, str(node), body=body)

    @staticmethod
    def _forbidden(why: str) -> str:
        return ("<!DOCTYPE html>\n<html lang=en><title>Error 403 (Forbidden)!!1</title>\n"
                "<p><b>403.</b> <ins>That's an error.</ins>\n"
                f"<p>Your client does not have permission to get this URL from this server. {why} "
                "<ins>That's all we know.</ins>\n")

    def _answer(self, status: HTTPStatus, text: str, *, body: bool, html: bool = False,
                content_type: str = "application/text") -> None:
        data = text.encode()
        # The whole answer is built first and recorded BEFORE the client can have it, so the
        # counters never lag behind what a client has already received.
        real, buf = self.wfile, io.BytesIO()
        self.wfile = buf
        try:
            self.send_response(status)
            self.send_header(*FLAVOR)
            self.send_header("Content-Type", "text/html; charset=UTF-8" if html else content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-XSS-Protection", "0")
            self.send_header("X-Frame-Options", "SAMEORIGIN")
            location = getattr(self, "_location", None)
            if location:
                self.send_header("Location", location)
                self._location = None
            self.end_headers()
            if body:
                buf.write(data)
        finally:
            self.wfile = real
        out = buf.getvalue()
        self.server.mds._record(Served(self.client_address[0], self.command, self.path, int(status),
                                       len(out), time.time()))
        real.write(out)
        real.flush()


def _snapshot(node: dict) -> dict:
    """A copy of a directory (taken under the server's lock) so answering never races a change."""
    return {k: (_snapshot(v) if isinstance(v, dict) else v) for k, v in node.items()}
