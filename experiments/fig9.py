"""Figure 9, worker sweep: measure what fits here and predict 8..640 workers; fit the same model on some of the
paper's M1 points and judge it on the others; and Figure 9b's cost saving from the paper's setup.

Every number carries its source (common.SOURCES): measured here, fitted, predicted, or paper.

Here (measured): a latency-bound `synthetic` job whose knee is known by construction. Each worker
serves 8 elements × 20 ms of CPU-free latency per batch, 6.25 batches/s; the model step takes
4 ms, so the trainer's ideal is ~200 batches/s and the knee ~30 workers, far beyond what one
2-core machine should run, like M1's (512) beyond any single host. One `dsctl sweep`-style run
(SweepRunner, one deployment scaled in place) measures the colocated and ideal baselines and
1..4 workers, plus 8 (quick) or 8 and 16 (full), held out: the model is fitted on 1..4 only and
judged on them. Predicted points are priced as `dsctl sweep --simulate` prices them.

M1, Figure 9a: ThroughputModel fitted on M1's 8-worker point (what specs/examples/calibrations/
paper-m1.yaml hands `dsctl sweep --calibration`) and, to show how much that choice matters, on the
two smallest counts (8 and 16, which fix both r and n0), with Figure 8's baselines (colocated 0.55,
ideal 6.47) as inputs. Each fit is judged on the paper's points it never saw. 512 and 640 "reach the
ideal", which the model is given, so they check only that the fitted rate has saturated by then.

M1, Figure 9b: cost saving(n) = speedup(n) × colocated $/h ÷ $/h with n workers. The paper gives prices
only for its open-source setup (TPU v2-8 $4.50/h, n2-standard-8 $0.08/h; M1 ran in production at prices it
does not disclose), so M1's 32 accelerators are priced as 4 TPU v2-8 VMs and each worker and the
dispatcher as an n2-standard-8 (vm-hours). The paper's own pair at 512 workers (12.3× faster, 11.4×
cheaper) fixes what the service must have cost beside its trainers; that ratio, fitted on the pair,
is judged on what the paper says at 8 and 640 workers, and says what the published prices miss.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

import dsctl.specs
from dsctl.costmodel import RunUsage, ThroughputModel, load_catalog, price, usage_from_spec
from dsctl.costmodel.throughput import hold_out
from dsctl.orchestrator.sweep import SweepOptions, SweepRunner, Window

from .common import (
    FITTED,
    MEASURED,
    PAPER,
    PREDICTED,
    ExperimentResult,
    Log,
    finish_axes,
    fmt,
    md_images,
    md_table,
    money,
    new_figure,
    write_spec,
)
from .fig8 import PAPER_ROWS

NAME = "fig9"
TITLE = "Figure 9: worker sweep"
SUMMARY = ("real sweep of a latency-bound job (fitted on 1..4 workers, 8 held out), predicted 8..640; "
           "the model fitted on some of M1's points and judged on the others; Figure 9b's cost saving")

SIMULATED = [8, 16, 32, 64, 128, 256, 512, 640]  # the paper's swept counts
FIT_LOCAL_UP_TO = 4

# The paper's M1 sweep (§4.2, Figure 9; baselines from Figure 8). The text gives no rate at 32 and 256.
PAPER_M1 = {8: 0.30, 16: 0.64, 64: 2.3, 128: 4.77}
PAPER_M1_COLOCATED, PAPER_M1_IDEAL = 0.55, 6.47
PAPER_M1_AT_IDEAL = (512, 640)     # "reaches the ideal training time"; 640: "job time remains unaffected"
PAPER_M1_512 = (12.3, 11.4)        # speedup and cost saving at 512 workers
PAPER_M1_8_COSTLIER = 0.83         # 8 workers: "training time and cost is 83% higher"
PAPER_M1_NOTES = {8: "time and cost 83% higher", 16: "1.14×", 64: "4.1×", 128: "8.6×",
                  512: "12.3× time, 11.4× cost saving", 640: "time unchanged, cost marginally higher"}
# Which paper points each fit sees: the calibration file's one point, then the two smallest counts.
M1_FITS = ((8,), (8, 16))
M1_CALIBRATION = Path(dsctl.specs.__file__).parent / "examples" / "calibrations" / "paper-m1.yaml"  # fit A
M1_HOSTS = 4  # 32 accelerators priced as 4 TPU v2-8 VMs (8 TPU cores each), the paper's only accelerator price

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
    counts = list(range(1, FIT_LOCAL_UP_TO + 1)) + held_out
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
    rates = {p["workers"]: p["batches_per_s"] for p in measured if p["batches_per_s"]}
    model, errors = hold_out(rates, [n for n in rates if n <= FIT_LOCAL_UP_TO], ideal, colocated)
    predicted = _predict(loaded.spec, model, measured, base["colocated"]["cost_per_1000_batches"])
    checks = [{"workers": n, "measured_bps": rates[n], "predicted_bps": model.predict(n), "error": e}
              for n, e in errors.items()]
    fits = [m1_fit(f) for f in M1_FITS]
    m1_model = ThroughputModel.calibrate({n: PAPER_M1[n] for n in M1_FITS[0]}, PAPER_M1_IDEAL, PAPER_M1_COLOCATED)

    res.data = {
        "sweep_id": runner.sweep_id, "colocated_bps": colocated, "ideal_bps": ideal,
        "measured": [{k: p.get(k) for k in ("workers", "batches_per_s", "speedup", "cost_saving", "run_id",
                                            "worker_cpu_cores")} for p in measured],
        "model": model.to_dict(), "predicted": predicted, "held_out": checks,
        "designed_knee": ideal / (1000.0 / (20 * 8)),  # workers whose latency-bound rates add up to the ideal
        "model_knee": model.knee(0.03), "m1_fits": fits, "m1_costs": m1_costs(m1_model),
    }
    _rows(res, measured, predicted, checks, base)
    _plots(res, measured, predicted, colocated, ideal)
    res.markdown = _markdown(res)
    return res


# -- M1: the paper's points, fitted and held out (pure arithmetic, no runs) ------------------------------------
def m1_fit(fit_on: tuple[int, ...], paper: dict[int, float] = PAPER_M1) -> dict:
    """The model fitted on the paper's M1 rates at `fit_on` only, and its error at every other count the paper
    gives a rate for. `paper` is a parameter so a test can change held-out rates and see the fit not move."""
    known = {**paper, **{n: PAPER_M1_IDEAL for n in PAPER_M1_AT_IDEAL}}  # 512 and 640: "ideal"
    model, errors = hold_out(known, fit_on, PAPER_M1_IDEAL, PAPER_M1_COLOCATED)
    points = [{"workers": n, "batches_per_s": model.predict(n), "speedup": model.speedup(n),
               "source": FITTED if n in fit_on else PREDICTED, "paper_batches_per_s": paper.get(n),
               "paper_says": "ideal" if n in PAPER_M1_AT_IDEAL else None, "error": errors.get(n)}
              for n in SIMULATED]
    held = [n for n in errors if n in paper]
    return {"fit_on": sorted(fit_on), "held_out": held, "model": model.to_dict(), "points": points,
            "max_held_out_error": max(abs(errors[n]) for n in held),
            "saturation_error": max(abs(errors[n]) for n in PAPER_M1_AT_IDEAL)}


def _m1_per_hour(workers: int) -> float:
    """$/h of M1's 4 trainer hosts plus `workers` workers and a dispatcher, vm-hours at the paper's prices."""
    usage = RunUsage(job_time_s=3600.0, n_trainers=M1_HOSTS, trainer_machine="tpu-v2-8", n_workers=workers,
                     worker_machine="n2-standard-8" if workers else None,
                     dispatcher_machine="n2-standard-8" if workers else None,
                     service_provisioning="spot")  # the paper's $0.08/h n2 price is a Spot price
    return price(usage, load_catalog("paper-2023-06"), "vm-hours").total


def m1_costs(model: ThroughputModel) -> dict:
    """Figure 9b from the paper's setup, at the published prices and at the price ratio the paper's own 512-worker
    pair implies (fitted), with the gap at 512 split into its throughput and price parts."""
    trainers = _m1_per_hour(0)
    machine = (_m1_per_hour(1) - trainers) / 2  # one worker; the dispatcher (priced alike) comes with the first
    share = machine / trainers                  # one machine's $/h over the trainers', at the published prices
    speedup_512, saving_512 = PAPER_M1_512
    implied = (speedup_512 / saving_512 - 1) / (512 + 1)  # the same, fitted on the paper's 512-worker pair
    _, _, _, _, fig8_speedup, fig8_workers, fig8_saving = next(r for r in PAPER_ROWS if r[0] == "M1")
    points = []
    for n in SIMULATED:
        s = model.speedup(n)
        assert s is not None, "the M1 model is calibrated with the paper's colocated rate"
        points.append({"workers": n, "speedup": s, "cost_saving": s * trainers / _m1_per_hour(n),
                       "cost_saving_implied_prices": s / (1 + (n + 1) * implied)})
    at = {p["workers"]: p for p in points}

    def costlier(p: dict, key: str) -> float:  # cost over colocated - 1 (8 workers are slower than colocated)
        return 1 / p[key] - 1

    model_512 = at[512]["cost_saving"]
    return {
        "trainers_per_hour": trainers, "machine_per_hour": machine, "machine_share": share,
        "machine_share_implied": implied,
        "machine_share_implied_fig8": (fig8_speedup / fig8_saving - 1) / (fig8_workers + 1),  # Figure 8's M1 row
        "points": points,
        "at_512": {"paper": saving_512, "model": model_512, "gap": saving_512 / model_512,
                   "from_throughput": speedup_512 / at[512]["speedup"],
                   "from_prices": (1 + 513 * share) / (1 + 513 * implied)},
        # What the published prices would have to be for the paper's ratio (one held fixed, the other solved).
        "needed_worker_per_hour": implied * trainers, "needed_trainers_per_hour": machine / implied,
        "checks": {"costlier_at_8": costlier(at[8], "cost_saving"),
                   "costlier_at_8_implied": costlier(at[8], "cost_saving_implied_prices"),
                   "costlier_at_8_paper": PAPER_M1_8_COSTLIER,
                   "cost_640_vs_512": at[512]["cost_saving"] / at[640]["cost_saving"] - 1,
                   "cost_640_vs_512_implied":
                       at[512]["cost_saving_implied_prices"] / at[640]["cost_saving_implied_prices"] - 1},
    }


# -- here ------------------------------------------------------------------------------------------------
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
        usage = usage_from_spec(spec, job_time_s=3600.0, batches=bps * 3600.0, workers=n,
                                measured={"worker_cpu_cores": cpu, "worker_mem_gb": mem})
        cost = price(usage, catalog, spec.cost_basis).per_1000_batches
        out.append({"workers": n, "batches_per_s": bps, "speedup": model.speedup(n),
                    "fraction_of_ideal": bps / model.ideal_bps, "cost_per_1000_batches": cost,
                    "cost_saving": colocated_cost / cost if colocated_cost and cost else None})
    return out


def _fit_role(n: int) -> str:
    return "fitted on" if n <= FIT_LOCAL_UP_TO else "held out"


def _rows(res: ExperimentResult, measured, predicted, checks, base) -> None:
    """CSV rows, each with its source (measured here, fitted, predicted, paper) and, for data, its part in the fit."""
    errors = {c["workers"]: c["error"] for c in checks}
    for mode in ("colocated", "ideal"):
        res.rows.append({"part": "here", "source": MEASURED, "fit": "baseline (model input)", "workers": mode,
                         "batches_per_s": base[mode]["batches_per_s"]})
    for p in measured:
        res.rows.append({"part": "here", "source": MEASURED, "fit": _fit_role(p["workers"]), "workers": p["workers"],
                         "batches_per_s": p["batches_per_s"], "speedup": p.get("speedup"),
                         "cost_saving": p.get("cost_saving"), "run_id": p.get("run_id")})
    for p in predicted:
        res.rows.append({"part": "here", "source": PREDICTED, "workers": p["workers"], "batches_per_s": p["batches_per_s"],
                         "speedup": p["speedup"], "cost_saving": p["cost_saving"],
                         "error_vs_held_out": errors.get(p["workers"])})
    for f in res.data["m1_fits"]:
        part = f"M1 9a, fit on {_counts(f['fit_on'])}"
        for p in f["points"]:
            n = p["workers"]
            if n in PAPER_M1:
                res.rows.append({"part": part, "source": PAPER, "fit": "fitted on" if n in f["fit_on"] else "held out",
                                 "workers": n, "batches_per_s": PAPER_M1[n]})
            elif n in PAPER_M1_AT_IDEAL:
                res.rows.append({"part": part, "source": PAPER, "fit": "held out (the ideal is a model input)",
                                 "workers": n, "batches_per_s": PAPER_M1_IDEAL, "paper_note": "reaches the ideal"})
            res.rows.append({"part": part, "source": p["source"], "workers": n, "batches_per_s": p["batches_per_s"],
                             "speedup": p["speedup"], "error_vs_held_out": p["error"], "paper_note": p["paper_says"]})
    c = res.data["m1_costs"]
    res.rows.append({"part": "M1 9b", "source": FITTED, "workers": 512,
                     "machine_share_of_trainers": c["machine_share_implied"],
                     "paper_note": "one worker's $/h over the trainers' $/h, fitted on the paper's 12.3x and 11.4x"})
    for p in c["points"]:
        res.rows.append({"part": "M1 9b", "source": PREDICTED, "workers": p["workers"], "speedup": p["speedup"],
                         "cost_saving": p["cost_saving"], "cost_saving_implied_prices": p["cost_saving_implied_prices"]})
    for n, saving in ((8, 1 / (1 + PAPER_M1_8_COSTLIER)), (512, PAPER_M1_512[1])):
        res.rows.append({"part": "M1 9b", "source": PAPER, "workers": n, "cost_saving": saving,
                         "paper_note": PAPER_M1_NOTES[n]})


def _counts(ns) -> str:
    return " and ".join(str(n) for n in ns)


# -- plots -----------------------------------------------------------------------------------------------
def _log2_workers(ax, counts: list[int]) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ticks = sorted(set(counts))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("tf.data service workers")


def _finish(res: ExperimentResult, fig, ax, counts, ylabel: str, title: str, suffix: str) -> None:
    ax.axhline(1.0, color="gray", linestyle="-.", linewidth=1, label="colocated (1×)")
    _log2_workers(ax, counts)
    finish_axes(ax, ylabel, title)
    res.add_figure(fig, suffix)


def _plots(res: ExperimentResult, measured, predicted, colocated, ideal) -> None:
    fit = [p for p in measured if p["workers"] <= FIT_LOCAL_UP_TO]
    held = [p for p in measured if p["workers"] > FIT_LOCAL_UP_TO]
    counts = [p["workers"] for p in measured] + [p["workers"] for p in predicted]
    for key, ylabel, suffix, title in (
            ("speedup", "speedup over colocated (×)", "speedup", "Figure 9a here: speedup"),
            ("cost_saving", "cost saving over colocated (×)", "cost-saving", "Figure 9b here: cost saving")):
        fig, ax = new_figure()
        ax.plot([p["workers"] for p in predicted], [p[key] for p in predicted], "o--", color="tab:blue",
                markerfacecolor="white", label=f"predicted (fitted on 1–{FIT_LOCAL_UP_TO} workers)")
        ax.plot([p["workers"] for p in fit], [p[key] for p in fit], "o-", color="tab:blue", label="measured here, fitted on")
        if held:
            ax.plot([p["workers"] for p in held], [p[key] for p in held], "s", color="tab:red", label="measured here, held out")
        if key == "speedup":
            ax.axhline(ideal / colocated, color="tab:green", linestyle=":", label=f"ideal, measured ({ideal / colocated:.3g}×)")
        _finish(res, fig, ax, counts, ylabel, title, f"local-{suffix}")

    d = res.data
    fig, ax = new_figure()
    for f, style in zip(d["m1_fits"], ("o--", "^:")):
        ax.plot(SIMULATED, [p["speedup"] for p in f["points"]], style, markerfacecolor="white",
                label=f"predicted, fitted on {_counts(f['fit_on'])} workers")
    primary = d["m1_fits"][0]["fit_on"]
    for role, color, ns in (("fitted on", "tab:blue", [n for n in PAPER_M1 if n in primary]),
                            ("held out", "tab:red", [n for n in PAPER_M1 if n not in primary])):
        ax.plot(ns, [PAPER_M1[n] / PAPER_M1_COLOCATED for n in ns], "s", color=color,
                label=f"paper, {role} (fit on {_counts(primary)})")
    ax.axhline(PAPER_M1_IDEAL / PAPER_M1_COLOCATED, color="tab:green", linestyle=":",
               label=f"ideal, paper ({PAPER_M1_IDEAL / PAPER_M1_COLOCATED:.3g}×; at 512 it says {PAPER_M1_512[0]}×)")
    _finish(res, fig, ax, SIMULATED, "speedup over colocated (×)", "Figure 9a, M1: fitted vs held out", "m1-speedup")

    c = d["m1_costs"]
    fig, ax = new_figure()
    ax.plot(SIMULATED, [p["cost_saving"] for p in c["points"]], "o--", markerfacecolor="white",
            label="predicted, paper's published prices (vm-hours)")
    ax.plot(SIMULATED, [p["cost_saving_implied_prices"] for p in c["points"]], "^:", markerfacecolor="white",
            label="predicted, price ratio fitted on the paper's 512 point")
    ax.plot([8, 512], [1 / (1 + PAPER_M1_8_COSTLIER), PAPER_M1_512[1]], "s", color="tab:red",
            label="paper (8: 83% costlier; 512: 11.4×)")
    _finish(res, fig, ax, SIMULATED, "cost saving over colocated (×)", "Figure 9b, M1: cost saving", "m1-cost-saving")


# -- markdown --------------------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%".replace("-0.0%", "0.0%").replace("+0.0%", "0.0%")


def _markdown(res: ExperimentResult) -> str:
    d, m = res.data, res.data["model"]
    lines = [f"## {TITLE}", ""]
    lines.append(f"Measured here ({'quick' if res.quick else 'full'}): a latency-bound `synthetic` job "
                 "(6.25 batches/s per worker, model step 4 ms), colocated and ideal baselines, then "
                 f"{', '.join(str(p['workers']) for p in d['measured'])} workers on one deployment scaled in place "
                 f"(sweep {d['sweep_id']}). The model was fitted on 1–{FIT_LOCAL_UP_TO} workers only and the larger "
                 f"counts held out: r = {m['per_worker_bps']:.3g} batches/s per worker (fitted), n0 = "
                 f"{m['overhead_workers']:.2g} (fitted), ideal {d['ideal_bps']:.3g} batches/s (measured here; "
                 f"colocated {d['colocated_bps']:.3g}); its knee (within 3% of ideal) is {d['model_knee']} workers "
                 f"(predicted); by design the workers' rates add up to the ideal at {d['designed_knee']:.0f} "
                 "(ideal / 6.25), and the last 3% take about 1.2× that.")
    lines.append("")
    held = {c["workers"]: c for c in d["held_out"]}
    rows = [[p["workers"], fmt(p["batches_per_s"]), fmt(p.get("speedup"), suffix="×"),
             fmt(p.get("cost_saving"), suffix="×"), MEASURED, _fit_role(p["workers"])] for p in d["measured"]]
    for p in d["predicted"]:
        note = (f"measured {fmt(held[p['workers']]['measured_bps'])}: error {_pct(held[p['workers']]['error'])}"
                if p["workers"] in held else "")
        rows.append([p["workers"], fmt(p["batches_per_s"]), fmt(p["speedup"], suffix="×"),
                     fmt(p["cost_saving"], suffix="×"), PREDICTED, note])
    lines.append(md_table(["workers", "batches/s", "speedup", "cost saving", "source", "fit / held out"], rows))
    lines.append("")

    f1, f2 = d["m1_fits"]
    lines.append(f"**M1, Figure 9a.** The same model fitted on some of the paper's M1 points, with Figure 8's baselines "
                 f"(colocated {PAPER_M1_COLOCATED}, ideal {PAPER_M1_IDEAL} batches/s, paper) as inputs, and judged on "
                 f"the points it did not see. Fit A: {_counts(f1['fit_on'])} workers (the point "
                 "`specs/examples/calibrations/paper-m1.yaml` hands `dsctl sweep --calibration`; n0 is then taken as "
                 f"0). Fit B: {_counts(f2['fit_on'])} workers, the two smallest counts, which fit both r and n0. "
                 "512 and 640 \"reach the ideal\" in the paper: the ideal is an input of the model, so those rows "
                 "check only that the fitted rate has saturated by then. Errors are predicted ÷ paper − 1.")
    lines.append("")
    a, b = ({p["workers"]: p for p in f["points"]} for f in (f1, f2))

    def cell(p: dict) -> str:
        return f"{fmt(p['batches_per_s'])} {p['source']}" + (f" ({_pct(p['error'])})" if p["error"] is not None else "")

    rows = [[n, fmt(PAPER_M1[n]) if n in PAPER_M1 else ("ideal" if n in PAPER_M1_AT_IDEAL else "not in the text"),
             PAPER_M1_NOTES.get(n, "—"), cell(a[n]), cell(b[n])] for n in SIMULATED]
    lines.append(md_table(["workers", "paper b/s", "paper says", f"fit A ({_counts(f1['fit_on'])})",
                           f"fit B ({_counts(f2['fit_on'])})"], rows))
    lines.append("")
    lines.append(f"Held-out error, largest over the paper's rates: fit A {100 * f1['max_held_out_error']:.1f}% "
                 f"(on {', '.join(map(str, f1['held_out']))}), fit B {100 * f2['max_held_out_error']:.1f}% "
                 f"(on {', '.join(map(str, f2['held_out']))}); the ideal at 512 and 640 is met within "
                 f"{100 * max(f1['saturation_error'], f2['saturation_error']):.1f}%. Fitted parameters: A r = "
                 f"{f1['model']['per_worker_bps']:.4g}, n0 = {f1['model']['overhead_workers']:.2g}; B r = "
                 f"{f2['model']['per_worker_bps']:.4g}, n0 = {f2['model']['overhead_workers']:.2g}. The paper's "
                 f"\"12.3×\" at 512 is 6.77 batches/s over 0.55, above its own ideal of 6.47 (11.76×, Figure 8's "
                 "11.7×): the model, capped at the ideal, cannot reach it.")
    lines.append("")
    lines += _cost_markdown(d["m1_costs"])
    lines.append("")
    lines.append("Why they differ: our job runs on one 2-core machine, where only CPU-free (latency-bound) work "
                 f"scales with workers and counts beyond {max(p['workers'] for p in d['measured'])} are predicted, "
                 "not measured. On M1 the model is linear until it saturates, and the paper's points are nearly "
                 "linear, so a fit on the smallest counts extrapolates to 128 within the errors above; the "
                 "cost saving is the part the paper's published prices cannot reproduce (above).")
    lines.append("")
    lines.append(md_images(res))
    return "\n".join(lines)


def _cost_markdown(c: dict) -> list[str]:
    g, k = c["at_512"], c["checks"]
    out = [f"**M1, Figure 9b.** Cost saving = speedup × colocated $/h ÷ $/h with the service, by the cost model "
           f"(vm-hours) at the only prices the paper publishes: M1's 32 accelerators as {M1_HOSTS} TPU v2-8 VMs "
           f"({money(c['trainers_per_hour'])}/h), each worker and the dispatcher an n2-standard-8 "
           f"({money(c['machine_per_hour'])}/h, Spot). Speedups from fit A. The last column prices the service at the "
           "ratio the paper's own 12.3× and 11.4× at 512 workers imply (fitted on that pair).", ""]
    rows = [[p["workers"], f"{fmt(p['speedup'], suffix='×')} {FITTED if p['workers'] in M1_FITS[0] else PREDICTED}",
             fmt(p["cost_saving"], suffix="×"),
             fmt(p["cost_saving_implied_prices"], suffix="×"), PAPER_M1_NOTES.get(p["workers"], "—")]
            for p in c["points"]]
    out.append(md_table(["workers", "speedup, fit A", "cost saving, published prices (predicted)",
                         "cost saving, implied price ratio (predicted)", "paper says (speedup; cost where given)"], rows))
    out.append("")
    out.append(
        f"At 512 workers the model gives {g['model']:.2f}× against the paper's {g['paper']}×, {g['gap']:.2f}× short: "
        f"{g['from_throughput']:.3f}× of it is throughput (the paper's 12.3× against the model's ceiling, the ideal) "
        f"and {g['from_prices']:.2f}× is prices. At the published prices one worker costs "
        f"1/{1 / c['machine_share']:,.0f} of the trainers per hour, so 512 workers and a dispatcher add "
        f"{100 * 513 * c['machine_share']:.0f}% to the colocated job's $/h; the paper's 12.3× and 11.4× imply they added "
        f"{100 * 513 * c['machine_share_implied']:.1f}%, one worker 1/{1 / c['machine_share_implied']:,.0f} of the "
        f"trainers (its Figure 8 M1 row, 442 workers, 11.7× and 10.8×: 1/{1 / c['machine_share_implied_fig8']:,.0f}). "
        "What the paper does not give: M1 ran on TPU v4 hosts in Google's fleet, at C_CPU, C_MEM and C_ACC it does "
        "not disclose, with workers charged on their (unpublished) utilization. For the service to cost what the paper "
        f"implies, with the trainers at {money(c['trainers_per_hour'])}/h a worker would have to cost "
        f"{money(c['needed_worker_per_hour'])}/h ({100 * c['needed_worker_per_hour'] / c['machine_per_hour']:.1f}% of "
        f"an n2-standard-8), or with workers at {money(c['machine_per_hour'])}/h the 32 accelerators would have to cost "
        f"{money(c['needed_trainers_per_hour'])}/h; at that ratio the model gives "
        f"{c['points'][SIMULATED.index(512)]['cost_saving_implied_prices']:.1f}× at 512 (the rest is throughput). "
        "That ratio also fits what the paper says at the counts it was not fitted on, and the published prices do not: "
        f"at 8 workers the job costs {100 * k['costlier_at_8_implied']:.1f}% more than colocated (published prices "
        f"{100 * k['costlier_at_8']:.1f}%; paper {100 * k['costlier_at_8_paper']:.0f}%), and 640 workers cost "
        f"{100 * k['cost_640_vs_512_implied']:.1f}% more than 512 (published prices {100 * k['cost_640_vs_512']:.1f}%; "
        "paper: \"marginally higher\").")
    return out
