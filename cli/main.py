"""The `dsctl` command line: every command registered in one place, each a module of this folder that parses its
arguments, calls one orchestrator function and renders the result."""

from __future__ import annotations

import os

import typer

from .check import check
from .cost import cost_app
from .deployments import down, status
from .errors import run_app
from .experiments import experiments_app
from .profile import profile
from .render import console
from .runs import logs, runs_app
from .sweep import sweep
from .tensorboard import tensorboard
from .up import supervise, up, validate

app = typer.Typer(
    name="dsctl",
    help="Run TensorFlow's tf.data service for training jobs from YAML specs: provision, measure, price, tear down.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Every command, one line each, in the order `dsctl --help` lists them (the groups after the commands): a new command
# is a module of this folder and its line here.
app.command("sweep")(sweep)
app.command("check")(check)
app.command("profile")(profile)
app.command("validate")(validate)
app.command("up")(up)
app.command("supervise", hidden=True)(supervise)
app.command("status")(status)
app.command("down")(down)
app.command("logs")(logs)
app.command("tensorboard")(tensorboard)
app.add_typer(runs_app, name="runs")
app.add_typer(cost_app, name="cost")
app.add_typer(experiments_app, name="experiments")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"dsctl {version('dsctl')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="print dsctl's version and exit")) -> None:
    """Run TensorFlow's tf.data service for training jobs from YAML specs: provision, measure, price, tear down."""


def main() -> None:
    """The `dsctl` entry point: Ctrl-C anywhere in here, the commands' own imports included, exits
    130 with one line and no traceback (cli.errors.interrupted)."""
    from .errors import interrupted

    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        run_app(app)
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    main()
