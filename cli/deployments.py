"""`dsctl status` and `dsctl down`: the deployments that are up, and taking them down."""

from __future__ import annotations

import typer

from dsctl.orchestrator.locate import Where

from .errors import err_console
from .locate import locating, said
from .render import console, print_json, status_table


def status(json_out: bool = typer.Option(False, "--json")) -> None:
    """Deployments that are up (or were left behind by a killed `dsctl up`), and TensorBoards serving."""
    from dsctl.orchestrator.deployments import rebuilt_from
    from dsctl.orchestrator.status import status_rows

    view = status_rows()
    rows = view.rows + view.tensorboards
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print("nothing is up.")
        return
    elsewhere = said("down")
    for d in view.unreadable:
        err_console.print(f"{d.run_id}: its state file ({d.run_dir}/state.json) cannot be read; {rebuilt_from(d)}. "
                          "`dsctl down` stops what was rebuilt, and nothing else."
                          + (f" If it ran elsewhere, `dsctl down {d.run_id} {elsewhere}` finds what it made there by "
                             "label." if elsewhere else ""))
    for m in view.unmonitored:
        err_console.print(f"{m['run']}: its monitor (the detached `dsctl up`, pid {m['pid']}) is gone, so nothing "
                          "supervises its service or records its run; its trainers' own metrics files say: "
                          f"{m['trainers_say']}. `dsctl down {m['run']}` stops what is left and records how it "
                          f"ended from those files. The monitor's log: {m['log']}", markup=False, highlight=False)
    for run, held in view.daemons:
        err_console.print(f"{run}: {len(held.others)} other process(es) in its cgroup ({held.container}), besides "
                          "dsctl's launcher, servers and trainers and what runs in their sessions (daemons they "
                          f"started): {'; '.join(held.others)}. `dsctl down {run}` ends them with the run.",
                          markup=False, highlight=False)
    for title, group in (("deployments", view.rows), ("tensorboard", view.tensorboards)):
        if group:
            console.print(status_table(title, group))


@locating("down")
def down(
    run: str | None = typer.Argument(None, help="run id (or a unique prefix), a sweep's point, or a TensorBoard's id "
                                                "(`dsctl status`); default: the only thing up"),
    all_: bool = typer.Option(False, "--all", help="take down every deployment that is up, and stop every TensorBoard"),
    where: Where = Where(),
) -> None:
    """Stop and remove everything a run started, even if `dsctl up` was killed or its state is gone; record how it
    ended from what its trainers wrote."""
    from dsctl.orchestrator.takedown import down as take_down

    take_down(run, all_, where, say=lambda line: console.print(line, markup=False, highlight=False))
