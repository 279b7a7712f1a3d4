"""Figure 9, worker sweep: measure what fits here, predict 8..640 workers with the calibrated model,
and check the same model against the paper's own M1 sweep.

Here (measured): a latency-bound `synthetic` job whose knee is known by construction. Each worker
serves 8 elements × 20 ms of CPU-free latency per batch, 6.25 batches/s; the model step takes
4 ms, so the trainer's ideal is ~200 batches/s and the knee ~30 workers, far beyond what one
2-core machine should run, like M1's (512) beyond any single host. One `dsctl sweep`-style run
(SweepRunner, one deployment scaled in place) measures the colocated and ideal baselines and
1..4 workers, plus 8 (quick) or 8 and 16 (full) held out to check the prediction.

Predicted: ThroughputModel calibrated on 1..4 workers and the baselines, over 8..640 workers;
cost per 1,000 batches by the cost model with the measured workers' mean utilization (as
`dsctl sweep --simulate` does). The trainer is priced as a TPU v2-8 host, workers as n2-standard-8.

Paper: the same model calibrated on M1's published 8-worker point and baselines
(specs/examples/calibrations/paper-m1.yaml), beside the paper's other points.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

import dsctl.specs
from dsctl.costmodel import RunUsage, ThroughputModel, load_catalog, price
from dsctl.orchestrator.sweep import SweepOptions, SweepRunner, Window
from dsctl.specs.calibration import load_calibration

from .common import ExperimentResult, Log, fmt, md_images, md_table, new_figure, write_spec

NAME = "fig9"
TITLE = "Figure 9: worker sweep"
SUMMARY = "real sweep of a latency-bound job (1..4 workers + held-out 8), predicted 8..640; the model on M1's points"

SIMULATED = [8, 16, 32, 64, 128, 256, 512, 640]  # the paper's swept counts
CALIBRATE_UP_TO = 4
PAPER_M1 = {8: 0.30, 16: 0.64, 64: 2.3, 128: 4.77, 512: 6.47, 640: 6.47}  # 512 and 640: "ideal"
PAPER_M1_NOTES = {8: "time and cost 83% higher", 16: "1.14×", 64: "4.1×", 128: "8.6×",
                  512: "12.3× time, 11.4× cost saving", 640: "time unchanged, cost marginally higher"}
M1_CALIBRATION = Path(dsctl.specs.__file__).parent / "examples" / "calibrations" / "paper-m1.yaml"
M1_TRAINER_HOSTS = 4  # 32 accelerators, priced as 4 TPU v2-8 hosts (as in fig8's rows)

LOCAL_SPEC = """
name: fig9-sweep
service:
  workers: 1
  worker_machine: n2-standard-8
  dispatcher_machine: n2-standard-8
  provisioning: spot             # paper-2023-06's n2 prices are Spot prices
trainer:
  machine: tpu-v2-8
  model: {kind: synthetic, step_time_ms: 4}   # ideal ~200-250 batches/s
  duration_s: 60                              # the sweep runs its own windows
  warmup_batches: 5
pipeline:
  builtin: synthetic
  params: {batch_size: 8, latency_ms: 20, epochs: null}   # 160 ms per batch per worker: 6.25 batches/s each
