"""Benchmark: dsctl's own CPU on each Google Cloud VM of a run, measured here with the code the VMs run.

    python benchmarks/bench_vm_overhead.py [--seconds 60] [--workers 4] [--quick] [--sshd PATH] [--profile FILE]
                                           [--every-second] [--scale-to 640]

A run on Google Cloud puts no dsctl process beside a worker's TensorFlow server: what dsctl costs a
worker VM is its sampler, the status command (provisioners/gcp/remote.py: status) that dsctl's
watcher (provisioners/gcp/watch.py) runs over SSH on each VM, and the sshd session that runs it. The
watcher reads trainers' VMs every second and the dispatcher's and workers' on a slower cadence that
keeps their readings to a budget (watch.server_every_s). On the dispatcher VM, a run handed over with
`dsctl up --detach` adds the supervisor (`dsctl supervise`, orchestrator/supervise.py): the watcher
reading every VM, the run loop sampling every SAMPLE_S into its store (orchestrator/run.py), and the
record published every PUBLISH_S (orchestrator/cloudrecord.py). Users pay for those cores, so they
are measured here:

  - stand-in VMs: one directory per VM with a real process in it (an idle Python started with
    remote.launch, exactly as a server is started on a VM: pid, shpid, rc files, and the ready file a
    server writes once it serves), one loopback address per VM served by a real OpenSSH sshd
    (standins/sshd.py, as the provider's tests use) when one is installed (--sshd, default
    /usr/sbin/sshd); without one, the status command runs through `bash -c` on this machine and sshd's
    own share is not measured (the printout says which);
  - the supervisor: a child process running dsctl's own Watcher and Ssh (fabric) against those VMs,
    the run loop's poll and sample steps at POLL_S / SAMPLE_S into a RunStore, and the supervisor's
    publishing thread (orchestrator/supervise.py's _Watchdog) writing the record to the Cloud Storage
    emulator (the gcs tests' stand-in) every PUBLISH_S;
  - measured over --seconds after every VM has been read twice: the supervisor's own CPU (getrusage)
    and readings, and, per VM, the CPU of sshd's whole process tree (the sessions and the status shells
    they ran and reaped), or with no sshd the CPU of the status shells the supervisor ran;
  - then two shorter windows (a third of --seconds each) with the watcher stopped, its connections
    still open: the same loop with this run's readings (what is not reading), and with the readings of
    --scale-to workers (what the loop's sampling, store and publishing cost at that size). From those,
    the supervisor at 64 and --scale-to workers is computed: the readings the cadence makes there at
    this run's CPU per reading, plus the rest interpolated between the two windows.

Printed as % of one core, each labelled measured here or computed, with the goal (<= 1% of one core).
--every-second reads every VM every second with paramiko's own 0.1 s wake-ups of idle connections, as
dsctl did before 2026-11-28, to compare with the cadence in one session on one machine.
--profile FILE writes where the supervisor's Python time goes (a stack sampler, every 5 ms) to FILE.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "standins"))  # the loopback stand-ins the provider's tests use too: sshd

GOAL_PERCENT = 1.0
FIRST_ADDRESS = "127.0.0.2"
BUCKET = "dsctl-bench"


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def tree_cpu_s(pid: int) -> float:
    """CPU-seconds of a process and its live descendants, each with the children it has reaped (nothing twice)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return total
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


class LocalShell:
    """The SSH client's `run` with no sshd: the command through `bash -c` here, as sshd runs it through the
    user's shell on a VM. Its shells are this process's children, so their CPU is RUSAGE_CHILDREN."""

    def run(self, host: str, command: str, *, doing: str, timeout: float = 60.0):
        from dsctl.provisioners.gcp.ssh import Result

        r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
        return Result(r.returncode, r.stdout, r.stderr)

    def drop(self, host: str) -> None:
        pass

    def close(self) -> None:
        pass


