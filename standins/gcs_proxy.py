"""Let REAL TensorFlow processes use gs:// paths served by gcp-storage-emulator, with no cloud.

TensorFlow's GCS filesystem (``libtensorflow_framework.so.2``, tsl/platform/cloud/gcs_file_system.cc)
has its endpoints compiled in and no emulator setting:

* ``https://www.googleapis.com/storage/v1/...``         bucket and object metadata, listing, delete
* ``https://www.googleapis.com/upload/storage/v1/...``  uploads (resumable: POST, then PUT to ``Location``)
* ``https://storage.googleapis.com/<bucket>/<object>``   object bytes, always with a ``Range`` header

It talks through libcurl, which honours the proxy environment variables and reads ``CURL_CA_BUNDLE``.
:class:`GcsProxy` is an HTTP CONNECT proxy on 127.0.0.1 that accepts tunnels to exactly those two
hosts (port 443), terminates their TLS with a certificate from a throwaway CA made for this proxy
(``cryptography``), checks each decrypted request against the GCS API paths TensorFlow uses, and
forwards it in plain HTTP to the emulator. Everything else is refused: CONNECT to any other host or
port, plain-HTTP proxying, other methods, other paths (OAuth token endpoints included). Nothing can
reach the internet through it, and nothing in dsctl or TensorFlow is changed or patched.

Usage::

    from gcs_proxy import GcsProxy

    with GcsProxy(emulator_endpoint="http://127.0.0.1:PORT", workdir=tmp_path) as proxy:
        env = {**os.environ, **proxy.env}          # for a subprocess running TensorFlow
        subprocess.run([python, "-c", "...tf.io.gfile.glob('gs://bucket/prefix/*')..."], env=env)
        assert proxy.bytes_read(bucket="bucket", prefix="prefix/") > 0
        assert proxy.refused == []

``proxy.env`` (merge it over the subprocess's environment; every key matters)::

    HTTPS_PROXY=http://127.0.0.1:<port>   curl (TensorFlow's GCS filesystem) sends https:// through it
    https_proxy=""       hides an inherited lower-case value: curl reads https_proxy first and treats
                         an empty one as unset (so falls back to HTTPS_PROXY); gRPC and Python's
                         urllib/requests read only the lower-case name and treat empty as "no proxy"
    grpc_proxy=""        gRPC (TensorFlow's bundled copy and grpcio alike) checks grpc_proxy first,
                         then https_proxy, then http_proxy; an empty value means "no proxy" for every
                         channel, so tf.data service dispatchers, workers and clients connect directly
    no_proxy="", NO_PROXY=""   no inherited exclusion can send TensorFlow's GCS traffic around the
                         proxy (curl reads no_proxy, then NO_PROXY; empty means no exclusions)
    CURL_CA_BUNDLE=<workdir>/gcs-proxy-ca.pem   only the throwaway CA: curl can verify nothing else
    GOOGLE_AUTH_TOKEN_FOR_TESTING=<token>   TensorFlow's GoogleAuthProvider returns this token before
                         looking at credential files or the metadata server; the proxy requires it
    NO_GCE_CHECK=true    belt and braces: never ask the GCE metadata server for a token

gRPC reads only lower-case proxy variables (grpc_proxy, https_proxy, http_proxy, no_grpc_proxy,
no_proxy: checked in TensorFlow 2.21's libtensorflow_cc.so.2 and grpcio 1.85's cygrpc, source
src/core/handshaker/http_connect/http_proxy_mapper.cc); curl 8.11 inside libtensorflow_framework
reads https_proxy then HTTPS_PROXY. Upper-case ``HTTPS_PROXY`` alone is therefore enough when the
parent environment has no proxy settings; the empty lower-case keys make it hold whatever the parent
has. Python's urllib/requests also ignore ``HTTPS_PROXY`` when ``https_proxy`` is set empty, so the
google-cloud-storage client in the same process keeps talking to ``STORAGE_EMULATOR_HOST`` directly.

What the proxy translates, and why (everything else is forwarded unchanged, ``Host`` included, so
the emulator builds its URLs with the GCS host names):

1. ``Location`` of a resumable-upload start. The emulator builds it from the ``Host`` header with
   scheme http (``http://www.googleapis.com/upload/...&upload_id=X``); GCS answers with https.
   Left alone, TensorFlow would PUT the data to plain http://www.googleapis.com, i.e. around the
   proxy (towards the internet). The proxy rewrites ``http://<either GCS host>/`` to ``https://``
   in ``Location``. Needed by every TensorFlow write (``GFile(..., "w")``, ``TFRecordWriter``).
2. An empty ``uploadType=media`` upload is sent to the emulator as the same zero-byte object in
   ``uploadType=multipart`` form: the emulator fails on a media upload without a body (its handler
   takes ``len(None)`` and drops the connection). TensorFlow's ``CreateDir`` (``tf.io.gfile.makedirs``
   / ``mkdir``) makes exactly that request for its ``dir/`` marker object.
3. A read whose ``Range`` starts at or past the end of the object: the emulator answers 206 with an
   empty body and a backwards ``Content-Range``; GCS answers 416 Requested Range Not Satisfiable
   with ``Content-Range: bytes */<size>``. The proxy returns GCS's 416. TensorFlow 2.21 copes with
   either (curl_http_request.cc reads 416 as "no bytes"; checked by running without this), so this
   one only keeps the test on the code path production takes (it happens when an object's size is a
   multiple of the read block size).
4. ``HEAD`` is sent to the emulator as ``GET`` and the body dropped (the emulator answers HEAD with
   501). TensorFlow does not use HEAD; it is allowed because it is GCS API surface.

Not translated because TensorFlow does not need it (checked with TensorFlow 2.21): ``fields=``
(the emulator returns whole resources; TensorFlow reads only the fields it asked for),
``maxResults``/``pageToken`` on listings (the emulator returns everything in one page; TensorFlow
stops after the count it wanted and follows ``nextPageToken`` only when present), and the
``ifGenerationMatch=0`` precondition of ``CreateDir`` (the emulator ignores preconditions;
TensorFlow checks that the marker is absent just before, so only a race could tell).

Two TensorFlow settings worth knowing when using this in tests (neither is needed; set them next to
``proxy.env``): ``GCS_READ_CACHE_BLOCK_SIZE_MB`` is the size of TensorFlow's range reads and of the
read buffer it allocates (and zero-fills) per open gs:// file, 64 MB by default, so a tf.data
pipeline interleaving 8 files holds 512 MB of buffers; ``GCS_RETRY_CONFIG_MAX_RETRIES`` (default
10, with backoff from 1 s to 32 s) decides how long a failing request is retried before an error.

Counting: every forwarded request is a :class:`ProxiedRequest` in ``proxy.requests`` (host,
method, kind, bucket, object, Range, status, bytes each way); every refusal is a line in
``proxy.refused``. ``proxy.bytes_read(...)``, ``proxy.count(...)``, ``proxy.ranged_reads(...)``
and ``proxy.reset()`` are there for assertions such as "the worker really read from Cloud Storage".

Kinds: ``bucket`` (GET bucket), ``list``, ``stat`` (object metadata), ``read`` (object bytes),
``upload`` (every request under /upload/), ``delete``, ``compose``, ``rewrite``.
"""

