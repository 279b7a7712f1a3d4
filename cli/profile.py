"""`dsctl profile`: run a spec's pipeline as one worker would, here; print where its CPU goes, the workers it needs,
and what would make it cheaper, each change with its measured effect."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dsctl.errors import stop_on_signals
from dsctl.orchestrator.profiling.record import Profile
from dsctl.orchestrator.profiling.session import ProfileOptions, ProfileProgress, profile_job
from dsctl.orchestrator.records import RunRecord

from .render import console, print_json


def profile(
    spec: Path = typer.Argument(..., metavar="JOB.yaml", help="job spec YAML"),
    seconds: float = typer.Option(8.0, "--seconds", "-s", min=1, max=600,
                                  help="measured window of each version of the pipeline, after its warm-up"),
    target_bps: float | None = typer.Option(None, "--target-bps", min=0.001, max=1e7,
                                            help="batches/s the trainers consume in all (default: the job's ideal rate: "
                                                 "its model's step time)"),
    cache_gb: float | None = typer.Option(None, "--cache-gb", min=0.001, max=1e7,
                                          help="storage a cache may take, GB (default: what is free where autocache "
                                               "keeps caches)"),
    service: bool = typer.Option(False, "--service", help="also run the pipeline on one real tf.data service worker and "
                                                          "measure what serving costs"),
    recommend: bool = typer.Option(True, "--recommend/--no-recommend", help="measure candidate changes too"),
    json_out: bool = typer.Option(False, "--json", help="print the profile as JSON"),
) -> None:
    """Where a pipeline's CPU goes, the workers it needs, and what would make it cheaper (each change measured)."""
    options = ProfileOptions(seconds=seconds, warmup_s=min(2.0, seconds), target_bps=target_bps, cache_gb=cache_gb,
                             service=service, recommend=recommend)
    stop_on_signals()  # SIGTERM and SIGHUP end it as Ctrl-C does: the profiling process first
    with _Progress(enabled=not json_out) as view:
        result = profile_job(spec, options, listener=view)
    if json_out:
        print_json(result.to_dict())
        return
    show(result)


class _Progress:
    """One status line while the profile runs (a line per phase when stderr is not a terminal)."""

    def __init__(self, enabled: bool):
        self.console = Console(stderr=True, highlight=False)
        self.enabled = enabled
        self.live: Live | None = None
        self.last = ("", 0.0)

    def __enter__(self) -> _Progress:
        if self.enabled and self.console.is_terminal:
            self.live = Live(Text(""), console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, p: ProfileProgress) -> None:
        if not self.enabled:
            return
        rate = f", {p.batches_per_s:.1f} batches/s" if p.batches_per_s else ""
        line = (f"[{p.phase}] {p.done_s:.1f}/{p.total_s:.1f} s, {p.batches} batches{rate}" if p.total_s
                else f"[{p.phase}]")
        if self.live is not None:
            self.live.update(Text(line))
        elif p.phase != self.last[0] or time.monotonic() - self.last[1] > 5:
            self.console.print(line, markup=False)
            self.last = (p.phase, time.monotonic())


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _bytes(n: float) -> str:
    return _count(n) + "B"


def profile_table(p: Profile) -> Table:
    rate = p.rate
    table = Table(title=f"profile {p.run_id}: {p.job}'s pipeline as one worker runs it, here ({rate.cores_here} cores), "
                        f"{rate.seconds:.3g} s measured (all figures measured here)", title_justify="left")
    for col, right in (("#", True), ("transformation", False), ("CPU/elem", True), ("share", True),
                       ("elements in→out", True), ("bytes in→out", True), ("inflation", True), ("parallelism", False),
                       ("buffer", True), ("thread busy", True), ("bounds", False)):
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    for i, r in enumerate(p.rows, 1):
        wait = f" +{_ms(r.wait_s_per_batch)} wait/batch" if r.wait_s_per_batch else ""
        table.add_row(str(i), ("  " if r.inner else "") + r.label, _ms(r.cpu_s_per_element) + wait, f"{r.share:.0%}",
                      f"{_count(r.elements_in)}→{_count(r.elements_out)}", f"{_bytes(r.bytes_in)}→{_bytes(r.bytes_out)}",
                      f"{r.inflation:.3g}×" if r.inflation is not None else "-", r.parallelism, r.buffer,
                      f"{min(r.utilization, 9.99):.0%}", "◀ bounds" if r.bounds else "")
    return table


