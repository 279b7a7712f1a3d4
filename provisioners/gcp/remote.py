"""The shell commands dsctl runs on the VMs, and the parsing of what they print.

Every value that reaches a remote shell goes through shlex.quote here (paths,
the Python executable, arguments, environment values); nothing else in the
provider builds command lines.

Each process has a directory on its VM, {remote_dir}/{run}/{vm name}/, holding
  pid, rc       the Python process's pid, and its exit code once it has exited
  shpid         the pid of the wrapper that records the exit code
  out.log       its stdout and stderr
  ready.json    written by a server when it serves (the runtime's --ready-file)
  metrics.jsonl, ids.json, spec.json, code/, cache/   (trainers)
  journal/      the dispatcher's fault-tolerance journal
  tree          marks a process that runs others (a trainer.command's runner): status() counts them too
A process is started with setsid + nohup under a small `sh` that records its pid
and exit code, so it outlives the SSH session and its end is known afterwards.
It is identified by pid AND start time (from /proc), never by name.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

q = shlex.quote


def node_dir(remote_dir: str, run_id: str, vm_name: str) -> str:
    return str(PurePosixPath(remote_dir) / run_id / vm_name)


@dataclass(frozen=True)
class Layout:
    dir: str

    def __getattr__(self, name: str) -> str:  # pid, rc, log, ready, metrics, ids, spec, code, cache, journal
        files = {"pid": "pid", "rc": "rc", "log": "out.log", "ready": "ready.json", "metrics": "metrics.jsonl",
                 "ids": "ids.json", "spec": "spec.json", "code": "code", "cache": "cache", "journal": "journal"}
        if name in files:
            return str(PurePosixPath(self.dir) / files[name])
        raise AttributeError(name)


def _env_prefix(env: dict[str, str]) -> str:
    return " ".join(f"{k}={q(v)}" for k, v in env.items())


def launch(layout: Layout, python: str, module: str, args: list[str], env: dict[str, str] | None = None,
           file_env: dict[str, dict[str, str]] | None = None, tree: bool = False) -> str:
    """Start `python -m module args` in the background; prints 'PID STARTTIME' once it runs.

    file_env: {path: env}, environment given only where that file exists on the VM (software.PJRT_ENV).
    tree: the process runs others (a command runner, runtime/command.py): status() counts their CPU and memory too.
    """
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    program = " ".join([_env_prefix(env), q(python), "-m", q(module), *map(q, args)])
    where = "".join(f"if [ -e {q(path)} ]; then export {_env_prefix(extra)}; fi; "
                    for path, extra in (file_env or {}).items())
    # Inside the session: run the program, record its pid, wait for it, record its exit code.
    # (The wrapper's own pid goes to shpid: between the program's end and `rc` being written, a process
    # that is gone but whose wrapper still runs is exiting, not killed.)
    inner = (f"echo $$ > shpid; {where}{program} > out.log 2>&1 < /dev/null & echo $! > pid.tmp && mv pid.tmp pid; "
             "wait $!; echo $? > rc.tmp && mv rc.tmp rc")
    d = q(layout.dir)
    mark = "touch tree && " if tree else ""
    return (
        f"mkdir -p {d} && cd {d} && rm -f pid shpid rc ready.json metrics.jsonl ids.json tree && {mark}"
        f"(setsid nohup sh -c {q(inner)} > /dev/null 2>&1 < /dev/null &) && "
        "i=0; while [ ! -s pid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
        "pid=$(cat pid 2>/dev/null); [ -n \"$pid\" ] || { echo 'no pid recorded' >&2; exit 1; }; "
        "st=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20); echo \"$pid ${st:-0}\""
    )


def parse_launch(stdout: str) -> tuple[int, int]:
    pid, start = stdout.strip().splitlines()[-1].split()
    return int(pid), int(start)


def stop(layout: Layout, start_time: int | None, grace_s: float = 8.0) -> str:
    """SIGTERM the process (if it is still the one started), SIGKILL its group after grace_s."""
    d = q(layout.dir)
    start = q("" if start_time is None else str(start_time))
    ticks = max(int(grace_s * 10), 1)
    return (
        f"cd {d} 2>/dev/null || exit 0; pid=$(cat pid 2>/dev/null); [ -n \"$pid\" ] || exit 0; "
        "st() { sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f20; }; "
        f"[ -n {start} ] && [ \"$(st)\" != {start} ] && exit 0; "
        "pg=$(sed 's/.*) //' /proc/$pid/stat 2>/dev/null | cut -d' ' -f3); "
        "kill -TERM $pid 2>/dev/null; i=0; "
        f"while [ -n \"$(st)\" ] && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done; "
        "if [ -n \"$(st)\" ]; then kill -KILL -- -$pg 2>/dev/null || kill -KILL $pid 2>/dev/null; fi; exit 0"
    )


# CPU ticks (utime+stime+cutime+cstime) and resident pages of a process's descendants, plus the CPU of the children
# it has reaped itself, from one read of /proc/*/stat: "TICKS PAGES". The fields after the command name (which may hold
# spaces and parentheses: the line is cut after its last ") ") are state ppid ... utime(12) stime cutime cstime ...
# rss(22). A child's CPU moves into its parent's cutime/cstime when the parent reaps it, so the sum does not jump
# when one ends. As runtime/sampler.py counts a command trainer's tree on this machine.
TREE = r"""awk -v root="$1" '
{ match($0, /.*\) /); split(substr($0, RLENGTH + 1), f, " "); p = $1 + 0
  parent[p] = f[2] + 0; ticks[p] = f[12] + f[13] + f[14] + f[15]; pages[p] = f[22] + 0
  if (p == root) own = f[14] + f[15] }
