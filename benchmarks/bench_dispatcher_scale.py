"""Benchmark: the control plane at scale: tf.data's dispatcher and dsctl's supervision as the worker count grows.

    python benchmarks/bench_dispatcher_scale.py [--quick] [--workers 8,16,32,64,128,256,640] [--window 30]
                                                [--hosts 4] [--holdout 2]

A real tf.data service: per worker count N, a fresh DispatchServer in a process of its own and N real
WorkerServers registered to it, many per process (spread over --hosts processes: a WorkerServer costs
well under 1 MB and a few threads, so this machine holds hundreds), every WorkerConfig field at
TensorFlow's default, heartbeat_interval_ms included (its value is read back from the workers' logs
and printed), and every DispatcherConfig field too. The processes are forked, per N, from one that
imported TensorFlow once (as dsctl's launcher does), so no N waits for TensorFlow imports competing
for the cores. Per N, measured here:

- registration: the wall time to start the N workers, each registering with the dispatcher;
- idle (heartbeats only): over --window seconds (default 30 s, one heartbeat interval), the
  dispatcher's CPU-seconds per second, read by the process of itself from the kernel's nanosecond
  per-process clock (psutil's clock-tick figures are too coarse for a few heartbeats), its resident
  memory (psutil; the pages it shares with the process it was forked from count once it has touched
  them), and the CPU of the processes holding the workers;
- a job: one consumer process reads `distribute(processing_mode="parallel_epochs")` over all N
  workers, a dataset whose elements carry a random tag drawn once per worker's task, so the consumer
  can tell when every worker has delivered. Timed from the job's creation (the consumer's `iter()`):
  the first element, every worker holding its task (each WorkerServer's task count, polled in its
  process), and an element from every worker; and the dispatcher's CPU-seconds over that span
  (creating the job and assigning N tasks);
- the job held (the consumer keeps its iterator, reading nothing more): the dispatcher's CPU per
  second and memory over --window seconds, its worker and client heartbeats now carrying N tasks.

dsctl's own supervision (orchestrator/supervision.py's Supervisor over the local provider's `poll`,
and the provider's `sample`, runtime/sampler.py's ProcessSampler): the CPU of one round of each over a
deployment of N workers, a dispatcher and a trainer whose processes are N+2 real sleeping processes
(what a round reads of a process, its /proc entries, does not depend on what the process runs), and
what that costs per second at the cadence `dsctl up` polls and samples (orchestrator/run.py).

Every figure is then fitted as a + b*N on the smaller worker counts, the largest --holdout counts
held out: the fit's prediction for each held-out count is printed beside what was measured there
(error %), then its prediction for 640 workers, labelled with the counts it was fitted and validated
on. Every line says whether its numbers were measured here, fitted, or predicted.

--quick (a test runs it): N = 2, 4, 8 in 2 processes, 2 s windows, the largest count held out; it
checks that everything runs and prints, not the values. Every process the benchmark starts (the
dispatcher, the worker processes, the consumer, the sleeping processes) is stopped at its end, also on
an error or Ctrl-C, and dies with it if it is killed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import queue
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PREFIX = "@@"  # a child's replies on stdout start with this; anything else it prints is ignored
TARGET_N = 640
REPLY_TIMEOUT_S = 180.0
PR_SET_PDEATHSIG = 1


# -- the child processes: dispatcher, worker host, consumer --------------------------------------------------------


class _Channel:
    """Where a child reads its commands and writes its replies: stdin/stdout, or the socket a forked one connects."""

    inp = sys.stdin
    out = sys.stdout


def _reply(obj: dict) -> None:
    _Channel.out.write(PREFIX + json.dumps(obj) + "\n")
    _Channel.out.flush()


def _commands():
    """The parent's commands, one JSON object per line; EOF (the parent gone or done) ends the child."""
    for line in _Channel.inp:
        if line.strip():
            yield json.loads(line)


def _raise_fd_limit() -> None:
    """A process holding hundreds of gRPC servers or connections needs more descriptors than the usual 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _usage() -> dict:
    """This process's CPU-seconds, every thread's (ended ones too), from the kernel's nanosecond count
    (CLOCK_PROCESS_CPUTIME_ID): the clock-tick figures in /proc are too coarse for a dispatcher's heartbeats."""
    return {"cpu": time.process_time(), "rss": psutil.Process().memory_info().rss}


