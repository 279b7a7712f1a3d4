"""Pecan's placement against remote-only autoscaling and colocated input (Pecan, USENIX ATC'24).

The job is latency-bound by construction (as in cachew-autoscale): each worker serves 6 elements × 5 ms of CPU-free
latency per batch (33 batches/s) and the model step takes 10 ms, so 3 producers reach the ideal (100 batches/s)
while the trainer's own CPU sits idle (its model sleeps like an accelerator busy on the step).

1. Colocated: the pipeline in the trainer process, no service.
2. Remote only, autoscaled by Cachew's policy (start at 1 worker, add while batch time improves by more than 3%).
3. `service.placement: auto`: Pecan's policy places remote workers and up to LOCAL_CAP workers inside the trainer.
Each run's final placement is measured (batches/s over its last windows there) and priced with the cost model for one
nominal epoch of EPOCH_BATCHES batches at that rate, on both bases of Equation 1; workers inside the trainer add
nothing (the trainer host is charged whatever its CPUs do). Prices: the shipped on-demand catalog, as Pecan's artifact
prices whole on-demand VMs (a TPU v2-8 and n2-standard-8 workers); the policy and the verdict use the vm-hours basis.
On the utilization basis a latency-bound worker, busy at about a tenth of a core, costs almost nothing, so there a
placement's saving is smaller than the noise in its measured rate (both are shown).
"""

from __future__ import annotations

from pathlib import Path

from dsctl.costmodel import load_catalog, price, usage_from_spec
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.timeline import placement_changes
from dsctl.specs.schema import Mode

from .common import ExperimentResult, Log, finish_axes, fmt, md_images, md_table, money, new_figure, run_job, write_spec

NAME = "pecan"
TITLE = "Pecan's hybrid placement vs remote-only autoscaling and colocated input"
SUMMARY = "the trainer's idle CPUs replace remote workers: fewer remote workers at the same batch time, cheaper batches"

LOCAL_CAP = 3
EPOCH_BATCHES = 10_000  # a nominal epoch: each placement is priced for this many batches at its measured rate
BASIS = "vm-hours"  # what the policy weighs and the verdict judges (module docstring)
SAME_BATCH_TIME = 0.05  # "the same batch time": within 5%
# Pecan's own results, from its abstract and artifact (../shared/reference/paper-results.md).
PAPER = {"preprocessing_cost_vs_remote": -0.87, "total_cost_vs_remote_up_to": -0.60, "total_cost_vs_colocated": -0.55}

JOB = """
name: {name}
service: {{workers: 1, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8{placement}}}
trainer:
  machine: tpu-v2-8
  duration_s: {duration}
  warmup_batches: 5
  window_s: 0.5
  model: {{kind: synthetic, step_time_ms: 10}}
pipeline: {{builtin: synthetic, params: {{batch_size: 6, latency_ms: 5, epochs: null}}}}
pricing: gcp-us-central1-2025
cost_basis: vm-hours
{autoscale}
"""

# Both policies judge a change against a 5% threshold here, not their 3%: on a shared 2-core machine one window's
# batch time moves by up to ~3% with nothing changed (measured: a removal that cost nothing read +2.9%).
SETTINGS = "settings: {{window_batches: {window}, pause_batches: {pause}, threshold: 0.05}}"