pricing: paper-2023-06
"""


def run(out_dir: Path, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    res = ExperimentResult(NAME, TITLE, quick, out_dir)
    loaded = write_spec(out_dir, "fig9-sweep", LOCAL_SPEC)
    held_out = [8] if quick else [8, 16]
    counts = list(range(1, CALIBRATE_UP_TO + 1)) + held_out
    options = SweepOptions(counts=counts, window=Window(seconds=4.0 if quick else 10.0),
                           warmup_s=1.5 if quick else 3.0)  # the sweep's own plots stay in its run dir
    runner = SweepRunner(loaded, options)
    if log:
        log(f"fig9: sweep {runner.sweep_id}: baselines, then {counts} workers on one deployment")
        runner.listener = _phase_logger(log)
    summary = runner.run()
    base = summary["baselines"]
    colocated, ideal = base["colocated"]["batches_per_s"], base["ideal"]["batches_per_s"]
    measured = [p for p in summary["points"] if not p.get("predicted")]
    calib = {p["workers"]: p["batches_per_s"] for p in measured if p["workers"] <= CALIBRATE_UP_TO and p["batches_per_s"]}
    model = ThroughputModel.calibrate(calib, ideal, colocated)
    predicted = _predict(loaded.spec, model, measured, base["colocated"]["cost_per_1000_batches"])
    checks = [{"workers": p["workers"], "measured_bps": p["batches_per_s"], "predicted_bps": model.predict(p["workers"]),
               "error": model.predict(p["workers"]) / p["batches_per_s"] - 1}
              for p in measured if p["workers"] in held_out and p["batches_per_s"]]
    designed_knee = ideal / (1000.0 / (20 * 8))  # workers whose latency-bound rate adds up to the ideal
    m1 = _m1()

    res.data = {
        "sweep_id": runner.sweep_id, "colocated_bps": colocated, "ideal_bps": ideal,
        "measured": [{k: p.get(k) for k in ("workers", "batches_per_s", "speedup", "cost_saving", "run_id",
                                            "worker_cpu_cores")} for p in measured],
        "model": model.to_dict(), "predicted": predicted, "held_out": checks,
        "designed_knee": designed_knee, "model_knee": model.knee(0.03), "m1": m1,
    }
    for p in measured:
        res.rows.append({"part": "measured here", "workers": p["workers"], "batches_per_s": p["batches_per_s"],
                         "speedup": p.get("speedup"), "cost_saving": p.get("cost_saving"),
                         "used_for_calibration": p["workers"] <= CALIBRATE_UP_TO, "run_id": p.get("run_id")})
    for p in predicted:
        res.rows.append({"part": "predicted here", "workers": p["workers"], "batches_per_s": p["batches_per_s"],
                         "speedup": p["speedup"], "cost_saving": p["cost_saving"]})
    for p in m1["points"]:
        res.rows.append({"part": "M1 model", "workers": p["workers"], "batches_per_s": p["batches_per_s"],
                         "speedup": p["speedup"], "cost_saving": p["cost_saving"],
                         "paper_batches_per_s": PAPER_M1.get(p["workers"]), "paper_note": PAPER_M1_NOTES.get(p["workers"])})
    _plots(res, measured, predicted, colocated, ideal, m1)
    res.markdown = _markdown(res)
    return res


def _phase_logger(log: Log):
    last = {"phase": None}

    def listener(progress) -> None:
        if progress.phase != last["phase"]:
            last["phase"] = progress.phase
            log(f"  {progress.phase}")

    return listener


def _predict(spec, model: ThroughputModel, measured: list[dict], colocated_cost: float | None) -> list[dict]:
    """Predicted points priced like `dsctl sweep --simulate` prices them: an hour at the predicted rate,
    workers using what the measured ones used on average."""
    catalog = load_catalog(spec.pricing)
    cpus = [p["worker_cpu_cores"] for p in measured if p.get("worker_cpu_cores") is not None]
    mems = [p["worker_mem_gb"] for p in measured if p.get("worker_mem_gb") is not None]
    cpu, mem = (mean(cpus) if cpus else None), (mean(mems) if mems else None)
    out = []
    for n in SIMULATED:
        bps = model.predict(n)
        usage = RunUsage(job_time_s=3600.0, batches=bps * 3600.0, n_trainers=1, trainer_machine=spec.trainer.machine,
                         accelerators_per_trainer=spec.trainer.accelerators_per_trainer, n_workers=n,
                         worker_machine=spec.service.worker_machine, worker_avg_cpu_cores=cpu, worker_avg_mem_gb=mem,
                         dispatcher_machine=spec.service.dispatcher_machine,
                         service_provisioning=spec.service.provisioning,
                         trainer_provisioning=spec.trainer.provisioning)
        cost = price(usage, catalog, spec.cost_basis).per_1000_batches
        out.append({"workers": n, "batches_per_s": bps, "speedup": model.speedup(n),
                    "fraction_of_ideal": bps / model.ideal_bps, "cost_per_1000_batches": cost,
                    "cost_saving": colocated_cost / cost if colocated_cost and cost else None})
    return out


def _m1() -> dict:
    """The model calibrated on the paper's M1 numbers; costs on the vm-hours basis (4 TPU v2-8 hosts,
    whole n2-standard-8 workers and a dispatcher at the paper's prices)."""
    cal = load_calibration(M1_CALIBRATION)
    model = ThroughputModel.calibrate(dict(cal.points), cal.ideal, cal.colocated)
    catalog = load_catalog("paper-2023-06")

    def cost(bps: float, workers: int) -> float:
        usage = RunUsage(job_time_s=3600.0, batches=bps * 3600.0 * M1_TRAINER_HOSTS, n_trainers=M1_TRAINER_HOSTS,
                         trainer_machine="tpu-v2-8", n_workers=workers,
                         worker_machine="n2-standard-8" if workers else None,
                         dispatcher_machine="n2-standard-8" if workers else None,
                         service_provisioning="spot")  # the paper's n2 prices are Spot prices
        return price(usage, catalog, "vm-hours").per_1000_batches

    c0 = cost(cal.colocated, 0)
    points = []
    for n in SIMULATED:
        bps = model.predict(n)
        points.append({"workers": n, "batches_per_s": bps, "speedup": bps / cal.colocated, "cost_saving": c0 / cost(bps, n),
                       "paper_batches_per_s": PAPER_M1.get(n),
                       "paper_speedup": PAPER_M1[n] / cal.colocated if n in PAPER_M1 else None})
    return {"model": model.to_dict(), "colocated_bps": cal.colocated, "ideal_bps": cal.ideal,
            "calibrated_on": {str(n): t for n, t in cal.points.items()}, "points": points}


