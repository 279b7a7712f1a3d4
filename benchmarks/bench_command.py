"""What dsctl.train's measurement costs a user's own training program (trainer.command) on the tf.data service.

    .venv/bin/python benchmarks/bench_command.py [--quick] [--rounds 8] [--batches N] [--warmup 20]

One TensorFlow DispatchServer and one WorkerServer (default configs, processes of
benchmarks/bench_data_path.py, both pinned to core 1) serve two pipelines in turn. Why two:
  - images: the `images` builtin as bench_keras.py serves it (40-pixel JPEGs, random 32 crop and
    flip, batch 32, uint8 on the wire, converted to float32 on the trainer, epochs null): a real
    input pipeline. A batch takes a few milliseconds, so a few microseconds of measurement per
    batch hide behind it; this is what a user's job looks like.
  - synthetic: the `synthetic` builtin with tiny elements (8 floats, batch 16, latency_ms 0,
    cpu_work 0, epochs null): batches arrive as fast as the service hands them over (about
    0.5 ms each here), and the trainer's core is nearly saturated by receiving them, so the
    per-batch cost of the measurement is as large a share of a batch as it gets: the worst case
    for the goal, where that cost is visible instead of hidden behind slow batches.

Each round runs, per pipeline, the same tiny training program (PROGRAM below, written to a temp
folder) twice, each time in a fresh process pinned to core 0, in alternating order. Both get
their dataset from `ds = dsctl.train.dataset()` inside a run: the benchmark sets DSCTL_TRAINER
itself (runtime/trainer_args.py), as runtime/command.py does for `dsctl up`, pointing at the
servers, at a spec JSON written here, mode service, a metrics file of its own, window_s 1 and
steps WARMUP + BATCHES. So both read the very same service dataset graph, each in a service job
of its own. Per batch both do the same small step, a reduce_sum of one tensor fetched to Python
(so the step is not zero). The arms differ only in the loop:
  - dsctl: `for batch in train.batches(ds)`: dsctl's measured loop (runtime/loop.py), which per
    batch reads the clock, counts and yields, writes a metrics window each second, samples the
    service client's queue fill every 0.1 s, and writes the end record. Its figure is the
    batches_per_s of the metrics `end` event: the batches after the warm-up, from the end of the
    warm-up batch to the end of the last batch.
  - bare: `for batch in iter(ds)`, a plain Python loop with no dsctl measurement, stopping after
    the same number of batches. It times itself where the measured loop does: from the end of
    batch WARMUP (the spec's warmup_batches) to the end of the last batch.

Why this timing is fair: both arms leave out the same warm-up (the service's first fetches and the
program's first ops), count the same batches and stop without fetching another. The program reads
time.perf_counter(), time.process_time() and time.thread_time() at the end of the step of batch
WARMUP and of the last batch, in both arms alike, so its figures span the same batches; in the
dsctl arm that span also holds the measurement's per-batch work, so the difference between the
arms is what the measurement costs. Two CPU figures are printed per configuration:
  - the process's CPU time (process_time): everything the trainer spent, TensorFlow's threads and
    the service client's included: the honest total, but those threads vary by up to a hundred
    microseconds per batch from run to run on this shared machine.
  - the loop's thread's CPU time (thread_time): the thread that iterates, where all of the
    measurement runs (runtime/loop.py works inside the generator, in the consumer's thread, and
    starts no thread of its own), without the other threads' noise. It still holds next()'s own
    work and waits, which shift by some microseconds either way when the loop is a little slower.
Both differences are small against their spread (in two full runs here: medians from 0 to 25 us
per batch, single rounds hundreds of us apart in the process's time and tens in the thread's), so
one more figure isolates the measurement itself: the measured loop alone (_loop_alone), in a
process of this file pinned to core 0: a MeasuredLoop over a list of ready batches against a bare
loop over the same list, alternating, in the thread's CPU time: the measurement's own work per
batch, with no service around it (a lower bound: it leaves out any effect the loop's work has on
the work around it, next()'s and the service client's).
(The dsctl arm's own clock, at the same instants, is printed per round beside its end event's
figure, as a check that the two agree.) After the last batch both write their figures and leave
with os._exit: destroying a tf.data service iterator waits on its outstanding requests (seconds,
at random; see bench_keras.py), outside any measurement but not worth waiting for. The servers
are shared by both arms and every round (a trainer that exits leaves its job's worker task idle:
checked, the worker used no CPU after it).

The machine is shared and has 2 cores, so the arms alternate (an even number of rounds by default,
so each arm goes first equally often) and the headline figures are medians of per-round ratios
dsctl / bare (goal >= 0.97) and of per-round CPU differences; medians of each arm are printed
beside them. The full run (8 rounds) takes about 5 minutes here, --quick (2 rounds, fewer
batches) about 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

SERVERS = str(Path(__file__).resolve().parent / "bench_data_path.py")  # plain DispatchServer and WorkerServer
TRAINER_CPU, SERVER_CPU = 0, 1
GOAL = 0.97
ARMS = ("dsctl", "bare")

# Each configuration: the builtin, its params, and the measured batches per arm (full, quick).
CONFIGS = {
    "images": {"builtin": "images", "batches": (1500, 400),
               "params": {"num_files": 4, "images_per_file": 64, "image_size": 40, "crop_size": 32,
                          "num_classes": 10, "batch_size": 32, "epochs": None}},
    "synthetic": {"builtin": "synthetic", "batches": (10000, 1500),
                  "params": {"feature_size": 8, "batch_size": 16, "latency_ms": 0, "cpu_work": 0, "epochs": None}},
}
LOOP_ALONE_BATCHES = {False: 50_000, True: 20_000}  # per repetition of _loop_alone: full, quick
SPEC = """
name: bench-command
service: {{workers: 1, processing_mode: parallel_epochs}}
trainer:
  command: python train.py
  steps: {steps}
  warmup_batches: {warmup}
  window_s: 1
