"""What every experiment shares: specs from YAML text, running jobs, and writing CSV, PNG and markdown.

An experiment writes into one output directory, flat, every file prefixed with its name:

    fig8.csv          one row per measured or computed quantity
    fig8-*.png        plots (labelled axes; axis labels also kept in fig8.json)
    fig8.md           its section of the report: ours beside the paper's, and why they differ
    fig8.json         everything above as data, for tests and `--json`
    specs/fig8-*.yaml the job specs it ran (each one runs alone with `dsctl up`)

Figures are bare `matplotlib.figure.Figure`s on an Agg canvas (as orchestrator/plots.py does),
never pyplot, so nothing leaks between experiments, tests or threads.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dsctl.costmodel.money import usd
from dsctl.orchestrator.home import dsctl_home
from dsctl.orchestrator.preflight import load_job
from dsctl.orchestrator.records import RunSummary
from dsctl.orchestrator.run import JobRunner, Progress
from dsctl.orchestrator.store import RunStore
from dsctl.specs import LoadedSpec
from dsctl.specs.schema import Mode

Log = Callable[[str], None]


def default_out_dir() -> Path:
    return dsctl_home() / "experiments"


# -- results ---------------------------------------------------------------------------------------
@dataclass
class ExperimentResult:
    """One experiment's outcome. `data` holds its numbers (what tests assert on); `axes` maps each
    PNG's file name to its (x label, y label); `figures` are the Figure objects (not serialized)."""

    name: str
    title: str
    quick: bool
    out_dir: Path
    rows: list[dict] = field(default_factory=list)
    markdown: str = ""
    plots: list[Path] = field(default_factory=list)
    axes: dict[str, list[str]] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict, repr=False)
    duration_s: float = 0.0

    @property
    def csv_path(self) -> Path:
        return self.out_dir / f"{self.name}.csv"

    @property
    def md_path(self) -> Path:
        return self.out_dir / f"{self.name}.md"

    @property
    def json_path(self) -> Path:
        return self.out_dir / f"{self.name}.json"

    def to_dict(self) -> dict:
        return {"name": self.name, "title": self.title, "quick": self.quick, "duration_s": self.duration_s,
                "csv": str(self.csv_path), "markdown": str(self.md_path),
                "plots": [str(p) for p in self.plots], "axes": self.axes, "data": self.data, "rows": self.rows}

    def add_figure(self, fig: Figure, suffix: str) -> Path:
        """Save `fig` as <name>-<suffix>.png and remember its axis labels (every axis must have both)."""
        path = self.out_dir / f"{self.name}-{suffix}.png"
        labels = []
        for ax in fig.axes:
            if not ax.get_xlabel() or not ax.get_ylabel():
                raise ValueError(f"{path.name}: every plot needs labelled axes")
            labels += [ax.get_xlabel(), ax.get_ylabel()]
        fig.savefig(path, format="png", dpi=110)
        self.plots.append(path)
        self.axes[path.name] = labels
        self.figures[path.name] = fig
        return path

    def write(self) -> None:
        """CSV, markdown and JSON (the PNGs are written by add_figure)."""
        write_csv(self.csv_path, self.rows)
        self.md_path.write_text(self.markdown.rstrip() + "\n")
        self.json_path.write_text(json.dumps(self.to_dict(), indent=1, default=_json_default) + "\n")


def _json_default(value: Any):
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def write_csv(path: Path, rows: list[dict]) -> None:
    """Rows of dicts; the header is the union of their keys, in first-seen order."""
    header: list[str] = []
    for row in rows:
        header += [k for k in row if k not in header]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for row in rows:
            w.writerow({k: _cell(v) for k, v in row.items()})


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


# -- labels ------------------------------------------------------------------------------------------
# Where a number comes from. Every table row and CSV row an experiment writes says which ("source"), so no
# reader takes a fitted or predicted number, or one copied from a paper, for a measurement.
MEASURED, FITTED, PREDICTED, PAPER = "measured here", "fitted", "predicted", "paper"
SOURCES = (MEASURED, FITTED, PREDICTED, PAPER)
SOURCES_LEGEND = ("**measured here**: run on this machine; **fitted**: a model's value at a point it was fitted on, "
                  "or a parameter fitted to other numbers (so it reproduces its input and is no evidence); "
                  "**predicted**: a model's value anywhere else (held out: compared with a number the fit never saw); "
                  "**paper**: taken from the paper's text.")


