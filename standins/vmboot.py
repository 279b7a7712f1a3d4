"""Boot a stand-in Compute Engine VM on this machine and run its REAL startup script, offline.

What CI must install (Debian/Ubuntu packages) so a fresh machine runs these tests
---------------------------------------------------------------------------------
The tests run as root (CI runs as root; otherwise they are skipped with the reason)::

    apt-get install -y debootstrap debian-archive-keyring iproute2 util-linux mount

``debootstrap`` builds the Debian 12 root filesystem once (from the machine's configured Debian
mirror, else http://deb.debian.org/debian); ``debian-archive-keyring`` lets it verify Debian's
signatures (already present on Debian, needed on Ubuntu); ``iproute2`` gives ``ip``;
``util-linux`` gives ``unshare``, ``nsenter`` and ``setpriv`` (2.32 or newer: ``--kill-child``,
``--pdeathsig``); ``mount`` gives ``mount``. The kernel needs network/mount/PID namespaces,
veth and overlayfs (any distribution kernel has them). Nothing else: no iptables/nftables, no
bridge, no systemd in the VM. The cached root filesystem lives in
``${XDG_CACHE_HOME:-~/.cache}/dsctl-tests/`` (``DSCTL_VMBOOT_CACHE`` overrides): CI may cache that
directory between runs to skip the build.

API
---
::

    from vmboot import BootedVm

    with BootedVm(tmp_path, metadata={"startup-script": script, "dsctl-bucket": "dsctl-test-staging"},
                  bucket="dsctl-test-staging") as vm:
        vm.storage_client().bucket("dsctl-test-staging").blob("wheels/x.whl").upload_from_filename(...)
        vm.metadata.set_attribute("dsctl-storage", vm.gcs_endpoint)     # attributes may change any time
        result = vm.run_startup_script(timeout_s=600)
        assert result.ok, result                      # str(result) is a readable report
        worker = vm.spawn(["python3", "-m", "http.server", "8080"])   # killed at teardown
        vm.exec(["cat", "/var/log/x"]).check().stdout
        print(vm.bytes_served())                      # ServedBytes(metadata=..., storage=..., dns=...)

``BootedVm(workdir, *, metadata=None, project_metadata=None, bucket="dsctl-test-staging",
name="dsctl-vm", project="dsctl-test", zone="us-central1-b", machine_type="e2-standard-4",
gcs_requires_token=True, allow_host_ports=(), binds=None, keep_files=False)``
    A context manager; ``start()``/``close()`` do the same by hand. ``workdir`` (e.g. pytest's
    ``tmp_path``) receives the VM's copy-on-write layer and process logs; the layer is deleted at
    close unless ``keep_files``. ``binds`` maps host paths to VM paths, bind-mounted read-only
    (an escape hatch for tests; a startup script under test should get everything through Cloud
    Storage instead). ``allow_host_ports`` opens host ports below the ephemeral range to the VM
    (see Network).

Attributes and methods of a booted VM:

``vm.ip`` / ``vm.host_ip`` / ``vm.gateway_ip``
    The VM's address (the host reaches it: ``urllib`` to ``http://{vm.ip}:PORT``), this machine's
    address as the VM sees it, and the gateway's (where the Cloud Storage emulator listens).
``vm.gcs_endpoint``
    ``http://<gateway_ip>:<port>``: the Cloud Storage JSON API the VM must use instead of
    https://storage.googleapis.com (the test tells the script, e.g. through a metadata attribute).
    The host reaches the same URL.
``vm.storage_client()``
    A ``google.cloud.storage.Client`` (AnonymousCredentials, explicit project) pointed at that
    emulator, for the test to stage objects. Host requests need no token; the VM's do (below).
``vm.metadata``, ``vm.storage``, ``vm.dns``
    The :class:`metadata_server.MetadataServer` (attributes, tokens, request log), the
    :class:`GcsEmulator` (``.storage`` is gcp-storage-emulator's store, ``.requests`` its log) and
    the :class:`DnsStandIn` (the VM's resolver, ``.queries``).
``vm.run_startup_script(timeout_s=600, held_open_grace_s=1.5)`` -> :class:`StartupResult`
    Runs ``/usr/bin/google_metadata_script_runner startup`` INSIDE the VM, a stand-in for the
    guest agent's runner that does what guest-agent's google_metadata_script_runner/main.go does:
    reads ``instance/attributes/?recursive=true`` (then ``project/attributes``) from
    169.254.169.254, finds ``startup-script`` and/or ``startup-script-url``, writes it to
    ``/tmp/metadata-scriptsNNN/startup-script`` (mode 0755, leading whitespace trimmed) and runs
    ``/bin/bash -c <that file>`` as root with cwd ``/``, stdin ``/dev/null``, stdout and stderr on
    one pipe it reads line by line until EOF (a line over 64 KiB ends the reading, as Go's
    bufio.Scanner does), then waits for the exit status. Like the google-startup-scripts.service
    it runs under, the environment is systemd's: ``PATH`` only (no ``HOME``). ``gs://`` script
    URLs are fetched from the emulator with a metadata-server token (the real runner would resolve
    storage.googleapis.com first, which has no DNS here). A script may be run several times.
    :class:`StartupResult`: ``exit_code`` (negative: killed by that signal; None: never exited),
    ``seconds`` (the script's own run time), ``output`` (what it printed, stdout and stderr
    interleaved), ``log`` (the runner's journal lines), ``timed_out``, ``held_open_by`` (see
    below), ``found``, ``ok``.
    If the script exits but something it started in the background still holds its stdout or
    stderr, the real runner keeps waiting for EOF (the unit stays "activating", and that process
    dies of SIGPIPE if the runner ever stops). Here the call returns ``held_open_grace_s`` after the
    script's exit with ``held_open_by`` naming those processes (redirect a daemon's output!); the
    runner keeps relaying in the background until teardown.
``vm.exec(argv, *, env=None, timeout_s=120, cwd="/", input=None, check=False)`` -> :class:`RunResult`
    Run a command inside the VM and wait (``exit_code``, ``stdout``, ``stderr``, ``seconds``,
    ``timed_out``; ``.check()`` raises :class:`VmCommandError` unless it exited 0). The default
    environment is a root login's (PATH, HOME=/root, LANG=C.UTF-8, ...); ``env`` entries override
    it (None removes one). On timeout the command's process group is killed. A background process
    left holding stdout does not block the call (at most one more second).
``vm.spawn(argv, *, env=None, cwd="/", name=None)`` -> :class:`VmProcess`
    Start a long-running process inside the VM; its stdout+stderr go to ``proc.log_path`` on the
    host (``proc.output()``). ``proc.pid`` is its host PID, ``proc.vm_pid`` its PID in the VM;
    ``poll``/``wait``/``send_signal``/``terminate``/``kill``/``alive``. Everything still running
    in the VM is killed at teardown.
``vm.path("/etc/hosts")``
    The host path of a file in the running VM (``/proc/<VM init>/root/...``). Absolute symlinks
    inside the VM resolve against the HOST's root through it: use ``vm.exec(["cat", p])`` for those.
``vm.bytes_served()`` -> :class:`ServedBytes`
    Bytes (status lines, headers and bodies; DNS answers) the metadata server, the Cloud Storage
    emulator and the resolver sent to the VM's address, counted by the servers. They are the only
    things the VM can fetch anything from (see Network), so this is everything the boot downloaded:
    "bytes fetched from outside Cloud Storage" is ``metadata + dns`` (configuration, tokens, name
    lookups) and nothing else.
    ``vm.requests_served()`` counts requests the same way; ``vm.link_bytes()`` reads the VM link's
    kernel counters (all traffic, TCP/IP overhead and host-initiated connections included).
``vm.allow_host_port(port)``
    Let the VM open TCP connections to ``host_ip:port`` (e.g. a tf.data dispatcher on the host).
``vm.name``, ``vm.project``, ``vm.zone``, ``vm.rootfs``, ``vm.boot_seconds``

Module functions: :func:`unsupported_reason` (why this machine cannot boot VMs, or None),
:func:`ensure_rootfs` (build or find the cached root filesystem), :func:`rootfs_path`.

Root filesystem (what is in the image, and why)
-----------------------------------------------
``debootstrap --variant=minbase bookworm`` plus ``--include`` of :data:`ROOTFS_PACKAGES`:
``python3`` (3.11.2), ``ca-certificates``, ``curl``, ``iproute2``, ``procps``, ``netbase``,
``xz-utils``, ``sudo``. Google builds its debian-12 image with FAI from Debian's cloud-team
classes (debian-cloud-images: CLOUD adds ``openssh-server``, ``sudo``...; EXTRAS adds
``ca-certificates``, ``curl``, ``xz-utils``, ``less``, ``vim``...) plus its own class,
GoogleCloudPlatform/compute-image-tools ``daisy_workflows/image_build/debian/fai_config/
package_config/GCE_SPECIFIC``, which installs ``python3`` explicitly (for the Google Cloud CLI),
the guest environment (``google-compute-engine``, ``google-osconfig-agent``, ``gce-disk-expand``),
``google-cloud-cli``, ``isc-dhcp-client``, ``haveged``, ``net-tools``; ``iproute2``, ``procps`` and
``netbase`` are Debian "important" packages every image but minbase has. Nothing installs
``python3-venv`` or ``python3-pip``, and neither is here: ``python3 -m pip`` and ``ensurepip`` do
not exist (``python3 -m venv --without-pip`` works), which is exactly what a wheelhouse-only
startup script must cope with. Python is Debian's 3.11.2.
Left out on purpose, with what that means for a script: the Google guest environment (this
module's runner stands in for its script runner; no OS Login, no guest agent), the Google Cloud
CLI (no ``gcloud``/``gsutil``: fetch objects over the JSON API with ``curl`` or ``urllib`` and a
metadata token, which works the same on the real image), ``openssh-server``, editors, and
systemd as PID 1 (nothing boots: no ``systemctl``, no journald; start daemons directly with
``setsid``/``nohup`` and redirect their output). APT's package lists and archives are removed from
the image (no network anyway: ``apt-get install`` fails). The recipe's hash names the cache entry:
change :data:`ROOTFS_PACKAGES` or :data:`RECIPE_VERSION` and a new one is built; delete
``rootfs-debian12-*`` in the cache directory to refresh Debian's packages.

Each boot mounts an overlayfs (the cached tree read-only below, a throwaway upper directory in
``workdir``; mount option ``volatile``: nothing a boot writes is synced; if ``workdir``'s
filesystem cannot hold an upper layer, e.g. it is itself an overlay as in many CI containers, a
tmpfs instead, and ``vm.upper_on`` says "tmpfs") inside the VM's own mount namespace, and a fresh
``/proc`` (read-only ``/proc/sys`` except ``/proc/sys/net``, read-only
``/proc/sysrq-trigger``), read-only ``/sys``, a minimal ``/dev`` (null, zero, full, random,
urandom, tty, ptmx, pts, shm, fd, std*), tmpfs ``/run``; ``/tmp`` is on the root disk as on the
real image. The per-boot files are GCE's: ``/etc/hostname``, ``/etc/hosts`` (with
``169.254.169.254 metadata.google.internal metadata``), ``/etc/resolv.conf`` (nameserver
169.254.169.254, where :class:`DnsStandIn` answers the metadata server's and the VM's own names
and NXDOMAIN to everything else, at once). The VM's processes run as root (uid 0) via ``chroot``
in new mount, UTS, IPC, network and PID
namespaces, without the capabilities that reach beyond them (sys_module, sys_boot, sys_time,
sys_rawio, mknod, syslog, bpf, perfmon, ...): a buggy script cannot change this machine's clock,
load modules or create device nodes for its disks.

Network
-------
Three network namespaces, addresses from the RFC 2544 benchmarking block 198.18.0.0/15 (unused
by real networks; a /29 "slot" per VM, skipped when anything on the host overlaps it, claimed with
a lock file under /run/dsctl-vmboot so concurrent boots never share one)::

    host (this machine)       gateway (per VM)                     VM
    dsvmNr  host_ip  ------  dsvmNg  .2                            ens4  vm.ip (mtu 1460, as GCE)
                             dsvmNv  gateway_ip  ----------------  routes: gateway's /30,
                             lo      169.254.169.254 (metadata)            169.254.169.254 and
                             Cloud Storage emulator: gateway_ip:PORT       host_ip, via gateway_ip
                                                                   NO default route

The gateway namespace belongs to this process (created by a thread, held by a file descriptor
and the servers' sockets, which this process serves from that namespace): the metadata server
and the emulator are the only listeners there, so 169.254.169.254 is never added to the host,
whose own metadata path stays untouched. The gateway forwards nothing from the VM except TCP to
``host_ip`` ports in the host's ephemeral range (replies to the host's connections, and host
services on port 0) or in ``allow_host_ports``; everything else from the VM gets ICMP "network
unreachable" back at once (policy rule ``unreachable``), even if a script adds a default route.
(That ICMP is subject to the kernel's route-error limit, 5 at once then 1 a second per VM: only
a script that adds its own default route and then tries many destinations notices.)
So from inside: the internet and every other host address fail at once with ENETUNREACH (no
route), names other than the metadata server's and the VM's get NXDOMAIN at once from the
resolver stand-in, ``host_ip:22`` (or any host service on a fixed port) fails fast, and the only
things answering are the metadata server (HTTP on 169.254.169.254:80, DNS on :53), the emulator
and what the host runs on ephemeral ports.

Teardown (``close``, also on exceptions and KeyboardInterrupt) kills the VM's PID 1, which makes
the kernel kill every process in the VM; deletes the veth pairs; stops the servers; closes the
gateway namespace; removes the per-boot files; releases the slot. If this process dies without
teardown (SIGKILL), the kernel does the same: the namespace holder dies by ``PR_SET_PDEATHSIG``
(unshare ``--kill-child`` passes it to the VM's PID 1; it is started from a long-lived daemon
thread, because that signal follows the death of the parent THREAD, so a VM booted from a
short-lived worker thread survives it), the mount namespace with the overlay
dies with it, and the network namespaces (with their veths, addresses and routes) die with the
last process and descriptor holding them. Nothing is left on the host but the per-boot directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, wraps
from http.server import ThreadingHTTPServer
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # metadata_server sits next to this file (standins/ is not a package)
    sys.path.insert(0, _HERE)
from metadata_server import MetadataServer, Served, ThreadedService  # noqa: E402

# ---- the image ---------------------------------------------------------------------------------
DEBIAN_SUITE = "bookworm"
#: What --include adds to `debootstrap --variant=minbase`: the parts of the stock debian-12 GCE
#: image a boot script can notice (see the module docstring for the sources and what is left out).
ROOTFS_PACKAGES = (
    "python3",          # GCE_SPECIFIC installs it (for the Google Cloud CLI): Python 3.11, no pip/venv
    "ca-certificates",  # debian-cloud-images EXTRAS class
    "curl",             # EXTRAS
    "iproute2",         # Debian "important": `ip`
    "procps",           # Debian "important": ps, pgrep, pkill, sysctl
    "netbase",          # Debian "important": /etc/services, /etc/protocols (socket.getservbyname)
    "xz-utils",         # EXTRAS: tar -J
    "sudo",             # debian-cloud-images CLOUD class
)
#: Bump to rebuild every cached root filesystem (part of the cache key).
RECIPE_VERSION = 1

# ---- the network -------------------------------------------------------------------------------
ADDRESS_POOL = ipaddress.ip_network("198.18.0.0/15")
MAX_SLOTS = 1024
LOCK_DIR = Path("/run/dsctl-vmboot")
METADATA_IP = "169.254.169.254"
VM_INTERFACE = "ens4"      # what the debian-12 image names its virtio-net NIC on GCE
VM_MTU = 1460              # GCE's default VPC MTU
VM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # systemd's default PATH

#: Capabilities no process in the VM gets (they act beyond its namespaces).
DROPPED_CAPABILITIES = ("sys_module", "sys_boot", "sys_time", "sys_rawio", "mknod", "syslog",
                        "mac_admin", "mac_override", "wake_alarm", "block_suspend", "sys_pacct",
                        "audit_control", "bpf", "perfmon")
_BOUNDING = ",".join("-" + c for c in DROPPED_CAPABILITIES)

_TOOLS = ("unshare", "nsenter", "setpriv", "ip", "chroot", "mount")
#: PATH for the host-side tools (root's sbin directories are not always on a CI runner's PATH).
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _tool(name: str) -> str:
    """Absolute path of a host tool (PATH first, then the usual sbin/bin directories)."""
    found = shutil.which(name) or shutil.which(name, path=HOST_PATH)
    if found is None:
        raise VmUnsupported(f"{name} is not installed")
    return found
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class VmBootError(RuntimeError):
    """Booting or tearing down the VM failed."""


class VmUnsupported(VmBootError):
    """This machine cannot boot VMs (not root, tools or kernel features missing)."""


class VmCommandError(VmBootError):
    def __init__(self, result: RunResult):
        super().__init__(f"command in the VM failed: {result}")
        self.result = result


# =================================================================================================
# Results
# =================================================================================================
@dataclass
class RunResult:
    """What :meth:`BootedVm.exec` ran and how it ended."""

    argv: list[str]
    exit_code: int | None        # None when killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> RunResult:
        if not self.ok:
            raise VmCommandError(self)
        return self

    def __str__(self) -> str:
        how = "timed out" if self.timed_out else f"exit {self.exit_code}"
        return (f"{self.argv!r}: {how} after {self.seconds:.2f} s\n--- stdout ---\n{_tail(self.stdout)}"
                f"\n--- stderr ---\n{_tail(self.stderr)}")


@dataclass
class StartupResult:
    """What the startup script did, as the guest's script runner saw it."""

    exit_code: int | None         # negative: killed by that signal; None: never exited (timeout, not found)
    seconds: float                # the script's run time (until it exited, or until the call returned)
    output: str                   # the script's stdout and stderr, interleaved, one line per line
    log: str                      # the runner's journal lines ("startup-script: ...", "Found ...", ...)
    timed_out: bool = False
    held_open_by: list[str] = field(default_factory=list)  # processes still holding the script's output
    found: bool = True            # a startup-script(-url) was in the metadata
    runner_error: str = ""        # the runner's own failure, if any (its stderr)

    @property
    def ok(self) -> bool:
        return self.found and self.exit_code == 0 and not self.timed_out

    def __str__(self) -> str:
        lines = [f"startup script: exit {self.exit_code} after {self.seconds:.2f} s"
                 + (" (TIMED OUT)" if self.timed_out else "") + ("" if self.found else " (no script in metadata)")]
        if self.held_open_by:
            lines.append("its output is still held open by: " + "; ".join(self.held_open_by))
        if self.runner_error:
            lines.append("runner error: " + _tail(self.runner_error))
        lines.append("--- runner log ---\n" + _tail(self.log, 12000))
        return "\n".join(lines)


