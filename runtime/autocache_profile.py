"""dsctl's autocache profiling phase, run by a trainer process before training (Cachew §4.4).

Cachew's workers report per-node active time and bytes; tf.data service's own workers report
nothing (no metrics endpoint), so dsctl measures the same quantities from outside, on the
workers that will serve the job: the pipeline cut at each point (its end, and each autocache
hint) is sent to the service as a job of its own, and the trainer times the elements that
arrive. Hints' elements travel in batches of 64, so the per-element RPC does not hide the
work. For each hint the pipeline is also rebuilt with that hint replayed from memory (32 of its
elements, repeated), and its end timed: the work after the hint alone, which Cachew gets by a
subtraction that misses work overlapping a slow source. A short first job estimates the rate,
so each point takes at most about `profile_s`.
It then measures the cache's storage (runtime/autocache_storage.py) and emits one
`autocache_profile` record, which the orchestrator's policy turns into a decision.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from . import autocache
from .autocache_storage import calibrate

TRANSFER_BATCH = 64  # elements per transfer batch at most: the per-element RPC then costs nothing measurable
PROBE_TRANSFER = 8  # elements per transfer batch in the probe, so that a slow pipeline's probe is short too
PROBE_BATCHES = 3  # timed batches in the first, rate-estimating job of each point
MIN_BATCHES = 6  # timed batches at least in the measuring job


def _raw_pipeline(spec, cache_dir, base_dir: Path):
    """What the workers run: the builtin or entrypoint dataset, before `distribute`."""
    from dsctl.runtime.pipelines.spec_pipeline import build_spec_pipeline

    return build_spec_pipeline(spec, cache_dir=cache_dir, base_dir=base_dir)


def element_bytes(batch) -> tuple[int, int]:
    """(rows, bytes) of one received batch: strings count their length, tensors their buffer."""
    leaves = batch.values() if isinstance(batch, dict) else (batch if isinstance(batch, (tuple, list)) else [batch])
    rows, total = 0, 0
    for leaf in leaves:
        if isinstance(leaf, (dict, tuple, list)):
            r, b = element_bytes(leaf)
            rows, total = max(rows, r), total + b
            continue
        arr = leaf.numpy() if hasattr(leaf, "numpy") else np.asarray(leaf)
        rows = max(rows, int(arr.shape[0]) if arr.ndim else 1)
        total += sum(len(x) for x in arr.ravel()) if arr.dtype == object else arr.nbytes
    return rows, total


def _timed(ds, mode: str, dispatcher: str | None, keep: list, batches: int,
           skip_rows: int = 0) -> tuple[int, int, float]:
    """Read a finite dataset to its end; (elements after the first batch, their bytes, seconds from the
    first batch to the last: neither the job's start nor the wait for its end is counted). It stops at
    `batches`, without waiting for the service to say the job has ended (about a second). The first
    `skip_rows` elements are not counted at all (a replay filling its memory at the source's pace)."""
    import tensorflow as tf

    if mode == "service":
        ds = ds.apply(tf.data.experimental.service.distribute("parallel_epochs", service=f"grpc://{dispatcher}"))
    it = iter(ds)
    keep.append(it)  # destroying a service iterator can wait for seconds; the process exits instead
    first: float | None = None
    last = 0.0
    rows = nbytes = skipped = n = 0
    for batch in it:
        r, b = element_bytes(batch)
        if skipped < skip_rows:
            skipped += r
            continue
        n += 1
        last = time.perf_counter()
        if first is None:
            first = last
        else:
            rows, nbytes = rows + r, nbytes + b
        if n >= batches:
            break
    return rows, nbytes, (last - first) if first is not None else 0.0


def measure_point(ds, *, batched: bool, mode: str, dispatcher: str | None, elements: int, budget_s: float,
                  keep: list, transfer_batch: int = TRANSFER_BATCH, skip_rows: int = 0,
                  estimate: tuple[float, float] | None = None) -> dict:
    """Seconds and bytes per element where `ds` ends (a hint's elements are batched for transport, and
    repeated so that a short epoch does not end the measurement).

    A hint's transfer batch is as large as the budget allows, up to `transfer_batch`: a pipeline at
    10 ms per element would otherwise need 7 x 64 elements (4.5 s) at least, whatever `profile_s`
    says; at a millisecond or more per element, 8 elements per RPC hide the RPC's cost as well.
    `estimate` (seconds per element, elements per batch: an earlier round's `rate`) replaces the probe,
    a service job of its own."""

    def cut(timed_batches: int, per_batch: int):  # one more batch than timed: the first only starts the clock
        if batched:
            return ds if skip_rows else ds.take(timed_batches + 1)  # a replay: endless, _timed stops it
        return ds.repeat().take((timed_batches + 1) * per_batch).batch(per_batch)

    probe = min(PROBE_TRANSFER, transfer_batch)
    if estimate is not None:
        per, batch_rows = estimate
    else:
        rows, _, secs = _timed(cut(PROBE_BATCHES, probe), mode, dispatcher, keep, PROBE_BATCHES + 1, skip_rows)
        per, batch_rows = (secs / rows if rows else 0.0), rows / PROBE_BATCHES
    if batched:
        per_batch, rows_per_batch = 0, max(1.0, batch_rows)
    else:
        fits = budget_s / (per * (MIN_BATCHES + 1)) if per > 0 else transfer_batch
        per_batch = int(min(transfer_batch, max(probe, fits)))
        rows_per_batch = per_batch
    want = elements if per <= 0 else min(elements, budget_s / per)
    timed = max(MIN_BATCHES, int(want // rows_per_batch))
    rows, nbytes, secs = _timed(cut(timed, per_batch), mode, dispatcher, keep, timed + 1, skip_rows)
    if rows <= 0 or secs <= 0:
        return {"elements": rows, "s_per_element": None, "bytes_per_element": None}
    return {"elements": rows, "s_per_element": secs / rows, "bytes_per_element": nbytes / rows,
            "rate": (secs / rows, rows / timed)}


def measure_points(end, hints: dict, *, mode: str, dispatcher: str | None, elements: int, budget_s: float,
                   transfer_batch: int = TRANSFER_BATCH, rounds: int = 2, after: dict | None = None) -> list[dict]:
    """The end, every hint, and what comes after each hint (`after`: hint name -> the pipeline replayed
    from memory at that hint, autocache.REPLAY), measured in turn `rounds` times; each keeps its fastest round.

    Cachew's projection subtracts the time at a hint from the time at the end, so both must be
    measured under the same conditions: on a shared machine a slow moment during one point
    only (another process's burst) would otherwise decide. Interleaved rounds and the fastest of
    each point keep such bursts out. The after-hint points are what the policy uses instead of the
    subtraction where it has them (policies/autocache.py says why)."""
    keep: list = []
    rates: dict[str, tuple[float, float]] = {}  # from the first round: later rounds need no probe job
    targets = [("end", end, True, 0), *((name, ds, False, 0) for name, ds in hints.items()),
               *((f"after:{name}", ds, True, autocache.REPLAY_ELEMENTS) for name, ds in (after or {}).items())]
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for name, ds, batched, skip in targets:
            m = measure_point(ds, batched=batched, mode=mode, dispatcher=dispatcher, elements=elements,
                              budget_s=budget_s / rounds, keep=keep, transfer_batch=transfer_batch, skip_rows=skip,
                              estimate=rates.get(name))
            rate = m.pop("rate", None)
            if rate is not None:
                rates.setdefault(name, rate)
            if m["s_per_element"] and (name not in best or m["s_per_element"] < best[name]["s_per_element"]):
                best[name] = m
    return [{"point": name, **best.get(name, {"elements": 0, "s_per_element": None, "bytes_per_element": None})}
            for name, _, _, _ in targets]


def replays(build, hints) -> dict:
    """For each hint, the pipeline rebuilt (`build(plan)` builds it under a plan) with that hint replayed
    from memory: the end of it is the work after the hint alone, as a get epoch with a free read runs it."""
    out = {}
    for name in hints:
        plan = autocache.Plan(mode=autocache.REPLAY + name)
        with autocache.active(plan):
            out[name] = build()
    return out


def cache_hits(plan: autocache.Plan) -> list[str]:
    """The hints whose cache a job with the same pipeline has sealed, in pipeline order."""
    hits = []
    for name, ds in plan.points.items():
        key = autocache.fingerprint(ds)
        status, _, _ = autocache.inspect(autocache.cache_path(plan.cache_root, name, key), key, plan.stale_s)
        if status == "complete":
            hits.append(name)
    return hits


def profile(spec, mode: str, dispatcher: str | None, cache_dir, base_dir: Path, plan: autocache.Plan, writer) -> dict:
    """Measure the end and every hint, then the storage; emit and return the profile."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing to save: the orchestrator may stop it once it reported
    ac = spec.autocache
    with autocache.active(plan):
        end = _raw_pipeline(spec, cache_dir, base_dir)
    hits = cache_hits(plan)
    if hits:  # Cachew checks its cache first: a sealed cache of this pipeline is read, nothing is profiled
        record: dict[str, Any] = {"points": [], "hits": hits, "hints": list(plan.points), "mode": mode}
        writer.emit("autocache_profile", **record)
        return record
    after = replays(lambda: _raw_pipeline(spec, cache_dir, base_dir), plan.points)
    points = measure_points(end, plan.points, mode=mode, dispatcher=dispatcher, elements=ac.profile_elements,
                            budget_s=ac.profile_s, after=after)
    storage = calibrate(plan.cache_root)
    record = {"points": points, "storage": storage, "hints": list(plan.points), "mode": mode}
    writer.emit("autocache_profile", **record)
    return record