END { t = own; m = 0
  for (p in parent) { q = parent[p]; n = 0
    while (q > 1 && q != root && n < 64) { q = (q in parent) ? parent[q] : 0; n++ }
    if (q == root && p != root) { t += ticks[p]; m += pages[p] } }
  printf "%d %d", t, m }'"""


SYSCONF = ".sysconf"  # "CLK_TCK PAGESIZE" of the VM, written by the first status in the run's directory there


def status(dirs: list[str]) -> str:
    """One line per process dir: pid, exit code, /proc state and CPU ticks, RSS pages, ready file, metrics size,
    and for a dir marked `tree` (launch(tree=True)) the CPU ticks and RSS pages of the process's descendants.

    The wrapper is checked before the process and the exit code is read last: the wrapper writes
    `rc` after the process ends and exits after writing it, so a process found gone with no `rc`
    always has its wrapper seen alive, and is never mistaken for one killed without an exit code.

    It runs on each VM every second (trainers) or every few (watch.py), so it reads with the shell's own `read`
    (POSIX sh, no program started for a plain process dir): `cat`, `sed` and `cut` in pipes took about twenty
    processes a dir, most of the VM's share of dsctl's CPU. CLK_TCK and PAGESIZE come from `getconf` once and are
    kept in the run's directory on the VM (SYSCONF); only marked dirs read every process's stat, and only
    trainers' dirs have a metrics file to `stat`.
    """
    quoted = " ".join(q(d) for d in dirs)
    conf = q(str(PurePosixPath(dirs[0]).parent / SYSCONF)) if dirs else "/dev/null"
    return (
        f"{{ read -r T P < {conf}; }} 2>/dev/null; "
        'case "${T:-x}${P:-x}" in *[!0-9]*) T=$(getconf CLK_TCK); P=$(getconf PAGESIZE); '
        f'{{ echo "$T $P" > {conf}; }} 2>/dev/null;; esac; '
        f"dtree() {{ cat /proc/[0-9]*/stat 2>/dev/null | {TREE}; }}; "
        f"for d in {quoted}; do "
        "pid=''; s=''; m=''; t=''; w=''; wa=0; r=''; z=''; rc=''; l=''; "
        '{ read -r pid < "$d/pid"; } 2>/dev/null; '
        '{ read -r w < "$d/shpid"; } 2>/dev/null; '
        'if [ -n "$w" ]; then { read -r l < "/proc/$w/stat"; } 2>/dev/null; l=${l##*") "}; '
        'case "${l%% *}" in \'\'|Z|X) ;; *) wa=1;; esac; fi; '
        'if [ -n "$pid" ] && [ -r "/proc/$pid/stat" ]; then l=\'\'; { read -r l < "/proc/$pid/stat"; } 2>/dev/null; '
        'if [ -n "$l" ]; then set -- ${l##*") "}; s="$1 ${12} ${13} ${20}"; fi; '
        '{ read -r l m l < "/proc/$pid/statm"; } 2>/dev/null; '
        '[ -e "$d/tree" ] && t=$(dtree "$pid"); fi; '
        'if [ -e "$d/ready.json" ]; then while IFS= read -r l || [ -n "$l" ]; do r="$r$l"; l=\'\'; done '
        '2>/dev/null < "$d/ready.json"; case "$r" in *"\t"*) r=$(printf %s "$r" | tr -d \'\\t\');; esac; fi; '
        '[ -e "$d/metrics.jsonl" ] && z=$(stat -c %s "$d/metrics.jsonl" 2>/dev/null); '
        '{ read -r rc < "$d/rc"; } 2>/dev/null; '
        "printf 'S\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' "
        "\"$d\" \"$pid\" \"$rc\" \"$s\" \"$m\" \"$r\" \"$z\" \"$T\" \"$P\" \"$wa\" \"$t\"; "
        "done"
    )