def serve_dispatcher() -> None:
    """A DispatchServer with DispatcherConfig's defaults, alone in its process so its CPU and memory are its own."""
    import tensorflow as tf

    server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=0))
    _reply({"address": server.target.split("://", 1)[1], "tensorflow": tf.__version__})
    for cmd in _commands():
        if cmd["op"] == "workers":
            _reply({"workers": server._num_workers()})
        elif cmd["op"] == "cpu":
            _reply(_usage())


def serve_workers() -> None:
    """Many WorkerServers in one process, started (each registers with the dispatcher) and watched until each holds
    a task, on the parent's command; the parent kills the process when it is done with them."""
    import tensorflow as tf

    svc = tf.data.experimental.service
    workers: list = []
    _reply({"ready": True})
    for cmd in _commands():
        op = cmd["op"]
        if op == "start":
            t0 = time.time()
            for _ in range(cmd["count"]):
                workers.append(svc.WorkerServer(svc.WorkerConfig(dispatcher_address=cmd["dispatcher"], port=0)))
            _reply({"started": len(workers), "seconds": time.time() - t0})
        elif op == "watch":
            deadline = time.time() + cmd["timeout"]
            while time.time() < deadline and not all(w._num_tasks() > 0 for w in workers):
                time.sleep(0.01)
            _reply({"assigned_at": time.time(), "with_task": sum(w._num_tasks() > 0 for w in workers)})
        elif op == "cpu":
            _reply(_usage())


def serve_consumer() -> None:
    """The job's one reader. Its dataset tags every element with a number drawn once per worker's task (no seed,
    so every worker draws its own), which tells the reader how many workers it has heard from."""
    import tensorflow as tf

    iterator = None
    _reply({"ready": True})
    for cmd in _commands():
        if cmd["op"] == "job":
            tags = tf.data.Dataset.random().take(1).flat_map(lambda tag: tf.data.Dataset.from_tensors(tag).repeat())
            ds = tags.apply(tf.data.experimental.service.distribute(
                processing_mode="parallel_epochs", service=f"grpc://{cmd['dispatcher']}"))
            created = time.time()
            iterator = iter(ds)
            seen: set[int] = set()
            first = last = None
            elements = 0
            deadline = created + cmd["timeout"]
            for element in iterator:
                last = time.time()
                first = first or last
                elements += 1
                seen.add(int(element))
                if len(seen) >= cmd["workers"] or last > deadline:
                    break
            _reply({"created": created, "first": first, "all": last, "seen": len(seen), "elements": elements})


SERVERS = {"dispatcher": serve_dispatcher, "workers": serve_workers, "consumer": serve_consumer}


def serve_preloaded() -> None:
    """TensorFlow imported once (seconds of CPU, which a shared machine would pay per process and per N), before
    any TensorFlow runtime exists; then a child forked per request, as dsctl's own launcher does
    (runtime/launcher.py). A child logs to its file and speaks to the parent over the Unix socket it is given."""
    import tensorflow  # noqa: F401 - the point of this process

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; the parent kills them by pid
    _reply({"ready": True})
    for cmd in _commands():
        pid = os.fork()
        if pid:
            _reply({"pid": pid})
            continue
        try:
            _die_with_parent()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            fd = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            os.close(fd)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(cmd["socket"])
            _Channel.inp = _Channel.out = sock.makefile("rw")
            SERVERS[cmd["role"]]()
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)


# -- the parent: children started, talked to, and always stopped ----------------------------------------------------