from __future__ import annotations

import datetime as _dt
import http.client
import json
import re
import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

GCS_API_HOST = "www.googleapis.com"
GCS_MEDIA_HOST = "storage.googleapis.com"
ALLOWED_HOSTS = (GCS_API_HOST, GCS_MEDIA_HOST)
DEFAULT_TOKEN = "dsctl-gcs-proxy-test-token"

_B = r"(?P<bucket>[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9])"
_O = r"(?P<object>[^/]+)"  # JSON API: the object name is one percent-encoded segment
# (host, methods, path pattern, kind); the first match wins.
_ROUTES: tuple[tuple[str, frozenset[str], re.Pattern, str], ...] = tuple(
    (host, frozenset(methods), re.compile(pattern), kind)
    for host, methods, pattern, kind in (
        (GCS_API_HOST, {"GET"}, rf"/storage/v1/b/{_B}", "bucket"),
        (GCS_API_HOST, {"GET"}, rf"/storage/v1/b/{_B}/o", "list"),
        (GCS_API_HOST, {"POST"}, rf"/storage/v1/b/{_B}/o/{_O}/compose", "compose"),
        (GCS_API_HOST, {"POST"},
         rf"/storage/v1/b/{_B}/o/{_O}/rewriteTo/b/[a-z0-9][-a-z0-9_.]{{1,220}}[a-z0-9]/o/[^/]+", "rewrite"),
        (GCS_API_HOST, {"GET", "HEAD"}, rf"/storage/v1/b/{_B}/o/{_O}", "stat"),
        (GCS_API_HOST, {"DELETE"}, rf"/storage/v1/b/{_B}/o/{_O}", "delete"),
        (GCS_API_HOST, {"POST", "PUT"}, rf"/upload/storage/v1/b/{_B}/o", "upload"),
        (GCS_API_HOST, {"GET", "HEAD"}, rf"/download/storage/v1/b/{_B}/o/{_O}", "read"),
        (GCS_MEDIA_HOST, {"GET", "HEAD"}, rf"/{_B}/(?P<object>.+)", "read"),
    )
)
_UPLOAD_TYPES = ("media", "multipart", "resumable")
# Not copied between the two hops (RFC 9110 hop-by-hop, plus what the proxy sets itself).
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
        "trailer", "transfer-encoding", "upgrade", "expect", "content-length", "authorization"}