pipeline: {{builtin: {builtin}, params: {params}}}
"""

PROGRAM = '''\
"""The training program both arms run (written by benchmarks/bench_command.py; DSCTL_TRAINER set by it).

    python train.py ARM WARMUP STEPS OUT.json

ARM dsctl iterates dsctl.train.batches(ds); ARM bare iterates the same dataset with a plain loop. Both do
the same step per batch and note the clock, the process's CPU time and this (the loop's) thread's CPU time
at the end of the step of batch WARMUP and of batch STEPS; the differences go to OUT.json.
"""
import json
import os
import sys
import time

import tensorflow as tf

from dsctl import train

arm, warmup, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ds = train.dataset()
key = "image" if "image" in ds.element_spec else "x"
marks = {}


def step(batch, n):
    """A small fixed step (a reduce_sum of one tensor, fetched to Python); the marks at batches WARMUP and STEPS."""
    tf.reduce_sum(batch[key]).numpy()
    if n == warmup or n == steps:
        marks[n] = (time.perf_counter(), time.process_time(), time.thread_time())


n = 0
if arm == "dsctl":
    for batch in train.batches(ds):  # stops after STEPS batches (DSCTL_TRAINER's steps); writes the end record
        n += 1
        step(batch, n)
else:
    iterator = iter(ds)  # what `for batch in ds` does, kept here so that its teardown comes after the figures
    for batch in iterator:
        n += 1
        step(batch, n)
        if n == steps:
            break
(t0, cpu0, loop0), (t1, cpu1, loop1) = marks[warmup], marks[steps]
with open(out, "w") as f:
    json.dump({"batches": n, "measured_batches": steps - warmup, "seconds": t1 - t0, "cpu_s": cpu1 - cpu0,
               "loop_cpu_s": loop1 - loop0}, f)
os._exit(0)  # destroying a service iterator waits on its outstanding requests; the figures are written
'''


def _pinned(cpu: int):
    return lambda: os.sched_setaffinity(0, {cpu})


RUNNING: list[subprocess.Popen] = []  # every process this benchmark started and has not reaped: killed on the way out


def _python(*args: str, cpu: int, env: dict | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.Popen([sys.executable, *args], env=env, preexec_fn=_pinned(cpu), **kw)
    RUNNING.append(proc)
    return proc


def _stop_all() -> None:
    while RUNNING:
        proc = RUNNING.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_dispatcher(work: Path) -> subprocess.Popen:
    """The dispatcher, a process of bench_data_path.py on core 1; it writes its port to work/port when it serves."""
    with open(work / "dispatcher.log", "w") as log:  # the child keeps its own copy of the descriptor
        return _python(SERVERS, "_raw-dispatcher", str(work / "port"), cpu=SERVER_CPU, stdout=log, stderr=log)


def start_worker(work: Path, dispatcher: subprocess.Popen) -> str:
    """Once the dispatcher serves, a worker (bench_data_path.py, core 1); returns the dispatcher's host:port."""
    port_file = work / "port"
    while not port_file.exists():
        if dispatcher.poll() is not None:
            raise SystemExit(f"the dispatcher exited:\n{(work / 'dispatcher.log').read_text()[-2000:]}")
        time.sleep(0.05)
    address = f"localhost:{port_file.read_text()}"
    with open(work / "worker.log", "w") as log:
        _python(SERVERS, "_raw-worker", address, cpu=SERVER_CPU, stdout=log, stderr=log)
    return address


