"""Benchmark of Cachew's scale-down signal as dsctl measures it: the client's result-queue fill.

    python benchmarks/bench_queue_fill.py [--workers 4] [--batches 150]

One dispatcher and N workers in this process, each element 5 ms of latency with no CPU
(SleepDataset), batches of 8: N workers serve N x 25 batches/s. A consumer whose step is
10 ms (the knee for 4 workers), then 20 ms (a model twice as slow: the workers now outpace it)
reads through the service with the client buffer autotuned and fixed at 32 (what dsctl uses
under the cachew policy). Prints, measured in this run:
  - the mean queue fill (elements buffered in the client, read as runtime/queuefill.py does)
    at each step time, and its rise: Cachew removes a worker above +40%;
  - the cost of one read of the iterator's autotuning model, and that cost at the harness's
    sampling interval (0.1 s) as a fraction of one core.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def run(tf, dispatcher: str, buffer: int | None, batches: int) -> dict:
    from tensorflow.python.data.experimental.ops.testing import sleep

    from dsctl.runtime.queuefill import read_model_fill

    ds = tf.data.Dataset.range(10**9).apply(sleep(5000)).batch(8)
    ds = ds.apply(tf.data.experimental.service.distribute("parallel_epochs", dispatcher,
                                                           max_outstanding_requests=buffer))
    iterator = iter(ds)
    read = read_model_fill(iterator)
    fills, costs = {}, []
    for step_ms in (10, 10, 20):  # the first 10 ms phase warms up and is overwritten
        samples = []
        for _ in range(batches):
            next(iterator)
            time.sleep(step_ms / 1e3)
            a = time.perf_counter()
            samples.append(read())
            costs.append(time.perf_counter() - a)
        fills[step_ms] = sum(samples) / len(samples)
    return {"fills": fills, "read_s": sorted(costs)[len(costs) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batches", type=int, default=150)
    args = ap.parse_args()
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(args.workers)]
    print(f"{args.workers} workers of 25 batches/s each; consumer step 10 ms, then 20 ms (measured here)")
    for label, buffer in (("autotuned buffer", None), ("buffer 32 (dsctl under cachew)", 32)):
        r = run(tf, dispatcher.target, buffer, args.batches)
        at_knee, slower = r["fills"][10], r["fills"][20]
        rise = (slower - at_knee) / at_knee if at_knee else float("inf")
        fires = "fires" if rise > 0.40 and slower - at_knee >= 1.0 else "does not fire"
        print(f"  {label:32s} queue fill {at_knee:5.1f} -> {slower:5.1f} elements ({rise:+.0%}): "
              f"Cachew's +40% rule {fires}")
        print(f"  {'':32s} one model read {r['read_s'] * 1e3:.2f} ms median; every 0.1 s: "
              f"{r['read_s'] / 0.1:.1%} of a core")
    del workers


if __name__ == "__main__":
    main()