_OWN_RESPONSE_HEADERS = {"server", "date"}  # the proxy's send_response() writes its own


@dataclass(frozen=True)
class ProxiedRequest:
    """One request forwarded to the emulator (after the proxy's checks)."""

    host: str
    method: str
    kind: str
    bucket: str
    object: str | None  # decoded object name, None for bucket-level requests
    path: str
    query: str
    range: str | None  # the request's Range header
    status: int  # status returned to the client
    bytes_in: int  # request body bytes (uploads)
    bytes_out: int  # response body bytes returned to the client


class GcsProxy:
    """A CONNECT proxy that serves TensorFlow's hard-coded GCS endpoints from gcp-storage-emulator.

    ``emulator_endpoint`` is the emulator's ``http://host:port``; ``workdir`` receives the CA and
    server certificate (``gcs-proxy-ca.pem`` is what ``CURL_CA_BUNDLE`` points at). ``token`` is
    the bearer token TensorFlow is told to send (``GOOGLE_AUTH_TOKEN_FOR_TESTING``); requests with
    another ``Authorization`` are refused, so a test also proves no real credential was used.
    ``upstream_token``: forwarded requests carry it instead (a token the Cloud Storage stand-in issued for the VM's
    account), so that an authorizing gate upstream (storage_gate.py) decides what TensorFlow may read as that account.
    """

    def __init__(self, emulator_endpoint: str, workdir: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 token: str = DEFAULT_TOKEN, upstream_token: str | None = None):
        parts = urlsplit(emulator_endpoint)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"emulator_endpoint must look like http://HOST:PORT, not {emulator_endpoint!r}")
        self.emulator = (parts.hostname, parts.port)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.upstream_token = upstream_token
        self._bind = (host, port)
        self._lock = threading.Lock()
        self._requests: list[ProxiedRequest] = []
        self._refused: list[str] = []
        self._abandoned: list[str] = []  # connections the client dropped before TLS was up: not refusals
        self.tunnels = 0  # CONNECT tunnels accepted
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.ca_file, self._cert_file, self._key_file = _make_certificates(self.workdir)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self._tls.load_cert_chain(self._cert_file, self._key_file)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> GcsProxy:
        if self._server is not None:
            return self
        self._server = _Server(self._bind, _FrontHandler, self)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="gcs-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> GcsProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what clients need -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("GcsProxy is not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for a TensorFlow process: its gs:// I/O goes through this proxy, gRPC goes direct."""
        return {
            "HTTPS_PROXY": self.url,
            "https_proxy": "",
            "grpc_proxy": "",
            "no_proxy": "",
            "NO_PROXY": "",
            "CURL_CA_BUNDLE": str(self.ca_file),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": self.token,
            "NO_GCE_CHECK": "true",
        }

    # -- counters --------------------------------------------------------------------------------

    @property
    def requests(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def refused(self) -> list[str]:
        with self._lock:
            return list(self._refused)

    @property
    def abandoned(self) -> list[str]:
        with self._lock:
            return list(self._abandoned)

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()
            self._refused.clear()
            self._abandoned.clear()
            self.tunnels = 0

    def _select(self, kind: str | None, bucket: str | None, prefix: str) -> list[ProxiedRequest]:
        return [r for r in self.requests
                if (kind is None or r.kind == kind) and (bucket is None or r.bucket == bucket)
                and (r.object or "").startswith(prefix)]

    def count(self, kind: str | None = None, *, bucket: str | None = None, prefix: str = "") -> int:
        """Forwarded requests of this kind (any if None) on objects whose name starts with prefix."""
        return len(self._select(kind, bucket, prefix))

    def bytes_read(self, *, bucket: str | None = None, prefix: str = "") -> int:
        """Object bytes returned to clients (successful ``read`` requests) under bucket/prefix."""
        return sum(r.bytes_out for r in self._select("read", bucket, prefix) if 200 <= r.status < 300)

    def bytes_written(self, *, bucket: str | None = None, prefix: str = "") -> int:
        """Request body bytes of uploads under bucket/prefix (resumable PUTs name no object: prefix="")."""
        return sum(r.bytes_in for r in self._select("upload", bucket, prefix) if 200 <= r.status < 400)

    def ranged_reads(self, *, bucket: str | None = None, prefix: str = "") -> list[ProxiedRequest]:
        """Successful reads that carried a Range header."""
        return [r for r in self._select("read", bucket, prefix) if r.range and 200 <= r.status < 300]

    def _record(self, entry: ProxiedRequest) -> None:
        with self._lock:
            self._requests.append(entry)

    def _refuse(self, what: str) -> None:
        with self._lock:
            self._refused.append(what)

    def _abandon(self, what: str) -> None:
        with self._lock:
            self._abandoned.append(what)

    def _tunnel_opened(self) -> None:
        with self._lock:
            self.tunnels += 1


# -- certificates ---------------------------------------------------------------------------------

def _make_certificates(workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and one server certificate for both GCS hosts, written under workdir."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = _dt.datetime.now(_dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dsctl test GCS proxy CA (throwaway)")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(hours=1)).not_valid_after(now + _dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GCS_API_HOST)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(hours=1)).not_valid_after(now + _dt.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in ALLOWED_HOSTS]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = workdir / "gcs-proxy-ca.pem"
    cert_file = workdir / "gcs-proxy-server.pem"
    key_file = workdir / "gcs-proxy-server.key"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return ca_file, cert_file, key_file