class StackSampler(threading.Thread):
    """Where the supervisor's threads spend their Python time: every thread's stack every 5 ms, counted by the
    innermost frames (a poor man's py-spy; only with --profile)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="bench-profile")
        self.own: collections.Counter[str] = collections.Counter()
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(0.005):
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                f, seen, first = frame, set(), True
                while f is not None:
                    name = f"{Path(f.f_code.co_filename).name}:{f.f_code.co_name}"
                    if first:
                        self.own[f"{name}:{f.f_lineno}"] += 1
                        first = False
                    if name not in seen:
                        self.inclusive[name] += 1
                        seen.add(name)
                    f = f.f_back
                self.samples += 1

    def report(self) -> str:
        lines = [f"# stack samples (all threads, every 5 ms, idle waits included): {self.samples}", "# innermost:"]
        lines += [f"{n:7d} {k}" for k, n in self.own.most_common(40)]
        lines += ["# inclusive:"] + [f"{n:7d} {k}" for k, n in self.inclusive.most_common(60)]
        return "\n".join(lines) + "\n"


class ManyReadings:
    """What the run loop reads of the watcher, for `workers` workers: this run's readings, each worker's copied to
    the workers it does not have (the loop's sampling, store and publishing at that size, with no SSH)."""

    def __init__(self, watcher, workers: int) -> None:
        readings, snap = watcher.readings(), watcher.snapshot()
        worker = next(k for k in readings if k[0] == "worker")
        self._readings = dict(readings)
        self._snap = dict(snap)
        for i in range(workers):
            self._readings.setdefault(("worker", i), readings[worker])
            self._snap.setdefault(("worker", i), snap[worker])

    def readings(self):
        return dict(self._readings)

    def snapshot(self):
        return dict(self._snap)

    def unreachable(self):
        return {}


def _old_cadence() -> None:
    """Every VM every second, idle connections woken every 0.1 s: dsctl before 2026-11-28."""
    from dsctl.provisioners.gcp import ssh as ssh_module
    from dsctl.provisioners.gcp import watch

    watch.SERVER_EVERY_MIN_S = watch.INTERVAL_S
    watch.SERVER_READS_PER_S = float("inf")
    ssh_module.IDLE_WAKE_S = 0.1


def supervise_child(config: dict) -> None:
    """The supervisor's steady state: prints `window NAME` / `end NAME` around each measured window, then one JSON
    line of what it measured."""
    os.environ["DSCTL_HOME"] = config["home"]
    if config.get("storage"):
        os.environ["STORAGE_EMULATOR_HOST"] = config["storage"]
    if config.get("every_second"):
        _old_cadence()
    from dsctl.orchestrator import run as run_loop
    from dsctl.orchestrator import supervise
    from dsctl.orchestrator.store import RunStore
    from dsctl.provisioners import HandOffLimits
    from dsctl.provisioners.gcp import processes
    from dsctl.provisioners.gcp.remote import Layout
    from dsctl.provisioners.gcp.ssh import Ssh
    from dsctl.provisioners.gcp.watch import Watched, Watcher

    run_id = "bench-vm-overhead"
    if config["sshd"]:
        ssh = Ssh(config["user"], config["port"], Path(config["key"]), Path(config["home"]) / "known_hosts")
    else:
        ssh = LocalShell()
    watcher = Watcher(ssh)  # type: ignore[arg-type]
    for role, index, host, d in config["vms"]:
        watcher.watch(Watched(key=(role, index), host=host, layout=Layout(d), launched_at=0.0))
    store = RunStore()
    store.create_run(id=run_id, name="bench", kind="job", provider="gcp", mode="service", status="running",
                     spec_json="{}", spec_hash="-", workers=config["workers"], trainers=0, run_dir=config["home"])
    objects: object
    if config.get("storage"):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        from dsctl.provisioners.gcp.storage import RunObjects

        objects = RunObjects(storage.Client(project="bench", credentials=AnonymousCredentials()), BUCKET, run_id)
    else:
        objects = MemoryObjects()
    progress = SimpleNamespace(phase="training", batches=1, batches_per_s=10.0, workers_ready=config["workers"],
                               restarts=0, last_event=None)
    runner = SimpleNamespace(run_id=run_id, progress=progress)
    ctx = SimpleNamespace(watcher=watcher)

    watcher.start()
    deadline = time.monotonic() + 60
    while len(watcher.readings()) < len(config["vms"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # warm-up: connections made, every VM read twice
    if len(watcher.readings()) < len(config["vms"]):
        raise SystemExit(f"only {len(watcher.readings())} of {len(config['vms'])} VMs were read: {watcher.last_error}")
    watchdog = supervise._Watchdog(runner, objects, deadline=time.time() + 86400,  # type: ignore[arg-type]
                                   limits=HandOffLimits(max_duration_s=86400, outage_limit_s=86400), attached=False)
    watchdog.start()
    time.sleep(1.0)

    def window(name: str, seconds: float, profiler: StackSampler | None = None) -> dict:
        """The run loop's poll and sample steps for `seconds`, reading what ctx.watcher holds."""
        print(f"window {name}", flush=True)
        r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        reads0 = watcher.reads
        if profiler:
            profiler.start()
        polls = samples = rows = 0
        last_sample = 0.0
        while (now := time.monotonic()) - t0 < seconds:
            ctx.watcher.unreachable()  # what the provider's poll() reads each POLL_S: the latest readings
            ctx.watcher.snapshot()
            polls += 1
            if now - last_sample >= run_loop.SAMPLE_S:
                last_sample = now
                got = processes.sample(ctx)  # type: ignore[arg-type]
                store.add_utilization(run_id, time.time(), got)
                samples += 1
                rows += len(got)
            time.sleep(run_loop.POLL_S)
        wall = time.monotonic() - t0
        r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        if profiler:
            profiler.stop.set()
            profiler.join()
            Path(config["profile"]).write_text(profiler.report())
        print(f"end {name}", flush=True)
        return {"wall_s": wall, "self_cpu_s": _cpu_s(r1) - _cpu_s(r0), "children_cpu_s": _cpu_s(c1) - _cpu_s(c0),
                "polls": polls, "samples": samples, "utilization_rows": rows, "reads": watcher.reads - reads0}

    result = window("reading", config["seconds"], StackSampler() if config.get("profile") else None)
    result["parts"] = len(objects.names("part-") if hasattr(objects, "names") else [])
    rest_s = max(config["seconds"] / 3, 5.0)
    watcher.stop()  # its connections stay open, as between readings
    time.sleep(1.0)  # readings in flight end
    result["rest"] = window("rest", rest_s)
    ctx.watcher = ManyReadings(watcher, config["scale_to"])  # type: ignore[assignment]
    result["rest_scaled"] = window("rest-scaled", rest_s)
    result["rest_scaled"]["workers"] = config["scale_to"]
    watchdog.finish(30)
    ssh.close()
    print(json.dumps(result), flush=True)


class MemoryObjects:
    """The record's objects kept in memory, where the Cloud Storage emulator is not installed."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put(self, name: str, data: bytes) -> None:
        self.data[name] = data

    def get(self, name: str) -> bytes | None:
        return self.data.get(name)

    def names(self, prefix: str = "") -> list[str]:
        return [n for n in self.data if n.startswith(prefix)]


def _start_storage():
    """The Cloud Storage emulator the provider's tests use, in this process (its CPU is not the supervisor's)."""
    try:
        from gcp_storage_emulator.server import create_server
    except ImportError:
        return None, None
    from sshd import free_port

    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # a `stop` object not there is the norm
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def _launch_vm_process(python: str, role: str, d: str) -> int:
    """An idle Python in the VM's process directory, started as the provider starts a server (remote.launch), with
    the ready file a server writes once it serves (runtime/serve.py): the watcher reads a ready server on its
    slower cadence."""
    from dsctl.provisioners.gcp import remote

    layout = remote.Layout(d)
    cmd = remote.launch(layout, python, "timeit", ["-n", "1", "-r", "1", "import time; time.sleep(86400)"])
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    pid = remote.parse_launch(out)[0]
    Path(layout.ready).write_text(json.dumps({"role": role, "pid": pid, "port": 0, "ready_at": time.time()}))
    return pid


def measure(seconds: float, workers: int, sshd_path: str | None, profile: str | None, every_second: bool = False,
            scale_to: int = 640) -> dict:
    """Stand-in VMs and a supervisor child; the CPU of each side over the child's measured window."""
    work = Path(tempfile.mkdtemp(prefix="dsctl-bench-vm-"))
    hosts = [f"127.0.0.{2 + i}" for i in range(workers + 1)]  # the dispatcher VM, then the worker VMs
    vms = [("dispatcher", 0, hosts[0], str(work / "vms" / "dispatcher-0"))]
    vms += [("worker", i, hosts[1 + i], str(work / "vms" / f"worker-{i}")) for i in range(workers)]
    pids: list[int] = []
    server = sshd_proc = None
    storage_server = None
    try:
        pids = [_launch_vm_process(sys.executable, role, d) for role, _, _, d in vms]
        config: dict = {"home": str(work / "home"), "vms": vms, "workers": workers, "seconds": seconds,
                        "sshd": False, "profile": profile, "every_second": every_second, "scale_to": scale_to}
        if sshd_path:
            import sshd

            sshd.SSHD = sshd_path
            server = sshd.Sshd(work / "sshd", hosts).start()
            sshd_proc = server.proc
            key = work / "client_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            server.authorized_keys.write_text(Path(f"{key}.pub").read_text())
            config.update(sshd=True, user=server.user, port=server.port, key=str(key))
        storage_server, config["storage"] = _start_storage()
        child = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(config)], stdout=subprocess.PIPE,
                                 text=True, cwd=str(work))
        assert child.stdout is not None
        sshd_cpu: dict[str, float] = {}
        result: dict = {}
        for line in child.stdout:
            if line.startswith(("window ", "end ")) and sshd_proc is not None:
                sshd_cpu[line.strip()] = tree_cpu_s(sshd_proc.pid)
            elif line.startswith("{"):
                result = json.loads(line)
        if child.wait() != 0 or not result:
            raise SystemExit(f"the supervisor stand-in failed (exit {child.returncode})")
        if "end reading" in sshd_cpu:
            result["vm_side_cpu_s"] = sshd_cpu["end reading"] - sshd_cpu["window reading"]
        else:
            result["vm_side_cpu_s"] = result["children_cpu_s"]
        result["transport"] = "sshd" if sshd_proc is not None else "bash"
        result["storage"] = "emulator" if config["storage"] else "memory"
        result["vms"] = len(vms)
        return result
    finally:
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), 15)
            except OSError:
                pass
        if server is not None:
            server.stop()
        if storage_server is not None:
            storage_server.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(r: dict, workers: int, every_second: bool = False) -> list[str]:
    from dsctl.provisioners.gcp import watch

    def pct(cpu_s: float, wall_s: float) -> float:
        return 100.0 * cpu_s / wall_s

    def goal(p: float) -> str:
        return f"goal <= {GOAL_PERCENT:g}%: {'met' if p <= GOAL_PERCENT else 'NOT met'}"

    def every_s(servers: int) -> float:
        return watch.INTERVAL_S if every_second else watch.server_every_s(servers)

    vms, wall, reads = r["vms"], r["wall_s"], max(r["reads"], 1)
    per_vm = pct(r["vm_side_cpu_s"], wall) / vms
    sup = pct(r["self_cpu_s"] + (r["children_cpu_s"] if r["transport"] == "sshd" else 0.0), wall)
    rest = pct(r["rest"]["self_cpu_s"], r["rest"]["wall_s"])
    scaled = r["rest_scaled"]
    rest_scaled = pct(scaled["self_cpu_s"], scaled["wall_s"])
    per_read_s = max(sup - rest, 0.0) / 100 * wall / reads  # the supervisor's CPU per reading
    vm_per_read_s = r["vm_side_cpu_s"] / reads  # a VM's CPU per reading of it (sshd's session, the status command)
    dispatcher_vm = sup + per_vm
    side = ("sshd's session and the status command" if r["transport"] == "sshd"
            else "the status command through bash (no sshd installed here: sshd's share not measured)")
    record = "the Cloud Storage emulator" if r["storage"] == "emulator" else "memory"
    cadence = ("every VM read every 1 s, idle connections woken every 0.1 s (dsctl before 2026-11-28)" if every_second
               else f"each read every {every_s(vms):g} s (max({watch.SERVER_EVERY_MIN_S:g} s, VMs / "
                    f"{watch.SERVER_READS_PER_S:g} a second); trainers' VMs, none here, every {watch.INTERVAL_S:g} s")
    lines = [
        f"# dsctl on each Google Cloud VM: {workers} worker VMs + the dispatcher VM, {cadence}; {wall:.0f} s measured; "
        f"record to {record}",
        f"# worker VM, sampler ({side}), per VM (measured here): {per_vm:.2f}% of one core ({goal(per_vm)}); "
        f"{1000 * vm_per_read_s:.1f} ms of CPU per reading (computed)",
        f"# dispatcher VM, supervisor for {workers} workers (watcher, sampling, store, publishing; measured here): "
        f"{sup:.2f}% of one core = {r['reads'] / wall:.2f} readings/s (measured here) at {1000 * per_read_s:.2f} ms "
        f"of CPU each (computed) + the rest, {rest:.2f}% (measured here, {r['rest']['wall_s']:.0f} s without readings)",
        f"# dispatcher VM, supervisor + its own sampler, {workers} workers (computed): {dispatcher_vm:.2f}% of one core "
        f"({goal(dispatcher_vm)})",
    ]

    def at(n: int) -> tuple[float, float, float, float, float]:
        """(total, readings' part, the rest, its own sampler, each server's period) at n workers."""
        period = every_s(n + 1)
        readings = 100 * (n + 1) / period * per_read_s
        other = rest + (rest_scaled - rest) * (n - workers) / max(scaled["workers"] - workers, 1)
        own = 100 * vm_per_read_s / period
        return readings + other + own, readings, other, own, period

    for n in sorted({64, scaled["workers"]}):
        total, readings, other, own, period = at(n)
        lines.append(
            f"# dispatcher VM at {n} workers (computed): {total:.2f}% of one core ({goal(total)}) = readings "
            f"{(n + 1) / period:.2f}/s, {readings:.2f}% + the rest {other:.2f}% (between {rest:.2f}% at {workers} and "
            f"{rest_scaled:.2f}% at {scaled['workers']} workers' readings, measured here) + its own sampler {own:.3f}%; "
            f"each server read every {period:g} s")
    within = next((n for n in range(workers, 100001) if at(n)[0] > GOAL_PERCENT), None)
    lines.append(f"# dispatcher VM stays within {GOAL_PERCENT:g}% up to about "
                 f"{'more than 100000' if within is None else max(within - 1, 0)} workers (computed, as above; idle "
                 "SSH connections of VMs beyond this run's not counted)")
    lines.append(f"# supervisor loop (measured here): {r['polls']} polls, {r['samples']} samples, "
                 f"{r['utilization_rows']} utilization rows, {r['parts']} record parts, {r['reads']} readings")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="measured window (after the warm-up)")
    p.add_argument("--workers", type=int, default=4, help="worker VMs (one loopback address each)")
    p.add_argument("--quick", action="store_true", help="a short check that everything runs: 6 s, 2 workers")
    p.add_argument("--sshd", default=os.environ.get("DSCTL_BENCH_SSHD", "/usr/sbin/sshd"),
                   help="OpenSSH server binary; if absent, the status command runs through bash with no sshd")
    p.add_argument("--profile", help="write the supervisor's stack samples to this file")
    p.add_argument("--every-second", action="store_true",
                   help="every VM every second, idle connections woken every 0.1 s: dsctl before 2026-11-28")
    p.add_argument("--scale-to", type=int, default=640, help="workers whose readings the loop is measured with")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        supervise_child(json.loads(args.child))
        return 0
    if args.quick:
        args.seconds, args.workers = 6.0, 2
    if args.workers + 1 > 16:
        p.error("at most 15 workers: sshd listens on 16 loopback addresses at most")
    sshd_path = args.sshd if args.sshd and os.access(args.sshd, os.X_OK) and shutil.which("ssh-keygen") else None
    r = measure(args.seconds, args.workers, sshd_path, args.profile, args.every_second, max(args.scale_to, args.workers))
    for line in report(r, args.workers, args.every_second):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
