"""Figure 8, horizontal scale-out: an input-bound job, colocated on one core vs one more core as a
tf.data service worker, and the ideal; plus the cost model run on the paper's published numbers.

Here (measured): the trainer is pinned to core 0 in every mode (`trainer.cpus: [0]`, the way
Cachew limits cores with taskset). Its model step needs 20 ms of that core's CPU (experiments/
steps.py: a host-bound step; a sleeping step would leave the core to the pipeline and one more
core could not help). The pipeline is `synthetic` with CPU work per element.
- colocated: pipeline and step share core 0;
- service: the same trainer reads from one worker pinned to core 1 (`service.worker_cpus: [1]`,
  the dispatcher with it);
- ideal: the step alone (`take(1).cache().repeat()`).
Costs: each run priced by the cost model (Equation 1, paper-2023-06 prices), the trainer standing
for a TPU v2-8 host and the worker for an n2-standard-8, as in the paper's ResNet50 example.

Paper rows (computed): dsctl's cost model on the paper's published throughputs and worker counts,
vm-hours basis, paper-2023-06 catalog. ResNet50 is the paper's open-source example and must
come out to the cent ($80.23 vs $40.63, 1.97×); M1–M3 ran in production at unknown prices, so
the model's savings are shown beside the paper's with the service share each implies.
"""

from __future__ import annotations

from pathlib import Path

from dsctl.costmodel import RunUsage, compare, estimate, load_catalog, price
from dsctl.specs import load_spec_text

from .common import ExperimentResult, Log, experiment_id, fmt, md_images, md_table, money, new_figure, run_job, write_spec

NAME = "fig8"
TITLE = "Figure 8: horizontal scale-out"
SUMMARY = "colocated on core 0 vs one service worker on core 1 vs ideal; cost model on the paper's four rows"

# The paper's Figure 8 (§4.2): model, accelerators, colocated b/s, service b/s, speedup, workers, cost saving.
PAPER_ROWS = [
    ("M1", 32, 0.55, 6.47, 11.7, 442, 10.8),
    ("M2", 8, 4.7, 518.4, 110.3, 421, 89.3),
    ("M3", 16, 22.2, 63.8, 2.9, 128, 2.8),
    ("ResNet50", 8, 1.75, 4.5, 2.57, 16, 1.97),
]
RESNET_STEPS = 112_320
RESNET_PAPER_COSTS = (80.2, 40.6)  # colocated, with service (paper §4.2)
PAPER_AVERAGES = (31.7, 26.2)

LOCAL_SPEC = """
name: fig8-scaleout
service:
  workers: 1
  worker_cpus: [1]               # the worker (and the dispatcher) on the other core
  worker_machine: n2-standard-8
  dispatcher_machine: n2-standard-8
  provisioning: spot             # paper-2023-06's n2 prices are Spot prices
trainer:
  machine: tpu-v2-8              # priced as the paper's ResNet50 trainer
  cpus: [0]                      # the trainer on one core, in every mode
  model: {{kind: python, entrypoint: "dsctl.experiments.steps:cpu_step"}}   # 20 ms of core-0 CPU per step
  duration_s: {duration}
  warmup_batches: 20
pipeline:
  builtin: synthetic
  params: {{batch_size: 16, cpu_work: {cpu_work}, epochs: null}}
pricing: paper-2023-06
cost_basis: utilization
"""

PAPER_SPEC = """
name: fig8-paper-{model}
provider: gcp
service: {{workers: {workers}, worker_machine: n2-standard-8, dispatcher_machine: n2-standard-8, provisioning: spot}}
trainer: {{machine: tpu-v2-8, count: {hosts}, accelerators_per_trainer: 8, steps: {steps}}}
pipeline: {{builtin: images, params: {{epochs: null}}}}
pricing: paper-2023-06
cost_basis: vm-hours
"""


