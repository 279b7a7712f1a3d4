"""Turn a run's stored metrics into the numbers users compare: throughput, input stall, utilization.

Throughput is steps per second per trainer (each trainer is one replica taking
one batch per step), averaged over trainers, measured after the warm-up batches: over the
wall clock (`batches_per_s`, what sweeps and prices use), and over the training step time
alone (`step_batches_per_s`: the time inside the trainer's loop over its batches, waiting for
input or stepping), which leaves out what a program does between its epochs (evaluation,
checkpoints: `outside_s`). A program's epochs (the passes it read to their end) are summarized
with what one pass holds read alone, and said when the two differ (epoch_note).

A trainer that never sent its end record (dsctl up killed, the trainer stopped early, the
record lost to a full disk) is summarized from its stored metrics windows the same way,
and the summary says so ("summary_source": "windows").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import mean
from typing import Any

from .records import RunSummary


def summarize(trainer_results: dict[int, dict], utilization: list[dict], started_at: float, ended_at: float,
              first_batch_wall: float | None, measured_from_wall: float | None = None) -> RunSummary:
    """Utilization is averaged over the measured part of the run (after warm-up) when it is known:
    TensorFlow's import and the warm-up would otherwise dilute it."""
    results = list(trainer_results.values())
    rates = [r["batches_per_s"] for r in results if r.get("batches_per_s")]
    wait = sum(r.get("input_wait_s", 0.0) for r in results)
    step = sum(r.get("step_s", 0.0) for r in results)
    batches = sum(r.get("batches", 0) for r in results)
    tokens = sum(r.get("tokens", 0) for r in results)
    padded = sum(r.get("padded_tokens", 0) for r in results)
    step_rates = [r["step_batches_per_s"] for r in results if r.get("step_batches_per_s")]
    outside = sum(r.get("outside_s") or 0.0 for r in results)
    measured_s = sum(r.get("measured_s") or 0.0 for r in results)
    measured_batches = sum(r.get("measured_batches", 0) for r in results)
    out = {
        "batches": batches,
        "batches_per_s": mean(rates) if rates else None,
        "total_batches_per_s": sum(rates) if rates else None,
        "step_batches_per_s": mean(step_rates) if step_rates else None,
        "outside_s": outside / len(results) if results else 0.0,  # per trainer
        "outside_frac": outside / measured_s if measured_s > 0 else None,
        "input_stall_frac": wait / (wait + step) if (wait + step) > 0 else None,
        "model_step_s": model_step_s(results),
        "duration_s": ended_at - started_at,
        "time_to_first_batch_s": (first_batch_wall - started_at) if first_batch_wall else None,
        "padded_token_frac": (1 - tokens / padded) if padded else None,
    }
    ends = [r["wall"] for r in results if "wall" in r]
    if measured_from_wall and ends:
        window = [u for u in utilization if measured_from_wall <= u["t"] <= max(ends) + 1.0]
        if len(window) >= 2:
            out.update(utilization_summary(window, measured_batches))
            return RunSummary.model_validate(out)
    out.update(utilization_summary(utilization, batches))
    return RunSummary.model_validate(out)


def model_step_s(results: list[dict]) -> float | None:
    """The model's own time per batch (each trainer's batch time less its input wait, the `step_s` of its measured
    windows), over the trainers' measured batches: what in-process workers (service.placement: hybrid) that take the
    model's CPU lengthen, where the batch time alone would not say whether the input or the model got slower."""
    pairs = [(r.get("step_s") or 0.0, r.get("measured_batches") or 0) for r in results]
    batches = sum(n for _, n in pairs)
    return sum(s for s, n in pairs if n) / batches if batches else None


def summarize_run(trainer_results: dict[int, dict], windows: list[dict], utilization: list[dict], started_at: float,
                  ended_at: float, first_batch_wall: float | None = None,
                  measured_from_wall: float | None = None) -> RunSummary:
    """summarize(), with the trainers whose end record is missing (or only the partial one dsctl up keeps)
    rebuilt from their windows."""
    results, rebuilt = complete_results(trainer_results, windows)
    out = summarize(results, utilization, started_at, ended_at, first_batch_wall, measured_from_wall).as_json()
    out.update(loss_summary(windows))
    out.update(epoch_summary(results))
    if rebuilt:
        out["summary_source"] = "windows"
        # Which ones: a reader must not be told that every trainer's end record is missing when one wrote its own.
        out["rebuilt_trainers"] = sorted(i for i, r in results.items() if r is not trainer_results.get(i))
    return RunSummary.model_validate(out)


def epoch_summary(results: dict[int, dict]) -> dict:
    """How many epochs (passes read to their end) the trainers read, each one's batches and elements (the first
    trainer's, listed), what a pass holds read alone, and what ended the reading; {} for a trainer that read no
    epoch to its end (a job cut by trainer.steps in its first pass)."""
    ends = [results[i] for i in sorted(results) if "epochs" in results[i]]
    if not ends:
        return {}
    first = ends[0]
    out = {"epochs": min(r["epochs"] for r in ends), "ended_by": first.get("reason")}
    if out["epochs"]:
        out.update(epoch_batches=first.get("epoch_batches") or [], epoch_examples=first.get("epoch_examples") or [])
    if first.get("pass_batches") is not None:
        out.update(pass_batches=first["pass_batches"], pass_examples=first.get("pass_examples"))
    return out


def epoch_note(summary: RunSummary | Mapping[str, Any], mode: str, processing_mode: str, workers: int) -> str | None:
    """Why a run's epochs differ from a pass read alone, when they do: parallel_epochs gives every worker the whole
    dataset; distributed_epoch has each worker batch the shards it was handed, so a pass ends with a partial batch
    per worker (or, with drop_remainder, drops each worker's remainder)."""
    s = summary if isinstance(summary, RunSummary) else RunSummary.model_validate(dict(summary))
    got, alone = s.epoch_batches or [], s.pass_batches
    if not got or alone is None or all(b == alone for b in got):
        return None
    shown = ", ".join(map(str, got[:8])) + (", ..." if len(got) > 8 else "")
    elements = s.epoch_examples or []
    held = f" ({', '.join(map(str, elements[:8]))}{', ...' if len(elements) > 8 else ''} elements)" if elements else ""
    alone_elements = s.pass_examples
    said = f"epochs of {shown} batches{held} against {alone} batches a pass read alone" + (
        f" ({alone_elements} elements)" if alone_elements else "")
    if mode == "service" and processing_mode in ("parallel_epochs", "off") and workers > 1:
        return (f"{said}: with processing_mode {processing_mode} each of the {workers} workers produced the whole "
                "dataset. processing_mode: distributed_epoch reads one copy per epoch.")
    if mode == "service" and workers > 1:
        return (f"{said}: with processing_mode {processing_mode} each of the {workers} workers batches the shards the "
                f"dispatcher hands it, so a pass ends with up to {workers} partial batches where it has one read "
                f"alone, or, when the pipeline batches with drop_remainder, loses up to {workers} x (batch size - 1) "
                "elements. Shards whose sizes are multiples of the batch size keep a pass's batches whole.")
    return f"{said}."


def epoch_line(trainer: int, rec: dict) -> str:
    """An epoch a trainer read to its end, as the run's events say it."""
    metrics = rec.get("metrics") or {}
    shown = "".join(f", {k} {v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)))
    return (f"trainer {trainer}: epoch {rec.get('epoch')}: {rec.get('batches')} batches, {rec.get('examples'):,} "
            f"elements, {rec.get('seconds', 0.0):.1f} s{shown}")


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
