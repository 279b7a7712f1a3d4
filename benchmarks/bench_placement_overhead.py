"""What hybrid placement's per-producer counting costs: batches/s with and without it, measured in one run.

    python benchmarks/bench_placement_overhead.py [--seconds 8] [--rounds 3] [--batch 64] [--out overhead.json]

With service.placement: hybrid, every element is tagged where it is made with the producing process ("host:pid",
two reads of /proc: runtime/placement.py producer_tagged) and counted per producer in the trainer, in a TensorFlow
table, the tag dropped (placement.counted). Both maps are on the data path of every batch. Measured here, the same
pipeline read as fast as one consumer takes it (no model step), with and without the two maps, alternating in
--rounds rounds of --seconds each (medians reported):
  - in-process: the pipeline alone, no service (the maps' own cost, the least noisy figure);
  - service: through a DispatchServer and one WorkerServer in this process, distribute(target_workers AUTO) as the
    hybrid trainer reads; the tagging runs in the worker, the counting in the client.
The pipeline is the cheapest there is (Dataset.range batched by --batch, int64), so the ratio is the worst case: the
cost per batch (microseconds) is what to compare with a real pipeline's batch time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from statistics import median


def rate(ds, seconds: float, keep: list) -> float:
    """Batches/s reading `ds` for `seconds`, after 20 warm-up batches; the iterator is kept in `keep` (destroying
    a service iterator waits on its outstanding requests)."""
    iterator = iter(ds)
    keep.append(iterator)
    for _ in range(20):
        next(iterator)
    n, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        next(iterator)
        n += 1
        if n % 64 == 0 and time.perf_counter() >= deadline:
            return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from dsctl.runtime import placement

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.removeprefix("grpc://")
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=address))

    def pipeline():
        return tf.data.Dataset.range(10**12).batch(a.batch)

    def distribute(ds):
        return ds.apply(service.distribute(processing_mode=service.ShardingPolicy.OFF, service=dispatcher.target,
                                           target_workers=placement.TARGET_WORKERS))

    builds = {
        ("in-process", "plain"): lambda: pipeline(),
        ("in-process", "counted"): lambda: placement.counted(placement.producer_tagged(pipeline())),
        ("service", "plain"): lambda: distribute(pipeline()),
        ("service", "counted"): lambda: placement.counted(distribute(placement.producer_tagged(pipeline()))),
    }
    keep: list = []
    rates: dict[tuple[str, str], list[float]] = {k: [] for k in builds}
    for r in range(a.rounds):
        for key, build in builds.items():
            rates[key].append(rate(build(), a.seconds, keep))
            print(f"  round {r + 1}: {key[0]:<10} {key[1]:<8} {rates[key][-1]:>10.0f} batches/s", flush=True)
    print(f"\nPer-producer counting (runtime/placement.py): batches of {a.batch} int64 from Dataset.range, read as fast "
          f"as one consumer takes them; medians of {a.rounds} rounds of {a.seconds:g} s [measured here]")
    out = {}
    for where in ("in-process", "service"):
        plain, counted = median(rates[(where, "plain")]), median(rates[(where, "counted")])
        cost_us = (1 / counted - 1 / plain) * 1e6
        ratios = [c / p for p, c in zip(rates[(where, "plain")], rates[(where, "counted")])]
        out[where] = {"plain_bps": plain, "counted_bps": counted, "ratio": counted / plain, "cost_us": cost_us,
                      "round_ratios": ratios}
        print(f"  {where:<10} without {plain:>9.0f} b/s   with {counted:>9.0f} b/s   ratio {counted / plain:.3f} "
              f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})   {cost_us:+.0f} us per batch")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
    worker.stop()
    os._exit(0)  # without destroying the kept service iterators


if __name__ == "__main__":
    main()
