"""Tests of the VM boot harness (vmboot.py) and of the metadata server stand-in (metadata_server.py).

The metadata server tests run anywhere, on loopback. The VM tests need root, util-linux, iproute2
and, for the first run, debootstrap (see vmboot.py's docstring for what CI installs); without them
they are skipped with the reason. They are marked slow because the first one builds the cached
Debian 12 root filesystem (35-100 s, once per machine); after that a boot takes about a second.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import vmboot
from metadata_server import MetadataServer
from vmboot import BootedVm

BUCKET = "dsctl-test-staging"
STANDINS = Path(__file__).resolve().parents[2] / "standins"  # vmboot.py, for the child processes that import it
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
IP = shutil.which("ip", path=os.environ.get("PATH", "") + ":" + vmboot.HOST_PATH) or "ip"


def _http(url: str, headers: dict | None = None, timeout: float = 5) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with _NO_PROXY.open(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


# ================================================================================================
# The metadata server on its own (no root needed)
# ================================================================================================
def test_metadata_server_paths_header_rules_and_counters():
    attrs = {"startup-script": "#!/bin/bash\necho hi\n", "dsctl-bucket": BUCKET}
    with MetadataServer(attributes=attrs, project_id="proj-1", network_ip="10.9.8.7",
                        service_account="sa@proj-1.iam.gserviceaccount.com") as mds:
        v1 = mds.url + "/computeMetadata/v1/"
        flavor = {"Metadata-Flavor": "Google"}

        status, headers, body = _http(v1 + "instance/attributes/startup-script")
        assert status == 403 and b"Missing Metadata-Flavor:Google header" in body
        assert headers["Metadata-Flavor"] == "Google"  # on refusals too
        status, _, _ = _http(v1 + "instance/attributes/startup-script", {"Metadata-Flavor": "google"})
        assert status == 403
        status, headers, body = _http(v1 + "instance/attributes/startup-script",
                                      {**flavor, "X-Forwarded-For": "10.0.0.1"})
        assert status == 403 and b"X-Forwarded-For" in body and headers["Metadata-Flavor"] == "Google"

        status, headers, body = _http(v1 + "instance/attributes/startup-script", flavor)
        assert (status, body) == (200, attrs["startup-script"].encode())
        assert headers["Metadata-Flavor"] == "Google"
        assert _http(v1 + "instance/attributes/dsctl-bucket", flavor)[2] == BUCKET.encode()
        assert _http(v1 + "project/project-id", flavor)[2] == b"proj-1"
        assert _http(v1 + "instance/network-interfaces/0/ip", flavor)[2] == b"10.9.8.7"
        for sa in ("default", "sa@proj-1.iam.gserviceaccount.com"):
            assert _http(v1 + f"instance/service-accounts/{sa}/email", flavor)[2] == b"sa@proj-1.iam.gserviceaccount.com"
        status, headers, body = _http(v1 + "instance/service-accounts/default/token", flavor)
        token = json.loads(body)
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert set(token) == {"access_token", "expires_in", "token_type"} and token["token_type"] == "Bearer"
        assert mds.token_is_valid(token["access_token"]) and not mds.token_is_valid("ya29.forged")

        # Directories: listing with "/", 301 to it without, JSON with recursive=true (as the
        # guest agent's script runner asks), attribute keys verbatim, built-in keys camelCased.
        assert _http(v1 + "instance/attributes/", flavor)[2].decode().splitlines() == ["startup-script", "dsctl-bucket"]
        assert _http(v1 + "instance/attributes", flavor)[0] == 200  # urllib followed the 301
        assert json.loads(_http(v1 + "instance/attributes?alt=json&recursive=true", flavor)[2]) == attrs
        instance = json.loads(_http(v1 + "instance/?recursive=true", flavor)[2])
        assert instance["networkInterfaces"]["0"]["ip"] == "10.9.8.7"
        assert instance["attributes"]["startup-script"] == attrs["startup-script"]
        assert "token" not in json.dumps(instance["serviceAccounts"])
        assert _http(v1 + "instance/attributes/nope", flavor)[0] == 404
        mds.set_attribute("late", "1")
        assert _http(v1 + "instance/attributes/late", flavor)[2] == b"1"

        served = mds.requests
        assert len(served) == mds.request_count("127.0.0.1") == 17  # the 301 and its follow-up count twice
        assert [s.status for s in served[:3]] == [403, 403, 403]
        assert mds.bytes_served() == sum(s.bytes for s in served)
        first_ok = next(s for s in served if s.status == 200)
        assert first_ok.bytes > len(attrs["startup-script"]) + 100  # status line + headers + body


# ================================================================================================
# The cached root filesystem
# ================================================================================================
@pytest.mark.skipif(os.geteuid() != 0 or not all(map(shutil.which, ("unshare", "setpriv"))),
                    reason="building a root filesystem needs root and util-linux (unshare, setpriv)")
def test_rootfs_cache_is_built_once_when_processes_race_and_stale_builds_are_redone(tmp_path):
    # A fake debootstrap (same command line as the real one) that is slow and counts its runs.
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "debootstrap").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        eval target=\\${{$(($# - 1))}}  # debootstrap ... SUITE TARGET MIRROR
        echo "$*" >> {tmp_path}/runs
        mkdir -p "$target/etc" "$target/var/cache/apt/archives" "$target/var/lib/apt/lists"
        echo host > "$target/etc/hostname"; echo "nameserver 10.0.0.1" > "$target/etc/resolv.conf"
        touch "$target/var/cache/apt/archives/x.deb"
        sleep 1
        """))
    (fakebin / "debootstrap").chmod(0o755)
    cache = tmp_path / "cache"
    env = {**os.environ, "DSCTL_VMBOOT_CACHE": str(cache), "PATH": f"{fakebin}:{os.environ['PATH']}",
           "DSCTL_VMBOOT_MIRROR": "http://mirror.invalid/debian"}
    code = f"import sys; sys.path.insert(0, {str(STANDINS)!r}); import vmboot; print(vmboot.ensure_rootfs())"
    final = Path(subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(STANDINS)!r}); import vmboot; "
                                 "print(vmboot.rootfs_path())"], env=env, capture_output=True,
                                text=True, check=True).stdout.strip())
    stale = cache / (".building-" + final.name)
    (stale / "junk").mkdir(parents=True)  # an interrupted build
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    paths = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert paths == {str(final)}
    runs = (tmp_path / "runs").read_text().splitlines()
    assert len(runs) == 1 and "--variant=minbase" in runs[0] and "bookworm" in runs[0], runs
    assert "--include=" + ",".join(vmboot.ROOTFS_PACKAGES) in runs[0]
    assert "http://mirror.invalid/debian" in runs[0]
    assert not stale.exists() and json.loads((final / ".dsctl-rootfs.json").read_text())["recipe"]["suite"] == "bookworm"
    assert (final / "etc/hostname").read_text() == "localhost\n" and (final / "etc/resolv.conf").read_text() == ""
    assert not (final / "var/cache/apt/archives/x.deb").exists()


