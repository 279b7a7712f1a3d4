"""GcsProxy: real TensorFlow processes read (and write) gs:// objects held by gcp-storage-emulator.

The fast tests talk to the proxy with Python's own TLS client and plain gRPC (grpcio); the slow
ones start real TensorFlow 2.21 processes whose only GCS configuration is ``proxy.env``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import pytest
from gcs_proxy import GCS_API_HOST, GCS_MEDIA_HOST, GcsProxy

from helpers import wait_for

BUCKET = "dsctl-gcs-proxy-test"
PROJECT = "dsctl-test"


def _no_proxy_env() -> dict[str, str]:
    """This process's environment without any proxy setting (the cases below add their own)."""
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


def _tfrecords(records: list[bytes]) -> bytes:
    """TFRecord framing (length, masked CRC32C of length, data, masked CRC32C of data), without TensorFlow."""
    def masked(b: bytes) -> bytes:
        crc = google_crc32c.value(b)
        return struct.pack("<I", ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF)

    out = bytearray()
    for r in records:
        n = struct.pack("<Q", len(r))
        out += n + masked(n) + r + masked(r)
    return bytes(out)


@pytest.fixture(scope="module")
def emulator(gcs_emulator):
    return gcs_emulator  # conftest's: gcp-storage-emulator in this process


@pytest.fixture(scope="module")
def bucket(emulator):
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", emulator)
        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        return client.lookup_bucket(BUCKET) or client.create_bucket(BUCKET)


@pytest.fixture
def proxy(emulator, tmp_path):
    with GcsProxy(emulator_endpoint=emulator, workdir=tmp_path / "gcs-proxy") as p:
        yield p


