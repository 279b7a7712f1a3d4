"""`autocache:` in a job spec: let dsctl decide where (or whether) to cache the pipeline (Cachew §4.4).

A field of its own file so the schema stays readable; the trainer reads `mode` from the spec
JSON it is given, which is how the orchestrator's decision reaches the dataset graph.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

HINT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
BUILTIN_HINTS = {"synthetic": ("source", "full"), "images": ("source", "decoded"), "text": ("source", "parsed")}


class AutocacheSpec(BaseModel):
    """Cache the pipeline at one of its autocache hints, or compute it, whichever is projected fastest."""

    # As schema.Strict (not imported: schema.py imports this file): unknown keys are errors.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    mode: str = Field("auto", description="auto: profile, then decide; compute: never cache; or a hint's name: "
                                          "cache there without profiling")
    cache_dir: str | None = Field(None, description="where caches live: a local folder or gs://bucket/path; "
                                                       "default DSCTL_HOME/autocache")
    storage: Literal["local-disk", "persistent-disk", "gcs"] | None = Field(
        None, description="what the cache is stored on, for its price; default gcs for gs://, else local-disk")
    profile_elements: int = Field(256, ge=16, le=10**6, description="elements measured per hint and at the end")
    profile_s: float = Field(3.0, gt=0, le=600, description="at most this long per measured point")
    tolerance: float = Field(0.05, ge=0, le=1, description="options projected within this fraction of the fastest "
                                                           "count as equally fast; the cheapest storage wins")

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v in ("auto", "compute", "profile") or HINT_RE.match(v):
            return v
        raise ValueError(f"mode must be auto, compute or a hint's name (letters, digits, '-', '_'), got {v!r}")

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(ord(c) < 32 for c in v)):
            raise ValueError(f"cache_dir must be a folder path or gs://bucket/path, got {v!r}")
        return v

    def storage_kind(self) -> str:
        if self.storage:
            return self.storage
        return "gcs" if (self.cache_dir or "").startswith("gs://") else "local-disk"
