"""Turn a run's stored metrics into the numbers users compare: throughput, input stall, utilization.

Throughput is steps per second per trainer (each trainer is one replica taking
one batch per step), averaged over trainers, measured after the warm-up batches.

A trainer that never sent its end record (dsctl up killed, the trainer stopped early, the
record lost to a full disk) is summarized from its stored metrics windows the same way,
and the summary says so ("summary_source": "windows").
"""

from __future__ import annotations

import math
from statistics import mean


def summarize(trainer_results: dict[int, dict], utilization: list[dict], started_at: float, ended_at: float,
              first_batch_wall: float | None, measured_from_wall: float | None = None) -> dict:
    """Utilization is averaged over the measured part of the run (after warm-up) when it is known:
    TensorFlow's import and the warm-up would otherwise dilute it."""
    results = list(trainer_results.values())
    rates = [r["batches_per_s"] for r in results if r.get("batches_per_s")]
    wait = sum(r.get("input_wait_s", 0.0) for r in results)
    step = sum(r.get("step_s", 0.0) for r in results)
    batches = sum(r.get("batches", 0) for r in results)
    tokens = sum(r.get("tokens", 0) for r in results)
    padded = sum(r.get("padded_tokens", 0) for r in results)
    out = {
        "batches": batches,
        "batches_per_s": mean(rates) if rates else None,
        "total_batches_per_s": sum(rates) if rates else None,
        "input_stall_frac": wait / (wait + step) if (wait + step) > 0 else None,
        "duration_s": ended_at - started_at,
        "time_to_first_batch_s": (first_batch_wall - started_at) if first_batch_wall else None,
        "padded_token_frac": (1 - tokens / padded) if padded else None,
    }
    measured_batches = sum(r.get("measured_batches", 0) for r in results)
    ends = [r["wall"] for r in results if "wall" in r]
    if measured_from_wall and ends:
        window = [u for u in utilization if measured_from_wall <= u["t"] <= max(ends) + 1.0]
        if len(window) >= 2:
            out.update(utilization_summary(window, measured_batches))
            return out
    out.update(utilization_summary(utilization, batches))
    return out


def summarize_run(trainer_results: dict[int, dict], windows: list[dict], utilization: list[dict], started_at: float,
                  ended_at: float, first_batch_wall: float | None = None,
                  measured_from_wall: float | None = None) -> dict:
    """summarize(), with the trainers whose end record is missing (or only the partial one dsctl up keeps)
    rebuilt from their windows."""
    results, rebuilt = complete_results(trainer_results, windows)
    out = summarize(results, utilization, started_at, ended_at, first_batch_wall, measured_from_wall)
    out.update(loss_summary(windows))
    if rebuilt:
        out["summary_source"] = "windows"
        # Which ones: a reader must not be told that every trainer's end record is missing when one wrote its own.
        out["rebuilt_trainers"] = sorted(i for i, r in results.items() if r is not trainer_results.get(i))
    return out


def loss_summary(windows: list[dict]) -> dict:
    """The model's loss in its first and last window that reported one (mean over trainers), so a reader sees
    whether it fell; {} for models that report no loss. A loss that stopped being a finite number (a diverged model)
    stays what it is (NaN or infinite, never the last finite value), and `loss_nonfinite` says where it first was
    so: which trainer, its value, and the batches that trainer had trained by the end of that window."""
    by_trainer: dict[int, list[float]] = {}
    trained: dict[int, int] = {}
    nonfinite: dict | None = None
    for w in sorted(windows, key=lambda w: (w.get("t_end") or 0.0, w["trainer"])):
        trained[w["trainer"]] = trained.get(w["trainer"], 0) + (w.get("batches") or 0)
        loss = w.get("loss")
        if loss is None:
            continue
        by_trainer.setdefault(w["trainer"], []).append(loss)
        if nonfinite is None and not math.isfinite(loss):
            nonfinite = {"trainer": w["trainer"], "value": nonfinite_text(loss), "batches": trained[w["trainer"]]}
    if not by_trainer:
        return {}
    out = {"loss_first": mean(v[0] for v in by_trainer.values()), "loss_last": mean(v[-1] for v in by_trainer.values())}
    return {**out, "loss_nonfinite": nonfinite} if nonfinite else out


def nonfinite_text(value: float) -> str:
    """nan, inf or -inf: how a non-finite number is written in records and messages."""
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def complete_results(trainer_results: dict[int, dict], windows: list[dict]) -> tuple[dict[int, dict], bool]:
    """Each trainer's own end record where it has one, else its windows' (when it has any); and whether any was."""
    from_windows = results_from_windows(windows)
    own = {i: r for i, r in trainer_results.items() if not r.get("partial") or i not in from_windows}
    rebuilt = {i: r for i, r in from_windows.items() if i not in own}
    return {**own, **rebuilt}, bool(rebuilt)


def results_from_windows(windows: list[dict]) -> dict[int, dict]:
    """What each trainer's end record would have said, from its windows: every batch counted, the rate and the
    input stall over the measured (non-warm-up) windows only, as the trainer itself measures them."""
    by_trainer: dict[int, list[dict]] = {}
    for w in windows:
        by_trainer.setdefault(w["trainer"], []).append(w)
    out = {}
    for trainer, mine in by_trainer.items():
        measured = [w for w in mine if not w.get("warmup")]
        measured_s = sum(w["t_end"] - w["t_start"] for w in measured)
        measured_batches = sum(w.get("batches") or 0 for w in measured)
        out[trainer] = {
            "batches": sum(w.get("batches") or 0 for w in mine),
            "measured_batches": measured_batches,
            "measured_s": measured_s,
            "batches_per_s": measured_batches / measured_s if measured_s > 0 else None,
            **{k: sum(w.get(k) or 0 for w in measured) for k in ("input_wait_s", "step_s", "tokens", "padded_tokens")},
        }
    return out


def utilization_summary(rows: list[dict], batches: int) -> dict:
    """Mean cores busy and resident GB per process of each role, and CPU-seconds per batch."""
    out: dict = {}
    for role in ("worker", "dispatcher", "trainer"):
        mine = [r for r in rows if r["role"] == role]
        if not mine:
            continue
        per_proc: dict[int, list[dict]] = {}
        for r in mine:
            per_proc.setdefault(r["idx"], []).append(r)
        out[f"{role}_cpu_cores"] = mean(mean(x["cpu_cores"] for x in v) for v in per_proc.values())
        out[f"{role}_mem_gb"] = mean(mean(x["rss_bytes"] for x in v) for v in per_proc.values()) / 2**30
        # CPU-seconds used during the run: last minus first cumulative sample of each process.
        cpu_s = sum(max(v[-1]["cpu_seconds"] - v[0]["cpu_seconds"], 0.0) for v in per_proc.values())
        out[f"{role}_cpu_seconds"] = cpu_s
        if batches:
            out[f"{role}_cpu_seconds_per_batch"] = cpu_s / batches
    return out