def _via_proxy(proxy: GcsProxy, host: str, method: str, target: str, *, headers: dict | None = None,
               body: bytes | None = None, token: str | None = "default") -> http.client.HTTPResponse:
    """One HTTPS request through the proxy's tunnel, trusting only the proxy's CA."""
    ctx = ssl.create_default_context(cafile=str(proxy.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=ctx, timeout=30)
    conn.set_tunnel(host, 443)
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {proxy.token if token == 'default' else token}"
    conn.request(method, target, body=body, headers=h)
    resp = conn.getresponse()
    resp.data = resp.read()
    conn.close()
    return resp


def _raw_proxy_request(proxy: GcsProxy, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(request)
        return s.recv(4096)


def test_proxy_serves_the_gcs_api_from_the_emulator_over_tls_from_its_own_ca(proxy, bucket):
    data = bytes(range(256)) * 4
    bucket.blob("fast/obj.bin").upload_from_string(data)
    assert set(proxy.env) == {"HTTPS_PROXY", "https_proxy", "grpc_proxy", "no_proxy", "NO_PROXY", "CURL_CA_BUNDLE",
                              "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK"}
    assert proxy.env["HTTPS_PROXY"] == proxy.url and proxy.env["grpc_proxy"] == "" == proxy.env["https_proxy"]

    meta = _via_proxy(proxy, GCS_API_HOST, "GET", f"/storage/v1/b/{BUCKET}/o/fast%2Fobj.bin?fields=size%2Cgeneration")
    assert meta.status == 200 and json.loads(meta.data)["size"] == "1024"
    listing = _via_proxy(proxy, GCS_API_HOST, "GET", f"/storage/v1/b/{BUCKET}/o?prefix=fast%2F")
    assert [i["name"] for i in json.loads(listing.data)["items"]] == ["fast/obj.bin"]

    part = _via_proxy(proxy, GCS_MEDIA_HOST, "GET", f"/{BUCKET}/fast%2Fobj.bin", headers={"Range": "bytes=100-199"})
    assert part.status == 206 and part.data == data[100:200]
    # Translation: a Range past the end is 416 with "bytes */size", as in GCS (the emulator says 206 + nothing).
    past = _via_proxy(proxy, GCS_MEDIA_HOST, "GET", f"/{BUCKET}/fast%2Fobj.bin", headers={"Range": "bytes=1024-2047"})
    assert past.status == 416 and past.getheader("Content-Range") == "bytes */1024" and past.data == b""
    # Translation: HEAD (the emulator has none) is a GET whose body stays in the proxy.
    head = _via_proxy(proxy, GCS_MEDIA_HOST, "HEAD", f"/{BUCKET}/fast%2Fobj.bin")
    assert head.status == 200 and head.getheader("Content-Length") == "1024" and head.data == b""
    missing = _via_proxy(proxy, GCS_API_HOST, "GET", f"/storage/v1/b/{BUCKET}/o/fast%2Fnope")
    assert missing.status == 404

    assert [r.kind for r in proxy.requests] == ["stat", "list", "read", "read", "read", "stat"]
    assert proxy.count("read", bucket=BUCKET, prefix="fast/") == 3
    assert proxy.bytes_read(bucket=BUCKET, prefix="fast/obj") == 100  # 206 only: 416 and HEAD carry no bytes
    assert [r.range for r in proxy.ranged_reads(prefix="fast/")] == ["bytes=100-199"]
    assert proxy.tunnels == 6 and proxy.refused == []

    # The certificate is the throwaway CA's: a client trusting the system CAs refuses it.
    conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=ssl.create_default_context(), timeout=10)
    conn.set_tunnel(GCS_API_HOST, 443)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", f"/storage/v1/b/{BUCKET}")
    conn.close()
    proxy.reset()
    assert proxy.requests == [] and proxy.refused == [] and proxy.tunnels == 0


def test_proxy_refuses_other_hosts_methods_paths_and_credentials(proxy, emulator):
    emulator_port = emulator.rsplit(":", 1)[1]
    for target in ("example.com:443", f"{GCS_API_HOST}:80", f"127.0.0.1:{emulator_port}", "oauth2.googleapis.com:443",
                   "metadata.google.internal:443"):
        reply = _raw_proxy_request(proxy, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 403"), (target, reply)
    reply = _raw_proxy_request(
        proxy, f"GET http://{GCS_API_HOST}/storage/v1/b/{BUCKET} HTTP/1.1\r\nHost: {GCS_API_HOST}\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 405")

    refusals = [
        (GCS_API_HOST, "POST", "/oauth2/v4/token", {}, b"grant_type=x", "default", 403),
        (GCS_API_HOST, "PATCH", f"/storage/v1/b/{BUCKET}/o/x", {}, b"{}", "default", 405),
        (GCS_API_HOST, "GET", f"/storage/v1/b/{BUCKET}", {}, None, "some-real-looking-token", 401),
        (GCS_API_HOST, "GET", f"/storage/v1/b/{BUCKET}", {}, None, None, 401),
        (GCS_API_HOST, "GET", f"/{BUCKET}/x", {}, None, "default", 403),  # media path on the API host
        (GCS_API_HOST, "GET", "/storage/v1/b", {}, None, "default", 403),  # listing buckets: not TensorFlow's
        (GCS_API_HOST, "POST", f"/upload/storage/v1/b/{BUCKET}/o?name=x", {}, b"", "default", 400),
        (GCS_API_HOST, "PUT", f"/upload/storage/v1/b/{BUCKET}/o?uploadType=resumable", {}, b"x", "default", 400),
        (GCS_MEDIA_HOST, "PUT", f"/{BUCKET}/x", {}, b"data", "default", 403),  # XML API writes
        (GCS_MEDIA_HOST, "GET", f"/storage/v1/b/{BUCKET}", {"Host": GCS_API_HOST}, None, "default", 421),
    ]
    for host, method, target, headers, body, token, status in refusals:
        resp = _via_proxy(proxy, host, method, target, headers=headers, body=body, token=token)
        assert resp.status == status, (host, method, target, resp.status, resp.data)
    assert proxy.requests == []  # nothing reached the emulator
    assert len(proxy.refused) == 6 + len(refusals)
    assert any("CONNECT example.com:443" in r for r in proxy.refused)


def test_a_client_gone_before_the_handshake_is_not_a_refusal(proxy):
    """A process killed while it opens a tunnel (a job killed in its put epoch): its socket closes, plainly or with
    a reset, before TLS is up. The proxy refused nothing, and says so; a CI run once counted that as refused."""
    for reset in (False, True):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(f"CONNECT {GCS_API_HOST}:443 HTTP/1.1\r\nHost: {GCS_API_HOST}:443\r\n\r\n".encode())
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends a reset
    wait_for(lambda: len(proxy.abandoned) == 2, timeout=30, what="both tunnels to end")
    assert proxy.refused == [] and proxy.tunnels == 0, proxy.refused


_GRPC_ECHO = textwrap.dedent("""\
    import sys
    from concurrent import futures
    import grpc
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}),))
    port = server.add_insecure_port(sys.argv[1] + ":0")
    server.start()
    with grpc.insecure_channel(f"{sys.argv[1]}:{port}") as channel:
        try:
            print("direct" if channel.unary_unary("/t.Echo/Echo")(b"ping", timeout=10) == b"ping" else "wrong")
        except grpc.RpcError as exc:
            print("failed", exc.code())
    server.stop(0)
    """)


def test_grpc_reads_only_lower_case_proxy_variables_and_proxy_env_keeps_it_direct(proxy):
    """gRPC (grpcio here, the same C core TensorFlow bundles) vs. the proxy variables curl reads."""
    url = proxy.url
    cases = {
        "upper-case HTTPS_PROXY only": ({"HTTPS_PROXY": url}, "direct"),
        "lower-case https_proxy": ({"https_proxy": url}, "proxied"),
        "grpc_proxy": ({"grpc_proxy": url}, "proxied"),
        "http_proxy (gRPC's last fallback)": ({"http_proxy": url}, "proxied"),
        "https_proxy with no_proxy=127.0.0.0/8": ({"https_proxy": url, "no_proxy": "127.0.0.0/8"}, "direct"),
        "inherited https_proxy/http_proxy, then proxy.env": ({"https_proxy": url, "http_proxy": url, **proxy.env},
                                                            "direct"),
    }

    def run(extra: dict[str, str]) -> str:
        out = subprocess.run([sys.executable, "-c", _GRPC_ECHO, "127.0.0.9"], env={**_no_proxy_env(), **extra},
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or out.stderr[-500:]

    with ThreadPoolExecutor(len(cases)) as pool:
        results = dict(zip(cases, pool.map(run, [env for env, _ in cases.values()])))
    for name, (_, expected) in cases.items():
        if expected == "direct":
            assert results[name] == "direct", (name, results[name])
        else:  # gRPC asked the proxy for a tunnel to the server, which the proxy refuses
            assert results[name].startswith("failed"), (name, results[name])
    proxied = sum(expected == "proxied" for _, expected in cases.values())
    refused = proxy.refused
    assert len(refused) >= proxied and all(r.startswith("CONNECT 127.0.0.9:") for r in refused), refused
    assert proxy.requests == []


_TF_FILES = textwrap.dedent("""\
    import hashlib, json, sys
    import tensorflow as tf
    B = sys.argv[1]
    out = {}
    out["exists"] = [tf.io.gfile.exists(f"gs://{B}/tfr/notes.txt"), tf.io.gfile.exists(f"gs://{B}/tfr"),
                     tf.io.gfile.exists(f"gs://{B}/tfr/nope")]
    with tf.io.gfile.GFile(f"gs://{B}/tfr/notes.txt", "r") as f:
        out["notes"] = f.read()
    files = sorted(tf.io.gfile.glob(f"gs://{B}/tfr/*.tfrecord"))
    out["glob"] = files
    out["records"] = [r.decode() for r in tf.data.TFRecordDataset(files).as_numpy_iterator()]
    with tf.io.gfile.GFile(f"gs://{B}/tfr/big.bin", "rb") as f:
        big = f.read()
    out["big"] = [len(big), hashlib.sha256(big).hexdigest()]
    # Writes: a resumable upload per file, and a directory marker.
    with tf.io.TFRecordWriter(f"gs://{B}/tfw/out.tfrecord") as w:
        for i in range(3):
            w.write(b"written-%d" % i)
    tf.io.gfile.makedirs(f"gs://{B}/tfw/sub")
    out["written"] = [r.decode() for r in tf.data.TFRecordDataset(f"gs://{B}/tfw/out.tfrecord").as_numpy_iterator()]
    out["isdir"] = tf.io.gfile.isdir(f"gs://{B}/tfw/sub")
    print("RESULT " + json.dumps(out))
    """)


def _run_tf(script: str, args: list[str], env: dict[str, str], timeout: float = 180) -> dict:
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.slow
def test_tensorflow_reads_and_writes_gs_paths_with_only_proxy_env(proxy, bucket):
    shards = {f"tfr/shard-{i}.tfrecord": [f"rec-{i}-{j}".encode() for j in range(5)] for i in range(3)}
    for name, records in shards.items():
        bucket.blob(name).upload_from_string(_tfrecords(records))
    bucket.blob("tfr/notes.txt").upload_from_string(b"hello from the emulator\n")
    big = os.urandom(3 * 1024 * 1024 + 12345)
    bucket.blob("tfr/big.bin").upload_from_string(big)

    out = _run_tf(_TF_FILES, [BUCKET], {**os.environ, **proxy.env})

    assert out["exists"] == [True, True, False]
    assert out["notes"] == "hello from the emulator\n"
    assert out["glob"] == [f"gs://{BUCKET}/{name}" for name in sorted(shards)]
    assert out["records"] == [r.decode() for name in sorted(shards) for r in shards[name]]
    assert out["big"] == [len(big), hashlib.sha256(big).hexdigest()]
    assert out["written"] == ["written-0", "written-1", "written-2"] and out["isdir"] is True
    # What the emulator now holds was written by TensorFlow through the proxy.
    assert bucket.blob("tfw/out.tfrecord").download_as_bytes() == _tfrecords([b"written-%d" % i for i in range(3)])
    assert bucket.get_blob("tfw/sub/").size == 0

    assert proxy.refused == []
    assert proxy.bytes_read(bucket=BUCKET, prefix="tfr/big.bin") == len(big)  # range GETs, every byte once
    reads = proxy.ranged_reads(bucket=BUCKET, prefix="tfr/")
    assert reads and all(r.host == GCS_MEDIA_HOST and r.range.startswith("bytes=") for r in reads)
    assert proxy.count("read", prefix="tfr/") == len(reads)  # TensorFlow never reads without a Range
    assert {r.kind for r in proxy.requests} >= {"stat", "list", "read", "upload"}
    assert proxy.bytes_written(bucket=BUCKET, prefix="tfw/out.tfrecord") == len(_tfrecords([b"written-0"] * 3))


_TF_SERVICE = textwrap.dedent("""\
    import json, sys
    import tensorflow as tf
    B = sys.argv[1]
    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0))
    port = int(dispatcher.target.rsplit(":", 1)[1])
    worker = svc.WorkerServer(svc.WorkerConfig(dispatcher_address=f"127.0.0.2:{port}",
                                               worker_address="127.0.0.3:%port%", port=0))
    files = sorted(tf.io.gfile.glob(f"gs://{B}/svc/*.tfrecord"))
    ds = tf.data.TFRecordDataset(files).map(lambda r: (tf.strings.substr(r, 0, 12), tf.strings.length(r)))
    ds = ds.apply(svc.distribute(processing_mode="parallel_epochs", service=f"grpc://127.0.0.2:{port}",
                                 job_name="gcs-proxy-test"))
    got = [(k.decode(), int(n)) for k, n in ds.as_numpy_iterator()]
    print("RESULT " + json.dumps({"files": files, "elements": got, "workers": dispatcher._num_workers()}))
    """)


@pytest.mark.slow
def test_tf_data_service_grpc_goes_direct_while_its_worker_reads_gs_through_the_proxy(proxy, bucket):
    # Records of 16 KiB framed; with 1 MB range reads: part-0 is exactly 1 MiB, so TensorFlow's read after
    # its last byte gets GCS's 416 (translated), the others take two and three range reads.
    payload = (bytes(range(256)) * 64)[:16384 - 16 - 12]
    shards = {f"svc/part-{i}.tfrecord": [f"svc-{i}-{j:04d}:".encode().ljust(12, b"_") + payload
                                         for j in range(64 + 32 * i)] for i in range(3)}
    sizes = {}
    for name, records in shards.items():
        blob = _tfrecords(records)
        sizes[name] = len(blob)
        bucket.blob(name).upload_from_string(blob)

    # The parent environment "has" lower-case proxy settings pointing at the proxy: without proxy.env's
    # empty grpc_proxy/https_proxy, every gRPC channel below would ask the proxy for a tunnel (and be refused).
    env = {**_no_proxy_env(), "https_proxy": proxy.url, "http_proxy": proxy.url, **proxy.env,
           "GCS_READ_CACHE_BLOCK_SIZE_MB": "1"}  # 1 MB range reads (the default block is 64 MB per open file)
    out = _run_tf(_TF_SERVICE, [BUCKET], env)

    assert out["files"] == [f"gs://{BUCKET}/{name}" for name in sorted(shards)]
    expected = sorted((r[:12].decode(), len(r)) for name in sorted(shards) for r in shards[name])
    assert sorted(map(tuple, out["elements"])) == expected
    assert out["workers"] == 1
    assert proxy.refused == []  # no gRPC channel (client, worker, dispatcher) came to the proxy
    assert sizes["svc/part-0.tfrecord"] == 1 << 20
    for name, size in sizes.items():
        assert proxy.bytes_read(bucket=BUCKET, prefix=name) == size, name  # every byte from Cloud Storage, once
        reads = [(r.range, r.status) for r in proxy.requests if r.kind == "read" and r.object == name]
        assert reads[0] == ("bytes=0-1048575", 206) and len(reads) >= 2, (name, reads)
    assert ("bytes=1048576-2097151", 416) in [(r.range, r.status) for r in proxy.requests
                                              if r.object == "svc/part-0.tfrecord"]
