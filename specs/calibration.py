"""Measured throughputs given by the user, to simulate a sweep without running anything.

    colocated: 0.55        # batches/s with the pipeline on the trainer
    ideal: 6.47            # batches/s when input never stalls
    points: {8: 0.30}      # workers: batches/s, measured elsewhere

`dsctl sweep JOB.yaml --workers 8..640 --simulate --calibration m1.yaml`
predicts every count from these numbers (the paper's M1 figures, here).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from .schema import Strict
from .validate import validate
from .yamlsource import read_yaml


class Calibration(Strict):
    colocated: float = Field(gt=0, description="batches/s of the colocated baseline")
    ideal: float = Field(gt=0, description="batches/s of the ideal baseline")
    points: dict[int, float] = Field(min_length=1, description="worker count: measured batches/s")
    source: str | None = Field(None, description="where the numbers come from")

    @field_validator("points")
    @classmethod
    def _positive(cls, v: dict[int, float]) -> dict[int, float]:
        bad = {n: r for n, r in v.items() if n < 1 or r <= 0}
        if bad:
            raise ValueError(f"worker counts must be at least 1 and rates greater than zero, got {bad}")
        return v


def load_calibration(path: str | Path) -> Calibration:
    return validate(Calibration, read_yaml(path))
