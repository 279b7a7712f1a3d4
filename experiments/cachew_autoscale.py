"""Cachew's autoscaler against a sweep and against Kubernetes' CPU autoscaler (Cachew ATC'22, §4.3, §6).

The job is latency-bound by construction: each worker serves 8 elements × 5 ms of CPU-free
latency per batch (25 batches/s) and the model step takes 10 ms, so 4 workers reach the ideal
(100 batches/s) while each worker uses little CPU, like workers reading remote storage.

1. A sweep (1..6 workers, one deployment scaled in place) measures the curve and its knee.
2. The same job autoscaled by the Cachew policy (start at 1 worker, add while batch time
   improves by more than 3%).
3. The same job autoscaled by the CPU-utilization policy (HPA at an 80% target), with its
   periods shortened to fit the run.
Each policy's final choice is placed on the measured curve and priced with the cost model: the
cost per 1,000 batches at that count, and what 100,000 steps would cost at its throughput.
"""

from __future__ import annotations

from pathlib import Path

from dsctl.costmodel import load_catalog, price, usage_from_spec
from dsctl.orchestrator.store import RunStore
from dsctl.orchestrator.sweep import SweepOptions, SweepRunner, Window
from dsctl.orchestrator.timeline import scaling_changes

from .common import ExperimentResult, Log, fmt, md_images, md_table, money, new_figure, run_job, write_spec

NAME = "cachew-autoscale"
TITLE = "Cachew autoscaling vs a sweep and the CPU autoscaler"
SUMMARY = "Cachew's batch-time policy converges to the sweep's knee; HPA on CPU under-provisions a latency-bound job"

KNEE = 4
STEPS_PRICED = 100_000
CPU_TARGET = 0.8  # HPA's default target utilization, the CPU policy's setting below

JOB = """
name: {name}
service: {{workers: 1, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8, provisioning: spot}}
trainer:
  machine: tpu-v2-8
  duration_s: {duration}
  warmup_batches: 5
  window_s: 0.5
  model: {{kind: synthetic, step_time_ms: 10}}
pipeline: {{builtin: synthetic, params: {{batch_size: 8, latency_ms: 5, epochs: null}}}}
pricing: paper-2023-06
{autoscale}
"""

CACHEW = """autoscale:
  policy: cachew
  max_workers: 8
  settings: {window_batches: 150, pause_batches: 100, recheck_batches: 450}
"""

# HPA's periods (15 s sync, 30 s pause, 300 s downscale stabilization) shortened to fit a short run;
# the target and the formula are HPA's.
CPU = f"""autoscale:
  policy: cpu
  max_workers: 8
  settings: {{target_util: {CPU_TARGET}, sync_period_s: 3, pause_after_change_s: 4, downscale_stabilization_s: 20}}
"""