def show(p: Profile) -> None:
    """The profile as `dsctl profile` and `dsctl runs show` print it."""
    out = [profile_table(p)]
    rate, pred = p.rate, p.prediction
    lines = [
        f"CPU/elem: per element each transformation produced; elements and bytes over the window; inflation: bytes out "
        f"÷ bytes in. Outside the transformations: {_ms(rate.outside_cpu_s_per_batch)} CPU per batch (the reading loop, "
        "tf.data's own threads).",
        f"check: TensorFlow's self times add up to {rate.self_coverage:.0%} of the CPU the OS counted for the process"
        + (f"; above it, threads waited (for a core on a busy machine, or inside a transformation: I/O, a sleep), so "
           f"the CPU column is self time × {rate.scale:.2f}"
           if rate.scale < 1 else "") + ".",
        f"one worker-like process here: {rate.batches_per_s:.4g} batches/s"
        + (f" ({rate.examples_per_s:.4g} elements/s)" if rate.examples_per_s else "")
        + f", {_ms(rate.cpu_s_per_batch)} CPU per batch, {rate.cores_used:.2f} of {rate.cores_here} cores busy "
          f"({rate.batches_per_s / max(rate.cores_used, 1e-9):.4g} batches/s per busy core). Bounds: {rate.bound}.",
    ]
    if pred.workers is not None:
        lines.append(f"workers needed (predicted for {pred.worker_machine}, {pred.cores_per_worker} cores each) for "
                     f"{pred.target_bps:.4g} batches/s ({pred.target_source}):")
    else:
        lines.append(f"one worker on {pred.worker_machine} (predicted); trainers' rate: {pred.target_source}")
    lines.append(f"  {pred.formula}")
    if pred.here_cap_bps is not None:
        lines.append(f"  here, every local worker shares this machine's {rate.cores_here} cores: at most "
                     f"{pred.here_cap_bps:.4g} batches/s in all, however many workers")
    if p.service is not None:
        s = p.service
        cost = (f"{_ms(s.worker_cpu_s_per_batch)} CPU per batch in the worker's process"
                + (f", {s.overhead:.2f}× the profiling process's" if s.overhead else "")) \
            if s.worker_cpu_s_per_batch else "the worker's CPU was not sampled"
        lines.append(f"through one tf.data service worker (run {s.run_id}, measured here): {s.batches_per_s:.4g} "
                     f"batches/s at the trainer, {cost}; {s.trainer_view}.")
    if p.recommendations:
        lines.append("recommendations, best first (before → after: the same window, measured here):")
        for i, rec in enumerate(p.recommendations, 1):
            e = rec.effect
            measured = (f"{e.before_bps:.4g} → {e.after_bps:.4g} batches/s ({e.speedup:.2f}×), CPU per batch "
                        f"{_ms(e.before_cpu_s_per_batch)} → {_ms(e.after_cpu_s_per_batch)} ({e.cpu_cut:.2f}× less)"
                        + (f", reading with a {e.consumer_step_s * 1e3:g} ms step per batch" if e.consumer_step_s else "")
                        if e else "not measured")
            lines.append(f" {i}. {rec.title}: {measured}")
            lines.append(f"    {rec.detail}")
            lines.append(f"    apply: {rec.apply}")
            if rec.note:
                lines.append(f"    note: {rec.note}")
    elif p.recommended:
        lines.append("recommendations: none: no sequential map bounds throughput, nothing runs in the reader's thread "
                     "worth a prefetch, no autocache hint saves enough CPU within the storage given, and every "
                     "reorderable section is in AutoOrder's order.")
    if p.steps:
        lines.append("reorderable steps, each alone on one sample (measured here): " + "; ".join(
            f"{s.section}.{s.step}: bytes ×{s.byte_ratio:.3g}, keeps {s.keep:.0%}, {_ms(s.cpu_s_per_element)} CPU/elem"
            if s.byte_ratio is not None and s.keep is not None else f"{s.section}.{s.step}" for s in p.steps))
    for note in p.notes:
        lines.append(f"note: {note}")
    if p.chart:
        lines.append(f"chart: {p.chart}")
    console.print(Group(*out))
    for line in lines:
        console.print(line, markup=False, highlight=False)


def show_recorded_profile(record: RunRecord) -> None:
    """`dsctl runs show` of a profile run: the profile as `dsctl profile` printed it, or how it ended."""
    profile = record.profiled.profile()
    if profile is not None:
        show(profile)
    else:
        console.print(f"profile {record.id} ({record.status}): {record.error or 'it recorded no profile'}",
                      markup=False, highlight=False)