@dataclass(frozen=True)
class ServedBytes:
    """Bytes the VM's two servers sent to the VM (status lines, headers, bodies)."""

    metadata: int
    storage: int
    dns: int = 0  # answers of the resolver at 169.254.169.254:53 (NXDOMAIN for the internet)

    @property
    def total(self) -> int:
        return self.metadata + self.storage + self.dns


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


# =================================================================================================
# Can this machine do it?
# =================================================================================================
_support_lock = threading.Lock()
_support_reason: list[str | None] = []


def unsupported_reason() -> str | None:
    """Why this machine cannot boot VMs (a sentence for pytest.skip), or None if it can."""
    with _support_lock:
        if not _support_reason:
            _support_reason.append(_check_support())
        return _support_reason[0]


def _check_support() -> str | None:
    if not sys.platform.startswith("linux"):
        return "VM boot tests need Linux (network, mount and PID namespaces)"
    if os.geteuid() != 0:
        return ("VM boot tests need root (they create network namespaces, veth pairs and mounts); "
                "CI runs them as root")
    def absent(tool: str) -> bool:
        return shutil.which(tool) is None and shutil.which(tool, path=HOST_PATH) is None
    missing = [t for t in _TOOLS if absent(t)]
    if not rootfs_path().joinpath(".dsctl-rootfs.json").exists() and absent("debootstrap"):
        missing.append("debootstrap")
    if missing:
        return (f"VM boot tests need {', '.join(missing)}: "
                "apt-get install -y debootstrap debian-archive-keyring iproute2 util-linux mount")
    try:
        fd = _new_netns()
        os.close(fd)
    except OSError as e:
        return f"VM boot tests cannot create a network namespace here ({e}); a container needs CAP_SYS_ADMIN"
    if "overlay" not in Path("/proc/filesystems").read_text():  # not built in, not loaded yet:
        modules = Path("/lib/modules", os.uname().release)        # mounting loads the module
        if not any(modules.glob("kernel/fs/overlayfs/overlay.ko*")):
            return "VM boot tests need overlayfs (kernel module 'overlay')"
    return None


