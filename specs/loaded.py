"""A validated spec and the file it came from: what every later check needs to point at a line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError
from .schema import JobSpec
from .yamlsource import YamlSource


@dataclass
class LoadedSpec:
    """A validated spec plus where it came from (for errors found later, e.g. by the runtime). The entrypoint check
    (orchestrator/preflight.py) adds `pipeline_cardinality`, the length of the dataset an entrypoint pipeline
    returned (tf.data's: -1 infinite, -2 unknown); `warnings` are what a run of it should be told, each pointing at
    its line as an error would."""

    spec: JobSpec
    source: YamlSource
    pipeline_cardinality: int | None = None
    warnings: list[SpecError] = field(default_factory=list)

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
