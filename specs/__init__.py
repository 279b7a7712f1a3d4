"""Job specs: the YAML schema, loading with file:line errors, and the examples users start from."""

from .errors import SpecError, UsageError
from .loaded import LoadedSpec
from .loader import load_spec, load_spec_text, spec_hash
from .schema import JobSpec

__all__ = ["JobSpec", "LoadedSpec", "SpecError", "UsageError", "load_spec", "load_spec_text", "spec_hash"]