# -- markdown ----------------------------------------------------------------------------------------
def fmt(v: Any, digits: int = 3, suffix: str = "") -> str:
    """Numbers for tables: `digits` significant digits (whole numbers as they are), '—' for missing."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, float):
        return (f"{v:,.0f}" if abs(v) >= 10 ** digits else f"{v:.{digits}g}") + suffix
    return f"{v}{suffix}"


def money(v: float | None) -> str:
    """Dollars to the cent; sums under a dollar keep three significant digits."""
    return "—" if v is None else usd(v)


def md_table(headers: list[str], rows: Iterable[Iterable[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def md_images(result: ExperimentResult) -> str:
    return "\n".join(f"![{p.stem}]({p.name})" for p in result.plots)


# -- figures -----------------------------------------------------------------------------------------
def new_figure(width: float = 6.4, height: float = 4.2) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


# -- specs and runs ------------------------------------------------------------------------------------
def finish_axes(ax, ylabel: str, title: str) -> None:
    """The experiments' common plot finish: a labelled y axis from 0, a title, a light grid, a legend."""
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def write_spec(out_dir: Path, name: str, text: str) -> LoadedSpec:
    """Write a spec built in code to out_dir/specs/<name>.yaml and load it from there, so each run's
    record names a file that `dsctl up` can run again."""
    path = out_dir / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return load_job(path)


@dataclass
class JobOutcome:
    run_id: str
    mode: Mode
    summary: RunSummary
    trainer_results: dict[int, dict]
    run_dir: Path

    def get(self, key: str, default=None):
        return self.summary.get(key, default)


class StopRequested(KeyboardInterrupt):
    """Raised inside a JobRunner (through its listener) to make it tear down as on Ctrl-C."""


def run_job(loaded: LoadedSpec, *, mode: Mode = "service", workers: int | None = None, duration_s: float | None = None,
            repeat: bool = True, parent_id: str | None = None, stop: threading.Event | None = None,
            log: Log | None = None, label: str = "", **extra) -> JobOutcome:
    """One JobRunner run, recorded as a point of the experiment; returns its summary and per-trainer results.

    `stop` (set from another thread) makes the run tear down as if interrupted: the runner's listener
    raises once, inside the runner, so its own Ctrl-C path stops everything it started.
    """
    raised = False

    def listener(progress: Progress) -> None:
        nonlocal raised
        if stop is not None and stop.is_set() and not raised:
            raised = True
            raise StopRequested()

    t0 = time.monotonic()
    runner = JobRunner(loaded, mode=mode, workers=workers, kind="point", parent_id=parent_id,
                       duration_s=duration_s, repeat=repeat, listener=listener, **extra)
    if log:
        log(f"{label or loaded.spec.name}: {mode}" + (f", {runner.workers} worker(s)" if mode == "service" else "")
            + f" (run {runner.run_id})")
    runner.run()
    store = runner.store
    record = store.recorded(runner.run_id)
    outcome = JobOutcome(run_id=runner.run_id, mode=mode, summary=record.job,
                         trainer_results=store.trainer_results(runner.run_id), run_dir=runner.run_dir)
    if log:
        bps = outcome.get("batches_per_s")
        log(f"  {bps:.2f} batches/s per trainer, {time.monotonic() - t0:.0f} s" if bps else
            f"  done in {time.monotonic() - t0:.0f} s")
    return outcome


