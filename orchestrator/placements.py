"""A hybrid run's placement in its record: the batches its trainers received from their in-process workers and from
the remote ones (each trainer's `placement` record, runtime/placement.py), and the CPU those in-process workers used.

That CPU is estimated, not measured: the in-process workers are threads of the trainer process, and TensorFlow leaves
its threads unnamed (every one reads "python" in /proc/<pid>/task/*/comm, checked with TensorFlow 2.21), so the
trainer's own threads and the workers' cannot be told apart. The estimate takes the remote workers' measured CPU per
batch they produced as the local workers' too (the same pipeline, on the same kind of core here):
local CPU-seconds = remote workers' CPU-seconds x local batches / remote batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import PlacementSummary, RunSummary, TrainerPlacement

ESTIMATED = ("estimated: local batches x the remote workers' measured CPU-seconds per batch they produced (the "
             "in-process workers' threads cannot be told apart from the trainer's in /proc)")


def placement_fields(records: Mapping[int, Mapping[str, Any]], summary: RunSummary, workers: int,
                     trainers: int) -> dict[str, Any]:
    """The summary's placement and local-CPU fields from the trainers' placement records ({} for a run with none:
    placement remote)."""
    if not records:
        return {}
    per = [TrainerPlacement(trainer=i, process=r.get("process"), local_batches=int(r.get("local_batches") or 0),
                            remote_batches=int(r.get("remote_batches") or 0),
                            by_producer={str(k): int(v) for k, v in (r.get("by_producer") or {}).items()})
           for i, r in sorted(records.items())]
    local, remote = sum(p.local_batches for p in per), sum(p.remote_batches for p in per)
    first = records[min(records)]
    out: dict[str, Any] = {"placement": PlacementSummary(
        placement=first.get("placement"), local_workers=first.get("local_workers"), local_batches=local,
        remote_batches=remote, trainers=per)}
    return {**out, **local_cpu(local, remote, summary, workers, trainers)}


def local_cpu(local: int, remote: int, summary: RunSummary, workers: int, trainers: int) -> dict[str, Any]:
    """The in-process workers' CPU, estimated from the remote workers' (module docstring); says why when it cannot be."""
    if not local:
        return {"local_cpu_cores": 0.0, "local_cpu_seconds": 0.0,
                "local_cpu_source": "measured here: the in-process workers produced no batch"}
    if not remote or summary.worker_cpu_seconds is None or summary.worker_cpu_cores is None:
        why = "no batch came from a remote worker" if not remote else "the remote workers' CPU was not sampled"
        return {"local_cpu_source": f"not known: {why}, so there is no CPU per batch to estimate from"}
    ratio = local / remote
    return {"local_cpu_seconds": summary.worker_cpu_seconds * ratio,
            "local_cpu_cores": summary.worker_cpu_cores * workers * ratio / max(trainers, 1),
            "local_cpu_source": ESTIMATED}