# =================================================================================================
# The cached root filesystem
# =================================================================================================
def _cache_dir() -> Path:
    override = os.environ.get("DSCTL_VMBOOT_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsctl-tests"


def _host_arch() -> str:
    if shutil.which("dpkg"):
        out = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def rootfs_recipe() -> dict:
    return {"suite": DEBIAN_SUITE, "variant": "minbase", "include": sorted(ROOTFS_PACKAGES),
            "arch": _host_arch(), "postprocess": "apt-clean,lists,hostname,resolv", "version": RECIPE_VERSION}


def rootfs_path() -> Path:
    recipe = json.dumps(rootfs_recipe(), sort_keys=True).encode()
    return _cache_dir() / f"rootfs-debian12-{hashlib.sha256(recipe).hexdigest()[:12]}"


def _debian_mirror() -> str:
    """The machine's configured Debian mirror for the suite (deb822 or one-line sources)."""
    override = os.environ.get("DSCTL_VMBOOT_MIRROR")
    if override:
        return override
    sources = Path("/etc/apt/sources.list.d")
    files = [Path("/etc/apt/sources.list")] + (sorted(sources.iterdir()) if sources.is_dir() else [])
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.split()
                if ("deb" in fields.get("types", []) and DEBIAN_SUITE in fields.get("suites", [])
                        and fields.get("uris")):
                    return fields["uris"][0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == DEBIAN_SUITE:
                    return words[1]
    return "http://deb.debian.org/debian"


def ensure_rootfs(log: Callable[[str], None] | None = None) -> Path:
    """Return the cached root filesystem, building it first if needed (about 35-100 s, once).

    Concurrent callers (two test processes) serialize on a lock file: one builds, the others
    wait and reuse. A build is made in a temporary directory and renamed into place when complete,
    so an interrupted build is never used (the next caller removes it and starts over)."""
    final = rootfs_path()
    marker = final / ".dsctl-rootfs.json"
    if marker.exists():
        return final
    cache = final.parent
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / (final.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return final
        building = cache / (".building-" + final.name)
        if building.exists():
            _refuse_if_mounted(building)
            shutil.rmtree(building)
        if final.exists():  # no marker: a broken copy
            _refuse_if_mounted(final)
            shutil.rmtree(final)
        mirror = _debian_mirror()
        build_log = cache / (final.name + ".build.log")
        cmd = [_tool("setpriv"), "--pdeathsig", "KILL", "--",
               # A private mount namespace: whatever debootstrap mounts (proc, sys) dies with it.
               _tool("unshare"), "--mount", "--propagation", "private", "--",
               _tool("debootstrap"), "--variant=minbase",
               "--include=" + ",".join(ROOTFS_PACKAGES), "--arch=" + _host_arch(),
               DEBIAN_SUITE, str(building), mirror]
        if log:
            log(f"building the Debian 12 root filesystem from {mirror} into {final} (once)")
        t0 = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C",
               "PATH": os.environ.get("PATH", "") + ":" + HOST_PATH}
        with open(build_log, "w") as out:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise VmBootError(f"debootstrap failed (exit {proc.returncode}); log: {build_log}\n"
                              + _tail(build_log.read_text(errors="replace"), 3000))
        _postprocess_rootfs(building)
        packages = subprocess.run([_tool("chroot"), str(building), "dpkg-query", "-W", "-f", "${Package} ${Version}\n"],
                                  capture_output=True, text=True).stdout.split("\n")
        info = {"recipe": rootfs_recipe(), "mirror": mirror, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.monotonic() - t0, 1), "packages": [p for p in packages if p]}
        (building / ".dsctl-rootfs.json").write_text(json.dumps(info, indent=1) + "\n")
        os.rename(building, final)
        if log:
            log(f"root filesystem built in {info['build_seconds']} s")
        return final


def _postprocess_rootfs(root: Path) -> None:
    for d in (root / "var/cache/apt/archives", root / "var/lib/apt/lists"):
        for entry in d.glob("*"):
            if entry.is_file() and entry.name != "lock":
                entry.unlink()
    for f in (root / "var/cache/apt/pkgcache.bin", root / "var/cache/apt/srcpkgcache.bin"):
        f.unlink(missing_ok=True)
    (root / "etc/hostname").write_text("localhost\n")      # debootstrap copies the host's
    resolv = root / "etc/resolv.conf"                          # ... and its resolver: not in the image
    if resolv.exists() or resolv.is_symlink():
        resolv.unlink()
    (root / "etc/resolv.conf").write_text("")


def _refuse_if_mounted(path: Path) -> None:
    prefix = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            raise VmBootError(f"{target} is mounted; refusing to delete {path}")


# =================================================================================================
# Network namespace helpers (Python 3.11 has no os.setns/os.unshare)
# =================================================================================================
def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _new_netns() -> int:
    """A new, empty network namespace, held by the returned file descriptor."""
    result: list = []

    def make() -> None:
        try:  # unshare(CLONE_NEWNET) affects only this thread, which then ends
            _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            result.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=make, name="new-netns")
    t.start()
    t.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


def _enter_netns(fd: int) -> None:
    """Move the calling thread (only) into the namespace."""
    _check(_libc.setns(fd, _CLONE_NEWNET), "setns(CLONE_NEWNET)")


def _in_netns(fd: int, fn: Callable[[], object]) -> object:
    result: list = []

    def run() -> None:
        try:
            _enter_netns(fd)
            result.append((True, fn()))
        except BaseException as e:
            result.append((False, e))

    t = threading.Thread(target=run, name="in-netns")
    t.start()
    t.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


def _run(cmd: Sequence[str], *, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [cmd[0] if "/" in cmd[0] else _tool(cmd[0]), *cmd[1:]]
    env = {**os.environ, "PATH": HOST_PATH + ":" + os.environ.get("PATH", "")}  # for `nsenter ... ip`
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise VmBootError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()}\n"
                          + (f"input:\n{input}" if input else ""))
    return proc


# =================================================================================================
# Address slots
# =================================================================================================
@dataclass
class _Slot:
    index: int
    lock_file: object
    net: ipaddress.IPv4Network

    def addr(self, offset: int) -> str:
        return str(self.net.network_address + offset)

    @property
    def host_ip(self) -> str:      # host end of host<->gateway
        return self.addr(1)

    @property
    def gw_host_side(self) -> str:
        return self.addr(2)

    @property
    def gateway_ip(self) -> str:   # gateway end of gateway<->VM
        return self.addr(5)

    @property
    def vm_ip(self) -> str:
        return self.addr(6)

    @property
    def host_link(self) -> str:
        return f"dsvm{self.index}r"

    @property
    def gw_host_link(self) -> str:
        return f"dsvm{self.index}g"

    @property
    def gw_vm_link(self) -> str:
        return f"dsvm{self.index}v"

    def release(self) -> None:
        try:
            self.lock_file.close()
        except OSError:
            pass