def run_concurrently(jobs: list[Callable[[threading.Event], JobOutcome]]) -> list[JobOutcome]:
    """Run jobs in threads (each builds its own JobRunner, store and provider inside its thread);
    Ctrl-C stops them all, each tearing down its own deployment, then re-raises."""
    stop = threading.Event()
    results: list[JobOutcome | None] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def target(i: int) -> None:
        try:
            results[i] = jobs[i](stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors[i] = exc
            stop.set()  # one failure stops the others: their numbers would not be comparable

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (dsctl.errors.Signalled): every job tears down first
        stop.set()
        _join_all(threads)
        raise
    failures = [e for e in errors if e is not None and not isinstance(e, StopRequested)]
    if failures:
        raise failures[0]
    if any(isinstance(e, StopRequested) for e in errors):
        raise KeyboardInterrupt
    done = [r for r in results if r is not None]
    assert len(done) == len(results), "every job returned or raised"
    return done


def _join_all(threads: list[threading.Thread]) -> None:
    """Wait for every thread to end, however often the user interrupts meanwhile: each is tearing down its own
    deployment, and these threads are daemons, so an exit now would leave what they had not stopped yet."""
    while any(t.is_alive() for t in threads):
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:
            continue


def experiment_id(name: str) -> str:
    return f"experiment-{name}-{time.strftime('%m%d-%H%M%S')}"



# -- steady state ------------------------------------------------------------------------------------------
def _trainer_windows(outcome: JobOutcome) -> dict[int, list[tuple[float, float, int]]]:
    """Measured (non-warm-up) windows of each trainer as (wall start, wall end, batches), from its metrics file."""
    out: dict[int, list[tuple[float, float, int]]] = {}
    for path in sorted((outcome.run_dir / "metrics").glob("trainer-*.jsonl")):
        index = int(path.stem.split("-")[1])
        rows = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "window" and not rec.get("warmup"):
                end = rec["wall"]
                rows.append((end - (rec["t_end"] - rec["t_start"]), end, int(rec["batches"])))
        out[index] = rows
    return out


def _cpu_at(samples: list[tuple[float, float]], t: float) -> float | None:
    """A process's cumulative CPU-seconds at wall time t, interpolated between samples."""
    if not samples or t < samples[0][0] or t > samples[-1][0]:
        return None
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
    return samples[-1][1]


def steady_state(outcomes: list[JobOutcome], role: str = "worker", settle_s: float = 1.0) -> dict:
    """Throughput and `role` CPU over the interval in which every trainer of every run was measuring.

    Runs started together (one deployment, or several side by side) warm up at slightly different
    times; taking only the common interval makes the CPU-seconds and the batches delivered refer to the
    same seconds. Returns per-trainer batches/s, the role's cores busy (summed over its processes and
    runs), CPU-seconds per delivered batch, and the interval's length. `concurrent` is False when the
    runs' measurements did not overlap (then each run's own interval is used and the sums are rates).
    """
    store = RunStore()
    per_run = []
    for o in outcomes:
        windows = _trainer_windows(o)
        starts = [w[0][0] for w in windows.values() if w]
        ends = [w[-1][1] for w in windows.values() if w]
        if not starts:
            raise ValueError(f"run {o.run_id} measured no windows")
        util: dict[int, list[tuple[float, float]]] = {}
        for row in store.utilization(o.run_id):
            if row["role"] == role:
                util.setdefault(row["idx"], []).append((row["t"], row["cpu_seconds"]))
        per_run.append((o, windows, max(starts) + settle_s, min(ends), util))
    a, b = max(r[2] for r in per_run), min(r[3] for r in per_run)
    concurrent = b - a >= 2.0
    rates: list[float] = []
    cores = 0.0
    for _o, windows, ra, rb, util in per_run:
        lo, hi = (a, b) if concurrent else (ra, rb)
        for rows in windows.values():
            inside = [(s, e, n) for s, e, n in rows if s >= lo - 1e-6 and e <= hi + 1e-6]
            seconds = sum(e - s for s, e, _ in inside)
            rates.append(sum(n for _, _, n in inside) / seconds if seconds > 0 else 0.0)
        for samples in util.values():
            # Samples run every 0.5 s and stop with the trainers: the rate is taken over the part of the
            # interval they cover.
            u_lo, u_hi = max(lo, samples[0][0]), min(hi, samples[-1][0])
            c_lo, c_hi = _cpu_at(samples, u_lo), _cpu_at(samples, u_hi)
            if c_lo is not None and c_hi is not None and u_hi - u_lo >= 1.0:
                cores += (c_hi - c_lo) / (u_hi - u_lo)
    total = sum(rates)
    store.close()
    return {"interval_s": b - a if concurrent else min(r[3] - r[2] for r in per_run), "concurrent": concurrent,
            "per_trainer_bps": rates, "mean_bps": total / len(rates) if rates else None, "total_bps": total,
            f"{role}_cores": cores, f"{role}_cpu_s_per_batch": cores / total if total else None}
