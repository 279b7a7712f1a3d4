"""What dsctl's keras trainer costs over a bare `model.fit` on the same tf.data service dataset (issue 14).

    .venv/bin/python benchmarks/bench_keras.py [--quick] [--rounds 7] [--steps 200] [--warmup 30]

One TensorFlow DispatchServer and one WorkerServer (default configs, each a process of this
file, both pinned to core 1) serve the `images` builtin (40-pixel JPEGs, random 32 crop and
flip, batch 32, uint8 on the wire). Each round trains the compact ResNet example
(specs/examples/models/compact_resnet.py) from scratch twice, each time in a fresh process
pinned to core 0, in alternating order:
  - dsctl: `python -m dsctl.runtime.trainer --mode service ...`, the command `dsctl up` starts
    for a trainer, on the spec below: its keras runner builds the model under the default
    strategy, wraps the dataset in the input meter (runtime/keras_input.py) and fits with its
    Meter callback writing windows (runtime/keras_runner.py). Its figure is the batches_per_s
    of the metrics `end` event.
  - raw: a plain script with no dsctl harness: the pipeline's own `build`, `distribute`, its
    `finish`, `.map(lambda e: (e["image"], e["label"]))`, and
    `model.fit(ds, steps_per_epoch=STEPS, epochs=1, verbose=0)` on the same model function.

Why this timing is fair: both start measuring where dsctl's harness does, at the beginning
of batch WARMUP (the tracing of the train step and the service's first fetches stay out),
and stop once `fit` has returned. dsctl reads that instant in its Meter callback; the raw
script needs one too, so it passes a callback that only implements `on_train_batch_begin`
and compares the batch number (a Python call per batch, under a microsecond against steps
of several milliseconds). Splitting the raw run into two fits instead would start a second
service job, with its own cold start, inside the measurement. The servers are shared by
both arms and every round; each trainer process starts its own job on them.

Fit's own end is printed apart: when `fit` returns, Keras drops its iterator over the service
dataset, and destroying a tf.data service iterator waits on its outstanding requests, which
here took from under a second to over 15 s, at random. dsctl's keras runner writes its end
event when the last batch is done (on_train_end) and its trainer exits before that teardown; a
bare `fit` returns after it. So two figures are printed per arm: to the end event (dsctl, what
`dsctl up` reports) or fit's return (raw), and to the end of the last batch (dsctl's windows: the
last one's start plus its step and input time; the raw script's `on_train_end`), which leaves
the teardown out of both and is the fair comparison.

The machine is shared and has 2 cores, so the arms alternate and the figure is the median of
the per-round ratios dsctl / raw (goal >= 0.97); medians of each arm are printed beside it.
A step takes about 0.1 s on one core here, so the full run (7 rounds of 200 steps) takes about
7 minutes and --quick (3 rounds of 100 steps) about 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "specs" / "examples"
SERVERS = str(Path(__file__).resolve().parent / "bench_data_path.py")  # its plain DispatchServer and WorkerServer processes
TRAINER_CPU, SERVER_CPU = 0, 1
PARAMS = {"num_files": 4, "images_per_file": 64, "image_size": 40, "crop_size": 32, "num_classes": 10,
          "batch_size": 32, "epochs": None}
MODEL_PARAMS = {"crop_size": 32, "num_classes": 10}
SPEC = """
name: bench-keras
service: {{workers: 1, processing_mode: parallel_epochs}}
trainer:
  model: {{kind: keras, entrypoint: "models.compact_resnet:build_model", params: {model_params}}}
  steps: {steps}
  warmup_batches: {warmup}
pipeline: {{builtin: images, params: {params}}}
"""


def _pinned(cpu: int):
    return lambda: os.sched_setaffinity(0, {cpu})


def _python(*args: str, cpu: int, **kw) -> subprocess.Popen:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, *args], env=env, preexec_fn=_pinned(cpu), **kw)


def start_servers(work: Path) -> tuple[str, list[subprocess.Popen]]:
    """A dispatcher and a worker, processes of this file on core 1; returns the dispatcher's host:port."""
    log = open(work / "servers.log", "w")
    port_file = work / "port"
    d = _python(SERVERS, "_raw-dispatcher", str(port_file), cpu=SERVER_CPU, stdout=log, stderr=log)
    while not port_file.exists():
        if d.poll() is not None:
            raise SystemExit(f"the dispatcher exited:\n{(work / 'servers.log').read_text()[-2000:]}")
        time.sleep(0.05)
    address = f"localhost:{port_file.read_text()}"
    w = _python(SERVERS, "_raw-worker", address, cpu=SERVER_CPU, stdout=log, stderr=log)
    return address, [d, w]


