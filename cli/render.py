"""Tables and numbers as users read them."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
import textwrap
from typing import Any

from rich.console import Console
from rich.table import Table

from dsctl.costmodel.money import usd
from dsctl.orchestrator.records import Baseline, CacheStorage, Record, RunRecord, RunSummary, SweepSummary

# Piped output (logs, CI, scripts) gets wide tables instead of rich's 80-column default.
console = Console(highlight=False, soft_wrap=True,
                  width=None if (sys.stdout.isatty() or "COLUMNS" in os.environ) else 200)


def fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value}{unit}"


def money(value: float | None) -> str:
    """Dollars to the cent for real sums; small local runs in plain decimals with three significant digits."""
    return usd(value)


def cache_text(cache: CacheStorage, catalog: str) -> str:
    """One line on a run's autocache cache (orchestrator.pricing.cache_storage): its size, where, and what
    keeping it costs, which is billed by the month and so shown apart from the run's total."""
    how = "written by this run" if cache.state == "put" else "read by this run"
    size = f"{cache.gb * 1e3:.3g} MB" if cache.gb < 1 else f"{cache.gb:.3g} GB"
    where = f"{size} on {cache.kind} ({how}, {cache.path})"
    if cache.per_month is None or cache.gb_month is None:
        return f"{where}; not priced: {catalog} has no {cache.kind} storage price"
    return (f"{where}; {money(cache.per_month)} per month while kept at ${cache.gb_month:g}/GB-month "
            f"({catalog}), not in the total")


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def when(ts: float | None) -> str:
    return "-" if not ts else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def strict_json(data: Any) -> Any:
    """`data` with every non-finite number (a diverged loss) as the string JSON readers know it by: strict JSON has no
    NaN or Infinity, which Python's json would write as bare tokens that other parsers reject."""
    if isinstance(data, float) and not math.isfinite(data):
        return NONFINITE[repr(data)]
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict_json(v) for v in data]
    return data


def write_line(line: str) -> None:
    """A line as it is (a program's output: no markup, no wrapping), straight to stdout. A reader that went away
    (`dsctl logs RUN | head`) ends the command quietly."""
    try:
        sys.stdout.write(line + "\n")
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more reaches it, not even the flush
        raise SystemExit(0) from None


def print_json(data: Any) -> None:
    print(json.dumps(strict_json(data), indent=2, default=str, allow_nan=False))


def job_summary(record: Any) -> RunSummary:
    """A record's job summary, typed (a summary given as its JSON is read as one)."""
    s = record.summary
    return s if isinstance(s, RunSummary) else RunSummary.model_validate(s.as_json() if isinstance(s, Record) else s)


def summary_table(record: RunRecord, resumed_by: list[str] | None = None,
                  notes: tuple[tuple[str, str], ...] | list[tuple[str, str]] = ()) -> Table:
    """One run's summary: what it measured, what it trained, what it cost; `notes` (label, text) after it."""
    s = job_summary(record)
    t = Table(title=f"run {record.id} ({record.mode}, {record.status})", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("throughput", f"{fmt(s.batches_per_s)} batches/s per trainer over the wall clock "
                       f"({record.trainers} trainer(s), {record.workers} worker(s))"),
        *time_rows(s),
        ("batches", fmt(s.batches)),
        *epoch_rows(s),
        ("input stall", pct(s.input_stall_frac)),
        *([("model step", f"{fmt(s.model_step_s * 1e3, ' ms')} per batch (the batch time less the input wait)")]
          if s.model_step_s is not None else []),
        ("duration", fmt(s.duration_s, " s", 1)),
        ("first batch after", fmt(s.time_to_first_batch_s, " s", 1)),
    ]
    if s.worker_cpu_cores is not None:
        rows.append(("worker CPU", f"{fmt(s.worker_cpu_cores)} cores, {fmt(s.worker_mem_gb)} GB resident (mean per "
                                   "worker)"))
    if s.trainer_cpu_cores is not None:
        rows.append(("trainer CPU", f"{fmt(s.trainer_cpu_cores)} cores, {fmt(s.trainer_mem_gb)} GB resident (mean per "
                                    "trainer)"))
    rows += placement_rows(s)
    if s.padded_token_frac is not None:
        rows.append(("padded tokens", pct(s.padded_token_frac)))
    if s.elements_expected is not None:
        rows.append(("elements", f"{s.elements_received} received of {s.elements_expected}: "
                                  f"{s.elements_lost} lost, {s.elements_duplicated} duplicated"))
    rows += training_rows(record, resumed_by or [])
    cost = s.cost
    if cost is not None and cost.total is not None:
        rows.append(("cost", f"{money(cost.total)}: service {money(cost.service)}, trainers {money(cost.trainers)} "
                             f"({cost.basis}, {cost.catalog}" + (f"; {cost.provisioning})" if cost.provisioning else ")")))
    if cost is not None and cost.total is not None and cost.remote_preprocessing is not None:
        local = "not priced" if cost.local_preprocessing is None else \
            f"{money(cost.local_preprocessing)} (its share of the trainers' cost, not added)"
        rows.append(("preprocessing", f"remote {money(cost.remote_preprocessing)}, local {local}"))
    elif cost is not None and cost.error is not None:
        rows.append(("cost", f"not priced: {cost.error}"))
    if cost is not None and cost.cache_storage is not None:
        rows.append(("cache", cache_text(cost.cache_storage, cost.catalog or "the catalog")))
    if record.error:
        rows.append(("error", record.error))
    for k, v in [*rows, *notes]:
        t.add_row(k, v)
    return t


