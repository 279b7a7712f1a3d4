"""A validated spec and the file it came from: what every later check needs to point at a line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import SpecError
from .schema import JobSpec
from .yamlsource import YamlSource


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