# -- the server -----------------------------------------------------------------------------------

class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, proxy: GcsProxy):
        self.proxy = proxy
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def track(self, sock: socket.socket, add: bool) -> None:
        with self._open_lock:
            (self._open.add if add else self._open.discard)(sock)

    def close_connections(self) -> None:
        """Unblock handler threads still holding kept-alive connections (curl pools them)."""
        with self._open_lock:
            socks = list(self._open)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _FrontHandler(BaseHTTPRequestHandler):
    """The proxy side: CONNECT to the two GCS hosts only; everything else is refused."""

    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 120

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    def _deny(self, code: int, what: str) -> None:
        self.server.proxy._refuse(what)
        body = f"dsctl GcsProxy refuses: {what}\n".encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_CONNECT(self):
        host, _, port = self.path.rpartition(":")
        if host.lower() not in ALLOWED_HOSTS or port != "443":
            return self._deny(403, f"CONNECT {self.path}")
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        proxy = self.server.proxy
        try:
            tls = proxy._tls.wrap_socket(self.connection, server_side=True)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError) as exc:
            # The client went away mid-handshake (a process killed while it opened a connection, as a test's job
            # killed in its put epoch is): nothing was refused. A client that rejects the certificate sends an
            # alert instead, an SSLError below.
            proxy._abandon(f"TLS handshake for {self.path} abandoned by the client: {exc}")
            return
        except (ssl.SSLError, OSError) as exc:
            proxy._refuse(f"TLS handshake for {self.path} failed: {exc}")
            return
        proxy._tunnel_opened()
        self.server.track(tls, True)
        try:
            tls.settimeout(self.timeout)
            _GcsHandler(tls, self.client_address, self.server, tunnel_host=host.lower())
        except (OSError, ssl.SSLError):
            pass
        finally:
            self.server.track(tls, False)
            try:
                tls.close()
            except OSError:
                pass

    def _not_connect(self):
        self._deny(405, f"{self.command} {self.path} (only CONNECT to {' or '.join(ALLOWED_HOSTS)}:443)")

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_connect


