"""Do other trainers' in-process (COLOCATED) workers receive tasks, or produce elements nobody reads? Measured here.

    python benchmarks/bench_colocated_prefetch.py [--seconds 30] [--step-ms 5] [--modes parallel_epochs,distributed_epoch]
                                                  [--no-control] [--out prefetch.json]

Hybrid placement (runtime/placement.py) starts tf.data service workers tagged COLOCATED inside each trainer process;
each trainer reads with target_workers AUTO, so it reads its own in-process workers and the untagged remote ones and
never another trainer's. But the dispatcher still gives every worker a task for every job: this measures what those
tasks cost. Per processing mode, one run of these processes:
  - a DispatchServer (in this process);
  - one remote worker, untagged, in a process of its own (as runtime/worker.py configures it);
  - two trainers, A and B, each a process that starts one COLOCATED worker with dsctl's own placement.start, builds
    its job (no job_name: two jobs) as dsctl's hybrid trainer does (placement.producer_tagged, distribute with
    placement.TARGET_WORKERS, placement.counted), and reads it for --seconds with a --step-ms sleep per batch (a
    model busy on an accelerator), both at the same time, while its workers stay up until both have finished.
Measured, per worker: the tasks it held (WorkerServer._num_tasks(), polled every 50 ms in its own process; the most
at once) and the batches it produced for each job, counted where they are made (the job's map runs tf.print with the
job's label, into the stderr of the process that runs it), including those nobody read; and per trainer, the batches
it received from each producing process (placement.counted's table, as the trainer's `placement` record).
"produced, unread" is produced minus received: what sat in buffers (the worker's and the client's prefetch) when the
trainer stopped reading, or was made for nobody.
A control run (left out with --no-control) reads with target_workers ANY in parallel_epochs, where each trainer does
read the other's in-process worker: it shows that the counting sees production for the other job when there is some.

Two cores, shared: the batch rates mean little; the counts of tasks and of batches produced for the other job are
the finding. A full run (two modes and the control, 30 s each) takes about 3 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAINERS = ("A", "B")
BATCH = 16
POLL_S = 0.05


# -- the processes ------------------------------------------------------------------------------------------------


def _ended(run: Path, parent: int) -> bool:
    """The run is over: the benchmark said so, or it is gone (a process of its never outlives it)."""
    return (run / "end").exists() or os.getppid() != parent


def _poll_tasks(servers, until) -> tuple[int, list[int]]:
    """(most tasks any of `servers` held at once, the distinct counts seen in order) until `until()` is true."""
    most, seen = 0, [0]
    while not until():
        n = sum(s._num_tasks() for s in servers)
        most = max(most, n)
        if n != seen[-1]:
            seen.append(n)
        time.sleep(POLL_S)
    return most, seen


def remote_worker(run: Path, dispatcher: str) -> None:
    """An untagged worker (runtime/worker.py's configuration), its tasks polled until the run's `end` file."""
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    server = tf.data.experimental.service.WorkerServer(service_config_pb2.WorkerConfig(
        dispatcher_address=dispatcher, worker_address="localhost:%port%", port=0, protocol="grpc",
        heartbeat_interval_ms=1000))
    parent = os.getppid()
    most, seen = _poll_tasks([server], lambda: _ended(run, parent))
    (run / "remote.json").write_text(json.dumps({"pid": os.getpid(), "most_tasks": most, "task_counts": seen}))
    server.stop()


def trainer(run: Path, dispatcher: str, name: str, mode: str, target: str, seconds: float, step_ms: float) -> None:
    """A hybrid trainer built from dsctl's own placement module: its in-process worker, its job, its counts."""
    import threading

    import tensorflow as tf

    from dsctl.runtime import placement
    from dsctl.runtime.trainer import SHARDING

    parent = os.getppid()
    placement.start(dispatcher, 1)
    assert placement._STARTED is not None
    servers = list(placement._STARTED.servers)
    polled: dict = {}
    poller = threading.Thread(target=lambda: polled.update(
        zip(("most_tasks", "task_counts"), _poll_tasks(servers, lambda: _ended(run, parent)))), daemon=True)
    poller.start()
    while not (run / "go").exists():
        if _ended(run, parent):
            os._exit(1)
        time.sleep(POLL_S)

    def produced(batch):
        tf.print("PROD", name, output_stream=sys.stderr)  # runs in the producing process: counted from its stderr
        return batch

    service = tf.data.experimental.service
    ds = tf.data.Dataset.range(10**12).batch(BATCH).map(produced)
    ds = placement.producer_tagged(ds).apply(service.distribute(
        processing_mode=getattr(service.ShardingPolicy, SHARDING[mode]), service=f"grpc://{dispatcher}",
        target_workers=target))
    ds = placement.counted(ds)
    read, deadline = 0, time.monotonic() + seconds
    iterator = iter(ds)
    while time.monotonic() < deadline:
        if _ended(run, parent):
            os._exit(1)
        next(iterator)
        read += 1
        time.sleep(step_ms / 1000)
    records: list[dict] = []
    placement.report(lambda event, **fields: records.append(fields))
    (run / f"trainer-{name}.json").write_text(json.dumps({"pid": os.getpid(), "read": read,
                                                          "by_producer": records[0]["by_producer"]}))
    while not _ended(run, parent):  # the in-process worker stays up (for the other job too) until both are done
        time.sleep(POLL_S)
    poller.join()
    (run / f"tasks-{name}.json").write_text(json.dumps(polled))
    placement.stop()
    os._exit(0)  # without destroying the service iterator (slow; runtime/trainer.py's _exit does the same)


# -- one measured run -------------------------------------------------------------------------------------------------


def _spawn(run: Path, role: str, *args: str) -> subprocess.Popen:
    err = open(run / f"{role}.err", "w")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, __file__, "--role", role, "--run", str(run), *args], stderr=err,
                            stdout=subprocess.DEVNULL, env=env)