def placement_rows(s: RunSummary) -> list[tuple[str, str]]:
    """Hybrid placement: where the trainers' batches came from (measured here) and the local workers' CPU."""
    p = s.placement
    if p is None:
        return []
    got = (p.local_batches or 0) + (p.remote_batches or 0)
    share = f" ({(p.local_batches or 0) / got:.0%} local)" if got else ""
    rows = [("placement", f"{p.placement}: {p.local_workers} in-process worker(s) per trainer; batches received from "
                          f"local workers {p.local_batches}, from remote workers {p.remote_batches}{share} "
                          "(measured here)")]
    for t in p.trainers:
        producers = ", ".join(f"{k} {v}" for k, v in sorted(t.by_producer.items()))
        rows.append((f"  trainer {t.trainer}", f"{t.process}: local {t.local_batches}, remote {t.remote_batches}; "
                                               f"by producer: {producers or 'none'}"))
    cores = "-" if s.local_cpu_cores is None else f"{fmt(s.local_cpu_cores)} cores per trainer"
    rows.append(("local worker CPU", f"{cores} ({s.local_cpu_source or 'not known'})"))
    return rows


def time_rows(s: RunSummary) -> list[tuple[str, str]]:
    """Time inside the trainers' loops (waiting for input, stepping) and outside them (a program's evaluation,
    checkpoints), when a program spent any outside: then throughput per training step time too."""
    if not s.outside_s or not s.step_batches_per_s:
        return []
    return [("in training", f"{fmt(s.step_batches_per_s)} batches/s per trainer over its training step time "
                            "(inside its loop over the batches: input wait and steps)"),
            ("outside training", f"{fmt(s.outside_s, ' s', 1)} per trainer ({pct(s.outside_frac)} of the "
                                 "measured time) outside its loop over the batches: the program's own evaluation, "
                                 "checkpoints; in the throughput over the wall clock, not in the one over training "
                                 "step time")]


ENDED_BY = {"end_of_data": "the end of its data", "closed": "the program's own loop", "steps": "trainer.steps, the job's cap",
            "duration": "trainer.duration_s", "signal": "the run's stop"}


def epoch_rows(s: RunSummary) -> list[tuple[str, str]]:
    """A program's epochs: how many, each one's batches against a pass read alone, and why they differ."""
    if s.epochs is None or (not s.epochs and s.ended_by in ("steps", "duration", None)):
        return []
    got = s.epoch_batches or []
    listed = (f": {got[0]:,} batches each" if got and len(set(got)) == 1 else
              f": {', '.join(map(str, got[:8]))}{', ...' if len(got) > 8 else ''} batches" if got else "")
    alone = f"; a pass read alone: {s.pass_batches:,} batches" if s.pass_batches is not None else ""
    ended = ENDED_BY.get(s.ended_by or "", s.ended_by or "-")
    rows = [("epochs", f"{s.epochs}{listed}{alone}; ended by {ended}")]
    if s.epoch_note:
        rows.append(("epoch note", s.epoch_note))
    return rows


