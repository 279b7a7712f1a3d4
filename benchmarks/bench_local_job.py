"""Benchmark of a local dsctl job, every figure measured in this one run (run it, do not time tests).

    python benchmarks/bench_local_job.py [--batches 1500] [--out bench.json]

Prints:
  (a) harness overhead: the trainer harness's batches/s over a bare TensorFlow
      loop reading the same tf.data service dataset from the same deployment
      (goal >= 0.95);
  (b) seconds from launching `dsctl up` (two workers) to the first batch, beside
      the seconds of `python -c "import tensorflow"` (goal <= 2x);
  (c) CPU-seconds per batch of the `images` pipeline through the service over the
      same pipeline colocated (Cachew reports 1.3-1.5x more cores for the service).
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

REPO = Path(__file__).resolve().parents[1]

FAST_SPEC = """
name: bench-overhead
service: {workers: 2}
trainer: {steps: 1000000, warmup_batches: 0, window_s: 1.0}
pipeline: {builtin: synthetic, params: {batch_size: 32, feature_size: 64, epochs: null}}
"""

IMAGES_SPEC = """
name: bench-images
service: {workers: 1}
trainer: {steps: %(steps)d, warmup_batches: 10, model: {step_time_ms: 1}}
pipeline: {builtin: images, params: {batch_size: 32, num_files: 8, images_per_file: 64, image_size: 96, crop_size: 80,
                                     epochs: null}}
"""


def harness_overhead(batches: int, rounds: int = 5) -> dict:
    """Alternate bare loops and harness runs against one deployment; compare median rates."""
    from dsctl.orchestrator.home import dsctl_home
    from dsctl.provisioners import Deployment
    from dsctl.provisioners.local import LocalProvider
    from dsctl.runtime.metrics import MetricsWriter
    from dsctl.runtime.tfimport import import_tensorflow_quietly
    from dsctl.runtime.trainer import Harness, build_input
    from dsctl.specs import load_spec_text

    spec = load_spec_text(FAST_SPEC).spec
    prov = LocalProvider()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    dep = Deployment(run_id="bench-overhead", provider="local", run_dir=str(run_dir))
    quiet = lambda kind, msg: None  # noqa: E731
    import_tensorflow_quietly()
    from dsctl.runtime.models import make_step

    bare_rates, harness_rates = [], []
    try:
        prov.up(spec, dep, 2, quiet)
        prov.wait_ready(dep, quiet)
        step = make_step(spec.trainer.model)
        for _ in range(rounds):
            ds = build_input(spec, "service", 0, dep.dispatcher_address, dsctl_home() / "cache", REPO)
            it = iter(ds)
            for _ in range(50):  # warm the job up the same way for both
                next(it)
            t0 = time.perf_counter()
            for _ in range(batches):
                next(it)
            bare_rates.append(batches / (time.perf_counter() - t0))

            ds = build_input(spec, "service", 0, dep.dispatcher_address, dsctl_home() / "cache", REPO)
            writer = MetricsWriter(os.devnull, 0)
            it = iter(ds)
            for _ in range(50):
                next(it)
            harness = Harness(spec, writer, batches, None, None)
            t0 = time.perf_counter()
            harness.run(_Prefetched(it), step)
            harness_rates.append(batches / (time.perf_counter() - t0))
    finally:
        prov.down(dep, quiet)
    bare, harn = sorted(bare_rates)[len(bare_rates) // 2], sorted(harness_rates)[len(harness_rates) // 2]
    return {"bare_batches_per_s": bare, "harness_batches_per_s": harn, "ratio": harn / bare,
            "rounds": rounds, "batches_per_round": batches}


class _Prefetched:
    """Hands the harness an already-warm iterator, so both loops read a running job."""

    def __init__(self, it):
        self._it = it

    def __iter__(self):
        return self._it


def time_to_first_batch(home: Path) -> dict:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True)
    import_s = time.time() - t0
    env = {**os.environ, "DSCTL_HOME": str(home)}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "up", str(REPO / "specs/examples/quickstart.yaml"), "--json"],
                          check=True, capture_output=True, text=True, env=env)
    record = json.loads(proc.stdout)
    first_batch_wall = record["created_at"] + record["summary"]["time_to_first_batch_s"]
    up_s = first_batch_wall - t0
    return {"import_tensorflow_s": import_s, "up_to_first_batch_s": up_s, "ratio": up_s / import_s}


def images_cpu_per_batch(home: Path, steps: int) -> dict:
    env = {**os.environ, "DSCTL_HOME": str(home)}
    spec = home / "images.yaml"
    spec.write_text(IMAGES_SPEC % {"steps": steps})
    out = {}
    for mode in ("colocated", "service"):
        proc = subprocess.run([sys.executable, "-m", "dsctl.cli.main", "up", str(spec), "--mode", mode, "--json"],
                              check=True, capture_output=True, text=True, env=env)
        s = json.loads(proc.stdout)["summary"]
        cpu = sum(s.get(f"{role}_cpu_seconds", 0.0) for role in ("worker", "dispatcher", "trainer"))
        measured = s.get("batches", 0) - 10
        out[mode] = {"cpu_seconds": cpu, "batches": measured, "cpu_seconds_per_batch": cpu / measured,
                     "batches_per_s": s.get("batches_per_s")}
    out["ratio"] = out["service"]["cpu_seconds_per_batch"] / out["colocated"]["cpu_seconds_per_batch"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=3000, help="batches per overhead round")
    ap.add_argument("--image-steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dsctl-bench-"))
    os.environ["DSCTL_HOME"] = str(home)
    results = {
        "harness_overhead": harness_overhead(args.batches),
        "time_to_first_batch": time_to_first_batch(home),
        "images_cpu_per_batch": images_cpu_per_batch(home, args.image_steps),
    }
    a, b, c = results["harness_overhead"], results["time_to_first_batch"], results["images_cpu_per_batch"]
    print(f"(a) harness / bare TensorFlow loop: {a['harness_batches_per_s']:.0f} / {a['bare_batches_per_s']:.0f} batches/s "
          f"= {a['ratio']:.3f} (goal >= 0.95)")
    print(f"(b) dsctl up to first batch (2 workers): {b['up_to_first_batch_s']:.1f} s; import tensorflow: "
          f"{b['import_tensorflow_s']:.1f} s; ratio {b['ratio']:.2f}x (goal <= 2x)")
    print(f"(c) images pipeline CPU-seconds per batch: service {c['service']['cpu_seconds_per_batch']:.4f} "
          f"(workers + dispatcher + trainer), colocated {c['colocated']['cpu_seconds_per_batch']:.4f}; "
          f"ratio {c['ratio']:.2f}x (Cachew: 1.3-1.5x)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
