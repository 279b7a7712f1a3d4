"""What the VMs fetch from Cloud Storage, put there from this machine before they need it.

Before any VM exists: the bucket (accounts.py grants the VMs' accounts what they read there), this dsctl's wheel and
one wheelhouse per VM kind (gcp.bootstrap: the VMs install from them, never from PyPI), and a
builtin's data files. Before the trainers start: the spec and, for user code, the spec's folder.
Each step is recorded in the deployment's state, so a second `up` of the same deployment (more
workers, the trainers of a baseline) stages nothing twice and `down` deletes what was staged.
"""

from __future__ import annotations

from pathlib import Path

from dsctl.specs.schema import JobSpec

from ..contract import EventSink
from . import data, wheelhouse
from .context import Context
from .machinetypes import machine_kind
from .storage import Staging, code_archive


def uses_code(spec: JobSpec) -> bool:
    """The trainers need the spec's folder: user code (an entrypoint, a model, the user's own command)."""
    return bool(spec.pipeline.entrypoint or spec.trainer.model.kind in ("python", "keras") or spec.trainer.command)


def bucket(ctx: Context) -> None:
    """The staging bucket, made if missing (in the zone's region, uniform bucket-level access), before the VMs'
    accounts are granted what they read there (accounts.ensure)."""
    if not ctx.state.bucket_ready:
        Staging(ctx.clients, ctx.dep.run_id).ensure_bucket()
        ctx.state.bucket_ready = True
        ctx.save()


def software(ctx: Context, spec: JobSpec, kinds: set[str], events: EventSink) -> None:
    """Everything the VMs of `kinds` fetch at boot, staged before any of them exists: this dsctl's wheel, one
    wheelhouse per VM kind, a builtin's data files (the bucket is there: `bucket`)."""
    s, state = ctx.settings, ctx.state
    staged = state.software
    staging = Staging(ctx.clients, ctx.dep.run_id)
    if s.bootstrap and staged.wheel is None:
        from .wheel import build_wheel

        path = build_wheel(Path(ctx.dep.run_dir) / "staging")
        state.staged = True
        ctx.save()  # before the upload: `down` deletes the run's staging objects
        staging.upload(path.name, path)
        staged.wheel = path.name
        events("cloud", f"staged {path.name} in {staging.url('')}")
    if s.bootstrap:
        for kind in sorted(kinds - set(staged.wheelhouses)):
            # The dispatcher's kind also carries what the run's supervisor needs (the dispatcher installs it).
            supervisor = kind == machine_kind(spec.service.dispatcher_machine).kind
            recipe = wheelhouse.Recipe.for_kind(s.run_software.for_kind(kind), supervisor=supervisor)
            house = wheelhouse.build(recipe, log=lambda msg: events("cloud", msg))
            sent = wheelhouse.stage(ctx.clients.storage, s.bucket, house, log=lambda msg: events("cloud", msg))
            staged.wheelhouses[kind] = house.prefix
            events("cloud", f"{kind} VMs install from gs://{s.bucket}/{house.prefix} ({house.size / 1e6:.0f} MB; "
                            f"{'uploaded now' if sent else 'already there'})")
    root = data.root(spec, s.bucket)
    if root and not state.data_root:
        sent = data.stage(spec, ctx.clients.storage, root, Path(ctx.dep.run_dir).parent.parent / "cache",
                          log=lambda msg: events("cloud", msg))
        state.data_root = root
        events("cloud", f"{spec.pipeline.builtin} data in {root} ({'uploaded now' if sent else 'already there'})")
    ctx.save()


def trainer_files(ctx: Context, spec: JobSpec, spec_json: Path, base_dir: Path) -> list[str]:
    """The spec (and the spec's folder, for user code) in the run's staging prefix, for the trainer VMs to fetch.
    A run handed over to a supervisor (handoff.py) was staged from the user's machine, where the code is."""
    state = ctx.state
    if state.trainer_files:
        return list(state.trainer_files)
    staging = Staging(ctx.clients, ctx.dep.run_id)
    staging.ensure_bucket()
    objects = [staging.upload("spec.json", Path(spec_json))]
    state.staged = True
    if uses_code(spec):
        objects.append(staging.upload("code.tar.gz", code_archive(base_dir, exclude=[Path(ctx.dep.run_dir).parent.parent])))
    return objects