def run_dsctl(work: Path, spec_json: Path, cache: Path, address: str, tag: str) -> dict:
    """The trainer harness as `dsctl up` runs it: batches/s from its metrics `end` event ("fit"), and to the
    end of its last batch ("batches"), from its windows: the last window's start plus the time it spent in
    steps and waiting for input (the Meter callback's own account of when each execution ended)."""
    metrics = work / f"{tag}.jsonl"
    proc = _python("-m", "dsctl.runtime.trainer", "--spec", str(spec_json), "--mode", "service", "--index", "0",
                   "--metrics", str(metrics), "--cache-dir", str(cache), "--base-dir", str(EXAMPLES),
                   "--dispatcher", address, cpu=TRAINER_CPU, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate()
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    end = next((r for r in records if r["event"] == "end"), None)
    if proc.returncode != 0 or end is None:
        raise SystemExit(f"the dsctl trainer failed ({proc.returncode}):\n{err[-3000:]}")
    measured = [r for r in records if r["event"] == "window" and not r["warmup"]]
    last = measured[-1]
    seconds = last["t_start"] + last["step_s"] + last["input_wait_s"] - measured[0]["t_start"]
    return {"fit": end["batches_per_s"], "batches": end["measured_batches"] / seconds,
            "teardown_s": end["measured_s"] - seconds}


def run_raw(conf: dict) -> dict:
    proc = _python(__file__, "_raw", json.dumps(conf), cpu=TRAINER_CPU, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the raw fit failed ({proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


# -- processes of this file --------------------------------------------------------------------------------------




def _raw(conf: dict) -> None:
    """The bare `model.fit`: the same dataset graph and model, no dsctl harness, callback or meter."""
    import keras
    import tensorflow as tf

    from dsctl.runtime.pipelines import images
    from dsctl.specs.pipelines import ImagesParams

    sys.path.insert(0, str(EXAMPLES))
    from models.compact_resnet import build_model

    p = ImagesParams.model_validate(conf["params"])
    ds = images.build(p, conf["cache"]).apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=f"grpc://{conf['dispatcher']}"))
    ds = images.finish(ds, p).map(lambda e: (e["image"], e["label"]))
    model = build_model(**MODEL_PARAMS)
    warmup, steps = conf["warmup"], conf["steps"]

    class Mark(keras.callbacks.Callback):
        """Notes the beginning of batch `warmup` and the end of training, as dsctl's Meter does."""

        started = ended = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                self.started = time.perf_counter()

        def on_train_end(self, logs=None):
            self.ended = time.perf_counter()

    mark = Mark()
    model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[mark])
    returned = time.perf_counter()
    n = steps - warmup
    print(json.dumps({"fit": n / (returned - mark.started), "batches": n / (mark.ended - mark.started),
                      "teardown_s": returned - mark.ended}), flush=True)
    os._exit(0)  # destroying a service iterator waits on its outstanding requests


# -- the run -----------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about 2 minutes: 3 rounds of 100 steps")
    ap.add_argument("--rounds", type=int, default=None, help="a/b pairs (default 7, quick 3)")
    ap.add_argument("--steps", type=int, default=None, help="steps per fit (default 200, quick 100)")
    ap.add_argument("--warmup", type=int, default=30, help="batches left out first, in both arms")
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 7)
    steps = args.steps or (100 if args.quick else 200)
    os.sched_setaffinity(0, {SERVER_CPU})  # this process only waits; keep it off the trainer's core
    t0 = time.monotonic()

    from dsctl.runtime.pipelines import images
    from dsctl.specs import load_spec_text
    from dsctl.specs.pipelines import ImagesParams

    work = Path(tempfile.mkdtemp(prefix="dsctl-bench-keras-"))
    cache = work / "cache"
    images.prepare(ImagesParams.model_validate(PARAMS), cache)  # generated once, before anything is timed
    spec = load_spec_text(SPEC.format(steps=steps, warmup=args.warmup, params=json.dumps(PARAMS),
                                      model_params=json.dumps(MODEL_PARAMS)), "<bench_keras>").spec
    spec_json = work / "spec.json"
    spec_json.write_text(spec.model_dump_json())
    address, servers = start_servers(work)
    conf = {"params": PARAMS, "cache": str(cache), "dispatcher": address, "steps": steps, "warmup": args.warmup}
    results = []
    try:
        for r in range(rounds):
            arms = ("dsctl", "raw") if r % 2 == 0 else ("raw", "dsctl")
            got = {}
            for arm in arms:
                got[arm] = run_dsctl(work, spec_json, cache, address, f"dsctl-{r}") if arm == "dsctl" else run_raw(conf)
            results.append(got)
            d, w = got["dsctl"], got["raw"]
            print(f"# round {r + 1} ({arms[0]} first): to fit's return dsctl {d['fit']:.2f} / raw {w['fit']:.2f} b/s "
                  f"= {d['fit'] / w['fit']:.3f}; to the last batch dsctl {d['batches']:.2f} / raw {w['batches']:.2f} b/s "
                  f"= {d['batches'] / w['batches']:.3f}; fit's end after the last batch: dsctl {d['teardown_s']:.1f} s, "
                  f"raw {w['teardown_s']:.1f} s", flush=True)
    finally:
        for s in servers:
            s.kill()
            s.wait()
    load = os.getloadavg()
    print(f"# {sys.executable} {' '.join(sys.argv)}")
    print(f"# compact ResNet on `images` (image_size 40, crop 32, batch 32) through 1 tf.data service worker; "
          f"trainer on core {TRAINER_CPU}, dispatcher and worker on core {SERVER_CPU}; {rounds} rounds of {steps} "
          f"steps, {args.warmup} warm-up; {time.monotonic() - t0:.0f} s; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for key, what in (("fit", "to fit's return (dsctl: its metrics end event)"),
                      ("batches", "to the end of the last batch (fit's own end left out)")):
        ratios = [g["dsctl"][key] / g["raw"][key] for g in results]
        ratio = median(ratios)
        print(f"# {what}, medians (measured here): dsctl {median(g['dsctl'][key] for g in results):.2f} b/s, "
              f"bare model.fit {median(g['raw'][key] for g in results):.2f} b/s; dsctl / bare, median of per-round "
              f"ratios {ratio:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}; goal >= 0.97: "
              f"{'met' if ratio >= 0.97 else 'NOT met'})")
    for arm in ("dsctl", "raw"):
        tail = sorted(g[arm]["teardown_s"] for g in results)
        print(f"# fit's end after the last batch (service iterator teardown), {arm} (measured here): median "
              f"{median(tail):.1f} s, max {tail[-1]:.1f} s")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_raw":
        _raw(json.loads(sys.argv[2]))
    else:
        main()