# ================================================================================================
# VMs
# ================================================================================================
@pytest.fixture(scope="session")
def rootfs():
    reason = vmboot.unsupported_reason()
    if reason:
        pytest.skip(reason)
    return vmboot.ensure_rootfs()


@pytest.fixture
def vm(rootfs, tmp_path):
    with BootedVm(tmp_path, bucket=BUCKET) as booted:
        yield booted


def _host_ipv4_addresses() -> list[str]:
    out = subprocess.run([IP, "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    addrs = []
    for line in out.splitlines():
        addr = ipaddress.ip_interface(line.split()[3]).ip
        if not addr.is_loopback and addr not in vmboot.ADDRESS_POOL:
            addrs.append(str(addr))
    return addrs


def _leftovers(info: dict) -> list[str]:
    """What a VM (described by _describe) left on the host: links, addresses, routes, rules, mounts."""
    def lines(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    link = info["links"][0]
    found = [f"link {line}" for line in lines(IP, "-o", "link", "show") if f" {link}@" in line or f" {link}:" in line]
    found += [f"addr {line}" for line in lines(IP, "-o", "addr", "show")
              if info["host_ip"] + "/" in line or vmboot.METADATA_IP in line]
    found += [f"route {line}" for line in lines(IP, "route", "show", "table", "all") if link in line]
    found += [f"rule {line}" for line in lines(IP, "rule", "show") if "dsvm" in line]
    found += [f"mount {line}" for line in Path("/proc/mounts").read_text().splitlines() if info["dir"] in line]
    found += [f"process {pid}" for pid in info["pids"] if not _gone(pid)]
    return found


def _describe(vm: BootedVm, *procs) -> dict:
    return {"links": list(vm.links), "host_ip": vm.host_ip, "slot": vm.slot, "dir": str(vm._dir),
            "pids": [vm.init_pid, *(p.pid for p in procs)]}


def _slot_is_free(slot: int) -> bool:
    import fcntl
    with open(vmboot.LOCK_DIR / f"slot-{slot}.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


_PROBE = textwrap.dedent("""
    import errno, json, socket, sys, time
    out = {}
    for host, port in json.loads(sys.argv[1]):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(10)
        t0 = time.monotonic()
        try:
            s.connect((host, port))
            result = "connected"
        except OSError as e:
            result = errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
        finally:
            s.close()
        out[f"{host}:{port}"] = [result, round(time.monotonic() - t0, 3)]
    for name in json.loads(sys.argv[2]):
        t0 = time.monotonic()
        try:
            socket.getaddrinfo(name, 443)
            result = "resolved"
        except OSError as e:
            result = type(e).__name__
        out[name] = [result, round(time.monotonic() - t0, 3)]
    print(json.dumps(out))
""")


def _probe(vm: BootedVm, targets: list[tuple[str, int]], names: list[str] = ()) -> dict:
    res = vm.exec(["python3", "-c", _PROBE, json.dumps(targets), json.dumps(list(names))], timeout_s=60).check()
    return json.loads(res.stdout)


@pytest.mark.slow
def test_startup_script_fetches_a_staged_object_with_only_python_and_a_metadata_token(rootfs, tmp_path):
    payload = os.urandom(300_000)
    script = textwrap.dedent("""\
        #!/bin/bash
        set -euo pipefail
        echo "startup on $(hostname) as $(id -un), HOME=${HOME-unset}"
        python3 - <<'PY'
        import hashlib, json, urllib.parse, urllib.request
        def md(path):
            req = urllib.request.Request("http://metadata.google.internal/computeMetadata/v1/" + path,
                                         headers={"Metadata-Flavor": "Google"})
            return urllib.request.urlopen(req, timeout=10).read().decode()
        endpoint, bucket = md("instance/attributes/dsctl-storage"), md("instance/attributes/dsctl-bucket")
        token = json.loads(md("instance/service-accounts/default/token"))["access_token"]
        url = "%s/storage/v1/b/%s/o/%s?alt=media" % (endpoint, bucket, urllib.parse.quote("wheelhouse/payload.bin", safe=""))
        data = urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer " + token}),
                                      timeout=30).read()
        marker = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                  "project": md("project/project-id"), "ip": md("instance/network-interfaces/0/ip")}
        open("/var/lib/dsctl-boot.json", "w").write(json.dumps(marker))
        print("fetched", len(data), "bytes")
        PY
        echo "startup done" >&2
        """)
    with BootedVm(tmp_path, metadata={"startup-script": script, "dsctl-bucket": BUCKET}, bucket=BUCKET,
                  name="boot-test") as vm:
        vm.metadata.set_attribute("dsctl-storage", vm.gcs_endpoint)
        vm.storage_client().bucket(BUCKET).blob("wheelhouse/payload.bin").upload_from_string(payload)
        result = vm.run_startup_script(timeout_s=60)
        assert result.ok, result
        assert result.output.splitlines() == ["startup on boot-test as root, HOME=unset",
                                              f"fetched {len(payload)} bytes", "startup done"], result
        assert "Found startup-script in metadata." in result.log and "startup-script exit status 0" in result.log
        marker = json.loads(vm.path("/var/lib/dsctl-boot.json").read_text())
        assert marker == {"sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload),
                          "project": "dsctl-test", "ip": vm.ip}
        served = vm.bytes_served()
        assert served.storage > len(payload) and 0 < served.metadata < 20_000, served
        assert vm.requests_served()["storage"] == 1

        # The bucket is private: without the metadata server's token the VM gets 401.
        url = f"{vm.gcs_endpoint}/storage/v1/b/{BUCKET}/o/wheelhouse%2Fpayload.bin?alt=media"
        code = vm.exec(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url]).check().stdout
        forged = vm.exec(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H",
                          "Authorization: Bearer ya29.forged", url]).check().stdout
        assert (code, forged) == ("401", "401")
        # Nothing the boot wrote reached the cached image.
        assert not (rootfs / "var/lib/dsctl-boot.json").exists()


@pytest.mark.slow
def test_network_isolation_only_metadata_and_storage_answer(vm):
    storage_port = int(vm.gcs_endpoint.rsplit(":", 1)[1])
    host_addrs = _host_ipv4_addresses()
    assert host_addrs, "this machine has no non-loopback IPv4 address to probe"
    outside = [("1.1.1.1", 443), ("8.8.8.8", 53), ("2606:4700:4700::1111", 443)]
    host_other = [(a, p) for a in host_addrs for p in (22, 80, 443)]
    host_fixed = [(vm.host_ip, 22), (vm.host_ip, 1)]   # host services on fixed ports: not for the VM
    peers = [(vmboot.METADATA_IP, 80), (vm.gateway_ip, storage_port)]
    names = ["pypi.org", "storage.googleapis.com", "deb.debian.org"]

    got = _probe(vm, outside + host_other + host_fixed + peers, names)
    for host, port in outside + host_other + host_fixed:
        result, seconds = got[f"{host}:{port}"]
        assert result in ("ENETUNREACH", "EHOSTUNREACH") and seconds < 1, (host, port, got)
    for host, port in peers:
        assert got[f"{host}:{port}"][0] == "connected", got
    for name in names:  # the resolver at 169.254.169.254 answers NXDOMAIN at once
        assert got[name][0] == "gaierror" and got[name][1] < 1, got
    assert vm.dns.request_count(vm.ip) >= len(names)

    # A script adding a default route changes nothing: the gateway forwards nothing and answers
    # "network unreachable" (ICMP; the kernel sends a burst of 5 such errors, then 1 a second,
    # hence only a few targets here).
    vm.exec(["ip", "route", "add", "default", "via", vm.gateway_ip]).check()
    targets = [("1.1.1.1", 443), (host_addrs[0], 22), (vm.host_ip, 1)]
    got = _probe(vm, targets)
    for host, port in targets:
        result, seconds = got[f"{host}:{port}"]
        assert result in ("ENETUNREACH", "EHOSTUNREACH") and seconds < 1, (host, port, got)

    # The host's own metadata path is untouched: 169.254.169.254 exists only in the gateway.
    host_addr = subprocess.run([IP, "-o", "addr", "show"], capture_output=True, text=True).stdout
    assert vmboot.METADATA_IP not in host_addr
    route = subprocess.run([IP, "route", "get", vmboot.METADATA_IP], capture_output=True, text=True).stdout
    assert "dsvm" not in route and " lo " not in route, route


@pytest.mark.slow
def test_vm_reaches_host_only_on_ephemeral_or_allowed_ports(vm):
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ephemeral = socket.create_server((vm.host_ip, 0))
    fixed = None
    for port in range(low - 2000, low - 1000):
        try:
            fixed = socket.create_server((vm.host_ip, port))
            break
        except OSError:
            continue
    assert fixed is not None
    try:
        eport, fport = ephemeral.getsockname()[1], fixed.getsockname()[1]
        got = _probe(vm, [(vm.host_ip, eport), (vm.host_ip, fport)])
        assert got[f"{vm.host_ip}:{eport}"][0] == "connected", got
        assert got[f"{vm.host_ip}:{fport}"][0] == "ENETUNREACH", got
        vm.allow_host_port(fport)
        assert _probe(vm, [(vm.host_ip, fport)])[f"{vm.host_ip}:{fport}"][0] == "connected"
    finally:
        ephemeral.close()
        fixed.close()


@pytest.mark.slow
def test_two_vms_get_separate_addresses_and_cannot_reach_each_other(rootfs, tmp_path):
    with BootedVm(tmp_path / "a", name="vm-a") as a, BootedVm(tmp_path / "b", name="vm-b") as b:
        assert len({a.ip, b.ip, a.host_ip, b.host_ip}) == 4 and a.slot != b.slot
        server = b.spawn(["python3", "-m", "http.server", "8080"])
        _wait_until(lambda: _port_open(b.ip, 8080), what="vm-b's web server")
        assert _http(f"http://{b.ip}:8080/")[0] == 200  # the host reaches both
        got = _probe(a, [(b.ip, 8080), (b.gateway_ip, 80)])
        assert all(v[0] in ("ENETUNREACH", "EHOSTUNREACH") for v in got.values()), got
        assert server.alive


def _port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_metadata_header_rules_seen_from_inside(rootfs, tmp_path):
    with BootedVm(tmp_path, metadata={"dsctl-x": "value-x"}) as vm:
        url = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/dsctl-x"

        def curl(*args):
            return vm.exec(["curl", "-s", "-i", *args]).check().stdout

        plain = curl(url)
        assert plain.startswith("HTTP/1.1 403") and "Metadata-Flavor: Google" in plain
        forwarded = curl("-H", "Metadata-Flavor: Google", "-H", "X-Forwarded-For: 10.0.0.9", url)
        assert forwarded.startswith("HTTP/1.1 403")
        ok = curl("-H", "Metadata-Flavor: Google", url)
        assert ok.startswith("HTTP/1.1 200") and "Metadata-Flavor: Google" in ok and ok.endswith("\r\n\r\nvalue-x")
        short = curl("-H", "Metadata-Flavor: Google", "http://metadata/computeMetadata/v1/project/project-id")
        assert short.endswith("dsctl-test")
        ip = curl("-H", "Metadata-Flavor: Google", "http://169.254.169.254/computeMetadata/v1/instance/network-interfaces/0/ip")
        assert ip.endswith(vm.ip)
        assert [s.status for s in vm.metadata.requests if s.client == vm.ip] == [403, 403, 200, 200, 200]


@pytest.mark.slow
def test_spawned_process_is_reachable_from_the_host_and_gone_after_teardown(rootfs, tmp_path):
    with BootedVm(tmp_path, name="web-vm") as vm:
        proc = vm.spawn(["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"], cwd="/etc", name="web")
        _wait_until(lambda: _port_open(vm.ip, 8080), what="the VM's web server")
        status, _, body = _http(f"http://{vm.ip}:8080/hostname")
        assert (status, body) == (200, b"web-vm\n")
        assert proc.alive and proc.vm_pid and proc.vm_pid > 1
        ps = vm.exec(["ps", "-eo", "pid,args"]).check().stdout
        assert "http.server" in ps and len(ps.splitlines()) < 10, ps  # its own PID namespace
        slow = vm.exec(["sh", "-c", "echo partial; sleep 30"], timeout_s=0.5)
        assert slow.timed_out and slow.exit_code is None and slow.stdout == "partial\n"
        init_pid, pid = vm.init_pid, proc.pid
    assert _gone(pid) and _gone(init_pid)
    assert proc.poll() is not None
    assert "GET /hostname" in proc.output()


@pytest.mark.slow
def test_teardown_leaves_nothing_behind_even_when_the_test_fails(rootfs, tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with BootedVm(tmp_path) as vm:
            sleeper = vm.spawn(["sleep", "1000"])
            vm.exec(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 < /dev/null &"]).check()
            info = _describe(vm, sleeper)
            daemon = [int(p) for p in vm.exec(["pgrep", "-x", "sleep"]).check().stdout.split()]
            assert len(daemon) == 3  # init's own sleep, the spawned one, the daemonized one
            present = _leftovers(info)
            assert any(x.startswith("link ") for x in present) and any(x.startswith("addr ") for x in present)
            assert not any(vmboot.METADATA_IP in x for x in present)  # never on the host, not even now
            assert not _slot_is_free(info["slot"])
            raise RuntimeError("boom")
    assert _leftovers(info) == []
    assert _slot_is_free(info["slot"])
    workdir = Path(info["dir"])
    assert not (workdir / "upper").exists() and not (workdir / "work").exists()


@pytest.mark.slow
def test_teardown_when_the_test_process_is_killed(rootfs, tmp_path):
    child = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(STANDINS)!r})
        import vmboot
        vm = vmboot.BootedVm({str(tmp_path)!r}).start()
        p = vm.spawn(["sleep", "1000"])
        vm.exec(["sh", "-c", "setsid sleep 1000 >/dev/null 2>&1 < /dev/null &"]).check()
        print(json.dumps({{"links": vm.links, "host_ip": vm.host_ip, "slot": vm.slot, "dir": str(vm._dir),
                          "pids": [vm.init_pid, p.pid]}}), flush=True)
        time.sleep(1000)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        assert _leftovers(info), "the VM should be up"
    finally:
        proc.send_signal(signal.SIGKILL)  # no teardown code runs: only the kernel cleans up
        proc.wait()
    _wait_until(lambda: _leftovers(info) == [], what="the kernel to remove the VM: " + repr(_leftovers(info)))
    assert _slot_is_free(info["slot"])


@pytest.mark.slow
def test_proc_sys_dev_tmp_and_the_image_inside(vm, rootfs):
    probe = textwrap.dedent("""
        import errno, json, os, socket, subprocess, tempfile
        r = {}
        r["cpus"] = os.cpu_count()
        r["cpuinfo"] = "processor" in open("/proc/cpuinfo").read()
        r["sys_cpus"] = len([d for d in os.listdir("/sys/devices/system/cpu") if d[3:].isdigit()])
        open("/dev/null", "w").write("x")
        r["urandom"] = len(os.urandom(16)) == 16 and open("/dev/zero", "rb").read(4) == b"\\0" * 4
        with tempfile.NamedTemporaryFile(dir="/tmp") as f, open("/dev/shm/probe", "w") as g:
            f.write(b"ok"); g.write("ok")
        r["hostname"] = socket.gethostname()
        r["metadata"] = socket.gethostbyname("metadata.google.internal")
        r["uid"] = os.getuid()
        r["pid1"] = open("/proc/1/cmdline").read().split("\\0")[0]
        r["debian"] = open("/etc/debian_version").read().strip()
        def err(fn):
            try:
                fn()
                return "ok"
            except OSError as e:
                return errno.errorcode[e.errno]
        r["proc_sys_vm"] = err(lambda: open("/proc/sys/vm/swappiness", "w").write("10"))
        r["proc_sys_net"] = err(lambda: open("/proc/sys/net/ipv4/ip_forward", "w").write("0"))
        r["sys"] = err(lambda: open("/sys/kernel/mm/transparent_hugepage/enabled", "w").write("never"))
        r["mknod"] = err(lambda: os.mknod("/tmp/disk", 0o600 | 0o60000, os.makedev(8, 0)))
        r["pip"] = subprocess.run(["python3", "-m", "pip", "--version"], capture_output=True).returncode
        r["ensurepip"] = subprocess.run(["python3", "-c", "import ensurepip"], capture_output=True).returncode
        r["venv_without_pip"] = subprocess.run(["python3", "-m", "venv", "--without-pip", "/tmp/v"]).returncode
        r["date_set"] = subprocess.run(["date", "-s", "2001-01-01"], capture_output=True).returncode
        r["curl"] = subprocess.run(["curl", "--version"], capture_output=True).returncode
        r["gcloud"] = subprocess.run(["sh", "-c", "command -v gcloud gsutil systemctl"], capture_output=True).stdout.decode()
        open("/etc/dsctl-probe", "w").write("x")
        print(json.dumps(r))
    """)
    r = json.loads(vm.exec(["python3", "-c", probe]).check().stdout)
    assert r["cpus"] == os.cpu_count() and r["cpuinfo"] and r["sys_cpus"] >= 1 and r["urandom"]
    assert (r["hostname"], r["metadata"], r["uid"], r["pid1"]) == (vm.name, vmboot.METADATA_IP, 0, "/bin/sh")
    assert r["debian"].startswith("12.")
    assert (r["proc_sys_vm"], r["proc_sys_net"], r["sys"], r["mknod"]) == ("EROFS", "ok", "EROFS", "EPERM")
    assert r["pip"] != 0 and r["ensurepip"] != 0 and r["venv_without_pip"] == 0 and r["curl"] == 0
    assert r["date_set"] != 0 and r["gcloud"] == ""
    assert not (rootfs / "etc/dsctl-probe").exists()


@pytest.mark.slow
def test_startup_script_runner_failures_held_output_urls_and_timeouts(vm):
    md = vm.metadata
    assert not vm.run_startup_script().found  # nothing in metadata: "No startup scripts to run."

    md.set_attribute("startup-script", "\n  #!/bin/bash\necho out\necho err >&2\nexit 3\n")
    res = vm.run_startup_script(timeout_s=30)
    assert (res.exit_code, res.output, res.ok) == (3, "out\nerr\n", False), res
    assert 'Script "startup-script" failed with error: exit status 3' in res.log

    # A background process left holding the script's stdout: the real runner would wait forever.
    md.set_attribute("startup-script", "#!/bin/bash\nsleep 300 &\necho started\n")
    t0 = time.monotonic()
    res = vm.run_startup_script(timeout_s=30)
    assert res.exit_code == 0 and not res.timed_out and time.monotonic() - t0 < 10
    assert any("sleep 300" in h for h in res.held_open_by), res
    md.set_attribute("startup-script",
                     "#!/bin/bash\nsetsid nohup sleep 300 >/var/log/d.log 2>&1 </dev/null &\necho started\n")
    res = vm.run_startup_script(timeout_s=30)
    assert res.ok and res.held_open_by == [] and res.output == "started\n", res

    # startup-script-url from the (private) bucket, fetched with a metadata token.
    vm.storage_client().bucket(BUCKET).blob("scripts/boot.sh").upload_from_string("#!/bin/sh\necho from-url\n")
    md.set_attribute("startup-script", None)
    md.set_attribute("startup-script-url", f"gs://{BUCKET}/scripts/boot.sh")
    res = vm.run_startup_script(timeout_s=30)
    assert res.ok and res.output == "from-url\n" and "Found startup-script-url in metadata." in res.log, res

    md.set_attribute("startup-script-url", None)
    md.set_attribute("startup-script", "#!/bin/bash\necho going\nsleep 30\n")
    res = vm.run_startup_script(timeout_s=1.5)
    assert res.timed_out and res.exit_code is None and res.output == "going\n" and not res.ok, res


@pytest.mark.slow
def test_tensorflow_runs_a_tf_data_service_inside_the_vm(rootfs, tmp_path):
    import tensorflow  # noqa: F401  (skips nothing: the project's venv has it)

    site = Path(tensorflow.__file__).resolve().parents[1]
    with BootedVm(tmp_path, binds={site: "/opt/host-site-packages"}) as vm:
        code = textwrap.dedent("""
            import tensorflow as tf
            dispatcher = tf.data.experimental.service.DispatchServer()
            address = dispatcher.target.split("://")[1]
            worker = tf.data.experimental.service.WorkerServer(
                tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
            ds = tf.data.Dataset.range(10).apply(
                tf.data.experimental.service.distribute("parallel_epochs", dispatcher.target))
            print(tf.__version__, sum(int(x) for x in ds))
        """)
        res = vm.exec(["python3", "-c", code], env={"PYTHONPATH": "/opt/host-site-packages",
                                                     "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout_s=180)
        assert res.ok, res
        assert res.stdout.split()[-1] == "45" and res.stdout.split()[0] == tensorflow.__version__, res


# ================================================================================================
# The run's watchdog, started by the REAL startup script (provisioners/gcp/watchdog.py)
# ================================================================================================
def _watchdogs(vm: BootedVm) -> list[str]:
    """The watchdog programs running in the VM (not the loop that restarts them)."""
    out = vm.exec(["pgrep", "-af", "/opt/dsctl/watchdog.py"]).stdout.splitlines()
    return [line.split(" ", 1)[1] for line in out if "until" not in line]


def test_the_startup_scripts_watchdog_deletes_its_vm_once_the_heartbeat_stops(rootfs, tmp_path):
    """A VM booted with the run's startup script (whose bootstrap fails here: nothing is staged) runs the
    watchdog as the unit's command (no systemd in this root filesystem: the nohup'd loop), keeps its VM while
    the heartbeat changes, and deletes it through the Compute API (the stand-in) once it has not changed for
    gcp.heartbeat_limit_s."""
    sys.path.insert(0, str(STANDINS))
    from fake_gce import FakeCloud, FakeGce, Faults, Timing

    from dsctl.provisioners.gcp import lifetime, software, startup, watchdog
    from dsctl.provisioners.gcp.settings import GcpSettings, local_tensorflow_version
    from dsctl.provisioners.gcp.storage import HeartbeatObject
    from dsctl.specs import load_spec_text

    spec = load_spec_text("name: b\nprovider: gcp\ntrainer: {machine: n2-standard-8, steps: 1}\n"
                          "pipeline: {builtin: synthetic}\ngcp: {project: dsctl-test, zone: us-central1-b}\n").spec
    sw = software.resolve(spec, local_tensorflow_version())
    limit = 15.0
    cloud = FakeCloud(Faults(), Timing(op_s=0.05, provisioning_s=0.1, staging_s=0.1, stopping_s=0.1))
    # The VM runs as the supervisor's account with what dsctl grants it on the project (accounts.py): its watchdog
    # calls the Compute API with that account's token from the VM's metadata server.
    account = "dsctl-supervisor@dsctl-test.iam.gserviceaccount.com"
    cloud.define_project("dsctl-test", owners=("owner@example.com",))
    cloud.grant(account, "roles/compute.instanceAdmin.v1", "projects/dsctl-test")
    with BootedVm(tmp_path / "vm", bucket=BUCKET, identity=cloud, service_account=account) as vm, \
            FakeGce(cloud, host=vm.host_ip) as api, cloud.acting_as("owner@example.com"):
        cloud.insert_instance(vm.project, vm.zone, {
            "name": vm.name, "machineType": f"zones/{vm.zone}/machineTypes/e2-standard-4",
            "disks": [{"boot": True, "autoDelete": True, "initializeParams": {
                "sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
            "networkInterfaces": [{"network": "global/networks/default"}],
            "serviceAccounts": [{"email": account}]}, None)
        settings = GcpSettings(project=vm.project, zone=vm.zone, bucket=BUCKET, heartbeat_limit_s=limit,
                               storage_host=vm.gcs_endpoint, compute_endpoint=api.endpoint)
        config = lifetime.watchdog_config(settings, "run-1", tpus=False)
        heart = HeartbeatObject(vm.storage_client(), BUCKET, "run-1")
        heart.beat(1)
        vm.metadata.set_attribute(lifetime.WATCHDOG_KEY, config.to_json())
        vm.metadata.set_attribute("startup-script", startup.script(
            kind=sw.for_kind("cpu"), tf_version=sw.tensorflow_version, bucket=BUCKET,
            wheelhouse_prefix="dsctl/wheelhouses/missing/", dsctl_prefix="dsctl/runs/run-1/staging/",
            dsctl_wheel="dsctl-0.1.0+g0-py3-none-any.whl", storage_host=vm.gcs_endpoint))
        result = vm.run_startup_script(timeout_s=120)
        assert result.exit_code != 0 and not result.held_open_by, result  # the bootstrap failed; the watchdog runs
        unit = vm.exec(["cat", watchdog.UNIT_PATH]).check().stdout
        command = next(line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart="))
        running = wait_for_value(lambda: _watchdogs(vm), what="the watchdog to run")
        assert running == [command.removeprefix("/usr/bin/env ")], (running, unit)
        assert "Restart=on-failure" in unit and "WantedBy=multi-user.target" in unit
        vm.run_startup_script(timeout_s=120)  # the next boot's run: still one watchdog
        assert len(_watchdogs(vm)) == 1

        for beat in range(2, 13):  # beats for longer than the limit: the VM stays
            time.sleep(2)
            heart.beat(beat)
            assert cloud.counts()["instances"] == 1, vm.exec(["cat", watchdog.LOG]).stdout
        stopped = time.monotonic()
        _wait_until(lambda: cloud.counts()["instances"] == 0, timeout=limit + 2 * config.check_s + 10,
                    what="the VM to delete itself")
        took = time.monotonic() - stopped
        assert limit - 2 <= took <= limit + 2 * config.check_s + 3, took
        log = vm.exec(["cat", watchdog.LOG]).stdout
        assert f"deleting projects/{vm.project}/zones/{vm.zone}/instances/{vm.name}: HTTP 200" in log, log
        assert ("DELETE", f"/compute/v1/projects/{vm.project}/zones/{vm.zone}/instances/{vm.name}") in cloud.calls


def wait_for_value(fn, timeout: float = 10.0, what: str = "value"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