def _host_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = _run(cmd, check=False).stdout
        for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", out):
            try:
                net = ipaddress.ip_network(token, strict=False)
            except ValueError:
                continue
            if net.prefixlen > 0:
                nets.append(net)
    return nets


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _acquire_slot() -> _Slot:
    LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
    used = _host_networks()
    for index in range(MAX_SLOTS):
        net = ipaddress.ip_network(f"{ADDRESS_POOL.network_address + 8 * index}/29")
        if any(net.overlaps(u) for u in used):
            continue
        lock = open(LOCK_DIR / f"slot-{index}.lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        slot = _Slot(index, lock, net)
        # A process killed a moment ago: its namespaces (and veths) are still being freed.
        deadline = time.monotonic() + 3
        while _link_exists(slot.host_link) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _link_exists(slot.host_link):
            slot.release()
            continue
        return slot
    raise VmBootError(f"no free address slot in {ADDRESS_POOL} (all {MAX_SLOTS} in use or overlapping)")


# =================================================================================================
# The Cloud Storage emulator, served from the gateway namespace
# =================================================================================================
def _one_call_at_a_time(storage):
    """gcp-storage-emulator's Storage with each of its public methods under one lock: its own server is single-threaded
    and its Storage is not thread-safe (two uploads at once once failed with "dictionary changed size during
    iteration" while it wrote its index). The lock is held for the storage call only, not while a request's bytes
    cross the network, so a large download does not hold up a VM's other requests."""
    lock = threading.RLock()  # a method that calls another takes it again

    def locked(method):
        @wraps(method)
        def call(*args, **kwargs):
            with lock:
                return method(*args, **kwargs)
        return call

    for name in dir(storage):
        if not name.startswith("_") and callable(method := getattr(storage, name)):
            setattr(storage, name, locked(method))
    return storage


class GcsEmulator(ThreadedService):
    """gcp-storage-emulator's storage and request handler (in memory, one bucket to start with),
    served by a threading HTTP server this module controls, so that it listens in the gateway
    namespace, counts the bytes it sends to each client and, for the clients in ``gated_clients``
    (the VM), insists on a bearer token the metadata server issued, as private buckets do."""

    def __init__(self, *, host: str, default_bucket: str, port: int = 0,
                 token_is_valid: Callable[[str], bool] | None = None, gated_clients: Iterable[str] = ()):
        from gcp_storage_emulator.handlers import buckets
        from gcp_storage_emulator.storage import Storage

        self.host, self.port = host, port
        self.storage = _one_call_at_a_time(Storage(use_memory_fs=True))
        buckets.create_bucket(default_bucket, self.storage)
        self.token_is_valid = token_is_valid
        self.gated_clients = set(gated_clients)
        self._lock = threading.Lock()
        self._served: list[Served] = []
        self._bytes: dict[str, int] = {}      # per client, counted before each write reaches it
        self._count: dict[str, int] = {}      # per client, counted when the request arrives
        self._connections: set = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[Served]:
        """Finished requests (appended once each answer is written)."""
        with self._lock:
            return list(self._served)

    def bytes_served(self, client: str | None = None) -> int:
        with self._lock:
            return sum(n for c, n in self._bytes.items() if client is None or c == client)

    def request_count(self, client: str | None = None) -> int:
        with self._lock:
            return sum(n for c, n in self._count.items() if client is None or c == client)

    def _add(self, table: dict[str, int], client: str, n: int) -> None:
        with self._lock:
            table[client] = table.get(client, 0) + n

    def _make_httpd(self):
        httpd = ThreadingHTTPServer((self.host, self.port), partial(_make_gcs_handler(), self))
        httpd.daemon_threads = True
        return httpd


# =================================================================================================
# The VM's resolver: on GCE the metadata server (169.254.169.254:53) answers DNS
# =================================================================================================
class DnsStandIn:
    """A UDP DNS responder on 169.254.169.254:53 in the gateway namespace. It knows the names GCE's
    resolver would answer from the VM's own project (metadata.google.internal, the VM's names) and
    answers NXDOMAIN to everything else at once, so a script that looks up pypi.org or
    storage.googleapis.com fails immediately, as it would with no route to the internet (without a
    listener the kernel's ICMP replies are rate-limited and lookups would hang for seconds)."""

    def __init__(self, host: str, records: Mapping[str, str], port: int = 53):
        self.host, self.port = host, port
        self.records = {k.lower().rstrip("."): v for k, v in records.items()}
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._served: list[Served] = []

    def bytes_served(self, client: str | None = None) -> int:
        with self._lock:
            return sum(s.bytes for s in self._served if client is None or s.client == client)

    def request_count(self, client: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self._served if client is None or s.client == client)

    @property
    def queries(self) -> list[Served]:
        with self._lock:
            return list(self._served)

    def start(self, prepare_thread: Callable[[], None] | None = None) -> DnsStandIn:
        ready, failure = threading.Event(), []

        def serve() -> None:
            try:
                if prepare_thread:
                    prepare_thread()
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((self.host, self.port))
                sock.settimeout(0.05)
                self._sock = sock
            except BaseException as e:
                failure.append(e)
                ready.set()
                return
            ready.set()
            while not self._stop.is_set():
                try:
                    query, client = sock.recvfrom(4096)
                except TimeoutError:
                    continue
                except OSError:
                    break
                answer, name = self._answer(query)
                if answer is None:
                    continue
                with self._lock:  # recorded before the client can have it
                    self._served.append(Served(client[0], "DNS", name, answer[3] & 0x0F, len(answer), time.time()))
                try:
                    sock.sendto(answer, client)
                except OSError:
                    continue
            sock.close()

        self._thread = threading.Thread(target=serve, name="dns-stand-in", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _answer(self, query: bytes) -> tuple[bytes | None, str]:
        if len(query) < 12 or query[2] & 0x80:  # too short, or a response
            return None, ""
        labels, i = [], 12
        try:
            while query[i]:
                n = query[i]
                labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace"))
                i += 1 + n
            qtype, qclass = int.from_bytes(query[i + 1:i + 3], "big"), int.from_bytes(query[i + 3:i + 5], "big")
        except IndexError:
            return None, ""
        question = query[12:i + 5]
        name = ".".join(labels).lower()
        address = self.records.get(name)
        flags = 0x8000 | (query[2] & 0x79) << 8 | 0x0080  # QR, opcode and RD from the query, RA
        answers = b""
        if address is None:
            flags |= 3  # NXDOMAIN
        elif qtype in (1, 255) and qclass == 1:  # A (or ANY) IN
            answers = (b"\xc0\x0c" + (1).to_bytes(2, "big") + (1).to_bytes(2, "big") + (60).to_bytes(4, "big")
                       + (4).to_bytes(2, "big") + socket.inet_aton(address))
        header = (query[:2] + flags.to_bytes(2, "big") + (1).to_bytes(2, "big")
                  + (1 if answers else 0).to_bytes(2, "big") + bytes(4))
        return header + question + answers, name


_gcs_handler_class = None


def _make_gcs_handler():
    """The handler class (built lazily: importing the emulator takes a moment)."""
    global _gcs_handler_class
    if _gcs_handler_class is not None:
        return _gcs_handler_class
    from gcp_storage_emulator.server import RequestHandler

    class _CountingWriter:
        """Counts bytes for the client before they are written, so the count never lags."""

        def __init__(self, raw, add: Callable[[int], None]):
            self.raw, self.add, self.count = raw, add, 0

        def write(self, data) -> int:
            self.add(len(data))
            self.count += len(data)
            return self.raw.write(data)

        def flush(self) -> None:
            self.raw.flush()

        def __getattr__(self, name):
            return getattr(self.raw, name)

    class _GcsHandler(RequestHandler):
        def __init__(self, emulator: GcsEmulator, *args, **kwargs):
            self.emulator = emulator
            self._status = 0
            super().__init__(emulator.storage, *args, **kwargs)

        def setup(self) -> None:
            super().setup()
            client = self.client_address[0]
            self.wfile = _CountingWriter(self.wfile, lambda n: self.emulator._add(self.emulator._bytes, client, n))
            with self.emulator._lock:
                self.emulator._connections.add(self.connection)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                with self.emulator._lock:
                    self.emulator._connections.discard(self.connection)

        def log_message(self, *args) -> None:
            pass

        def _denied(self) -> bool:
            emu = self.emulator
            if emu.token_is_valid is None or self.client_address[0] not in emu.gated_clients:
                return False
            auth = self.headers.get("Authorization", "")
            token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if token and emu.token_is_valid(token):
                return False
            if token:
                message, reason = "Invalid Credentials", "authError"
            else:
                message = ("Anonymous caller does not have storage.objects.get access to the Google Cloud "
                           "Storage object. Permission 'storage.objects.get' denied on resource (or it may "
                           "not exist).")
                reason = "required"
            body = json.dumps({"error": {"code": 401, "message": message, "errors": [
                {"message": message, "domain": "global", "reason": reason,
                 "locationType": "header", "location": "Authorization"}]}}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("WWW-Authenticate", 'Bearer realm="https://accounts.google.com/"')
            self.end_headers()
            self.wfile.write(body)
            return True

        def send_response(self, code, message=None) -> None:
            self._status = int(code)
            super().send_response(code, message)

        def _account(self) -> None:
            writer = self.wfile
            count = getattr(writer, "count", 0)
            if isinstance(writer, _CountingWriter):
                writer.count = 0
            with self.emulator._lock:
                self.emulator._served.append(Served(self.client_address[0], self.command, self.path,
                                                    self._status, count, time.time()))

        def _serve(self, method: str) -> None:
            self.emulator._add(self.emulator._count, self.client_address[0], 1)
            try:
                if not self._denied():
                    getattr(RequestHandler, method)(self)
            finally:
                self._account()

        def do_GET(self):
            self._serve("do_GET")

        def do_POST(self):
            self._serve("do_POST")

        def do_PUT(self):
            self._serve("do_PUT")

        def do_DELETE(self):
            self._serve("do_DELETE")

        def do_PATCH(self):
            self._serve("do_PATCH")

        def do_HEAD(self):
            self._serve("do_GET")

    _gcs_handler_class = _GcsHandler
    return _GcsHandler


# =================================================================================================
# The VM
# =================================================================================================
_SETUP = r"""
set -eu
L=$1 U=$2 W=$3 M=$4 H=$5 S=$6 CAPS=$7
shift 7
where=disk
if ! mount -t overlay overlay -o "lowerdir=$L,upperdir=$U,workdir=$W,volatile" "$M" 2>/dev/null \
   && ! mount -t overlay overlay -o "lowerdir=$L,upperdir=$U,workdir=$W" "$M" 2>/dev/null; then
    # The work directory's filesystem cannot hold an overlay upper layer (e.g. it is itself an
    # overlay, as in many CI containers): use a tmpfs in this mount namespace instead.
    mount -t tmpfs -o mode=755 vmboot-upper "$S"
    mkdir "$S/u" "$S/w"
    cp -a "$U/." "$S/u/"
    mount -t overlay overlay -o "lowerdir=$L,upperdir=$S/u,workdir=$S/w" "$M"
    where=tmpfs
fi
mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
mount --bind "$M/proc/sys" "$M/proc/sys"
mount -o remount,bind,ro "$M/proc/sys"
mount --bind "$M/proc/sys/net" "$M/proc/sys/net"
mount -o remount,bind,rw "$M/proc/sys/net"
if [ -e "$M/proc/sysrq-trigger" ]; then
    mount --bind "$M/proc/sysrq-trigger" "$M/proc/sysrq-trigger"
    mount -o remount,bind,ro "$M/proc/sysrq-trigger"
fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys"
mount -t tmpfs -o mode=755,nosuid,size=65536k vmboot-dev "$M/dev"
mknod -m 666 "$M/dev/null" c 1 3
mknod -m 666 "$M/dev/zero" c 1 5
mknod -m 666 "$M/dev/full" c 1 7
mknod -m 666 "$M/dev/random" c 1 8
mknod -m 666 "$M/dev/urandom" c 1 9
mknod -m 666 "$M/dev/tty" c 5 0
mkdir -m 755 "$M/dev/pts"
mkdir -m 1777 "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$M/dev/pts"
mount -t tmpfs -o mode=1777,nosuid,nodev vmboot-shm "$M/dev/shm"
ln -s pts/ptmx "$M/dev/ptmx"
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"
ln -s /proc/self/fd/1 "$M/dev/stdout"
ln -s /proc/self/fd/2 "$M/dev/stderr"
mount -t tmpfs -o mode=755,nosuid,nodev vmboot-run "$M/run"
mkdir -m 1777 "$M/run/lock"
for spec in "$@"; do
    src=${spec%%=*} dst=${spec#*=}
    if [ -d "$src" ]; then mkdir -p "$M$dst"; else mkdir -p "$(dirname "$M$dst")"; : > "$M$dst"; fi
    mount --bind "$src" "$M$dst"
    mount -o remount,bind,ro "$M$dst"
done
hostname "$H"
echo "ready $where"
exec setpriv --bounding-set="$CAPS" -- chroot "$M" /bin/sh -c \
    'exec </dev/null >/dev/null 2>&1; trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done'
"""


class VmProcess:
    """A process started in the VM with :meth:`BootedVm.spawn`."""

    def __init__(self, popen: subprocess.Popen, argv: list[str], log_path: Path):
        self._popen = popen
        self.argv = argv
        self.log_path = log_path
        self.pid = _child_of(popen)           # host PID of the process in the VM
        self.vm_pid = _vm_pid(self.pid) if self.pid else None

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._popen.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    @property
    def alive(self) -> bool:
        return self._popen.poll() is None

    def send_signal(self, sig: int) -> None:
        if self.alive and self.pid:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process and everything else it started in its process group."""
        if self._popen.poll() is None:
            _kill_command(self._popen)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __repr__(self) -> str:
        return f"<VmProcess {self.argv!r} pid={self.pid} vm_pid={self.vm_pid} returncode={self.returncode}>"


def _child_of(popen: subprocess.Popen, timeout: float = 5.0) -> int | None:
    """The child of a process: nsenter (and unshare --fork) fork the command into the new PID namespace."""
    pid = popen.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            return None
        if children:
            return int(children[0])
        if popen.poll() is not None:
            return None
        time.sleep(0.002)
    return None


def _vm_pid(host_pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return None


class _Reader(threading.Thread):
    """Collects a pipe's bytes (optionally per line, to a callback) until EOF."""

    def __init__(self, stream, on_line: Callable[[bytes], None] | None = None):
        super().__init__(daemon=True, name="vm-pipe-reader")
        self.stream, self.on_line, self.data = stream, on_line, bytearray()
        self.start()

    def run(self) -> None:
        try:
            if self.on_line:
                for line in iter(self.stream.readline, b""):
                    self.data += line
                    self.on_line(line)
            else:
                while chunk := self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536):
                    self.data += chunk
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        return bytes(self.data).decode("utf-8", errors="replace")


class BootedVm:
    """A Debian 12 "VM": chroot + namespaces over a copy-on-write view of the cached image, with a
    metadata server and a Cloud Storage emulator as its only network peers. See the module docstring."""

    def __init__(self, workdir: str | os.PathLike, *, metadata: Mapping[str, str] | None = None,
                 project_metadata: Mapping[str, str] | None = None, bucket: str = "dsctl-test-staging",
                 name: str = "dsctl-vm", project: str = "dsctl-test", zone: str = "us-central1-b",
                 machine_type: str = "e2-standard-4", gcs_requires_token: bool = True,
                 allow_host_ports: Iterable[int] = (), binds: Mapping[str | os.PathLike, str] | None = None,
                 keep_files: bool = False, rootfs: str | os.PathLike | None = None,
                 identity=None, service_account: str | None = None):
        """`identity`: the Compute stand-in (fake_gce.FakeCloud) whose APIs the VM calls: the VM's metadata server then
        issues its tokens, for `service_account`, and its Cloud Storage accepts the tokens that stand-in issued."""
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise ValueError(f"instance name {name!r} is not a valid Compute Engine name")
        self.workdir = Path(workdir)
        self.name, self.project, self.zone, self.machine_type = name, project, zone, machine_type
        self.bucket = bucket
        self._metadata_init = dict(metadata or {})
        self._project_metadata_init = dict(project_metadata or {})
        self._gcs_requires_token = gcs_requires_token
        self._allow_host_ports = [int(p) for p in allow_host_ports]
        self._binds = {str(Path(k).resolve()): str(v) for k, v in (binds or {}).items()}
        for src, dst in self._binds.items():
            if "=" in src or "=" in dst or not dst.startswith("/") or not Path(src).exists():
                raise ValueError(f"bind {src} -> {dst}: need an existing host path and an absolute VM path, no '='")
        self._keep_files = keep_files
        self._identity, self._service_account = identity, service_account
        self.rootfs: Path | None = Path(rootfs) if rootfs else None
        self.boot_seconds: float | None = None
        self.upper_on: str | None = None
        self.metadata: MetadataServer | None = None
        self.storage: GcsEmulator | None = None
        self.dns: DnsStandIn | None = None
        self._slot: _Slot | None = None
        self._gw_fd: int | None = None
        self._init: subprocess.Popen | None = None
        self._pid1: int | None = None
        self._dir: Path | None = None
        self._children: list[subprocess.Popen] = []
        self._children_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._rule_pref = 110

    # ---- addresses -------------------------------------------------------------------------
    @property
    def ip(self) -> str:
        return self._need_slot().vm_ip

    @property
    def host_ip(self) -> str:
        return self._need_slot().host_ip

    @property
    def gateway_ip(self) -> str:
        return self._need_slot().gateway_ip

    @property
    def gcs_endpoint(self) -> str:
        if self.storage is None:
            raise VmBootError("the VM is not running")
        return self.storage.endpoint

    @property
    def slot(self) -> int:
        return self._need_slot().index

    @property
    def links(self) -> tuple[str, str, str]:
        """(host link, gateway's host-side link, gateway's VM-side link) names."""
        s = self._need_slot()
        return s.host_link, s.gw_host_link, s.gw_vm_link

    @property
    def init_pid(self) -> int:
        if self._pid1 is None:
            raise VmBootError("the VM is not running")
        return self._pid1

    def _need_slot(self) -> _Slot:
        if self._slot is None:
            raise VmBootError("the VM is not running")
        return self._slot

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> BootedVm:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception as cleanup_error:
            if exc is None:
                raise
            exc.add_note(f"(and tearing down the VM failed too: {cleanup_error})")

    def start(self) -> BootedVm:
        if self._started:
            raise VmBootError("a BootedVm boots once")
        self._started = True
        reason = unsupported_reason()
        if reason:
            raise VmUnsupported(reason)
        try:
            self._boot()
        except BaseException:
            self.close()
            raise
        return self

    def _boot(self) -> None:
        lower = self.rootfs or ensure_rootfs()
        self.rootfs = lower
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix=f"vm-{self.name}-", dir=self.workdir))
        for sub in ("upper", "work", "root", "scratch", "logs"):
            (self._dir / sub).mkdir()
        self._slot = slot = _acquire_slot()
        self._write_boot_files(self._dir / "upper")

        # The gateway namespace, then the VM's namespaces (the VM's PID 1 holds them).
        self._gw_fd = _new_netns()
        self._start_init(lower)

        gw = f"/proc/{os.getpid()}/fd/{self._gw_fd}"
        nsenter = _tool("nsenter")
        _run(["ip", "link", "add", slot.host_link, "type", "veth", "peer", "name", slot.gw_host_link, "netns", gw])
        _run(["ip", "-batch", "-"], input="\n".join([
            f"addr add {slot.host_ip}/30 dev {slot.host_link}",
            f"link set {slot.host_link} up",
            f"route add {slot.net.network_address + 4}/30 via {slot.gw_host_side} dev {slot.host_link}",
        ]) + "\n")
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        _run([nsenter, f"--net={gw}", "ip", "-batch", "-"], input="\n".join([
            "link set lo up",
            f"addr add {METADATA_IP}/32 dev lo",
            f"addr add {slot.gw_host_side}/30 dev {slot.gw_host_link}",
            f"link set {slot.gw_host_link} up",
            f"link add {slot.gw_vm_link} mtu {VM_MTU} type veth peer name {VM_INTERFACE} mtu {VM_MTU} netns {self._pid1}",
            f"addr add {slot.gateway_ip}/30 dev {slot.gw_vm_link}",
            f"link set {slot.gw_vm_link} up",
            # From the VM, forward only TCP to the host's ephemeral ports (replies to the host's
            # connections, host services on port 0); everything else: ICMP network unreachable.
            f"rule add pref 100 iif {slot.gw_vm_link} from {slot.vm_ip} to {slot.host_ip} ipproto tcp "
            f"dport {lo}-{hi} lookup main",
            f"rule add pref 1000 iif {slot.gw_vm_link} unreachable",
        ]) + "\n")
        def gateway_sysctls() -> None:
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
            # The gateway's "network unreachable" answers go out at once: no per-peer ICMP rate
            # limit in this namespace (the route-error limiter, 5 then 1 a second, still applies).
            Path("/proc/sys/net/ipv4/icmp_ratemask").write_text("0\n")
            Path("/proc/sys/net/ipv4/icmp_ratelimit").write_text("0\n")
        _in_netns(self._gw_fd, gateway_sysctls)
        _run([nsenter, "-t", str(self._pid1), "-n", "ip", "-batch", "-"], input="\n".join([
            "link set lo up",
            f"addr add {slot.vm_ip}/30 dev {VM_INTERFACE}",
            f"link set {VM_INTERFACE} up",
            f"route add {METADATA_IP}/32 via {slot.gateway_ip} dev {VM_INTERFACE}",
            f"route add {slot.host_ip}/32 via {slot.gateway_ip} dev {VM_INTERFACE}",
        ]) + "\n")
        for port in self._allow_host_ports:
            self.allow_host_port(port)

        # The VM's two network peers, serving from the gateway namespace.
        enter_gw = partial(_enter_netns, self._gw_fd)
        self.metadata = MetadataServer(
            attributes=self._metadata_init, project_attributes=self._project_metadata_init,
            project_id=self.project, instance_name=self.name, zone=self.zone, machine_type=self.machine_type,
            network_ip=slot.vm_ip, gateway_ip=slot.gateway_ip, subnet_mask="255.255.255.252", mtu=VM_MTU,
            host=METADATA_IP, port=80, service_account=self._service_account,
            token_issuer=self._identity.issue_token if self._identity is not None else None
        ).start(prepare_thread=enter_gw)
        identity = self._identity
        valid = ((lambda token: identity.account_of(token) is not None) if identity is not None
                 else self.metadata.token_is_valid)
        self.storage = GcsEmulator(
            host=slot.gateway_ip, default_bucket=self.bucket,
            token_is_valid=valid if self._gcs_requires_token else None,
            gated_clients=[slot.vm_ip]).start(prepare_thread=enter_gw)
        fqdn = f"{self.name}.{self.zone}.c.{self.project}.internal"
        self.dns = DnsStandIn(METADATA_IP, {"metadata.google.internal": METADATA_IP, "metadata": METADATA_IP,
                                            fqdn: slot.vm_ip, f"{self.name}.c.{self.project}.internal": slot.vm_ip,
                                            self.name: slot.vm_ip}).start(prepare_thread=enter_gw)
        self.boot_seconds = time.monotonic() - t0

    def _write_boot_files(self, upper: Path) -> None:
        """What the guest environment writes at boot on GCE, as the upper layer's first files."""
        slot = self._need_slot()
        etc = upper / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hostname").write_text(self.name + "\n")
        (etc / "hosts").write_text(
            "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
            "ff02::1\t\tip6-allnodes\nff02::2\t\tip6-allrouters\n\n"
            f"{slot.vm_ip} {self.name}.{self.zone}.c.{self.project}.internal {self.name}  # Added by Google\n"
            f"{METADATA_IP} metadata.google.internal metadata  # Added by Google\n")
        (etc / "resolv.conf").write_text(
            f"domain {self.zone}.c.{self.project}.internal\n"
            f"search {self.zone}.c.{self.project}.internal c.{self.project}.internal google.internal\n"
            f"nameserver {METADATA_IP}\n")
        runner = upper / "usr/bin/google_metadata_script_runner"
        runner.parent.mkdir(parents=True, exist_ok=True)
        runner.write_text(_RUNNER)
        runner.chmod(0o755)

    def _start_init(self, lower: Path) -> None:
        d = self._dir
        assert d is not None
        binds = [f"{src}={dst}" for src, dst in self._binds.items()]
        cmd = [_tool("setpriv"), "--pdeathsig", "KILL", "--",
               _tool("unshare"), "--mount", "--uts", "--ipc", "--net", "--pid", "--fork",
               "--kill-child=SIGKILL", "--propagation", "private", "--",
               "/bin/sh", "-c", _SETUP, "vmboot-setup", str(lower), str(d / "upper"), str(d / "work"),
               str(d / "root"), self.name, str(d / "scratch"), _BOUNDING, *binds]
        errlog = open(d / "logs" / "init.log", "wb")
        try:
            self._init = _Keeper.run(lambda: subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errlog, start_new_session=True,
                env={"PATH": HOST_PATH, "LC_ALL": "C"}))
        finally:
            errlog.close()
        assert self._init.stdout is not None
        ready, _, _ = select.select([self._init.stdout], [], [], 30)
        line = self._init.stdout.readline().decode(errors="replace").strip() if ready else ""
        if not line.startswith("ready"):
            self._init.kill()
            self._init.wait()
            raise VmBootError(f"the VM's init did not come up ({line or 'no answer'}): "
                              + (d / "logs" / "init.log").read_text(errors="replace"))
        self.upper_on = line.split()[1] if len(line.split()) > 1 else "disk"
        self._pid1 = _child_of(self._init)
        if self._pid1 is None:
            raise VmBootError("the VM's PID 1 vanished")

    def close(self) -> None:
        """Tear everything down (idempotent). Raises VmBootError listing what could not be undone."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []

        def attempt(what: str, fn: Callable[[], object]) -> None:
            try:
                fn()
            except Exception as e:  # keep going: everything else must still be torn down
                problems.append(f"{what}: {e}")

        pid1, init = self._pid1, self._init
        if pid1:
            attempt("kill the VM's PID 1", lambda: os.kill(pid1, signal.SIGKILL))
        if init is not None:  # unshare reaps PID 1 (once every process in the VM is gone) and exits
            def reap_holder() -> None:
                try:
                    init.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    init.kill()
                    init.wait(timeout=10)
            attempt("reap the namespace holder", reap_holder)
        if pid1:
            attempt("wait for the VM's processes to die", lambda: _wait_gone(pid1, 10))
        with self._children_lock:
            children = list(self._children)
        for child in children:
            attempt("reap a VM process", lambda c=child: _reap(c))
        slot = self._slot
        if slot is not None:
            if _link_exists(slot.host_link):
                attempt("delete the host's veth", lambda: _run(["ip", "link", "del", slot.host_link]))
        for server in (self.dns, self.storage, self.metadata):
            if server is not None:
                attempt(f"stop {type(server).__name__}", server.stop)
        if self._gw_fd is not None:
            fd, self._gw_fd = self._gw_fd, None
            attempt("close the gateway namespace", lambda: os.close(fd))
        if slot is not None:
            if _link_exists(slot.host_link):
                problems.append(f"{slot.host_link} still exists")
            slot.release()
        if self._dir is not None and not self._keep_files:
            for sub in ("upper", "work"):
                path = self._dir / sub
                attempt(f"remove {path}", lambda p=path: _remove_tree(p))
        if problems:
            raise VmBootError("VM teardown incomplete: " + "; ".join(problems))

    # ---- running things inside -------------------------------------------------------------
    def _enter(self, argv: Sequence[str], cwd: str = "/") -> list[str]:
        if self._closed or self._pid1 is None:
            raise VmBootError("the VM is not running")
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of strings")
        return [_tool("setpriv"), f"--bounding-set={_BOUNDING}", "--",
                _tool("nsenter"), "-t", str(self._pid1), "-m", "-u", "-i", "-n", "-p", "-r",
                f"--wdns={cwd}", "--", *[str(a) for a in argv]]

    @staticmethod
    def _env(env: Mapping[str, str | None] | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
        out = dict(base if base is not None else {
            "PATH": VM_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root",
            "SHELL": "/bin/bash"})
        for k, v in (env or {}).items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = str(v)
        return out

    def _popen(self, cmd: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, umask=0o022, **kw)
        with self._children_lock:
            self._children.append(proc)
        return proc

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str | None] | None = None, timeout_s: float = 120.0,
             cwd: str = "/", input: str | bytes | None = None, check: bool = False) -> RunResult:
        """Run a command inside the VM and wait for it."""
        t0 = time.monotonic()
        proc = self._popen(self._enter(argv, cwd), self._env(env),
                           stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = _Reader(proc.stdout), _Reader(proc.stderr)
        if input is not None:
            data = input.encode() if isinstance(input, str) else input

            def feed() -> None:
                try:
                    proc.stdin.write(data)
                    proc.stdin.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass
            threading.Thread(target=feed, daemon=True).start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_command(proc)
        for r in (out, err):
            r.join(timeout=1.0)
        with self._children_lock:
            self._children.remove(proc)
        result = RunResult([str(a) for a in argv], None if timed_out else proc.returncode, out.text(), err.text(),
                           time.monotonic() - t0, timed_out)
        return result.check() if check else result

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str | None] | None = None, cwd: str = "/",
              name: str | None = None) -> VmProcess:
        """Start a long-running process inside the VM (killed at teardown at the latest)."""
        assert self._dir is not None
        label = re.sub(r"[^A-Za-z0-9_.-]+", "_", name or Path(str(argv[0])).name)[:40]
        log_path = self._dir / "logs" / f"{label}-{int(time.time() * 1000) % 10**8}.log"
        with open(log_path, "wb") as log:
            proc = self._popen(self._enter(argv, cwd), self._env(env), stdin=subprocess.DEVNULL,
                               stdout=log, stderr=subprocess.STDOUT)
        return VmProcess(proc, [str(a) for a in argv], log_path)

    def run_startup_script(self, timeout_s: float = 600.0, held_open_grace_s: float = 1.5) -> StartupResult:
        """Run the startup script from the metadata as the guest's script runner does (see module docstring)."""
        t0 = time.monotonic()
        env = self._env({"DSCTL_VMBOOT_STORAGE_ENDPOINT": self.gcs_endpoint}, base={"PATH": VM_PATH})
        proc = self._popen(self._enter(["/usr/bin/google_metadata_script_runner", "startup"], "/"), env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        events: list[dict] = []
        raw_err = bytearray()
        lock = threading.Lock()

        def on_event(line: bytes) -> None:
            try:
                ev = json.loads(line)
            except ValueError:
                with lock:
                    raw_err.extend(line)
                return
            ev["_t"] = time.monotonic()
            with lock:
                events.append(ev)

        log_reader = _Reader(proc.stdout)
        err_reader = _Reader(proc.stderr, on_line=on_event)

        def latest(kind: str) -> list[dict]:
            with lock:
                return [e for e in events if e.get("event") == kind]

        timed_out = False
        while True:
            if proc.poll() is not None:
                log_reader.join(timeout=2)
                err_reader.join(timeout=2)
                break
            exited, finished = latest("exited"), latest("finished")
            if exited and len(exited) > len(finished) and time.monotonic() - exited[-1]["_t"] > held_open_grace_s:
                break  # the script is done; something it left behind holds its output (reported)
            if time.monotonic() - t0 > timeout_s:
                timed_out = True
                _kill_command(proc)
                log_reader.join(timeout=2)
                err_reader.join(timeout=2)
                break
            time.sleep(0.02)

        log = log_reader.text()
        found = bool(latest("found"))
        exits = latest("exited")
        keys = [e["key"] for e in latest("found")]
        codes = [e["status"] for e in exits]
        exit_code = next((c for c in codes if c != 0), codes[-1] if codes else None)
        seconds = sum(e["seconds"] for e in exits)
        if len(exits) < len(latest("started")):  # still running (timeout)
            started = latest("started")[-1]
            seconds += time.monotonic() - started["_t"]
        held = []
        if exits and len(exits) > len(latest("finished")):
            for e in latest("held-open"):
                held = e.get("holders", [])
        prefixes = tuple(f"{k}: " for k in keys)
        output = "".join(line[line.index(": ") + 2:] + "\n" for line in log.splitlines() if line.startswith(prefixes))
        with lock:
            runner_error = bytes(raw_err).decode(errors="replace")
        for e in latest("error"):
            runner_error += f"{e.get('key')}: {e.get('message')}\n"
        if proc.poll() is not None and proc.returncode not in (0, None) and not timed_out:
            runner_error += f"(runner exited {proc.returncode})\n"
        return StartupResult(exit_code=exit_code, seconds=seconds, output=output, log=log, timed_out=timed_out,
                             held_open_by=held, found=found, runner_error=runner_error)

    # ---- inspection ------------------------------------------------------------------------
    def path(self, vm_path: str) -> Path:
        """The host path of a file inside the running VM."""
        return Path(f"/proc/{self.init_pid}/root") / vm_path.lstrip("/")

    def storage_client(self):
        """A google.cloud.storage.Client on the host, pointed at the VM's emulator."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=self.project, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.gcs_endpoint})

    def bytes_served(self) -> ServedBytes:
        if self.metadata is None or self.storage is None:
            return ServedBytes(0, 0)
        dns = self.dns.bytes_served(self.ip) if self.dns is not None else 0
        return ServedBytes(metadata=self.metadata.bytes_served(self.ip), storage=self.storage.bytes_served(self.ip),
                           dns=dns)

    def requests_served(self) -> dict[str, int]:
        if self.metadata is None or self.storage is None:
            return {"metadata": 0, "storage": 0}
        return {"metadata": self.metadata.request_count(self.ip), "storage": self.storage.request_count(self.ip)}

    def link_bytes(self) -> dict[str, int]:
        """Kernel counters of the VM's link (all traffic): bytes and packets to and from the VM."""
        slot = self._need_slot()
        out = _run([_tool("nsenter"), f"--net=/proc/{os.getpid()}/fd/{self._gw_fd}",
                    "ip", "-s", "-j", "link", "show", slot.gw_vm_link]).stdout
        stats = json.loads(out)[0]["stats64"]
        return {"to_vm": stats["tx"]["bytes"], "from_vm": stats["rx"]["bytes"],
                "to_vm_packets": stats["tx"]["packets"], "from_vm_packets": stats["rx"]["packets"]}

    @contextlib.contextmanager
    def capture_to_vm(self):
        """Count every frame sent to the VM over its link, by source: yields a dict filled in on exit with
        {"ip <source address>": bytes (IP packets, headers included), "link": bytes (ARP, IPv6 link-local
        neighbour discovery), "dropped packets": frames the capture missed (the counts are complete when 0)}.
        A raw packet socket on the gateway's end of the link, in its own process."""
        slot = self._need_slot()
        counts: dict[str, int] = {}
        proc = subprocess.Popen([_tool("nsenter"), f"--net=/proc/{os.getpid()}/fd/{self._gw_fd}", sys.executable,
                                 "-c", _SNIFFER, slot.gw_vm_link], stdout=subprocess.PIPE, text=True,
                                pass_fds=(self._gw_fd,))
        try:
            if proc.stdout.readline().strip() != "ready":
                raise VmBootError("the link capture did not start")
            yield counts
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
            counts.update(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})

    def allow_host_port(self, port: int) -> None:
        """Let the VM connect to host_ip:port over TCP (on top of the host's ephemeral ports)."""
        slot = self._need_slot()
        self._rule_pref += 1
        _run([_tool("nsenter"), f"--net=/proc/{os.getpid()}/fd/{self._gw_fd}", "ip", "rule",
              "add", "pref", str(self._rule_pref), "iif", slot.gw_vm_link, "from", slot.vm_ip, "to", slot.host_ip,
              "ipproto", "tcp", "dport", str(int(port)), "lookup", "main"])

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._pid1 else "not started")
        ip = self._slot.vm_ip if self._slot else "-"
        return f"<BootedVm {self.name} {state} ip={ip}>"