def write_specs(work: Path, address: str, batches: dict[str, int], warmup: int) -> dict[str, dict]:
    """Per configuration, its spec JSON (what `dsctl up` hands a trainer) and what run_arm needs to run it."""
    from dsctl.specs import load_spec_text

    confs = {}
    for name, c in CONFIGS.items():
        steps = warmup + batches[name]
        spec = load_spec_text(SPEC.format(steps=steps, warmup=warmup, builtin=c["builtin"],
                                          params=json.dumps(c["params"])), f"<bench_command {name}>").spec
        spec_json = work / f"spec-{name}.json"
        spec_json.write_text(spec.model_dump_json())
        confs[name] = {"spec": spec_json, "dispatcher": address, "cache": work / "cache", "steps": steps,
                       "warmup": warmup, "batches": batches[name]}
    return confs


def run_arm(arm: str, conf: dict, work: Path, tag: str) -> dict:
    """One fresh trainer process running PROGRAM as `arm`; its batches/s and CPU-seconds per batch."""
    from dsctl.runtime.trainer_args import ENV_VAR, TrainerArgs

    metrics, out, log_path = work / f"{tag}.jsonl", work / f"{tag}.json", work / f"{tag}.log"
    args = TrainerArgs(spec=str(conf["spec"]), metrics=str(metrics), mode="service", dispatcher=conf["dispatcher"],
                       index=0, cache_dir=str(conf["cache"]), base_dir=str(work), steps=conf["steps"], window_s=1.0)
    with open(log_path, "w") as log:
        proc = _python(str(work / "train.py"), arm, str(conf["warmup"]), str(conf["steps"]), str(out),
                       cpu=TRAINER_CPU, env={ENV_VAR: args.to_env()}, cwd=work, stdout=log, stderr=log)
    got = _wait(proc, out, log_path, f"the {arm} trainer")
    if got["batches"] != conf["steps"]:
        raise SystemExit(f"the {arm} trainer read {got['batches']} batches, not {conf['steps']}")
    n = got["measured_batches"]
    result = {"own_bps": n / got["seconds"], "cpu_per_batch_s": got["cpu_s"] / n,
              "loop_cpu_per_batch_s": got["loop_cpu_s"] / n}
    if arm == "dsctl":
        end = next((r for r in map(json.loads, metrics.read_text().splitlines()) if r["event"] == "end"), None)
        if end is None or end["measured_batches"] != n:
            raise SystemExit(f"the dsctl trainer's end event is missing or counts other batches: {end}")
        result["bps"] = end["batches_per_s"]
    else:
        result["bps"] = result["own_bps"]
    return result


def _wait(proc: subprocess.Popen, out: Path, log_path: Path, what: str):
    """The JSON that `proc` wrote to `out`, once it has exited; its log's tail if it failed."""
    code = proc.wait()
    RUNNING.remove(proc)
    if code != 0 or not out.exists():
        raise SystemExit(f"{what} failed ({code}):\n{log_path.read_text()[-3000:]}")
    return json.loads(out.read_text())


