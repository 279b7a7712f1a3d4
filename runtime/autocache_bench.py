"""Measure constructed pipelines in every autocache mode, and profile them, in this process.

    python -m dsctl.runtime.autocache_bench --cases '{"full": {"work": 100, ...}, ...}' --root DIR --out OUT.json

For `dsctl experiments run cachew-autocache` (Cachew Figure 8): a worker runs the same graph, so
the modes are compared here without the service's transport. Each case is Cachew's synthetic
pipeline (§6.3): read (a CPU-free per-element delay, `read_ms`), the `source` hint, a transform
that burns `work` 64x64 matmuls and makes the element `expand` float32s (a fill: cheap to make,
costly to store and read), the `full` hint, batch. compute reads one epoch (three times, the fastest kept); each hint is one job
that puts (its time kept too) and, after sealing, three that get (the fastest kept); the clock starts at each epoch's
first batch (start-up is not the steady state a long epoch sees). Every epoch's ids are kept to
show that cached epochs deliver the computed elements. The profile is dsctl's own
(autocache_profile.measure_point and the storage calibration), run the same way.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from . import autocache
from .autocache_profile import measure_points, replays
from .autocache_storage import calibrate


def pipeline(elements: int, batch_size: int, read_ms: float = 0.0, work: int = 0, expand: int = 16,
             epochs: int | None = 1):
    """The constructed pipeline, with its two hints (see the module's docstring)."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import testing as tf_data_testing

    ds = tf.data.Dataset.range(elements)
    if read_ms > 0:
        ds = ds.apply(tf_data_testing.sleep(int(read_ms * 1000)))
    ds = autocache.autocache(ds, "source")

    def transform(i):
        w = tf.constant(0.0)
        if work > 0:
            m = tf.fill([64, 64], tf.cast(i % 7, tf.float32) / 64.0)
            _, m = tf.while_loop(lambda k, m: k < work, lambda k, m: (k + 1, tf.tanh(tf.matmul(m, m))),
                                 (tf.constant(0), m))
            w = tf.reduce_sum(m)
        return {"id": i, "x": tf.fill([expand], tf.cast(i, tf.float32)), "w": w}

    ds = ds.map(transform, num_parallel_calls=tf.data.AUTOTUNE)
    ds = autocache.autocache(ds, "full")
    ds = ds.repeat(epochs) if epochs is not None else ds.repeat()
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def _epoch(root: str, mode: str, params: dict) -> tuple[float, list[int], autocache.Plan]:
    plan = autocache.Plan(mode=mode, cache_root=root)
    with autocache.active(plan):
        ds = pipeline(**params)
    ids: list[int] = []
    start: float | None = None
    timed = 0
    for batch in ds:
        if start is None:
            start = time.perf_counter()
        else:
            timed += int(batch["id"].shape[0])
        ids.extend(batch["id"].numpy().tolist())
    assert start is not None, "the pipeline has elements"
    return (time.perf_counter() - start) / max(timed, 1), ids, plan


def _state(plan: autocache.Plan) -> dict:
    """An epoch's cache state (put or get): every epoch at a hint has one."""
    assert plan.state is not None, f"the epoch at hint {plan.mode!r} has no cache state"
    return plan.state


def bench(params: dict, root: str, profile_s: float, storage_root: str) -> dict:
    n = params["elements"]
    runs = [_epoch(root, "compute", params) for _ in range(3)]  # the fastest of three, as for the gets: bursts
    plan = runs[0][2]
    modes: dict[str, dict[str, Any]] = {"compute": {"s_per_element": min(r[0] for r in runs),
                         "ids_ok": all(sorted(r[1]) == list(range(n)) for r in runs)}}
    for hint in plan.points:
        put_s, put_ids, put_plan = _epoch(root, hint, params)
        sealed = autocache.seal(_state(put_plan))[0] if _state(put_plan)["state"] == "put" else "reused"
        gets = [_epoch(root, hint, params) for _ in range(3)]
        modes[hint] = {"s_per_element": min(g[0] for g in gets), "put_s_per_element": put_s, "sealed": sealed,
                       "states": [_state(put_plan)["state"], *(_state(g[2])["state"] for g in gets)],
                       "ids_ok": sorted(put_ids) == list(range(n)) and all(sorted(g[1]) == list(range(n)) for g in gets)}
    prof = autocache.Plan(mode="profile", cache_root=root)
    with autocache.active(prof):
        end = pipeline(**{**params, "epochs": None})
    after = replays(lambda: pipeline(**{**params, "epochs": None}), prof.points)
    # Hints' elements in batches of the pipeline's own size.
    points = measure_points(end, prof.points, mode="colocated", dispatcher=None, elements=n, budget_s=profile_s,
                            transfer_batch=params["batch_size"], after=after)
    return {"modes": modes, "profile": {"points": points, "hints": list(prof.points), "storage": calibrate(storage_root)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsctl-autocache-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", required=True, help="case name -> pipeline() arguments (JSON)")
    ap.add_argument("--root", required=True, help="cache folder: one fresh subfolder per case")
    ap.add_argument("--profile-s", type=float, default=1.0)
    ap.add_argument("--storage-root", default=None, help="where the storage model is measured and kept (default: --root)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    result = {}
    for name, params in json.loads(args.cases).items():
        root = Path(args.root) / name
        root.mkdir(parents=True, exist_ok=True)
        result[name] = bench(params, str(root), args.profile_s, args.storage_root or str(root))
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