def _log2_workers(ax, counts: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = sorted(set(counts))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("tf.data service workers")


def _plots(res: ExperimentResult, measured, predicted, colocated, ideal, m1) -> None:
    cal = [p for p in measured if p["workers"] <= CALIBRATE_UP_TO]
    held = [p for p in measured if p["workers"] > CALIBRATE_UP_TO]
    counts = [p["workers"] for p in measured] + [p["workers"] for p in predicted]
    for key, ylabel, suffix, title in (
            ("speedup", "speedup over colocated (×)", "speedup", "Figure 9a here: speedup"),
            ("cost_saving", "cost saving over colocated (×)", "cost-saving", "Figure 9b here: cost saving")):
        fig, ax = new_figure()
        ax.plot([p["workers"] for p in predicted], [p[key] for p in predicted], "o--", color="tab:blue",
                markerfacecolor="white", label="predicted (model calibrated on 1–4 workers)")
        ax.plot([p["workers"] for p in cal], [p[key] for p in cal], "o-", color="tab:blue", label="measured, used to calibrate")
        if held:
            ax.plot([p["workers"] for p in held], [p[key] for p in held], "s", color="tab:red", label="measured, held out")
        if key == "speedup":
            ax.axhline(ideal / colocated, color="tab:green", linestyle=":", label=f"ideal ({ideal / colocated:.3g}×)")
        ax.axhline(1.0, color="gray", linestyle="-.", linewidth=1, label="colocated (1×)")
        _log2_workers(ax, counts)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        res.add_figure(fig, f"local-{suffix}")

    pts = m1["points"]
    for key, paper_key, ylabel, suffix, title in (
            ("speedup", "paper_speedup", "speedup over colocated (×)", "m1-speedup", "Figure 9a, M1: model vs paper"),
            ("cost_saving", None, "cost saving over colocated (×)", "m1-cost-saving", "Figure 9b, M1: model vs paper")):
        fig, ax = new_figure()
        ax.plot([p["workers"] for p in pts], [p[key] for p in pts], "o--", color="tab:blue", markerfacecolor="white",
                label="model calibrated on M1's 8-worker point (vm-hours)" if key == "cost_saving" else
                "model calibrated on M1's 8-worker point")
        if paper_key:
            ax.plot([p["workers"] for p in pts if p[paper_key]], [p[paper_key] for p in pts if p[paper_key]], "s",
                    color="tab:red", label="paper")
            ax.axhline(m1["ideal_bps"] / m1["colocated_bps"], color="tab:green", linestyle=":",
                       label=f"ideal ({m1['ideal_bps'] / m1['colocated_bps']:.3g}×)")
        else:
            ax.plot([8, 512], [1 / 1.83, 11.4], "s", color="tab:red", label="paper (8: 83% costlier; 512: 11.4×)")
        ax.axhline(1.0, color="gray", linestyle="-.", linewidth=1, label="colocated (1×)")
        _log2_workers(ax, [p["workers"] for p in pts])
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        res.add_figure(fig, suffix)


def _markdown(res: ExperimentResult) -> str:
    d = res.data
    m = d["model"]
    lines = [f"## {TITLE}", ""]
    lines.append(f"Measured here ({'quick' if res.quick else 'full'}): a latency-bound `synthetic` job "
                 "(6.25 batches/s per worker, model step 4 ms), colocated and ideal baselines, then "
                 f"{', '.join(str(p['workers']) for p in d['measured'])} workers on one deployment scaled in place "
                 f"(sweep {d['sweep_id']}). The model was calibrated on 1–{CALIBRATE_UP_TO} workers only: "
                 f"r = {m['per_worker_bps']:.3g} batches/s per worker, n0 = {m['overhead_workers']:.2g}, "
                 f"ideal {d['ideal_bps']:.3g} batches/s (colocated {d['colocated_bps']:.3g}); its knee (within 3% of "
                 f"ideal) is {d['model_knee']} workers; by design the workers' rates add up to the ideal at "
                 f"{d['designed_knee']:.0f} (ideal / 6.25), and the last 3% take about 1.2× that.")
    lines.append("")
    rows = [[p["workers"], fmt(p["batches_per_s"]), fmt(p.get("speedup"), suffix="×"), fmt(p.get("cost_saving"), suffix="×"),
             "measured" + (" (calibration)" if p["workers"] <= CALIBRATE_UP_TO else " (held out)")] for p in d["measured"]]
    held = {c["workers"]: c for c in d["held_out"]}
    for p in d["predicted"]:
        note = "predicted"
        if p["workers"] in held:
            note += f" (measured {fmt(held[p['workers']]['measured_bps'])}: error {round(100 * held[p['workers']]['error']):+d}%)"
        rows.append([p["workers"], fmt(p["batches_per_s"]), fmt(p["speedup"], suffix="×"), fmt(p["cost_saving"], suffix="×"), note])
    lines.append(md_table(["workers", "batches/s", "speedup", "cost saving", ""], rows))
    lines.append("")
    m1 = d["m1"]
    lines.append("The same model calibrated on the paper's M1 numbers (colocated 0.55, ideal 6.47, 8 workers 0.30 "
                 "batches/s), beside the paper's other points; cost by the cost model (vm-hours, 4 TPU v2-8 hosts, "
                 "whole n2-standard-8 workers at $0.08/h):")
    lines.append("")
    lines.append(md_table(
        ["workers", "model b/s", "paper b/s", "model speedup", "paper b/s ÷ 0.55", "model cost saving", "paper says"],
        [[p["workers"], fmt(p["batches_per_s"]), fmt(PAPER_M1.get(p["workers"])) if p["workers"] not in (512, 640)
          else "ideal", fmt(p["speedup"], suffix="×"), fmt(p["paper_speedup"], suffix="×"),
          fmt(p["cost_saving"], suffix="×"), PAPER_M1_NOTES.get(p["workers"], "—")] for p in m1["points"]]))
    lines.append("")
    errors = [abs(p["batches_per_s"] / p["paper_batches_per_s"] - 1) for p in m1["points"]
              if p["paper_batches_per_s"] and p["workers"] != 8]
    lines.append("Why they differ: our job runs on one 2-core machine, where only CPU-free (latency-bound) work "
                 "scales with workers and counts beyond "
                 f"{max(p['workers'] for p in d['measured'])} are predicted, not measured; on M1 the model, fitted "
                 f"on the one 8-worker point, stays within {100 * max(errors):.0f}% of the paper's other points, but "
                 "its cost savings are lower than the paper's because it prices hundreds of whole $0.08/h workers "
                 "against $4.50/h TPU hosts, not the production prices and worker utilization the paper used.")
    lines.append("")
    lines.append(md_images(res))
    return "\n".join(lines)
