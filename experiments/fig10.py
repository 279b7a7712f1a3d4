"""Figure 10, ephemeral data sharing: k concurrent training jobs reading the same pipeline, in the
paper's three modes.

- A: one deployment, the jobs share one tf.data service job through the cross-trainer cache
  (service.job_name shared, cross_trainer_cache: true, epochs: null): each element computed once.
- B: one deployment, no sharing: each of the k trainers gets its own job over the same workers.
- C: one deployment per job: k separate runs of one trainer each, side by side (threads, each with
  its own JobRunner and provider), so they compete for this machine's two cores as they would not
  on dedicated machines. C with k = 1 is B with k = 1 (the same deployment), run once.

The pipeline is CPU-heavy (`synthetic`, 64 matmuls per element, ~18 ms of CPU per batch) and the
model step 40 ms, so one job needs about half a core of input processing. Per job: batches/s;
per mode: worker CPU-seconds per delivered batch, measured over the interval in which every trainer
was measuring (common.steady_state), and the normalized processing cost, k × that / the one-job value:
the worker CPU it takes for k jobs to train the same number of steps, relative to one job.
The paper's worst case with sharing is k·C − (k−1)·(cache size / dataset size)·C.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from dsctl.specs import LoadedSpec

from .common import (
    ExperimentResult,
    JobOutcome,
    Log,
    experiment_id,
    finish_axes,
    fmt,
    md_images,
    md_table,
    new_figure,
    run_concurrently,
    run_job,
    steady_state,
    write_spec,
)

NAME = "fig10"
TITLE = "Figure 10: ephemeral data sharing"
SUMMARY = "k = 1, 2 (quick) or 1, 2, 4 concurrent jobs: shared cache (A), one deployment (B), one each (C)"

MODES = {"A": "one deployment, cross-trainer cache", "B": "one deployment, no sharing", "C": "one deployment per job"}
ELEMENTS = 16384
FEATURE_SIZE = 64
BATCH = 16
CACHE_MB = 2  # per worker: a window of ~480 batches, under half the epoch, so the worst case is not trivial
PAPER = {"A": "no slowdown for any number of jobs (tested to 64)",
         "B": "fine up to 4 jobs; 8 jobs 1.75× slower, 16 jobs 3× slower",
         "C": "no slowdown; processing cost grows linearly"}

SPEC = """
name: fig10-{mode_l}-k{k}{suffix}
service:
  workers: 1
  worker_machine: n2-standard-8
  provisioning: spot            # paper-2023-06's n2 prices are Spot prices
{sharing}trainer:
  machine: tpu-v2-8
  count: {count}
  model: {{kind: synthetic, step_time_ms: 40}}
  duration_s: {duration}
  warmup_batches: 10
  window_s: 0.5
pipeline:
  builtin: synthetic
  params: {{batch_size: {batch}, cpu_work: 64, elements: {elements}, feature_size: {feature}, epochs: null}}
pricing: paper-2023-06
"""
SHARING = f"""  job_name: fig10-shared
  cross_trainer_cache: true
  cross_trainer_cache_mb: {CACHE_MB}
"""


def _spec(out_dir: Path, mode: str, k: int, duration: float, suffix: str = ""):
    text = SPEC.format(mode_l=mode.lower(), k=k, suffix=suffix, sharing=SHARING if mode == "A" else "",
                       count=1 if mode == "C" else k, duration=duration, batch=BATCH, elements=ELEMENTS,
                       feature=FEATURE_SIZE)
    return write_spec(out_dir, f"fig10-{mode.lower()}-k{k}{suffix}", text)


def dataset_mb() -> float:
    """One epoch as the cache holds it: batches of ids (int64) and x (float32 × feature_size)."""
    return ELEMENTS * (8 + 4 * FEATURE_SIZE) / 2**20


def worst_case_sharing(k: int, cache_mb: float, dataset_size_mb: float) -> float:
    """The paper's worst-case processing cost of k jobs sharing, in units of one job's cost C:
    k·C − (k−1)·(cache size / dataset size)·C, the ratio capped at 1 (a cache holding the whole
    dataset shares everything)."""
    return k - (k - 1) * min(cache_mb / dataset_size_mb, 1.0)


def _job(loaded: LoadedSpec, parent: str, duration: float, log: Log | None,
         label: str) -> Callable[[threading.Event], JobOutcome]:
    """One of mode C's concurrent jobs, for run_concurrently (which gives it the event that stops it)."""
    return lambda stop: run_job(loaded, parent_id=parent, stop=stop, duration_s=duration, log=log, label=label)