def training_rows(record: RunRecord, resumed_by: list[str]) -> list[tuple[str, str]]:
    """The model's loss, the runs this one resumed or was resumed by, its checkpoints and event files."""
    s, rows = job_summary(record), []
    if s.loss_first is not None and s.loss_last is not None:
        bad = s.loss_nonfinite
        diverged = (f"; {bad.value} (not a finite number: the model diverged) from trainer {bad.trainer}'s window "
                    f"ending at batch {bad.batches}") if bad else ""
        rows.append(("loss", f"{s.loss_first:.4g} in the first window, {s.loss_last:.4g} in the last "
                             f"(measured here, as the model reports it){diverged}"))
    if record.resumed_from:
        at = f" at step {s.restored_step}" if s.restored_step is not None else " (step not known)"
        rows.append(("resumed from", f"{record.resumed_from}{at}"))
    if resumed_by:
        rows.append(("resumed by", ", ".join(resumed_by)))
    if record.checkpoint_dir:
        last = f"; last saved at step {s.checkpoint_step}" if s.checkpoint_step is not None else ""
        rows.append(("checkpoints", f"{record.checkpoint_dir}/trainer-<i>{last}"))
    board = s.tensorboard
    if board is not None and board.dir:
        from dsctl.orchestrator.tbevents import event_files

        files = event_files(board.dir)
        if files:
            where = f"{board.dir} ({len(files)} event file(s))" + (f", copied to {board.copy_to}"
                                                                  if board.copy_to else "")
        elif board.copy_to:
            where = f"{board.copy_to} (not in {board.dir}: written where the run was followed)"
        else:
            where = f"none in {board.dir}"
        if board.error:
            where += f"; stopped: {board.error}"
        shown = f"; `dsctl tensorboard {record.id}` shows them" if files or board.copy_to else ""
        rows.append(("tensorboard", where + shown))
    return rows


def resume_line(resume, steps: int | None) -> str:
    """What `dsctl up --resume` restores, printed with the plan before anything starts: with the damaged checkpoints
    it skipped for the newest intact ones (Resume.notes)."""
    holder = "" if resume.holder == resume.run_id else f", written by run {resume.holder}, which {resume.run_id} resumed"
    if resume.step is not None:
        rest = f": trains the remaining {steps - resume.step} of {steps} steps" if steps else ""
        at = f"from step {resume.step}"
    else:
        rest = ""
        at = "from each trainer's latest checkpoint (its step is not known here; the trainers say it when they start)"
    notes = "".join(f" {note}." for note in resume.notes)  # damaged checkpoints it skipped, and what it uses instead
    return f"resuming run {resume.run_id} {at} (checkpoints in {resume.restore_from}/trainer-<i>{holder}){rest}.{notes}"


def fitted_table(title: str, columns: list[str], rows: list[list[str]], keep: list[str], width: int | None = None,
                 more: str = "--json") -> Table:
    """A table whose columns fit in `width` (default: the console's) without cutting any cell: the columns are
    taken in the order `keep` names them (the first, a run id, always) while they fit, and shown in their own
    order; the caption names those left out. A run id is what every other command takes, so it is never cut."""
    width = width or console.width
    need = {c: max([len(c), *(len(row[i]) for row in rows)]) + 3 for i, c in enumerate(columns)}  # padding, border
    chosen: list[str] = []
    used = 1
    for c in [c for c in keep if c in columns] + [c for c in columns if c not in keep]:
        if not chosen or used + need[c] <= width:
            chosen.append(c)
            used += need[c]
    shown = [c for c in columns if c in chosen]
    left = [c for c in columns if c not in chosen]
    caption = "\n".join(textwrap.wrap(f"left out to fit {width} columns: {', '.join(left)} ({more} has every field)",
                                      width)) if left else None  # wrapped here: the console does not wrap
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for c in shown:
        t.add_column(c, no_wrap=True, min_width=need[c] - 3)
    for row in rows:
        t.add_row(*(cell for c, cell in zip(columns, row) if c in chosen))
    return t


def status_table(title: str, group: list[dict], width: int | None = None) -> Table:
    """`dsctl status`: one table of deployments (or TensorBoards), their run ids whole."""
    cols = list(dict.fromkeys(k for r in group for k in r if k not in ("kind", "other_processes")))
    rows = [[str(r.get(c, "")) for c in cols] for r in group]
    return fitted_table(title, cols, rows, ["run", "status", "provider", "url"], width, more="`dsctl status --json`")


RUN_COLUMNS = ["run", "status", "mode", "workers", "trainers", "batches/s", "stall", "duration", "started"]
RUN_COLUMNS_KEPT = ["run", "status", "mode", "batches/s", "duration", "started", "stall", "workers", "trainers"]


def job_length(loaded) -> str:
    """What ends a spec's job, as `dsctl validate` says it: a cap of steps, a duration, or its pipeline's end."""
    from dsctl.specs.pipelines import batches_per_pass

    t, p = loaded.spec.trainer, loaded.spec.pipeline
    if t.steps is not None:
        return f"ends at trainer.steps ({t.steps:,}, a cap on training steps)"
    if t.duration_s is not None:
        return f"ends after trainer.duration_s ({t.duration_s:g} s)"
    alone = batches_per_pass(p.builtin, p.params) if p.builtin else None
    known = f"{alone:,} batches a pass, read alone" if alone else "a pass's length is told when it runs"
    if t.command:
        return f"ends when your program does: its own loop over its epochs decides ({known})"
    return f"ends with its pipeline ({known})"


