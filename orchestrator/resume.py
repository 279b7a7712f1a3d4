"""`dsctl up job.yaml --resume RUN`: which checkpoints a new run restores, or why it cannot.

A run can be resumed when it has ended (an interrupted or failed run, or a finished one given more
steps), trained the same job (the pipeline, the model and the trainer count decide what a checkpoint
holds and which trainer restores which), and left a checkpoint for every trainer. A resumed run
that stopped before writing checkpoints of its own is resumed from the run it restored, so chains
of resumes go back to the latest checkpoint there is. A keras trainer's latest checkpoint whose files
are missing or empty is skipped for the newest intact one before it, and the plan says which
(`Resume.notes`); damage only TensorFlow can see (a truncated or overwritten file) is found by the
trainer as it restores, which skips it the same way and says so (runtime/checkpoint.py). A command's
checkpoints are its own: dsctl resumes from the step its note names, and the program restores it.
Every refusal is one paragraph naming the run and, for a different job, the field and its line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from dsctl.specs import LoadedSpec, SpecError, UsageError
from dsctl.specs.errors import dotted
from dsctl.specs.schema import JobSpec

from .checkpoints import Latest, latest, run_checkpoint_dir, trainer_dirs
from .records import RunRecord
from .store import RunStore

SAME_JOB = (("pipeline",), ("trainer", "model"), ("trainer", "count"))  # what a checkpoint depends on


@dataclass(frozen=True)
class Resume:
    """What a resumed run restores: each trainer's latest checkpoint below `restore_from`."""

    run_id: str  # the run named with --resume: the new run's record says it resumed this one
    restore_from: str  # the checkpoint folder restored (its trainer-<i> folders)
    holder: str  # the run that wrote those checkpoints: run_id, or an earlier run of its chain
    steps: tuple[int | None, ...] = ()  # each trainer's latest checkpoint step, None where unknown
    notes: tuple[str, ...] = ()  # newer checkpoints skipped as damaged, one sentence each

    @property
    def step(self) -> int | None:
        """The step training continues from, when every trainer's is known (the lowest, if they differ)."""
        known = [s for s in self.steps if s is not None]
        return min(known) if self.steps and len(known) == len(self.steps) else None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Resume | None:
        return cls(**{**d, "steps": tuple(d.get("steps") or ()), "notes": tuple(d.get("notes") or ())}) if d else None


def plan_resume(store: RunStore, ref: str, loaded: LoadedSpec) -> Resume:
    """The checkpoints `dsctl up --resume ref` restores; SpecError (one paragraph) if it cannot resume."""
    record = store.find(ref)
    if record is None:
        raise UsageError(f"--resume {ref}: no run '{ref}' is recorded; `dsctl runs` lists the recorded ones.")
    rid = record.id
    if record.status == "running":
        raise SpecError(f"--resume {rid}: run {rid} is still running (its record says so), and a run resumed while "
                        f"the other still writes checkpoints would race it. Wait for it to end, or stop it with "
                        f"`dsctl down {rid}` (which also records a run whose `dsctl up` was killed), then resume it.")
    old = JobSpec.model_validate_json(record.spec_json)
    _same_job(old, loaded, rid)
    if old.trainer.checkpoint is None:
        raise SpecError(f"--resume {rid}: run {rid} wrote no checkpoints: its spec has no trainer.checkpoint section. "
                        "Only runs with trainer.checkpoint (a keras model: {dir: ..., every_steps: N}; a command: "
                        "{dir: ...}, saving into dsctl.train.checkpoint_dir()) can be resumed.")
    resume = _latest_in_chain(store, record, loaded.spec.trainer.count)
    steps = loaded.spec.trainer.steps
    if steps is not None and resume.step is not None and resume.step >= steps:
        raise loaded.error(("trainer", "steps"), f"--resume {rid}: its checkpoints are at step {resume.step}, and this "
                           f"spec trains {steps} steps, so nothing is left to train. Give trainer.steps above "
                           f"{resume.step} to train on from there.")
    return resume


