"""Load a job spec from YAML: parse, validate fields, validate pipeline params, apply rules. Nothing of the
user's code runs here: its entrypoints (checked in a contained child process), its price catalog and its
command, which need containment, the cost model and the provider, are checked above this package:
orchestrator/preflight.py load_job."""

from __future__ import annotations

import hashlib
import json
import os

from .errors import Problems, SpecError
from .loaded import LoadedSpec
from .pipelines import PARAMS_BY_BUILTIN
from .rules import check_rules
from .schema import JobSpec
from .validate import validate
from .yamlsource import YamlSource, parse_yaml, read_yaml


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
    spec = validate(JobSpec, src)  # every problem of the schema; nothing below can be checked without it
    problems = Problems()
    if spec.pipeline.builtin is not None:
        params_model = PARAMS_BY_BUILTIN[spec.pipeline.builtin]
        with problems.check():
            params = validate(params_model, src, spec.pipeline.params, prefix=("pipeline", "params"))
            spec.pipeline.params = params.model_dump(mode="json")
    with problems.check():
        check_rules(spec, src)
    problems.raise_any()
    return LoadedSpec(spec=spec, source=src)


def load_spec(path: str | os.PathLike[str], *, check_entrypoints: bool = False) -> LoadedSpec:
    """Read, validate and return a job spec; every problem is a SpecError naming file:line.

    It runs none of the user's code. The entrypoint check (entrypoints.py: the user's modules imported, and a
    pipeline function called, in a child process with a time limit) is made by
    dsctl.orchestrator.preflight.load_job, which ends that child and all it started with a cgroup of its own; this
    package cannot make one. `check_entrypoints` is accepted for callers written when the check was made here:
    False, or a TypeError that says where the check is.
    """
    if check_entrypoints:
        raise TypeError("specs.load_spec no longer checks entrypoints (it cannot contain the user's code); "
                        "use dsctl.orchestrator.preflight.load_job")
    return from_source(read_yaml(path))


def load_spec_text(text: str, source: str = "<spec>") -> LoadedSpec:
    return from_source(parse_yaml(text, source))
