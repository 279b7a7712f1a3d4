"""What a trainer is told about its run: one typed record, parsed from the command line of dsctl's own
trainer harness (`python -m dsctl.runtime.trainer ...`) and of the runner of a user's command
(`python -m dsctl.runtime.command ...`), and handed on to the user's script in one environment
variable, DSCTL_TRAINER, which `dsctl.train` reads.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from dsctl.specs.schema import MODES, Accelerator, Mode

ENV_VAR = "DSCTL_TRAINER"


@dataclass(frozen=True)
class TrainerArgs:
    spec: str  # the job spec as JSON, written by dsctl up
    metrics: str  # the JSON-lines metrics file this trainer writes
    mode: Mode = "service"
    dispatcher: str | None = None  # host:port, in service mode
    index: int = 0  # which trainer this is (coordinated reads' consumer index)
    cache_dir: str = str(Path.home() / ".dsctl" / "cache")  # builtin data, autocache (local or gs://)
    base_dir: str = "."  # the spec's folder: user entrypoints are imported, and commands run, from here
    steps: int | None = None  # overrides trainer.steps (with duration_s: both from the spec when neither is given)
    duration_s: float | None = None  # overrides trainer.duration_s
    record_ids: str | None = None  # write the ids of received synthetic elements here (element accounting)
    repeat: bool = False  # repeat a finite pipeline (steady-state measurements: sweeps)
    window_s: float | None = None  # overrides trainer.window_s
    record_steps: str | None = None  # per-batch wait, step time and token counts (JSON), for experiments
    accelerator: Accelerator = "none"  # what the trainer machine has (distribution strategy)
    accelerators: int = 0  # how many
    checkpoint_dir: str | None = None  # this trainer's checkpoint folder (local or gs://)
    restore_from: str | None = None  # the folder of the run resumed (dsctl up --resume), this trainer's
    resume_step: int = 0  # the step a resumed command continues from (set by the runner, not a flag)
    vm_python: bool = False  # a command's `python` is the one running the runner (on a cloud VM), not PATH's

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> TrainerArgs:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def with_(self, **changes) -> TrainerArgs:
        return replace(self, **changes)


def parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="the job spec as JSON (written by dsctl up)")
    ap.add_argument("--mode", choices=MODES, default="service")
    ap.add_argument("--dispatcher", default=None, help="host:port, required in service mode")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--cache-dir", default=TrainerArgs.cache_dir)
    ap.add_argument("--base-dir", default=".", help="where the user's entrypoint modules live")
    ap.add_argument("--steps", type=int, default=None, help="override trainer.steps")
    ap.add_argument("--duration-s", type=float, default=None, help="override trainer.duration_s")
    ap.add_argument("--record-ids", default=None, help="write the ids of received synthetic elements here")
    ap.add_argument("--repeat", action="store_true", help="repeat a finite pipeline (steady-state measurements)")
    ap.add_argument("--window-s", type=float, default=None, help="override trainer.window_s")
    ap.add_argument("--record-steps", default=None, help="write per-batch wait, step time and token counts here (JSON)")
    ap.add_argument("--accelerator", choices=("none", "gpu", "tpu"), default="none",
                    help="what the trainer machine has (keras models and commands: picks the distribution strategy)")
    ap.add_argument("--accelerators", type=int, default=0, help="how many of them")
    ap.add_argument("--checkpoint-dir", default=None, help="save checkpoints here (local or gs://)")
    ap.add_argument("--restore-from", default=None, help="restore the latest checkpoint here first")
    ap.add_argument("--vm-python", action="store_true",
                    help="commands: put this interpreter's folder first on PATH (a cloud VM's Python)")
    return ap


def parse(argv: list[str] | None, prog: str, description: str | None) -> TrainerArgs:
    ap = parser(prog, description)
    ns = ap.parse_args(argv)
    if ns.mode == "service" and not ns.dispatcher:
        ap.error("--dispatcher is required in service mode")
    return TrainerArgs(**vars(ns))


def from_environment() -> TrainerArgs | None:
    """The trainer's record when this process runs inside a dsctl run (a user's command), else None."""
    text = os.environ.get(ENV_VAR)
    return TrainerArgs.from_env(text) if text else None