# Runs in the gateway's network namespace: count frames leaving toward the VM (PACKET_OUTGOING) by source.
_SNIFFER = r"""
import json, signal, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.setsockopt(socket.SOL_SOCKET, 33, 256 << 20)  # SO_RCVBUFFORCE (root): room for bursts while counting
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
counts = {}
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
print("ready", flush=True)
while not stop:
    try:
        frame, addr = s.recvfrom(65536)
    except socket.timeout:
        continue
    if addr[2] != socket.PACKET_OUTGOING:
        continue
    kind = frame[12:14]
    if kind == b"\x08\x00":
        key, size = "ip " + socket.inet_ntop(socket.AF_INET, frame[26:30]), int.from_bytes(frame[16:18], "big")
    elif kind == b"\x86\xdd" and frame[22:24] == b"\xfe\x80":
        key, size = "link", len(frame)
    elif kind == b"\x86\xdd":
        key, size = "ip " + socket.inet_ntop(socket.AF_INET6, frame[22:38]), 40 + int.from_bytes(frame[18:20], "big")
    else:
        key, size = "link", len(frame)
    counts[key] = counts.get(key, 0) + size
import struct
packets, drops = struct.unpack("II", s.getsockopt(263, 6, 8))  # SOL_PACKET, PACKET_STATISTICS
counts["dropped packets"] = drops  # frames the kernel could not hand over: not counted above
print(json.dumps(counts), flush=True)
"""