@dataclass
class ProcStatus:
    dir: str
    pid: int | None
    rc: int | None
    state: str | None  # /proc state letter, None if no such process
    cpu_ticks: int  # with a tree (launch(tree=True)), its descendants' too
    start_time: int | None
    rss_bytes: int
    ready: dict | None
    metrics_size: int | None
    clk_tck: int
    wrapper_alive: bool = False  # the sh that waits for the process and records its exit code
    at: float = 0.0  # local monotonic time of the reading

    def running(self, start_time: int | None) -> bool:
        """Not finished: the process started is there (not a zombie, not a reused pid), or it has just
        ended and its wrapper is still writing the exit code."""
        if self.rc is not None:
            return False
        if self.state is not None and self.state not in ("Z", "X") and (
                start_time is None or self.start_time == start_time):
            return True
        return self.wrapper_alive

    @property
    def exit_code(self) -> int:
        """The recorded exit code; -9 for a process that vanished without one (killed with its wrapper)."""
        return self.rc if self.rc is not None else -9

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_ticks / (self.clk_tck or 100)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_status(stdout: str, at: float) -> dict[str, ProcStatus]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 12 or parts[0] != "S":
            continue
        _, d, pid, rc, stat, statm, ready, size, tck, page, wrapper, tree = parts
        fields = stat.split()
        state = fields[0] if fields else None
        ticks = (_int(fields[1]) or 0) + (_int(fields[2]) or 0) if len(fields) >= 3 else 0
        tree_ticks, tree_pages = (_int(x) or 0 for x in (tree.split() + ["0", "0"])[:2])
        start = _int(fields[3]) if len(fields) >= 4 else None
        try:
            ready_obj = json.loads(ready) if ready else None
        except json.JSONDecodeError:
            ready_obj = None
        out[d] = ProcStatus(dir=d, pid=_int(pid), rc=_int(rc), state=state, cpu_ticks=ticks + tree_ticks,
                            start_time=start, rss_bytes=((_int(statm) or 0) + tree_pages) * (_int(page) or 4096),
                            ready=ready_obj, metrics_size=_int(size), clk_tck=_int(tck) or 100,
                            wrapper_alive=wrapper == "1", at=at)
    return out


PROBE = r"""
import json, platform, sys
from importlib import metadata as md
def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None
print(json.dumps({"node": sys.argv[1], "python": platform.python_version(),
    "tensorflow": version("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tensorflow-intel", "tf-nightly", "tf-nightly-cpu"),
    "dsctl": version("dsctl")}))
"""


def probe(python: str, label: str) -> str:
    """Report the VM's TensorFlow and dsctl versions as one JSON line (does not import TensorFlow)."""
    return f"{q(python)} -c {q(PROBE)} {q(label)}"