def run(out_dir: Path, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    res = ExperimentResult(NAME, TITLE, quick, out_dir)
    # Colocated needs only its rate; the policies need time to search (Pecan's about a dozen measured changes).
    duration, colocated_s, window, pause = (45, 10, 80, 120) if quick else (120, 30, 150, 150)
    settings = SETTINGS.format(window=window, pause=pause)
    jobs: dict[str, tuple[Mode, str, str]] = {
        "colocated": ("colocated", "", ""),
        "remote (cachew)": ("service", "", f"autoscale: {{policy: cachew, max_workers: 6, {settings}}}"),
        "auto (pecan)": ("service", f", placement: auto, local_workers: {LOCAL_CAP}",
                         f"autoscale: {{max_workers: 6, {settings}}}"),
    }
    placements = {}
    for label, (mode, placement, autoscale) in jobs.items():
        name = "pecan-" + label.split()[0]
        loaded = write_spec(out_dir, name, JOB.format(name=name, duration=colocated_s if mode == "colocated" else duration,
                                                      placement=placement,
                                                      autoscale=autoscale))
        outcome = run_job(loaded, mode=mode, workers=0 if mode == "colocated" else None, repeat=True, log=log,
                          label=f"{NAME} {label}")
        placements[label] = _placement(outcome.run_id, loaded.spec, mode)
    res.data = {"placements": placements, "epoch_batches": EPOCH_BATCHES, "local_cap": LOCAL_CAP, "paper": PAPER}
    res.data["verdict"] = verdict(placements)
    for label, p in placements.items():
        res.rows.append({"placement": label, "remote_workers": p["remote"], "local_workers": p["local"],
                         "batches_per_s": p["bps"], "epoch_cost_vm_hours": p["epoch_cost"]["vm-hours"],
                         "preprocessing_cost_vm_hours": p["preprocessing_cost"]["vm-hours"],
                         "epoch_cost_utilization": p["epoch_cost"]["utilization"]})
    _plot(res, placements)
    res.markdown = _markdown(res)
    return res


def _placement(run_id: str, spec, mode: str) -> dict:
    """Where a run ended (remote workers, local workers per trainer), its rate there (measured), and one epoch's cost
    at that rate (predicted by the cost model from the measured rate and the run's measured worker CPU)."""
    store = RunStore()
    windows = [w for w in store.windows(run_id) if w["trainer"] == 0 and not w["warmup"]]
    last = windows[-1]
    remote = last["workers"] if mode == "service" else 0
    local = last.get("local_workers") or 0

    def at_end(w: dict) -> bool:
        return w["workers"] == last["workers"] and (w.get("local_workers") or 0) == local

    tail = [w for w in windows if at_end(w)][-10:]
    bps = sum(w["batches"] for w in tail) / sum(w["t_end"] - w["t_start"] for w in tail)
    summary = store.recorded(run_id).summary
    catalog = load_catalog(spec.pricing)
    usage = usage_from_spec(spec, job_time_s=EPOCH_BATCHES / bps, batches=EPOCH_BATCHES, workers=remote,
                            measured=summary.model_dump() if remote else None)
    costs = {basis: price(usage, catalog, basis) for basis in ("utilization", "vm-hours")}
    return {"run_id": run_id, "remote": remote, "local": local, "bps": bps, "batch_time_ms": 1000.0 / bps,
            "changes": placement_changes(windows), "timeline": [(w["t_end"], w["workers"], w.get("local_workers") or 0)
                                                                 for w in windows],
            "epoch_cost": {b: c.total for b, c in costs.items()},
            "preprocessing_cost": {b: c.service for b, c in costs.items()}}


def verdict(placements: dict) -> dict:
    """What the run shows, from its numbers: Pecan's placement ends with fewer remote workers than Cachew's policy at
    a batch time within 5%, and its batches cost less (Equation 1, vm-hours basis: see the module docstring)."""
    remote, auto, colocated = (placements[k] for k in ("remote (cachew)", "auto (pecan)", "colocated"))
    slower = remote["bps"] / auto["bps"] - 1.0  # auto's batch time over remote-only's, less one
    v = {"fewer_remote": auto["remote"] < remote["remote"],
         "same_batch_time": slower <= SAME_BATCH_TIME, "batch_time_change": slower,
         "used_local": auto["local"] > 0,
         "total_vs_remote": auto["epoch_cost"][BASIS] / remote["epoch_cost"][BASIS] - 1.0,
         "preprocessing_vs_remote": auto["preprocessing_cost"][BASIS] / remote["preprocessing_cost"][BASIS] - 1.0,
         "total_vs_colocated": auto["epoch_cost"][BASIS] / colocated["epoch_cost"][BASIS] - 1.0,
         "total_vs_remote_utilization": (auto["epoch_cost"]["utilization"] / remote["epoch_cost"]["utilization"]
                                         - 1.0)}
    v["cheaper"] = v["total_vs_remote"] < 0
    v["reproduced"] = v["fewer_remote"] and v["same_batch_time"] and v["cheaper"]
    return v


def _plot(res: ExperimentResult, placements: dict) -> None:
    fig, ax = new_figure()
    for label, color in (("remote (cachew)", "tab:green"), ("auto (pecan)", "tab:orange")):
        p = placements[label]
        ts = [t for t, _, _ in p["timeline"]]
        ax.step(ts, [n for _, n, _ in p["timeline"]], where="pre", color=color, label=f"{label}: remote workers")
        if any(lo for _, _, lo in p["timeline"]):
            ax.step(ts, [lo for _, _, lo in p["timeline"]], where="pre", color=color, linestyle="--",
                    label=f"{label}: workers in the trainer")
    ax.set_xlabel("time since the trainer started (s)")
    finish_axes(ax, "tf.data service workers", "Placement over time (measured here)")
    res.add_figure(fig, "placement")


def _conclusion(d: dict) -> str:
    v, p = d["verdict"], d["placements"]
    remote, auto = p["remote (cachew)"], p["auto (pecan)"]
    out = [f"Cachew's policy ends with {remote['remote']} remote workers at {fmt(remote['bps'])} batches/s; Pecan's "
           f"with {auto['remote']} remote and {auto['local']} in the trainer at {fmt(auto['bps'])} batches/s "
           f"(batch time {v['batch_time_change']:+.1%})."]
    if v["reproduced"]:
        out.append(f"So the trainer's idle CPUs replaced {remote['remote'] - auto['remote']} remote worker(s) at the "
                   f"same batch time (within {SAME_BATCH_TIME:.0%}), and an epoch costs {v['total_vs_remote']:+.1%} "
                   f"in all, its preprocessing {v['preprocessing_vs_remote']:+.1%} ({BASIS} basis): the direction "
                   "of Pecan's result.")
    else:
        why = [w for w, bad in (("no fewer remote workers", not v["fewer_remote"]),
                                (f"batch time more than {SAME_BATCH_TIME:.0%} longer", not v["same_batch_time"]),
                                ("no cheaper batches", not v["cheaper"])) if bad]
        out.append(f"This run does not reproduce Pecan's result: {', '.join(why)}.")
    out.append(f"Against colocated input an epoch costs {v['total_vs_colocated']:+.1%} ({BASIS} basis). On the "
               f"utilization basis, which charges these workers' tenth of a core, Pecan's epoch costs "
               f"{v['total_vs_remote_utilization']:+.1%} against Cachew's: there the workers' charge is too small for the "
               "placement to show, and the difference is mostly the measured rates'.")
    return " ".join(out)


def _markdown(res: ExperimentResult) -> str:
    d = res.data
    rows = [[label, p["remote"], p["local"], fmt(p["bps"]), money(p["epoch_cost"]["vm-hours"]),
             money(p["preprocessing_cost"]["vm-hours"]), money(p["epoch_cost"]["utilization"])]
            for label, p in d["placements"].items()]
    paper = d["paper"]
    return f"""## {TITLE}

A latency-bound job whose trainer has idle CPU (measured here: each placement's final workers and its batches/s over
its last windows there; cost: predicted by the cost model at on-demand us-central1 prices for one nominal epoch of
{EPOCH_BATCHES:,} batches at the measured rate; workers in the trainer add nothing, its host is charged either way).

{md_table(["placement", "remote workers", "in the trainer", "batches/s", "epoch (vm-hours)",
           "preprocessing (vm-hours)", "epoch (utilization)"], rows)}

{_conclusion(d)}

Pecan reports (taken from the paper): preprocessing cost {paper['preprocessing_cost_vs_remote']:+.0%} on average and
total cost up to {paper['total_cost_vs_remote_up_to']:+.0%} against remote-only (Cachew-style) placement, and total
cost {paper['total_cost_vs_colocated']:+.0%} against colocated, on ResNet50 and RetinaNet with TPU v2-8 trainers.

Why they differ: Pecan's numbers come from real input pipelines on cloud VMs whose workers do real CPU work; ours
from one 2-core machine, a synthetic model step and CPU-free latency standing for remote reads, with the trainer's
accelerator price dominating each epoch's cost, so only the direction is comparable.

{md_images(res)}
"""