def _die_with_parent() -> None:
    """Run in each child before exec: the kernel kills it if the benchmark dies (even by SIGKILL); Ctrl-C in the
    terminal reaches the benchmark, which stops its children in order."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Child:
    """A child forked by the pre-loaded process (`--serve ROLE` logic), spoken to in JSON lines over a Unix socket."""

    def __init__(self, role: str, work: Path, preloaded: Preloaded, children: list[Child]):
        self.role = role
        self.log = work / f"{role}-{preloaded.forks}.log"
        # An abstract socket (Linux): no file, and no limit from the length of the work folder's path.
        path = f"\0dsctl-bench-dscale-{os.getpid()}-{preloaded.forks}"
        preloaded.forks += 1
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(REPLY_TIMEOUT_S)
        try:
            self.pid = preloaded.fork(role, path, str(self.log))
            children.append(self)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                raise RuntimeError(f"the {role} process did not connect; see {self.log}") from None
        finally:
            listener.close()
        self.conn = conn
        self.file = conn.makefile("rw")
        self.ps = psutil.Process(self.pid)
        self.replies: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.file:
                if line.startswith(PREFIX):
                    self.replies.put(json.loads(line[len(PREFIX):]))
        except (OSError, ValueError):
            pass
        self.replies.put(None)

    def send(self, **cmd) -> None:
        self.file.write(json.dumps(cmd) + "\n")
        self.file.flush()

    def reply(self, timeout: float = REPLY_TIMEOUT_S) -> dict:
        try:
            got = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the {self.role} process did not answer in {timeout:.0f} s; see {self.log}") from None
        if got is None:
            raise RuntimeError(f"the {self.role} process exited; see {self.log}")
        return got

    def ask(self, **cmd) -> dict:
        self.send(**cmd)
        return self.reply()

    def cpu_seconds(self) -> float:
        """Its CPU-seconds, as the child reads them of itself (see _usage); the child must be idle to answer."""
        return self.ask(op="cpu")["cpu"]

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def stop(self) -> None:
        """Killed, and waited for until gone (the pre-loaded process reaps it): it keeps nothing that needs a clean
        shutdown, and a WorkerServer with a task of an endless dataset takes up to a minute to stop."""
        try:
            self.ps.kill()
            self.ps.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
        for f in (self.file, self.conn):
            try:
                f.close()
            except OSError:
                pass


class Preloaded:
    """The process that imports TensorFlow once and forks every other (serve_preloaded)."""

    def __init__(self, work: Path):
        self.forks = 0
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "0"}  # workers log their config
        with open(work / "preloaded.log", "w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "preloaded"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                         preexec_fn=_die_with_parent)
        self.ps = psutil.Process(self.proc.pid)
        self._answer()

    def _answer(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        raise RuntimeError(f"the pre-loaded process exited (code {self.proc.wait()})")

    def fork(self, role: str, sock: str, log: str) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"role": role, "socket": sock, "log": log}) + "\n")
        self.proc.stdin.flush()
        return self._answer()["pid"]

    def stop(self) -> None:
        """Its children first (the caller's), then it; a child left would die with it anyway (PDEATHSIG)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def stop_all(children: list[Child], sleepers: list[subprocess.Popen], preloaded: list[Preloaded]) -> None:
    for p in sleepers:
        if p.poll() is None:
            p.kill()
    for p in sleepers:
        p.wait()
    sleepers.clear()
    while children:
        children.pop().stop()
    while preloaded:
        preloaded.pop().stop()


# -- measurement --------------------------------------------------------------------------------------------------


@dataclass
class Point:
    n: int
    values: dict[str, float] = field(default_factory=dict)


def _shares(n: int, hosts: int) -> list[int]:
    return [n // hosts + (1 if i < n % hosts else 0) for i in range(hosts)]


def measure_service(n: int, args: argparse.Namespace, work: Path, preloaded: Preloaded,
                    children: list[Child]) -> tuple[Point, dict]:
    """One worker count, every process fresh: registration, idle window, job start, held-job window. The processes
    are killed at its end (Child.stop)."""
    shares = [s for s in _shares(n, args.hosts) if s]
    disp = Child("dispatcher", work, preloaded, children)
    used = [Child("workers", work, preloaded, children) for _ in shares]
    consumer = Child("consumer", work, preloaded, children)
    try:
        info = disp.reply()
        addr = info["address"]
        for c in [*used, consumer]:
            c.reply()
        t0 = time.time()
        for host, share in zip(used, shares):
            host.send(op="start", dispatcher=addr, count=share)
        for host in used:
            host.reply()
        registration = time.time() - t0
        registered = disp.ask(op="workers")["workers"]
        if registered != n:
            raise RuntimeError(f"{registered} of {n} workers registered with the dispatcher")
        info["heartbeat_ms"] = heartbeat_ms([h.log for h in used])
        time.sleep(min(1.0, args.window))  # the registrations' own work done before the window opens
        window, job_timeout = args.window, args.job_timeout
        p = Point(n)
        p.values["registration_s"] = registration

        d0, w0, t0 = disp.cpu_seconds(), sum(h.cpu_seconds() for h in used), time.monotonic()
        time.sleep(window)
        d1, w1, t1 = disp.cpu_seconds(), sum(h.cpu_seconds() for h in used), time.monotonic()
        p.values["idle_disp_pct"] = 100 * (d1 - d0) / (t1 - t0)
        p.values["idle_disp_rss"] = disp.rss_mb()
        p.values["idle_workers_pct"] = 100 * (w1 - w0) / (t1 - t0)

        for host in used:
            host.send(op="watch", timeout=job_timeout)
        d0 = disp.cpu_seconds()
        job = consumer.ask(op="job", dispatcher=addr, workers=n, timeout=job_timeout)
        d1 = disp.cpu_seconds()
        watched = [host.reply() for host in used]
        if job["seen"] < n or sum(w["with_task"] for w in watched) < n:
            raise RuntimeError(f"after {job_timeout:.0f} s, {job['seen']} of {n} workers had delivered and "
                               f"{sum(w['with_task'] for w in watched)} held their task")
        p.values["first_s"] = job["first"] - job["created"]
        p.values["assigned_s"] = max(w["assigned_at"] for w in watched) - job["created"]
        p.values["delivered_s"] = job["all"] - job["created"]
        p.values["assign_cpu_ms"] = 1000 * (d1 - d0)

        d0, t0 = disp.cpu_seconds(), time.monotonic()
        time.sleep(window)
        d1, t1 = disp.cpu_seconds(), time.monotonic()
        p.values["job_disp_pct"] = 100 * (d1 - d0) / (t1 - t0)
        p.values["job_disp_rss"] = disp.rss_mb()
        return p, info
    finally:
        for c in [consumer, *used, disp]:
            c.stop()
            children.remove(c)


def measure_supervision(n: int, sleepers: list[subprocess.Popen], work: Path, rounds: int) -> Point:
    """One round of `dsctl up`'s supervision poll and of its sample, over a local deployment of n workers."""
    from dsctl.orchestrator.supervision import Supervisor
    from dsctl.provisioners.local.launcher import Launcher
    from dsctl.provisioners.local.provider import LocalProvider
    from dsctl.provisioners.local.state import LocalDeployment, LocalNode
    from dsctl.provisioners.state import Deployment, Node

    run_dir = work / f"run-{n}"
    run_dir.mkdir(exist_ok=True)
    dep = Deployment(run_id=f"bench-{n}", provider="local", run_dir=str(run_dir), status="up",
                     dispatcher_address="127.0.0.1:1", state=LocalDeployment())
    roles = [("dispatcher", 0), ("trainer", 0)] + [("worker", i) for i in range(n)]
    for (role, index), proc in zip(roles, sleepers):
        ps = psutil.Process(proc.pid)
        dep.nodes.append(Node(role=role, index=index, address=f"127.0.0.1:{20000 + index}", pid=proc.pid,
                              pgid=os.getpgid(proc.pid), create_time=ps.create_time(),
                              log=str(run_dir / f"{role}-{index}.log"),
                              state=LocalNode(port=20000 + index, ready=True, served=True)))
    provider = LocalProvider()
    provider._launcher = Launcher(run_dir)  # as in `dsctl up`: its processes were forked by the launcher
    supervisor = Supervisor(provider, dep, fault_tolerant=False, events=lambda kind, message: None)
    supervisor.poll()
    provider.sample(dep)  # the first sample only sets each process's baseline
    c0 = time.process_time()
    for _ in range(rounds):
        state = supervisor.poll()
    c1 = time.process_time()
    for _ in range(rounds):
        samples = provider.sample(dep)
    c2 = time.process_time()
    if state.running != [0] or len(samples) != n + 2:
        raise RuntimeError(f"supervision saw {state.running} trainers running and sampled {len(samples)} of {n + 2}")
    p = Point(n)
    p.values["poll_ms"] = 1000 * (c1 - c0) / rounds
    p.values["sample_ms"] = 1000 * (c2 - c1) / rounds
    return p


# -- the fit and the report ---------------------------------------------------------------------------------------


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares a + b*N."""
    k = len(points)
    mx = sum(n for n, _ in points) / k
    my = sum(y for _, y in points) / k
    sxx = sum((n - mx) ** 2 for n, _ in points)
    b = sum((n - mx) * (y - my) for n, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def _ns(ns: list[int]) -> str:
    return ",".join(map(str, ns))


def report_fits(title: str, points: list[Point], metrics: list[tuple[str, str, str]], holdout: int,
                per_worker: dict[str, tuple[float, str]]) -> None:
    """For each metric: the fit on the smaller counts, each held-out count predicted against measured, 640."""
    ns = sorted(p.n for p in points)
    held = ns[-holdout:] if 0 < holdout < len(ns) - 1 else []
    fitted_on = [n for n in ns if n not in held]
    print(f"# {title}: a + b*N fitted on N={_ns(fitted_on)}, held out N={_ns(held) or 'none'}")
    for key, label, unit in metrics:
        a, b = fit([(p.n, p.values[key]) for p in points if p.n in fitted_on])
        extra = ""
        if key in per_worker:
            scale, what = per_worker[key]
            extra = f"; per worker {b * scale:.4f} {what}"
        print(f"fitted {label}: a = {a:.4f} {unit}, b = {b:.6f} {unit} per worker{extra} (fitted on N={_ns(fitted_on)})")
        for p in points:
            if p.n in held:
                pred, got = a + b * p.n, p.values[key]
                err = f"{100 * (pred - got) / abs(got):+.1f}%" if got else "n/a (measured 0)"
                print(f"held-out {label} N={p.n}: predicted {pred:.4f} {unit}, measured here {got:.4f} {unit}, "
                      f"error {err}")
        validated = f"validated on held-out N={_ns(held)}" if held else "not validated: no count held out"
        measured = [p.values[key] for p in points if p.n == TARGET_N]
        also = f"; measured here at N={TARGET_N}: {measured[0]:.4f} {unit}" if measured else ""
        print(f"predicted {label} N={TARGET_N}: {a + b * TARGET_N:.4f} {unit} (predicted, fitted on "
              f"N={_ns(fitted_on)}, {validated}){also}")


SERVICE_METRICS = [
    ("registration_s", "workers' start and registration", "s"),
    ("idle_disp_pct", "dispatcher CPU idle", "%core"),
    ("idle_disp_rss", "dispatcher RSS idle", "MB"),
    ("idle_workers_pct", "worker processes' CPU idle, all N", "%core"),
    ("first_s", "job: first element", "s"),
    ("assigned_s", "job: every worker holds its task", "s"),
    ("delivered_s", "job: every worker delivered", "s"),
    ("assign_cpu_ms", "job: dispatcher CPU from creation to every worker delivered", "ms"),
    ("job_disp_pct", "dispatcher CPU job held", "%core"),
    ("job_disp_rss", "dispatcher RSS job held", "MB"),
]
SUPERVISION_METRICS = [
    ("poll_ms", "supervision poll CPU per round", "ms"),
    ("sample_ms", "sample CPU per round", "ms"),
    ("pct", "supervision + sampling CPU at dsctl up's cadence", "%core"),
]


def heartbeat_ms(logs: list[Path]) -> int | None:
    """The interval the workers run with, as TensorFlow logs their config."""
    for log in logs:
        m = re.search(r"heartbeat_interval_ms: (\d+)", log.read_text(errors="replace"))
        if m:
            return int(m.group(1))
    return None


def run(args: argparse.Namespace, work: Path, children: list[Child], sleepers: list[subprocess.Popen],
        preloaded: list[Preloaded]) -> None:
    from dsctl.orchestrator.run import POLL_S, SAMPLE_S

    ns = sorted(set(args.workers))
    t_start = time.monotonic()
    service: list[Point] = []
    tf_version, interval = "?", None
    for n in ns:
        print(f"N={n}: the dispatcher and {n} workers ...", file=sys.stderr, flush=True)
        p, info = measure_service(n, args, work, preloaded[0], children)
        tf_version, interval = info["tensorflow"], info["heartbeat_ms"]
        service.append(p)
    sleepers += [subprocess.Popen(["sleep", "86400"], preexec_fn=_die_with_parent) for _ in range(max(ns) + 2)]
    supervision = []
    for n in ns:
        p = measure_supervision(n, sleepers, work, args.rounds)
        p.values["pct"] = 100 * (p.values["poll_ms"] / 1000 / POLL_S + p.values["sample_ms"] / 1000 / SAMPLE_S)
        supervision.append(p)
    stop_all(children, sleepers, preloaded)

    load = os.getloadavg()[0]
    print(f"# tf.data service control plane at scale: TensorFlow {tf_version}, per N a fresh dispatcher process, N real "
          f"WorkerServers in {args.hosts} processes and a consumer; heartbeat_interval_ms unset, TensorFlow's default: "
          f"{interval if interval is not None else '?'} ms (read from the workers' logs); windows {args.window:g} s; "
          f"{os.cpu_count()} cores, load average {load:.2f}; {time.monotonic() - t_start:.0f} s in all")
    print("# measured here, per N: start = workers' start and registration; idle = heartbeats only; job = one "
          "consumer, parallel_epochs over all N, timed from its creation; held = the job's iterator kept, idle")
    print("#            start s | idle: disp %core  disp MB  workers %core | job: first s  tasks s  delivered s  "
          "disp CPU ms | held: disp %core  disp MB")
    for p in service:
        v = p.values
        print(f"measured N={p.n:<4d} {v['registration_s']:8.3f} | {v['idle_disp_pct']:16.4f} {v['idle_disp_rss']:8.1f} "
              f"{v['idle_workers_pct']:17.4f} | {v['first_s']:12.3f} {v['assigned_s']:8.3f} {v['delivered_s']:12.3f} "
              f"{v['assign_cpu_ms']:12.1f} | {v['job_disp_pct']:16.4f} "
              f"{v['job_disp_rss']:8.1f}")
    hb = (interval or 30000) / 1000
    report_fits("the dispatcher", service, SERVICE_METRICS, args.holdout,
                {"idle_disp_pct": (hb * 10, "CPU-ms per heartbeat (b x heartbeat interval)"),
                 "idle_workers_pct": (hb * 10, "CPU-ms per heartbeat, worker side"),
                 "job_disp_pct": (hb * 10, "CPU-ms per heartbeat interval"),
                 "assign_cpu_ms": (1.0, "CPU-ms per task")})
    print(f"# dsctl's supervision, measured here: CPU of one round over N workers + a dispatcher + a trainer (N+2 "
          f"sleeping processes), {args.rounds} rounds; `dsctl up` polls every {POLL_S:g} s and samples every "
          f"{SAMPLE_S:g} s")
    for p in supervision:
        v = p.values
        print(f"measured N={p.n:<4d} poll {v['poll_ms']:.4f} ms, sample {v['sample_ms']:.4f} ms per round; "
              f"{v['pct']:.3f} %core at that cadence")
    report_fits("dsctl's supervision", supervision, SUPERVISION_METRICS, args.holdout, {})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", choices=["preloaded"], help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="N = 2,4,8 in 2 processes, 2 s windows (a test runs it)")
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64, 128, 256, 640])
    ap.add_argument("--window", type=float, default=30.0, help="seconds per measured window (default: one heartbeat)")
    ap.add_argument("--hosts", type=int, default=4, help="processes the workers are spread over")
    ap.add_argument("--holdout", type=int, default=2, help="the largest counts left out of the fit, to check it")
    ap.add_argument("--rounds", type=int, default=50, help="supervision rounds measured per N")
    ap.add_argument("--job-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.serve:
        _raise_fd_limit()
        serve_preloaded()
        return 0
    if args.quick:
        args.workers, args.window, args.hosts, args.holdout, args.rounds = [2, 4, 8], 2.0, 2, 1, 5
        args.job_timeout = 30.0
    _raise_fd_limit()

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    work = Path(tempfile.mkdtemp(prefix="dsctl-bench-dscale-"))
    children: list[Child] = []
    sleepers: list[subprocess.Popen] = []
    preloaded: list[Preloaded] = []
    ok = False
    try:
        preloaded.append(Preloaded(work))
        run(args, work, children, sleepers, preloaded)
        ok = True
    except KeyboardInterrupt:
        print("interrupted: every process the benchmark started is being stopped", file=sys.stderr)
        return 130
    finally:
        stop_all(children, sleepers, preloaded)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"the processes' logs are kept in {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