class _GcsHandler(BaseHTTPRequestHandler):
    """Inside a tunnel: strict GCS API requests, forwarded to the emulator."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def __init__(self, request, client_address, server, *, tunnel_host: str):
        self.tunnel_host = tunnel_host
        super().__init__(request, client_address, server)

    def setup(self):
        # The socket is already TLS-wrapped (and its timeout set) by the front handler.
        self.connection = self.request
        self.rfile = self.connection.makefile("rb", -1)
        self.wfile = socketserver._SocketWriter(self.connection)

    def log_message(self, format, *args):  # noqa: A002 - quiet
        pass

    # -- refusal ---------------------------------------------------------------------------------

    def _error(self, code: int, message: str, refused: bool = True) -> None:
        if refused:
            self.server.proxy._refuse(f"{self.tunnel_host} {self.command} {self.path}: {message}")
        body = json.dumps({"error": {"code": code, "message": f"dsctl GcsProxy: {message}"}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    # -- requests --------------------------------------------------------------------------------

    def _handle(self):
        proxy = self.server.proxy
        host = (self.headers.get("Host") or "").lower().removesuffix(":443")
        if host != self.tunnel_host:
            self._discard_body()
            return self._error(421, f"Host {host!r} in a tunnel to {self.tunnel_host}")
        path, _, query = self.path.partition("?")
        if not path.startswith("/") or "#" in self.path:
            self._discard_body()
            return self._error(400, "request target must be an absolute path")
        route = next(((kind, m) for h, methods, pattern, kind in _ROUTES
                      if h == host and (m := pattern.fullmatch(path)) and self.command in methods), None)
        if route is None:
            self._discard_body()
            return self._error(403, "not a GCS API request this proxy forwards")
        kind, match = route
        if kind == "upload":
            if self.command == "POST" and _param(query, "uploadType") not in _UPLOAD_TYPES:
                self._discard_body()
                return self._error(400, "uploads need uploadType=media|multipart|resumable")
            if self.command == "PUT" and not _param(query, "upload_id"):
                self._discard_body()
                return self._error(400, "PUT under /upload/ needs an upload_id")
        auth = self.headers.get("Authorization")
        if auth != f"Bearer {proxy.token}":
            self._discard_body()
            return self._error(401, "Authorization is not the test token (GOOGLE_AUTH_TOKEN_FOR_TESTING)")
        body = self._read_body()
        if body is None:
            return self._error(400, "bad request body framing")

        bucket = match.group("bucket")
        obj = match.groupdict().get("object")
        obj = unquote(obj) if obj is not None else (_param(query, "name") if kind == "upload" else None)
        rng = self.headers.get("Range")

        bytes_in = len(body)
        target, send_headers = self.path, {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if proxy.upstream_token:
            send_headers["Authorization"] = f"Bearer {proxy.upstream_token}"
        if kind == "upload" and self.command == "POST" and _param(query, "uploadType") == "media" and not body:
            # Translation 2: an empty media upload (TensorFlow's directory marker) as multipart.
            target, send_headers, body = _empty_media_as_multipart(path, query, send_headers, obj or "")
        status, reason, headers, payload = self._forward(target, send_headers, body)
        # Translation 3: a Range starting at/after the end of the object is 416 in GCS.
        if kind == "read" and rng and status == 206:
            m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", _header(headers, "Content-Range") or "")
            if m and int(m.group(2)) < int(m.group(1)):
                status, reason, payload = 416, "Requested range not satisfiable", b""
                headers = [("Content-Range", f"bytes */{m.group(3)}"), ("Content-Type", "text/plain")]
        # Translation 1: resumable-upload session URIs are https, like every other GCS URL.
        headers = [(k, re.sub(r"^http://(www|storage)\.googleapis\.com(:80)?/", r"https://\1.googleapis.com/", v))
                   if k.lower() == "location" else (k, v) for k, v in headers]

        self.send_response(status, reason)
        for k, v in headers:
            if k.lower() not in _HOP and k.lower() not in _OWN_RESPONSE_HEADERS:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        sent = 0
        if self.command != "HEAD":  # Translation 4: HEAD went out as GET; its body stays here.
            self.wfile.write(payload)
            sent = len(payload)
        proxy._record(ProxiedRequest(host=host, method=self.command, kind=kind, bucket=bucket, object=obj,
                                     path=path, query=query, range=rng, status=status, bytes_in=bytes_in,
                                     bytes_out=sent))

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _handle

    def _disallowed(self):
        self._discard_body()
        self._error(405, f"method {self.command} is not forwarded")

    do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _disallowed

    def _forward(self, target: str, headers: dict[str, str], body: bytes):
        method = "GET" if self.command == "HEAD" else self.command
        conn = http.client.HTTPConnection(*self.server.proxy.emulator, timeout=120)
        try:
            if body or method in ("POST", "PUT"):
                headers = {**headers, "Content-Length": str(len(body))}
            conn.request(method, target, body=body if body or method in ("POST", "PUT") else None, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, resp.reason, resp.getheaders(), payload
        except (OSError, http.client.HTTPException) as exc:
            msg = json.dumps({"error": {"code": 502, "message": f"dsctl GcsProxy: emulator unreachable: {exc}"}})
            return 502, "Bad Gateway", [("Content-Type", "application/json")], msg.encode()
        finally:
            conn.close()

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    self.close_connection = True
                    return None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline(1024)
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            return None
        return self.rfile.read(n) if n > 0 else b""

    def _discard_body(self) -> None:
        if self._read_body() is None:
            self.close_connection = True


def _empty_media_as_multipart(path: str, query: str, headers: dict[str, str], name: str):
    """The same zero-byte object as a multipart upload, which the emulator accepts (it fails on empty media)."""
    boundary = "dsctl-gcs-proxy-boundary"
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "application/octet-stream")
    meta = json.dumps({"name": name})
    body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
            f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n\r\n--{boundary}--\r\n").encode()
    query = "&".join("uploadType=multipart" if part == "uploadType=media" else part for part in query.split("&"))
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    headers["Content-Type"] = f"multipart/related; boundary={boundary}"
    return f"{path}?{query}", headers, body


def _param(query: str, name: str) -> str | None:
    for part in query.split("&"):
        k, _, v = part.partition("=")
        if unquote(k) == name:
            return unquote(v)
    return None


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name.lower()), None)