class _Keeper:
    """A daemon thread that starts the processes carrying PR_SET_PDEATHSIG. The kernel sends that
    signal when the parent THREAD exits, so they must not be forked by a short-lived thread (a
    test booting VMs from a thread pool): this thread lives as long as the process."""

    _lock = threading.Lock()
    _thread: threading.Thread | None = None
    _jobs: list[tuple[Callable[[], object], list, threading.Event]] = []
    _wake = threading.Condition(_lock)

    @classmethod
    def run(cls, fn: Callable[[], object]) -> object:
        done, box = threading.Event(), []
        with cls._lock:
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._loop, name="vmboot-keeper", daemon=True)
                cls._thread.start()
            cls._jobs.append((fn, box, done))
            cls._wake.notify()
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    @classmethod
    def _loop(cls) -> None:
        while True:
            with cls._lock:
                while not cls._jobs:
                    cls._wake.wait()
                fn, box, done = cls._jobs.pop(0)
            try:
                box.append((True, fn()))
            except BaseException as e:
                box.append((False, e))
            done.set()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def _kill_command(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """Kill what an nsenter'd command runs inside the VM, then let nsenter reap it and exit.

    Killing nsenter together with its child would orphan the child: it would be re-parented to
    the HOST's init (nsenter is in the host's PID namespace), and the VM's PID 1 cannot finish
    dying at teardown until that init gets round to reaping it (a second or more on some hosts)."""
    for _ in range(3):
        victims = [pid for pid in _group_members(proc.pid) if pid != proc.pid]
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        proc.wait()


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        _kill_command(proc)


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise VmBootError(f"process {pid} (the VM's PID 1) did not die")


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    _refuse_if_mounted(path)
    # The overlay's work directory holds a mode-000 "work" subdirectory; root removes it anyway.
    shutil.rmtree(path)


# =================================================================================================
# The stand-in for guest-agent's google_metadata_script_runner, run by the VM's python3
# =================================================================================================
_RUNNER = r'''#!/usr/bin/python3
"""Stand-in for the Google guest environment's google_metadata_script_runner (guest-agent,
google_metadata_script_runner/main.go), written by the dsctl test harness (standins/vmboot.py).

Journal lines go to stdout exactly as the real runner logs them; machine-readable events for the
harness go to stderr as JSON lines."""
import json, os, re, shutil, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.parse, urllib.request

MDS = "http://169.254.169.254/computeMetadata/v1/"   # guest-agent metadata.defaultMetadataURL
STORAGE = os.environ.pop("DSCTL_VMBOOT_STORAGE_ENDPOINT", "")
MAX_LINE = 64 * 1024                                   # bufio.MaxScanTokenSize
GS_PATTERNS = [r"^gs://([a-z0-9][-_.a-z0-9]*)/(.+)$",
               r"^https?://([a-z0-9][-_.a-z0-9]*)\.storage\.googleapis\.com/(.+)$",
               r"^https?://storage\.cloud\.google\.com/([a-z0-9][-_.a-z0-9]*)/(.+)$",
               r"^https?://(?:commondata)?storage\.googleapis\.com/([a-z0-9][-_.a-z0-9]*)/(.+)$"]


def log(message):
    sys.stdout.buffer.write(message.encode() if isinstance(message, str) else message)
    sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


def event(**kw):
    sys.stderr.write(json.dumps(kw) + "\n")
    sys.stderr.flush()


def mds_get(key, recursive=False, attempts=5):
    url = MDS + key.lstrip("/") + ("?alt=json&recursive=true" if recursive else "")
    for i in range(1, attempts + 1):
        try:
            req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(req, timeout=70) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code in (404, 412):
                raise
            err = e
        except OSError as e:
            err = e
        time.sleep(i * 0.1)
    raise RuntimeError("reached max attempts to connect to metadata: %s" % err)


def download(value, path):
    value = value.strip()
    for pattern in GS_PATTERNS:
        m = re.match(pattern, value)
        if m:
            bucket, obj = m.group(1), m.group(2)
            token = json.loads(mds_get("instance/service-accounts/default/token"))["access_token"]
            url = "%s/download/storage/v1/b/%s/o/%s?alt=media" % (
                STORAGE, urllib.parse.quote(bucket, safe=""), urllib.parse.quote(obj, safe=""))
            req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
            break
    else:
        req = urllib.request.Request(value)
    with urllib.request.urlopen(req, timeout=60) as resp, open(path, "wb") as out:
        shutil.copyfileobj(resp, out)
    os.chmod(path, 0o755)


def holders_of(fd):
    inode = os.fstat(fd).st_ino
    link = "pipe:[%d]" % inode
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            if any(os.readlink("/proc/%s/fd/%s" % (pid, fd_)) == link for fd_ in os.listdir("/proc/%s/fd" % pid)):
                cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode(errors="replace")
                found.append("%s %s" % (pid, cmd.strip()))
        except OSError:
            pass
    return found


def run_script(path, name):
    r, w = os.pipe()
    started = time.monotonic()
    proc = subprocess.Popen(["/bin/bash", "-c", path], stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                            close_fds=True)
    os.close(w)
    event(event="started", key=name)
    eof = threading.Event()
    exited = {}

    def waiter():
        status = proc.wait()
        exited["status"] = status
        exited["seconds"] = time.monotonic() - started
        event(event="exited", key=name, status=status, seconds=exited["seconds"])
        if not eof.wait(0.5):
            event(event="held-open", key=name, holders=holders_of(r))

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    buf = b""
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                if buf:
                    log(name.encode() + b": " + buf.rstrip(b"\r"))
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                log(name.encode() + b": " + line.rstrip(b"\r"))
            if len(buf) > MAX_LINE:
                log('error while communicating with "%s" script: bufio.Scanner: token too long' % name)
                break
    eof.set()
    t.join()
    status = exited["status"]
    event(event="finished", key=name, status=status, seconds=exited["seconds"])
    return status


def main(argv):
    if len(argv) != 2 or argv[1] not in ("startup", "shutdown", "specialize"):
        print('no valid arguments specified. Specify one of "startup", "shutdown" or "specialize"')
        return 2
    kind = argv[1]
    for key in ("project/project-id", "instance/attributes/created-by"):
        try:
            mds_get(key)
        except Exception:
            pass
    log("Starting %s scripts (version dsctl-vmboot-stand-in)." % kind)
    wanted = ["%s-script" % kind, "%s-script-url" % kind]
    scripts = {}
    for attrs in ("instance/attributes", "project/attributes"):
        try:
            md = json.loads(mds_get(attrs, recursive=True))
        except Exception as e:
            log(str(e))
            event(event="error", key=attrs, message=str(e))
            return 1
        scripts = {k: md[k] for k in wanted if md.get(k)}
        if scripts:
            break
    if not scripts:
        log("No %s scripts to run." % kind)
        event(event="done", found=False)
        return 0
    for key in wanted:
        if key not in scripts:
            continue
        log("Found %s in metadata." % key)
        event(event="found", key=key)
        tmpdir = tempfile.mkdtemp(prefix="metadata-scripts")
        path = os.path.join(tmpdir, key)
        try:
            try:
                if key.endswith("-url"):
                    download(scripts[key], path)
                else:
                    with open(path, "w") as f:
                        f.write(scripts[key].lstrip(" \n\v\f\t\r"))
                    os.chmod(path, 0o755)
            except Exception as e:
                log('Script "%s" failed with error: unable to write script to file: %s' % (key, e))
                event(event="error", key=key, message="unable to write script to file: %s" % e)
                continue
            status = run_script(path, key)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        if status == 0:
            log("%s exit status 0" % key)
        elif status < 0:
            log('Script "%s" failed with error: signal: %s' % (key, {9: "killed", 15: "terminated"}.get(-status, str(-status))))
        else:
            log('Script "%s" failed with error: exit status %d' % (key, status))
    log("Finished running %s scripts." % kind)
    event(event="done", found=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''