def _wait(pred, timeout: float, what: str, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit(f"a process of the benchmark failed while waiting for {what}; see its .err file")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def prod_counts(err: Path) -> dict[str, int]:
    """Batches produced in the process whose stderr is `err`, by job label ("PROD A" lines)."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"^PROD (\w+)$", err.read_text(), re.MULTILINE):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def measure(mode: str, target: str, seconds: float, step_ms: float) -> dict:
    """One run (a dispatcher, a remote worker, two hybrid trainers); per worker, its tasks and batches by job."""
    import tensorflow as tf

    run = Path(tempfile.mkdtemp(prefix="dsctl-prefetch-"))
    dispatcher = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=0))
    address = dispatcher.target.removeprefix("grpc://")
    procs = [_spawn(run, "remote", "--dispatcher", address)]
    procs += [_spawn(run, f"trainer-{n}", "--dispatcher", address, "--name", n, "--mode", mode, "--target", target,
                     "--seconds", str(seconds), "--step-ms", str(step_ms)) for n in TRAINERS]
    try:
        _wait(lambda: dispatcher._num_workers() >= 3, 180, "the three workers to register", procs)
        (run / "go").touch()  # every worker is known before either job starts: each gets a task for both jobs
        _wait(lambda: all((run / f"trainer-{n}.json").exists() for n in TRAINERS), seconds + 180, "the trainers",
              procs)
        (run / "end").touch()
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    got = {n: json.loads((run / f"trainer-{n}.json").read_text()) for n in TRAINERS}
    tasks = {n: json.loads((run / f"tasks-{n}.json").read_text()) for n in TRAINERS}
    remote = json.loads((run / "remote.json").read_text())
    host = __import__("socket").gethostname()
    workers = {f"{n}'s in-process": (f"{host}:{got[n]['pid']}", tasks[n]["most_tasks"], tasks[n]["task_counts"],
                                     prod_counts(run / f"trainer-{n}.err")) for n in TRAINERS}
    workers["remote"] = (f"{host}:{remote['pid']}", remote["most_tasks"], remote["task_counts"],
                         prod_counts(run / "remote.err"))
    rows = []
    for label, (proc, most, seen, made) in workers.items():
        rows.append({"worker": label, "process": proc, "most_tasks": most, "task_counts": seen,
                     "produced": {n: made.get(n, 0) for n in TRAINERS},
                     "received": {n: got[n]["by_producer"].get(proc, 0) for n in TRAINERS}})
    return {"mode": mode, "target": target, "seconds": seconds, "step_ms": step_ms, "batch": BATCH,
            "read": {n: got[n]["read"] for n in TRAINERS}, "workers": rows, "dir": str(run)}


def other_jobs(result: dict) -> tuple[int, int, int]:
    """(tasks the in-process workers held for the other trainer's job, batches they produced for it, batches they
    produced in all): the figures the docs quote."""
    tasks = other = total = 0
    for row in result["workers"]:
        owner = row["worker"].split("'")[0]
        if owner in TRAINERS:
            tasks += max(row["most_tasks"] - 1, 0)  # its own job's task is one
            other += sum(v for n, v in row["produced"].items() if n != owner)
            total += sum(row["produced"].values())
    return tasks, other, total


def show(result: dict) -> None:
    print(f"\n{result['mode']}, target_workers {result['target']}: each trainer read {result['seconds']:g} s with a "
          f"{result['step_ms']:g} ms step per batch of {result['batch']} (read: A {result['read']['A']}, "
          f"B {result['read']['B']} batches) [measured here]")
    print(f"  {'worker':<16}{'tasks (most)':>13}{'made for A':>12}{'made for B':>12}{'read by A':>11}{'read by B':>11}"
          f"{'made, unread':>14}")
    for row in result["workers"]:
        made, recv = row["produced"], row["received"]
        unread = sum(made.values()) - sum(recv.values())
        print(f"  {row['worker']:<16}{row['most_tasks']:>13}{made['A']:>12}{made['B']:>12}{recv['A']:>11}"
              f"{recv['B']:>11}{unread:>14}")
    tasks, other, total = other_jobs(result)
    print(f"  in-process workers: {tasks} task(s) held for the other trainer's job; {other} of the {total} batches "
          f"they made were for the other trainer's job [measured here]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each trainer reads, per mode")
    ap.add_argument("--step-ms", type=float, default=5.0, help="the trainer's step per batch (a sleep)")
    ap.add_argument("--modes", default="parallel_epochs,distributed_epoch")
    ap.add_argument("--no-control", action="store_true", help="skip the control run with target_workers ANY")
    ap.add_argument("--out", default=None, help="write every figure as JSON here")
    ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dispatcher", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--name", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--target", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "remote":
        return remote_worker(Path(a.run), a.dispatcher)
    if a.role is not None:
        return trainer(Path(a.run), a.dispatcher, a.name, a.mode, a.target, a.seconds, a.step_ms)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dsctl.runtime import placement

    runs = [(m, placement.TARGET_WORKERS) for m in a.modes.split(",")]
    if not a.no_control:
        runs.append(("parallel_epochs", "ANY"))
    results = []
    for mode, target in runs:
        result = measure(mode, target, a.seconds, a.step_ms)
        show(result)
        results.append(result)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