def start_loop_alone(work: Path, batches: int) -> subprocess.Popen:
    """_loop_alone in a process of this file on core 0 (finish_loop_alone reads its figures)."""
    with open(work / "loop-alone.log", "w") as log:
        return _python(__file__, "_loop-alone", str(work / "loop-alone.json"), str(batches), cpu=TRAINER_CPU,
                       stdout=log, stderr=log)


def finish_loop_alone(work: Path, proc: subprocess.Popen) -> list[float]:
    """The measured loop's own CPU per batch, per repetition (seconds)."""
    return _wait(proc, work / "loop-alone.json", work / "loop-alone.log", "the loop-alone process")


def _loop_alone(out: str, batches: int, reps: int = 7) -> None:
    """A process of this file: runtime/loop.py's MeasuredLoop over a list of ready batches (the synthetic
    configuration's {id, x} tensors; no service, so nothing to wait for) against a bare loop over the same list,
    alternating, in this thread's CPU time: what the measurement itself costs per batch, with no tf.data service or
    service client around it to add their noise. (No queue-fill sampling: a list has no service client to read; it
    runs ten times a second, not per batch, and reads in tens of microseconds.)"""
    import tensorflow as tf

    from dsctl.runtime.loop import MeasuredLoop
    from dsctl.runtime.metrics import MetricsWriter

    data = [{"id": tf.zeros([16], tf.int64), "x": tf.zeros([16, 8])}] * batches
    extra = []
    for r in range(reps):
        t = time.thread_time()
        for _batch in data:
            pass
        bare = time.thread_time() - t
        loop = MeasuredLoop(MetricsWriter(f"{out}.{r}.jsonl", 0), steps=batches, duration_s=None, window_s=1.0,
                            warmup_batches=20)
        t = time.thread_time()
        for _batch in loop.run(data):
            pass
        measured = time.thread_time() - t
        loop.finish()
        extra.append((measured - bare) / batches)
    Path(out).write_text(json.dumps(extra))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="under 2 minutes: 2 rounds, fewer batches")
    ap.add_argument("--rounds", type=int, default=None, help="dsctl/bare pairs per configuration (default 8, quick 2)")
    ap.add_argument("--batches", type=int, default=None,
                    help="measured batches per arm, every configuration (default: images 1500, synthetic 10000; "
                         "quick 400 and 1500)")
    ap.add_argument("--warmup", type=int, default=20, help="batches left out first, in both arms (at least 1)")
    args = ap.parse_args()
    if args.warmup < 1:
        ap.error("--warmup must be at least 1: both arms start timing at the end of a warm-up batch")
    rounds = args.rounds or (2 if args.quick else 8)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.sched_setaffinity(0, {SERVER_CPU})  # this process only waits; keep it off the trainer's core
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill runs the finally below, as Ctrl-C does
    t0 = time.monotonic()

    from dsctl.runtime.pipelines import images
    from dsctl.specs.pipelines import ImagesParams

    work = Path(tempfile.mkdtemp(prefix="dsctl-bench-command-"))
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    try:
        alone = start_loop_alone(work, LOOP_ALONE_BATCHES[args.quick])  # core 0, while the servers start on core 1
        dispatcher = start_dispatcher(work)
        images.prepare(ImagesParams.model_validate(CONFIGS["images"]["params"]), work / "cache")  # meanwhile, here
        (work / "train.py").write_text(PROGRAM)
        address = start_worker(work, dispatcher)
        alone = finish_loop_alone(work, alone)  # done before any trainer runs on core 0
        batches = {name: args.batches or c["batches"][1 if args.quick else 0] for name, c in CONFIGS.items()}
        confs = write_specs(work, address, batches, args.warmup)
        for r in range(rounds):
            arms = ARMS if r % 2 == 0 else ARMS[::-1]
            for name, conf in confs.items():
                got = {arm: run_arm(arm, conf, work, f"{name}-{r}-{arm}") for arm in arms}
                results[name].append(got)
                d, b = got["dsctl"], got["bare"]
                print(f"# round {r + 1}, {name} ({arms[0]} first), measured here: dsctl {d['bps']:.1f} b/s (end "
                      f"event; {d['own_bps']:.1f} by the program's clock) / bare {b['bps']:.1f} b/s = "
                      f"{d['bps'] / b['bps']:.3f}; CPU per batch, process: dsctl {_us(d['cpu_per_batch_s'])}, bare "
                      f"{_us(b['cpu_per_batch_s'])}; loop's thread: dsctl {_us(d['loop_cpu_per_batch_s'])}, bare "
                      f"{_us(b['loop_cpu_per_batch_s'])}", flush=True)
    finally:
        _stop_all()  # the servers, and a trainer still running (Ctrl-C, SIGTERM, a failure)
        shutil.rmtree(work, ignore_errors=True)
    report(results, alone, batches, rounds, args.warmup, time.monotonic() - t0)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def report(results: dict[str, list[dict]], alone: list[float], batches: dict[str, int], rounds: int, warmup: int,
           seconds: float) -> None:
    """Per configuration its medians; then dsctl / bare against the goal, and the measurement's CPU per batch."""
    load = os.getloadavg()
    print(f"# {sys.executable} {' '.join(sys.argv)}")
    print(f"# the same program (a reduce_sum per batch) reading each pipeline through 1 tf.data service worker; "
          f"trainer on core {TRAINER_CPU}, dispatcher and worker on core {SERVER_CPU}; {rounds} rounds, "
          f"{warmup} warm-up batches; {seconds:.0f} s; load average at the end {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}")
    for name, rows in results.items():
        c = CONFIGS[name]
        d, b = ({k: median(g[arm][k] for g in rows) for k in rows[0][arm]} for arm in ARMS)
        print(f"{name} ({c['builtin']} {json.dumps(c['params'])}, {batches[name]} batches per arm), medians "
              f"(measured here): dsctl.train.batches {d['bps']:.1f} b/s, CPU per batch {_us(d['cpu_per_batch_s'])} "
              f"(loop's thread {_us(d['loop_cpu_per_batch_s'])}); bare loop {b['bps']:.1f} b/s, CPU per batch "
              f"{_us(b['cpu_per_batch_s'])} (loop's thread {_us(b['loop_cpu_per_batch_s'])})")
    for name, rows in results.items():
        ratios = [g["dsctl"]["bps"] / g["bare"]["bps"] for g in rows]
        ratio = median(ratios)
        print(f"{name}: dsctl / bare batches/s, median of per-round ratios (measured here) {ratio:.3f} "
              f"(rounds {min(ratios):.3f}-{max(ratios):.3f}; goal >= {GOAL}: "
              f"{'met' if ratio >= GOAL else 'NOT met'})")
        for key, what in (("cpu_per_batch_s", "the process's"), ("loop_cpu_per_batch_s", "the loop's thread's")):
            extra = [g["dsctl"][key] - g["bare"][key] for g in rows]
            share = [x * g["dsctl"]["bps"] for x, g in zip(extra, rows)]  # CPU-s per second: a share of a core
            print(f"{name}: the measurement's CPU per batch, dsctl - bare in {what} CPU time, median of per-round "
                  f"differences (measured here) {_us(median(extra))} (rounds {_us(min(extra))} to {_us(max(extra))}), "
                  f"{median(share) * 100:.2f}% of a core at dsctl's batch rate")
    at = ", ".join(f"{median(alone) * median(g['dsctl']['bps'] for g in rows) * 100:.2f}% of a core at {name}'s "
                   f"dsctl rate" for name, rows in results.items())
    print(f"the measured loop alone (runtime/loop.py over ready batches, no service), its own CPU per batch over a "
          f"bare loop's, median of {len(alone)} repetitions (measured here): {_us(median(alone))} (repetitions "
          f"{_us(min(alone))} to {_us(max(alone))}); {at}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_loop-alone":
        _loop_alone(sys.argv[2], int(sys.argv[3]))
    else:
        main()