def runs_table(records: list[RunRecord], width: int | None = None) -> Table:
    """`dsctl runs`: every run id whole; a narrow terminal drops the other columns, least telling first."""
    rows = []
    for r in records:
        s, p = r.job, r.profiled
        rate, seconds = (p.batches_per_s, p.duration_s) if r.kind == "profile" else (s.batches_per_s, s.duration_s)
        rows.append([r.id, r.status, r.mode if r.kind != "sweep" else "sweep", str(r.workers), str(r.trainers),
                     fmt(rate), pct(s.input_stall_frac), fmt(seconds, " s", 1), when(r.created_at)])
    return fitted_table("runs", RUN_COLUMNS, rows, RUN_COLUMNS_KEPT, width, more="`dsctl runs --json`")


def worker_counts(counts: list[int], asked: str | None) -> str:
    """The counts a sweep visits, and what --workers as typed may have led a reader to expect instead."""
    from dsctl.specs.workercounts import doubling_note

    note = doubling_note(asked) if asked else None
    return ", ".join(map(str, counts)) + (f" ({note})" if note else "")


def sweep_plan_line(measured: list[int], predicted: list[int], asked: str | None, local: list[int] | None = None,
                    local_asked: str | None = None) -> str:
    """A sweep's first line, before it measures anything: exactly which counts run."""
    counts = sorted(measured + predicted)
    line = f"sweeping {len(counts)} worker count{'' if len(counts) == 1 else 's'}: {worker_counts(counts, asked)}"
    if local is not None:
        line += (f", each with {worker_counts(local, local_asked)} local worker(s) per trainer "
                 f"({len(counts) * len(local)} points)")
    if predicted and not measured:
        line += "; every one predicted from the calibration, nothing runs"
    elif predicted:
        line += f"; measured here: {', '.join(map(str, measured))}; predicted: {', '.join(map(str, predicted))}"
    return line


def sweep_summary(record: Any) -> SweepSummary:
    """A sweep record's summary, typed (a summary given as its JSON is read as one)."""
    s = record.summary
    return s if isinstance(s, SweepSummary) else SweepSummary.model_validate(s.as_json() if isinstance(s, Record) else s)


def sweep_table(record: RunRecord) -> Table:
    """Figure 9 as a table: throughput, speedup, fraction of ideal, cost, saving; each row says where it comes from."""
    s = sweep_summary(record)
    colo, ideal = s.baselines.get("colocated") or Baseline(), s.baselines.get("ideal") or Baseline()
    given = colo.given or ideal.given
    counts = f"worker counts: {worker_counts(s.counts, s.workers_asked)}\n" if s.counts else ""
    measures = f"each point measures {s.measures}\n" if s.measures else ""
    caption = (f"{counts}{measures}colocated {fmt(colo.batches_per_s)} b/s, ideal {fmt(ideal.batches_per_s)} b/s "
               f"({'given: ' + given if given else 'measured here'}); source: measured here, fitted (the model "
               "at a count it was fitted on: its input back), or predicted (* in the workers column)")
    t = Table(title=f"sweep {record.id} ({record.status}; window {s.window}, warm-up {s.warmup_s} s)",
              title_justify="left", caption_justify="left", caption=caption)
    local = s.local_counts is not None
    for col in ("workers", *(("local",) if local else ()), "batches/s", "speedup", "of ideal", "$/1k batches",
                "cost saving", "source"):
        t.add_column(col, justify="right", no_wrap=True)
    for p in s.points:
        mark = "*" if p.predicted and p.source != "fitted" else ""
        source = p.source or ("predicted" if p.predicted else "measured here")
        t.add_row(f"{p.workers}{mark}", *((str(p.local_workers or 0),) if local else ()), fmt(p.batches_per_s),
                  fmt(p.speedup, "x"), pct(p.fraction_of_ideal), money(p.cost_per_1000_batches),
                  fmt(p.cost_saving, "x"), source)
    rec = s.recommendation
    if rec is not None:
        lines = [f"recommended: none: {rec.refused}"] if rec.refused else []
        remote = "remote only, " if rec.rule is not None else ""
        if rec.smallest is not None:
            lines.append(f"{remote}recommended: {rec.smallest.workers} worker(s): {rec.smallest.reason}")
        if rec.cheapest is not None:
            lines.append(f"{remote}cheapest: {rec.cheapest.workers} worker(s): {rec.cheapest.reason}")
        if rec.rule is not None:
            lines.append(f"recommended placement: {rec.surface.reason if rec.surface else 'none (no measured point was priced)'}"
                         f" (rule: {rec.rule}; local workers add no dollars: they run on the trainer hosts, charged "
                         "whole either way)")
        lines += [f"warning: {said}" for said in (rec.warning, rec.extend) if said]
        caption += "\n" + "\n".join(lines)
    if s.plots:
        caption += "\nplots: " + ", ".join(s.plots)
    t.caption = caption
    return t