def run(out_dir: Path, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    res = ExperimentResult(NAME, TITLE, quick, out_dir)
    duration = 40 if quick else 90
    sweep_spec = write_spec(out_dir, "cachew-sweep", JOB.format(name="cachew-sweep", duration=60, autoscale=""))
    # Cachew's 3% rule needs points steadier than 3%: quick 3 s windows on a shared 2-core machine move plateau
    # points by up to ~6%, so the quick sweep recommends the smallest count within 10% of the best.
    tolerance = 0.10 if quick else 0.03
    runner = SweepRunner(sweep_spec, SweepOptions(counts=list(range(1, 7)), window=Window(seconds=3.0 if quick else 8.0),
                                                  warmup_s=1.5, tolerance=tolerance))
    if log:
        log(f"{NAME}: sweep {runner.sweep_id} over 1..6 workers")
    sweep = runner.run()
    curve = {p["workers"]: p for p in sweep["points"]}

    policies = {}
    for policy, block in (("cachew", CACHEW), ("cpu", CPU)):
        loaded = write_spec(out_dir, f"cachew-{policy}", JOB.format(name=f"autoscale-{policy}", duration=duration,
                                                                    autoscale=block))
        outcome = run_job(loaded, repeat=True, log=log, label=f"{NAME} {policy}")
        policies[policy] = _policy_result(outcome.run_id, loaded.spec, curve)

    res.data = {"sweep_id": runner.sweep_id, "knee_by_construction": KNEE,
                "sweep_recommendation": (sweep["recommendation"]["smallest"] or {}).get("workers"),
                "sweep_tolerance": tolerance,
                "curve": [{k: curve[n].get(k) for k in ("workers", "batches_per_s", "cost_per_1000_batches")}
                          for n in sorted(curve)],
                "policies": policies}
    res.data["verdict"] = verdict(res.data)
    for n in sorted(curve):
        res.rows.append({"part": "sweep", "workers": n, "batches_per_s": curve[n]["batches_per_s"],
                         "cost_per_1000_batches": curve[n]["cost_per_1000_batches"]})
    for name, p in policies.items():
        res.rows.append({"part": f"{name} policy", "workers": p["final_workers"], "batches_per_s": p["final_bps"],
                         "cost_per_1000_batches": p["cost_per_1000_batches"], "cost_100k_steps": p["cost_100k_steps"],
                         "mean_workers": p["mean_workers"], "changes": len(p["changes"])})
    _plots(res, curve, policies)
    res.markdown = _markdown(res)
    return res


def _policy_result(run_id: str, spec, curve: dict) -> dict:
    """Where a policy settled, its steady throughput there, and what the cost model says it costs."""
    store = RunStore()
    windows = [w for w in store.windows(run_id) if w["trainer"] == 0 and not w["warmup"]]
    final = windows[-1]["workers"]
    tail = [w for w in windows if w["workers"] == final][-10:]
    bps = sum(w["batches"] for w in tail) / sum(w["t_end"] - w["t_start"] for w in tail)
    catalog = load_catalog(spec.pricing)
    summary = store.recorded(run_id).summary
    point = curve.get(final, {})
    usage = usage_from_spec(spec, job_time_s=STEPS_PRICED / bps, batches=STEPS_PRICED, workers=final)
    cost = price(usage, catalog, "vm-hours")
    return {"run_id": run_id, "final_workers": final, "final_bps": bps,
            "mean_workers": summary.get("mean_workers"),
            # A local worker is granted one core: its mean cores in use is the utilization HPA sees.
            "worker_cpu_util": min(summary["worker_cpu_cores"], 1.0) if summary.get("worker_cpu_cores") is not None else None,
            "changes": scaling_changes(windows), "timeline": [(w["t_end"], w["workers"]) for w in windows],
            "cost_per_1000_batches": point.get("cost_per_1000_batches"), "cost_100k_steps": cost.total,
            "training_hours_100k_steps": STEPS_PRICED / bps / 3600}


def _plots(res: ExperimentResult, curve: dict, policies: dict) -> None:
    fig, ax = new_figure()
    ns = sorted(curve)
    ax.plot(ns, [curve[n]["batches_per_s"] for n in ns], marker="o", label="sweep (measured)")
    markers = {"cachew": ("tab:green", "*"), "cpu": ("tab:red", "X")}
    for name, p in policies.items():
        color, marker = markers[name]
        ax.plot([p["final_workers"]], [p["final_bps"]], marker=marker, markersize=14, color=color, linestyle="none",
                label=f"{name} policy settles at {p['final_workers']}")
    ax.axvline(KNEE, color="gray", linestyle=":", label=f"knee by construction ({KNEE})")
    ax.set_xlabel("tf.data service workers")
    ax.set_ylabel("batches/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("Where each autoscaler settles, on the measured curve")
    res.add_figure(fig, "choices")

    fig, ax = new_figure()
    for name, p in policies.items():
        ts = [t for t, _ in p["timeline"]]
        ax.step(ts, [n for _, n in p["timeline"]], where="pre", color=markers[name][0], label=f"{name} policy")
    ax.set_xlabel("time since the trainer started (s)")
    ax.set_ylabel("tf.data service workers")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title("Workers over time (Cachew Figure 9 style)")
    res.add_figure(fig, "timeline")


def verdict(d: dict) -> dict:
    """What the run shows, computed from its numbers, so the section's conclusion can never outlive them:
    the sweep finds the designed knee, Cachew's policy settles within one worker of the sweep's choice, and the
    CPU policy settles below it with less throughput and a higher cost (Cachew §6: HPA under-provisions)."""
    rec, c, h = d["sweep_recommendation"], d["policies"]["cachew"], d["policies"]["cpu"]
    known = rec is not None  # None: the sweep's window was too short to recommend from (recommend.py)
    v = {"sweep_at_knee": known and abs(rec - KNEE) <= 1,
         "cachew_at_sweep": known and abs(c["final_workers"] - rec) <= 1,
         "cpu_under_provisions": known and h["final_workers"] < rec and h["final_bps"] < c["final_bps"],
         "cpu_below_target": h.get("worker_cpu_util") is not None and h["worker_cpu_util"] < CPU_TARGET,
         "slower": h["training_hours_100k_steps"] / c["training_hours_100k_steps"],
         "dearer": h["cost_100k_steps"] / c["cost_100k_steps"]}
    v["reproduced"] = v["sweep_at_knee"] and v["cachew_at_sweep"] and v["cpu_under_provisions"] and v["dearer"] > 1
    return v


def _conclusion(d: dict) -> str:
    """The section's findings, each sentence chosen by the verdict."""
    v, rec, c, h = d["verdict"], d["sweep_recommendation"], d["policies"]["cachew"], d["policies"]["cpu"]
    util = h.get("worker_cpu_util")
    if rec is None:
        return ("The sweep recommends nothing: its measurements contradicted each other (a point above the ideal, or "
                "the ideal below colocated), so its window was too short for this machine's noise; run it again.")
    out = [f"The sweep recommends {rec} workers (the fewest within {d.get('sweep_tolerance', 0.03):.0%} of its best; "
           f"{'within one of' if v['sweep_at_knee'] else 'more than one from'} "
           f"the knee by construction, {KNEE}). Cachew's policy settles at {c['final_workers']}, "
           + ("within one worker of the sweep's choice." if v["cachew_at_sweep"] else
              "more than one worker from the sweep's choice: here it did not find the knee.")]
    cpu = (f"The CPU policy (HPA, {CPU_TARGET:.0%} target) settles at {h['final_workers']} "
           f"({fmt(h['final_bps'])} batches/s against Cachew's {fmt(c['final_bps'])})")
    if util is not None:
        cpu += f", its workers using {util:.0%} of a core on average"
    if v["cpu_under_provisions"]:
        curve = {p["workers"]: p["batches_per_s"] for p in d["curve"]}
        sweep = (f" (the sweep: {fmt(curve.get(h['final_workers']))} batches/s at {h['final_workers']} workers, "
                 f"{fmt(curve.get(rec))} at {rec})")
        cpu += (": it under-provisions, " + ("its workers' CPU staying below the target while more workers still raise "
                f"throughput{sweep}." if v["cpu_below_target"] else
                f"although its workers reached the target, stopping short of the sweep's choice{sweep}."))
    else:
        cpu += (": it does not settle below the sweep's choice with less throughput than Cachew's, "
                "so this run does not show HPA under-provisioning.")
    out.append(cpu)
    out.append(f"With the CPU policy's choice, 100,000 steps take {v['slower']:.2f}× as long and cost {v['dearer']:.2f}× as "
               "much as with Cachew's (cost model, paper prices, vm-hours).")
    if v["reproduced"]:
        out.append("This is the direction of Cachew's result (up to 4.1× shorter training and 1.1–3.8× lower cost than "
                   "HPA) and its mechanism: CPU utilization does not see a latency-bound pipeline's need for workers.")
    else:
        out.append("So this run does not reproduce Cachew's result (up to 4.1× shorter training and 1.1–3.8× lower "
                   "cost than HPA).")
    return "\n".join(out)


def _markdown(res: ExperimentResult) -> str:
    d = res.data
    rows = [[name, p["final_workers"], fmt(p["mean_workers"]), fmt(p["final_bps"]), money(p["cost_100k_steps"]),
             fmt(p["training_hours_100k_steps"])] for name, p in d["policies"].items()]
    return f"""## {TITLE}

A latency-bound job whose knee is {KNEE} workers by construction (measured here: the sweep and both policies'
runs; cost: predicted by the cost model at the paper's prices for 100,000 steps at the measured rate).

{md_table(["policy", "final workers", "mean workers", "batches/s there", "100k steps cost (vm-hours)", "hours"], rows)}

{_conclusion(d)}

Why they differ: Cachew's numbers come from cloud deployments of real input pipelines and HPA's own periods;
ours from one 2-core machine, a synthetic model step, CPU-free latency standing for remote reads, and HPA's
periods shortened to fit a short run.

{md_images(res)}
"""