def _same_job(old: JobSpec, loaded: LoadedSpec, rid: str) -> None:
    new = loaded.spec.model_dump(mode="json")
    was = old.model_dump(mode="json")
    for section in SAME_JOB:
        diffs = _differences(_at(was, section), _at(new, section), section)
        if diffs:
            loc, before, now = diffs[0]
            more = f" ({len(diffs) - 1} more field(s) differ too)" if len(diffs) > 1 else ""
            raise loaded.error(loc, f"--resume {rid}: this is not the job run {rid} trained: {dotted(loc)} is "
                               f"{_show(now)} here but was {_show(before)} there{more}. A run resumes only the same "
                               "pipeline, trainer.model and trainer.count, which decide what its checkpoints hold; "
                               f"use the spec run {rid} used (`dsctl runs show {rid} --json` has it), or start afresh "
                               "without --resume.")


def _at(d: object, path: tuple) -> object:
    for part in path:
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _differences(a: object, b: object, loc: tuple) -> list[tuple[tuple, object, object]]:
    """(field path, old value, new value) of every leaf that differs, in field order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            out += _differences(a.get(key), b.get(key), loc + (key,))
        return out
    return [] if a == b else [(loc, a, b)]


def _show(value: object) -> str:
    return "absent" if value is None else repr(value) if isinstance(value, str) else str(value)


def _checkpoint_base(record: RunRecord) -> str | None:
    """Where a run wrote its checkpoints, as recorded; for runs recorded before that column, as its spec says."""
    if record.checkpoint_dir:
        return record.checkpoint_dir
    spec = JobSpec.model_validate_json(record.spec_json)
    if spec.trainer.checkpoint is None or not record.spec_path:
        return None
    return run_checkpoint_dir(spec, Path(record.spec_path).parent, record.id)


def _latest_in_chain(store: RunStore, record: RunRecord, count: int) -> Resume:
    """The named run's checkpoints, or, where it wrote none, those of the run it resumed (and so on)."""
    looked: list[str] = []
    skipped: list[tuple[str, list[str]]] = []  # (run, its damaged checkpoints) of the runs looked at so far
    current: RunRecord | None = record
    while current is not None and current.id not in looked:
        looked.append(current.id)
        base = _checkpoint_base(current)
        note_only = bool(JobSpec.model_validate_json(current.spec_json).trainer.command)
        found: list[Latest] = [latest(d, note_only) for d in trainer_dirs(base, count)] if base else []
        if base and found and all(f.found is not False for f in found):
            notes = [f"skipped as damaged, run {run}'s checkpoints: {'; '.join(d)}" for run, d in skipped]
            notes += [f"trainer {i}'s latest checkpoint is damaged ({'; '.join(f.damaged)}): it resumes from step "
                      f"{f.step}, the newest intact one" for i, f in enumerate(found) if f.damaged]
            return Resume(run_id=record.id, restore_from=base, holder=current.id, steps=tuple(f.step for f in found),
                          notes=tuple(notes))
        damaged = [d for f in found for d in f.damaged]
        if damaged:
            skipped.append((current.id, damaged))
        current = store.get(current.resumed_from) if current.resumed_from else None
    if skipped:
        listed = "; ".join(d for _, ds in skipped for d in ds)
        raise SpecError(f"--resume {record.id}: no intact checkpoint is left for every trainer (their files are "
                        f"missing or empty: {listed}). Restore those files from a copy, or start the job afresh "
                        "without --resume.")
    base = _checkpoint_base(record)
    where = f" in {base}/trainer-<i>" if base else ""
    chain = f" (nor did the run(s) it resumed: {', '.join(looked[1:])})" if len(looked) > 1 else ""
    trainer = JobSpec.model_validate_json(record.spec_json).trainer
    assert trainer.checkpoint is not None, "plan_resume refuses a run without trainer.checkpoint"
    when = (f"(every {trainer.checkpoint.every_steps} steps)" if trainer.command is None else
            "(a command's save counts once it calls dsctl.train.checkpoint_saved(step))")
    raise SpecError(f"--resume {record.id}: run {record.id} wrote no checkpoint for every trainer{where}{chain}: its "
                    f"trainers stopped before their first save {when}, or the folder was removed. Start the job afresh "
                    "without --resume.")
