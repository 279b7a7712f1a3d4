"""Load a job spec from YAML: parse, validate fields, validate pipeline params, apply rules,
load its price catalog, and (for a file) check its entrypoints in a child process."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from . import entrypoints
from .command import command_problem
from .errors import SpecError
from .pipelines import PARAMS_BY_BUILTIN
from .rules import check_rules
from .schema import JobSpec
from .validate import validate
from .yamlsource import YamlSource, parse_yaml, read_yaml


@dataclass
class LoadedSpec:
    """A validated spec plus where it came from (for errors found later, e.g. by the runtime)."""

    spec: JobSpec
    source: YamlSource

    @property
    def base_dir(self) -> Path:
        """Directory user entrypoints are imported from (the spec's own folder)."""
        return Path(self.source.path).resolve().parent

    def error(self, loc: tuple, message: str) -> SpecError:
        return self.source.error(loc, message)

    def locate(self, exc: SpecError) -> SpecError:
        """A SpecError raised with a field name only (by code that has no file), pointed at that field's line here."""
        if exc.where or not exc.field:
            return exc
        return self.error(tuple(exc.field.split(".")), exc.message)


def spec_hash(spec: JobSpec) -> str:
    """Stable hash of what a spec means (defaults filled in), not of its formatting."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def from_source(src: YamlSource) -> LoadedSpec:
    if src.data is None:
        raise SpecError("the file is empty (or only comments); a job spec is a mapping that needs at least the keys "
                        "'name', 'trainer' and 'pipeline', e.g. specs/examples/quickstart.yaml.", where=f"{src.path}:1")
    if not isinstance(src.data, dict):
        raise SpecError(
            f"a job spec is a mapping of keys (name, service, trainer, pipeline, ...), got a {type(src.data).__name__}.",
            where=src.where(()),
        )
    spec = validate(JobSpec, src)
    if spec.pipeline.builtin is not None:
        params_model = PARAMS_BY_BUILTIN[spec.pipeline.builtin]
        params = validate(params_model, src, spec.pipeline.params, prefix=("pipeline", "params"))
        spec.pipeline.params = params.model_dump(mode="json")
    check_rules(spec, src)
    loaded = LoadedSpec(spec=spec, source=src)
    _check_pricing(loaded)
    return loaded


def _check_pricing(loaded: LoadedSpec) -> None:
    """Load the catalog `pricing` names, so a bad one (a negative price, a typo) fails here with its
    file and line, not when the finished run is priced. Catalogs are costmodel's; this is the one
    place specs/ reaches up to it, lazily, because a catalog is part of what a spec says."""
    from dsctl.costmodel.catalog import load_catalog

    try:
        load_catalog(loaded.spec.pricing, base_dir=loaded.base_dir)
    except SpecError as exc:
        if not exc.where:  # unknown name, missing file: the spec's line is the one to change
            raise loaded.error(("pricing",), exc.message) from None
        raise SpecError(f"{exc.message} (This is the price catalog that 'pricing' names at "
                        f"{loaded.source.where(('pricing',))}.)", where=exc.where, field=exc.field) from None


def load_spec(path: str | Path, *, check_entrypoints: bool = True) -> LoadedSpec:
    """Read, validate and return a job spec; every problem is a SpecError naming file:line.

    With check_entrypoints, user entrypoints are imported (and a pipeline function called) in a
    child process with a time limit (see entrypoints.py): a module that hangs at import is an
    error at its spec line, and nothing of the user's code runs in this process.
    """
    loaded = from_source(read_yaml(path))
    if check_entrypoints:
        _check_command(loaded)
        entrypoints.check_entrypoints(loaded)
    return loaded


def _check_command(loaded: LoadedSpec) -> None:
    """trainer.command names a program that exists and may be executed (not run: see command.py)."""
    trainer = loaded.spec.trainer
    if trainer.command is None:
        return
    why = command_problem(trainer.command, loaded.base_dir, {**os.environ, **trainer.env},
                          on_this_machine=loaded.spec.provider == "local")
    if why:
        raise loaded.error(("trainer", "command"), why)


def load_spec_text(text: str, source: str = "<spec>") -> LoadedSpec:
    return from_source(parse_yaml(text, source))
