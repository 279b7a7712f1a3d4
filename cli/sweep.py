"""`dsctl sweep`: run a job over worker counts; print the table, the recommendation and where the plots are."""

from __future__ import annotations

from pathlib import Path

import typer

from dsctl.errors import stop_on_signals
from dsctl.specs import UsageError
from dsctl.specs.workercounts import parse_worker_counts

from .errors import err_console
from .live import LiveView
from .render import console, print_json, sweep_plan_line, sweep_table
from .up import choice

LOCAL_HELP = ("in-process workers per trainer to sweep with every --workers count (service.placement: hybrid; 0: remote "
              "only), same forms as --workers, e.g. 0..2. Recommends the cheapest point within --tolerance of the "
              "best measured throughput.")
WORKERS_HELP = ("worker counts; the end is always included. 8..640 doubles: 8,16,...,512,640 (the paper's Figure 9); "
                "1..4 gives 1,2,4 and 1..4:1 every count; 1..6:2 steps by 2: 1,3,5,6; 8,16,64 is a list. The sweep "
                "prints the counts before it measures.")


def sweep(
    spec: Path | None = typer.Argument(None, metavar="[JOB.yaml]",
                                          help="job spec; default: the deployment `dsctl up --detach` left running"),
    workers: str = typer.Option(..., "--workers", "-w", help=WORKERS_HELP),
    local_workers: str | None = typer.Option(None, "--local-workers", metavar="COUNTS", help=LOCAL_HELP),
    simulate: bool = typer.Option(False, "--simulate", help="predict counts this machine cannot hold with the calibrated model"),
    window: str = typer.Option("5s", "--window", help="measurement per point: batches (200) or seconds (5s)"),
    warmup: float = typer.Option(2.0, "--warmup", min=0, help="seconds discarded after each change of worker count"),
    tolerance: float = typer.Option(0.03, "--tolerance", min=0, max=1,
                                    help="recommend the smallest count within this of the best"),
    out: Path | None = typer.Option(None, "--out", help="directory for the plots (default: the sweep's run dir)"),
    calibration: Path | None = typer.Option(None, "--calibration", metavar="FILE",
                                            help="with --simulate: predict every count from measured rates in FILE, "
                                                 "run nothing"),
    from_profile: str | None = typer.Option(None, "--profile", metavar="RUN|FILE",
                                            help="with --simulate: predict every count from a profile (`dsctl profile`: "
                                                 "one worker's rate from CPU per batch), run nothing"),
    json_out: bool = typer.Option(False, "--json", help="print the sweep record as JSON"),
    strategy: str = typer.Option("in-place", "--strategy", hidden=True, help="in-place | restart"),
) -> None:
    """Run one job over several worker counts and find where more workers stop paying off (paper Figure 9)."""
    from dsctl.orchestrator.sweep import SweepOptions, Window
    from dsctl.orchestrator.sweep import sweep as run_sweep
    from dsctl.specs.calibration import load_calibration

    counts = parse_worker_counts(workers)
    local_counts = parse_worker_counts(local_workers, option="--local-workers", zero_ok=True) \
        if local_workers is not None else None
    if calibration is not None and not simulate:
        raise UsageError("--calibration predicts a sweep without running it; add --simulate.", field="--calibration")
    if from_profile is not None and (not simulate or calibration is not None):
        raise UsageError("--profile predicts a sweep from a profile without running it: add --simulate, and give it "
                         "instead of --calibration, not with it.", field="--profile")
    options = SweepOptions(counts=counts, window=Window.parse(window), warmup_s=warmup, simulate=simulate,
                           tolerance=tolerance, out_dir=out, strategy=choice(strategy, ("in-place", "restart"),
                                                                             "--strategy"),
                           calibration=load_calibration(calibration) if calibration else None, profile=from_profile,
                           asked=workers.strip(), local_counts=local_counts,
                           local_asked=local_workers.strip() if local_workers is not None else None)
    # SIGTERM (a scheduler, `kill`) and SIGHUP (a closed terminal) end the sweep as Ctrl-C does: everything it
    # started is stopped, its record says interrupted and keeps the finished points, exit 128 + the signal.
    stop_on_signals()

    def plan(measured: list[int], predicted: list[int]) -> None:
        (err_console if json_out else console).print(sweep_plan_line(measured, predicted, options.asked, local_counts,
                                                                     options.local_asked), markup=False)

    with LiveView(enabled=not json_out) as view:
        record = run_sweep(spec, options, view, plan)
    if json_out:
        print_json(record.as_dict())
        return
    console.print(sweep_table(record))