def paper_rows() -> list[dict]:
    """The cost model on each of the paper's Figure 8 rows (pure arithmetic, no runs)."""
    catalog = load_catalog("paper-2023-06")
    out = []
    for model, acc, b0, b1, paper_speedup, workers, paper_saving in PAPER_ROWS:
        hosts = max(acc // 8, 1)
        steps = RESNET_STEPS if model == "ResNet50" else 1000  # M1–M3: per 1,000 batches (job length unknown)
        spec = load_spec_text(PAPER_SPEC.format(model=model.lower(), workers=workers, hosts=hosts, steps=steps),
                              f"<fig8 paper row {model}>").spec
        colocated = estimate(spec, catalog, batches_per_sec=b0, steps=steps, basis="vm-hours", workers=0)
        service = estimate(spec, catalog, batches_per_sec=b1, steps=steps, basis="vm-hours", workers=workers)
        cmp = compare(colocated, service)
        out.append({
            "model": model, "accelerators": acc, "trainer_hosts": f"{hosts} x tpu-v2-8", "workers": workers,
            "colocated_bps": b0, "service_bps": b1, "steps": steps,
            "colocated_cost": colocated.total, "service_cost": service.total,
            "service_part": service.service, "trainer_part": service.trainers,
            "speedup": cmp.speedup, "cost_saving": cmp.cost_saving,
            "paper_speedup": paper_speedup, "paper_cost_saving": paper_saving,
            # Service cost as a share of the trainers' cost, ours (whole n2-standard-8 VMs) and what the
            # paper's saving implies (saving = speedup / (1 + share) when trainer cost per hour is fixed).
            "service_share": service.service / service.trainers,
            "paper_implied_service_share": paper_speedup / paper_saving - 1,
        })
    return out


MODES = ("colocated", "service", "ideal")


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _steady_cost(spec, mode: str, s: dict) -> float | None:
    """Cost per 1,000 batches of an hour at the measured rate (Equation 1): the service priced on its
    measured use, the trainer host whole. Start-up (TensorFlow imports, warm-up) is left out, as for
    sweep points, so the three modes compare at steady state."""
    bps = s.get("batches_per_s")
    if not bps:
        return None
    service = mode == "service"
    usage = RunUsage(
        job_time_s=3600.0, batches=bps * 3600.0, n_trainers=spec.trainer.count, trainer_machine=spec.trainer.machine,
        accelerators_per_trainer=spec.trainer.accelerators_per_trainer, n_workers=spec.service.workers if service else 0,
        worker_machine=spec.service.worker_machine if service else None,
        worker_avg_cpu_cores=s.get("worker_cpu_cores") if service else None,
        worker_avg_mem_gb=s.get("worker_mem_gb") if service else None,
        dispatcher_machine=spec.service.dispatcher_machine if service else None,
        dispatcher_avg_cpu_cores=s.get("dispatcher_cpu_cores") if service else None,
        dispatcher_avg_mem_gb=s.get("dispatcher_mem_gb") if service else None,
        service_provisioning=spec.service.provisioning, trainer_provisioning=spec.trainer.provisioning)
    return price(usage, load_catalog(spec.pricing), spec.cost_basis).per_1000_batches


def run(out_dir: Path, quick: bool = False, log: Log | None = None) -> ExperimentResult:
    res = ExperimentResult(NAME, TITLE, quick, out_dir)
    parent = experiment_id(NAME)
    duration = 8.0 if quick else 20.0
    loaded = write_spec(out_dir, "fig8-scaleout", LOCAL_SPEC.format(duration=duration, cpu_work=64))
    # Full runs measure each mode twice, in mirrored order (colocated, service, ideal, ideal, service,
    # colocated), so a load trend on this shared machine weighs on every mode alike.
    order = MODES if quick else MODES + MODES[::-1]
    runs: dict[str, list] = {m: [] for m in MODES}
    for mode in order:
        runs[mode].append(run_job(loaded, mode=mode, parent_id=parent, log=log, label="fig8"))
    local = {}
    for mode, outcomes in runs.items():
        merged = {k: _mean([o.get(k) for o in outcomes]) for k in (
            "batches_per_s", "input_stall_frac", "trainer_cpu_cores", "worker_cpu_cores", "worker_mem_gb",
            "dispatcher_cpu_cores", "dispatcher_mem_gb")}
        local[mode] = {"run_id": " ".join(o.run_id for o in outcomes), **{k: merged[k] for k in (
            "batches_per_s", "input_stall_frac", "trainer_cpu_cores", "worker_cpu_cores")},
            "cost_per_1000_batches": _steady_cost(loaded.spec, mode, merged)}
    b0, b1, bi = (local[m]["batches_per_s"] for m in ("colocated", "service", "ideal"))
    c0, c1 = local["colocated"]["cost_per_1000_batches"], local["service"]["cost_per_1000_batches"]
    local_speedup = b1 / b0 if b0 and b1 else None
    local_saving = c0 / c1 if c0 and c1 else None
    rows = paper_rows()
    res.data = {"local": local, "local_speedup": local_speedup, "local_cost_saving": local_saving,
                "ideal_speedup": bi / b0 if bi and b0 else None,
                "fraction_of_ideal": b1 / bi if b1 and bi else None, "paper_rows": rows}

    for mode in ("colocated", "service", "ideal"):
        l = local[mode]
        res.rows.append({"part": "measured", "case": mode, "batches_per_s": l["batches_per_s"],
                         "speedup": (l["batches_per_s"] / b0) if l["batches_per_s"] and b0 else None,
                         "cost_per_1000_batches": l["cost_per_1000_batches"],
                         "cost_saving": (c0 / l["cost_per_1000_batches"]) if c0 and l["cost_per_1000_batches"] and mode != "ideal" else None,
                         "input_stall_frac": l["input_stall_frac"], "run_id": l["run_id"]})
    for r in rows:
        res.rows.append({"part": "paper row, cost model", "case": r["model"], "workers": r["workers"],
                         "colocated_bps": r["colocated_bps"], "service_bps": r["service_bps"],
                         "colocated_cost": r["colocated_cost"], "service_cost": r["service_cost"],
                         "speedup": r["speedup"], "cost_saving": r["cost_saving"],
                         "paper_speedup": r["paper_speedup"], "paper_cost_saving": r["paper_cost_saving"]})
    _plots(res, local, rows)
    res.markdown = _markdown(res, local, rows, duration)
    return res


def _plots(res: ExperimentResult, local: dict, rows: list[dict]) -> None:
    fig, ax = new_figure(6.0, 4.0)
    modes = list(MODES)
    labels = ["colocated\n(core 0)", "service\n(core 0 + worker on core 1)", "ideal\n(step only)"]
    values = [local[m]["batches_per_s"] or 0 for m in modes]
    bars = ax.bar(labels, values, color=["tab:gray", "tab:blue", "tab:green"])
    ax.bar_label(bars, fmt="%.1f")
    ax.set_ylabel("batches/s (trainer)")
    ax.set_xlabel("input processing")
    ax.set_ylim(top=max(values) * 1.15 if max(values) > 0 else 1)
    ax.set_title("Figure 8 here: trainer on core 0, worker on core 1", fontsize="medium")
    res.add_figure(fig, "local")

    fig, ax = new_figure(6.4, 4.2)
    names = [r["model"] for r in rows]
    x = range(len(names))
    w = 0.2
    series = [("paper speedup", "paper_speedup", "tab:blue", None), ("model speedup", "speedup", "tab:blue", "//"),
              ("paper cost saving", "paper_cost_saving", "tab:orange", None),
              ("model cost saving", "cost_saving", "tab:orange", "//")]
    for i, (label, key, color, hatch) in enumerate(series):
        ax.bar([xi + (i - 1.5) * w for xi in x], [r[key] for r in rows], w, label=label, color=color,
               hatch=hatch, alpha=0.55 if hatch else 1.0, edgecolor=color)
    ax.set_yscale("log")
    ax.set_xticks(list(x), names)
    ax.set_xlabel("model (paper Figure 8)")
    ax.set_ylabel("× over colocated (log scale)")
    ax.set_title("Figure 8 rows: paper vs dsctl's cost model (vm-hours)")
    ax.legend(fontsize="small")
    res.add_figure(fig, "paper-rows")


def _markdown(res: ExperimentResult, local: dict, rows: list[dict], duration: float) -> str:
    d = res.data
    lines = [f"## {TITLE}", ""]
    lines.append(f"Measured here ({'quick: ' if res.quick else 'twice, in mirrored order, '}{duration:g} s per mode "
                 "after warm-up): one trainer "
                 "pinned to core 0 whose model step needs 20 ms of that core, reading a CPU-heavy `synthetic` pipeline "
                 "colocated (same core), from one tf.data service worker pinned to core 1, or not at all (ideal). "
                 "Costs: Equation 1 with the paper's prices for an hour at each measured rate, the trainer priced as a "
                 "TPU v2-8 host and the worker and dispatcher on their measured use.")
    lines.append("")
    rn = next(r for r in rows if r["model"] == "ResNet50")
    lines.append(md_table(
        ["", "colocated b/s", "with service b/s", "ideal b/s", "speedup", "cost saving"],
        [["ours (2 cores, 1 worker)", fmt(local["colocated"]["batches_per_s"]), fmt(local["service"]["batches_per_s"]),
          fmt(local["ideal"]["batches_per_s"]), fmt(d["local_speedup"], suffix="×"), fmt(d["local_cost_saving"], suffix="×")],
         ["paper ResNet50 (TPU v2-8, 16 workers)", "1.75", "4.5", "—", "2.57×", "1.97×"],
         ["paper average (M1–M3, ResNet50)", "—", "—", "—", f"{PAPER_AVERAGES[0]}×", f"{PAPER_AVERAGES[1]}×"]]))
    lines.append("")
    frac = d["fraction_of_ideal"]
    noisy = " — above 100%: this machine is shared and the modes ran a minute apart" if frac and frac > 1 else ""
    lines.append(f"Why they differ: here the service can add only one core to the trainer's one, so the speedup is "
                 f"bounded by the ideal/colocated ratio ({fmt(d['ideal_speedup'], suffix='×')}; the service reached "
                 f"{fmt(100 * frac if frac else None, 2)}% of ideal{noisy}), whereas the paper adds 16 to 442 "
                 "machines to a host whose own CPUs could not keep up.")
    lines.append("")
    lines.append("The cost model on the paper's published throughputs and worker counts (vm-hours: whole "
                 "n2-standard-8 workers at $0.08/h plus one dispatcher, 8-accelerator hosts priced as TPU v2-8 VMs at "
                 "$4.50/h, paper-2023-06 catalog; ResNet50 for its 112,320 steps, M1–M3 per 1,000 batches):")
    lines.append("")
    table = []
    for r in rows:
        costs = (f"{money(r['colocated_cost'])} → {money(r['service_cost'])}" if r["model"] == "ResNet50"
                 else f"{money(r['colocated_cost'])} → {money(r['service_cost'])} per 1k batches")
        paper_costs = "$80.2 → $40.6" if r["model"] == "ResNet50" else "—"
        table.append([r["model"], r["workers"], r["trainer_hosts"], costs, paper_costs, fmt(r["speedup"], suffix="×"),
                      f"{r['paper_speedup']}×", fmt(r["cost_saving"], suffix="×"), f"{r['paper_cost_saving']}×",
                      f"{100 * r['service_share']:.1f}%", f"{100 * r['paper_implied_service_share']:.1f}%"])
    lines.append(md_table(["model", "workers", "trainers (assumed)", "cost (model)", "cost (paper)", "speedup",
                           "paper", "cost saving (model)", "paper", "service / trainer cost (model)",
                           "implied by paper"], table))
    lines.append("")
    lines.append(f"ResNet50 reproduces the paper's arithmetic: {money(rn['colocated_cost'])} vs "
                 f"{money(rn['service_cost'])} ({money(rn['service_part'])} service + {money(rn['trainer_part'])} TPU VM), "
                 f"{rn['cost_saving']:.2f}× (paper: $80.2 vs $40.6 = $9.4 + $31.2, 1.97×). "
                 "Why M1–M3 differ: they ran in Google's production fleet, whose accelerator and CPU prices and worker "
                 "utilization the paper does not publish; priced as whole $0.08/h VMs beside $4.50/h TPU hosts, their "
                 "hundreds of workers cost far more relative to the trainers than the paper's savings imply (last two "
                 "columns), so the model's savings are lower.")
    lines.append("")
    lines.append(md_images(res))
    return "\n".join(lines)