def run(out_dir: Path, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    res = ExperimentResult(NAME, TITLE, quick, out_dir)
    parent = experiment_id(NAME)
    duration = 6.0 if quick else 25.0  # quick: CPU per batch, not steady throughput, is what it shows
    ks = [1, 2] if quick else [1, 2, 4]
    measured: dict[tuple[str, int], dict] = {}
    for k in ks:
        for mode in ("A", "B", "C"):
            if mode == "C" and k == 1:
                measured[("C", 1)] = {**measured[("B", 1)], "note": "same deployment as B, k = 1"}
                continue
            if log:
                log(f"fig10: mode {mode} ({MODES[mode]}), k = {k}")
            if mode == "C":
                specs = [_spec(out_dir, "C", k, duration, suffix=f"-job{i}") for i in range(k)]
                jobs = [_job(s, parent, duration, log, f"fig10 C job {i}") for i, s in enumerate(specs)]
                outcomes = run_concurrently(jobs)
            else:
                outcomes = [run_job(_spec(out_dir, mode, k, duration), parent_id=parent, duration_s=duration, log=log,
                                    label=f"fig10 {mode}")]
            st = steady_state(outcomes)
            measured[(mode, k)] = {"mode": mode, "k": k, "run_ids": [o.run_id for o in outcomes],
                                   "per_job_bps": st["mean_bps"], "per_trainer_bps": st["per_trainer_bps"],
                                   "delivered_bps": st["total_bps"], "worker_cores": st["worker_cores"],
                                   "worker_cpu_s_per_batch": st["worker_cpu_s_per_batch"],
                                   "interval_s": st["interval_s"], "concurrent": st["concurrent"]}
    one = measured[("B", 1)]
    ds_mb = dataset_mb()
    rows = []
    for (mode, k), m in sorted(measured.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cpb = m["worker_cpu_s_per_batch"]
        rows.append({
            "mode": mode, "k": k, "per_job_bps": m["per_job_bps"],
            "slowdown": one["per_job_bps"] / m["per_job_bps"] if m["per_job_bps"] else None,
            "worker_cores": m["worker_cores"], "worker_cpu_s_per_batch": cpb,
            "normalized_processing_cost": (k * cpb / one["worker_cpu_s_per_batch"]
                                           if cpb and one["worker_cpu_s_per_batch"] else None),
            "worst_case_with_sharing": worst_case_sharing(k, CACHE_MB, ds_mb) if mode == "A" else None,
            "no_sharing_cost": float(k), "interval_s": m["interval_s"], "concurrent": m["concurrent"],
            "run_ids": " ".join(m["run_ids"]),
        })
    res.rows = rows
    by = {(r["mode"], r["k"]): r for r in rows}
    res.data = {"ks": ks, "rows": rows, "cache_mb": CACHE_MB, "dataset_mb": ds_mb,
                "a_vs_b_cpu_per_batch_k2": by[("A", 2)]["worker_cpu_s_per_batch"] / by[("B", 2)]["worker_cpu_s_per_batch"]}
    _plots(res, rows, ks)
    res.markdown = _markdown(res, rows, duration)
    return res


def _plots(res: ExperimentResult, rows: list[dict], ks: list[int]) -> None:
    colors = {"A": "tab:green", "B": "tab:orange", "C": "tab:blue"}
    for key, ylabel, suffix, title in (
            ("per_job_bps", "batches/s per job", "throughput", "Figure 10 here: per-job throughput"),
            ("normalized_processing_cost", "processing cost, normalized to one job (×)", "cost",
             "Figure 10 here: input processing cost")):
        fig, ax = new_figure()
        for mode in ("A", "B", "C"):
            pts = [(r["k"], r[key]) for r in rows if r["mode"] == mode and r[key] is not None]
            ax.plot([k for k, _ in pts], [y for _, y in pts], "o-", color=colors[mode], label=f"{mode}: {MODES[mode]}")
        if key == "normalized_processing_cost":
            worst = [worst_case_sharing(k, CACHE_MB, dataset_mb()) for k in ks]
            ax.plot(ks, worst, ":", color=colors["A"], label="worst case with sharing (paper's formula)")
            ax.plot(ks, ks, "--", color="gray", linewidth=1, label="k × one job")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("concurrent jobs (k)")
        finish_axes(ax, ylabel, title)
        res.add_figure(fig, suffix)


def _markdown(res: ExperimentResult, rows: list[dict], duration: float) -> str:
    d = res.data
    lines = [f"## {TITLE}", ""]
    lines.append(f"Measured here ({'quick, ' if res.quick else ''}{duration:g} s per run after warm-up): k = "
                 f"{', '.join(map(str, d['ks']))} jobs, each a trainer with a 40 ms model step reading a CPU-heavy "
                 "`synthetic` pipeline (about half a core per job), one worker per deployment; mode C's deployments "
                 "ran side by side on this machine. Worker CPU-seconds per delivered batch and throughput are taken "
                 "over the seconds in which every trainer was measuring; processing cost = k × CPU-seconds per "
                 f"batch, normalized to one job. Worst case with sharing: k − (k−1) × ({d['cache_mb']} MB cache / "
                 f"{d['dataset_mb']:.1f} MB epoch).")
    lines.append("")
    lines.append(md_table(
        ["mode", "k", "batches/s per job", "slowdown", "worker CPU per delivered batch", "processing cost (norm.)",
         "worst case with sharing", "paper"],
        [[f"{r['mode']}: {MODES[r['mode']]}", r["k"], fmt(r["per_job_bps"]), fmt(r["slowdown"], suffix="×"),
          fmt(1e3 * r["worker_cpu_s_per_batch"] if r["worker_cpu_s_per_batch"] is not None else None, suffix=" ms"),
          fmt(r["normalized_processing_cost"], suffix="×"),
          fmt(r["worst_case_with_sharing"], suffix="×"), PAPER[r["mode"]] if r["k"] == max(d["ks"]) else ""]
         for r in rows]))
    lines.append("")
    kmax = max(d["ks"])
    by = {(r["mode"], r["k"]): r for r in rows}
    b_slow, c_slow = by[("B", kmax)]["slowdown"], by[("C", kmax)]["slowdown"]
    b_text = (f"so B already slows down at k = {kmax} ({fmt(b_slow, suffix='×')}), where the paper's first "
              "slowdown was at 8 jobs" if b_slow and b_slow > 1.1 else
              f"though B still kept up at k = {kmax}, as the paper's did up to 4 jobs")
    c_text = (f", so C's slowdown at k = {kmax} ({fmt(c_slow, suffix='×')}) is this machine's, not the mode's."
              if c_slow and c_slow > 1.05 else ".")
    lines.append(f"With sharing (A) the worker spent {d['a_vs_b_cpu_per_batch_k2']:.2f}× the CPU per delivered batch "
                 "of one deployment without sharing (B) at k = 2: each element is computed once and sent to both jobs. "
                 "Why they differ from the paper: here a deployment is one worker on a shared 2-core machine, not "
                 f"128 workers, {b_text}; and mode C's deployments share the same two cores instead of getting "
                 "machines of their own" + c_text)
    lines.append("")
    lines.append(md_images(res))
    return "\n".join(lines)