def parse_probe(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "tensorflow" in data:
            return data
    return None


# Runs on a VM with the image's own Python (standard library only): download objects from Cloud
# Storage's JSON API, with the VM's service-account token from the metadata server (metadata.google.internal, or
# GCE_METADATA_HOST as Google's own libraries read it). Modes:
#   objects  prefix + each name -> dest/name; a .tar.gz is unpacked into dest/<name without .tar.gz>
#   manifest prefix + MANIFEST.json lists {"name", "sha256", "size"}: each is fetched and checked
# Retried as Google advises (https://cloud.google.com/storage/docs/retry-strategy): 408, 429, 5xx and failed
# connections with exponential backoff (1 s doubling to 30 s, 10 tries); a 401 or 403 for up to 480 s from the first,
# since the VM's account may have been granted its read access moments before the VM booted and grants take minutes
# to be in effect; a 401 also takes a new token. Prints {"bytes": N, "files": K} (bytes fetched from Cloud Storage).
FETCH = r"""
import hashlib, io, json, os, sys, tarfile, time, urllib.error, urllib.parse, urllib.request
storage, bucket, prefix, dest, mode = sys.argv[1:6]
names = sys.argv[6:]
MD = "http://%s/computeMetadata/v1/" % os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
token = [None]
def fresh_token():
    req = urllib.request.Request(MD + "instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"})
    try:
        token[0] = json.load(NO_PROXY.open(req, timeout=10))["access_token"]
    except Exception as exc:
        raise SystemExit("no access token from the metadata server (does the VM have a service account?): %s" % exc)
total = 0
def get(name):
    global total
    url = "%s/storage/v1/b/%s/o/%s?alt=media" % (storage.rstrip("/"), bucket, urllib.parse.quote(prefix + name, safe=""))
    wait, tries, denied_since = 1.0, 0, None
    while True:
        if token[0] is None:
            fresh_token()
        request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token[0]})
        try:
            data = NO_PROXY.open(request, timeout=300).read()
            break
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                denied_since = denied_since or time.monotonic()
                if time.monotonic() - denied_since > 480:
                    raise SystemExit("could not download gs://%s/%s%s: %s (the VM's service account may not read "
                                     "the bucket)" % (bucket, prefix, name, exc))
                if exc.code == 401:
                    token[0] = None
            elif exc.code not in (408, 429) and exc.code < 500 or tries >= 10:
                raise SystemExit("could not download gs://%s/%s%s: %s" % (bucket, prefix, name, exc))
        except (urllib.error.URLError, OSError) as exc:
            if tries >= 10:
                raise SystemExit("could not download gs://%s/%s%s: %s" % (bucket, prefix, name, exc))
        tries += 1
        time.sleep(wait)
        wait = min(wait * 2, 30.0)
    total += len(data)
    return data
os.makedirs(dest, exist_ok=True)
if mode == "manifest":
    files = json.loads(get("MANIFEST.json"))["files"]
    for f in files:
        data = get(f["name"])
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise SystemExit("gs://%s/%s%s does not match its manifest (sha256)" % (bucket, prefix, f["name"]))
        with open(os.path.join(dest, f["name"]), "wb") as out:
            out.write(data)
    names = [f["name"] for f in files]
else:
    for name in names:
        data = get(name)
        if name.endswith(".tar.gz"):
            target = os.path.join(dest, name[: -len(".tar.gz")])
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar.getmembers():
                    path = os.path.realpath(os.path.join(target, member.name))
                    if not path.startswith(os.path.realpath(target) + os.sep) or not (member.isfile() or member.isdir()):
                        raise SystemExit("refusing archive member %r" % member.name)
                tar.extractall(target)
        else:
            with open(os.path.join(dest, name), "wb") as out:
                out.write(data)
print(json.dumps({"bytes": total, "files": len(names)}))
"""
REAL_STORAGE = "https://storage.googleapis.com"


def fetch(python: str, bucket: str, prefix: str, dest: str, objects: list[str], storage_host: str | None,
          manifest: bool = False) -> str:
    """A command that downloads staged objects (or a whole manifest's worth) on a VM, as its service account; see
    FETCH."""
    mode = "manifest" if manifest else "objects"
    return " ".join([q(python), "-c", q(FETCH), q(storage_host or REAL_STORAGE), q(bucket), q(prefix), q(dest), mode,
                     *map(q, objects)])


# A free port below the ephemeral range, so no outgoing connection on the VM (which takes its local port
# from that range) can hold a server's port while the server restarts.
FREE_PORT = r"""
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for port in random.sample(range(10000, max(low, 10001)), min(200, max(low - 10000, 1))):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port below the ephemeral range (%d)" % low)
"""


def free_port(python: str) -> str:
    """Print a port nothing listens on, outside the ephemeral range (see FREE_PORT)."""
    return f"{q(python)} -c {q(FREE_PORT)}"


def tail(path: str, lines: int = 15) -> str:
    return f"tail -n {int(lines)} {q(path)} 2>/dev/null"


def wait_file(path: str, timeout_s: float) -> str:
    """Wait for a file (e.g. the startup script's marker) and print it; exit 1 on timeout."""
    ticks = max(int(timeout_s * 2), 1)
    return (f"i=0; while [ ! -s {q(path)} ] && [ $i -lt {ticks} ]; do sleep 0.5; i=$((i+1)); done; "
            f"cat {q(path)} 2>/dev/null || exit 1")
