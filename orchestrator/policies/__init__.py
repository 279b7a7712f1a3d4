"""Worker-scaling policies: pure objects the orchestrator feeds metrics windows, one decision each.

`cachew` watches the trainers (batch time, input stall, queue fill); `cpu` is the Kubernetes
HPA baseline on worker CPU. `simulate` closes the loop against a synthetic job for tests and
experiments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .base import Decision, Limits, Measurement, Observation, ScalingPolicy, summarize
from .cachew import CachewConfig, CachewPolicy
from .cpu import CpuConfig, CpuUtilizationPolicy, hpa_desired

# Each policy by its name: the class, made with its config, and the config's model.
POLICIES: dict[str, tuple[Callable[[Any], ScalingPolicy], type[Limits]]] = {
    "cachew": (CachewPolicy, CachewConfig), "cpu": (CpuUtilizationPolicy, CpuConfig)}


def make_policy(name: str, config: Mapping[str, Any] | None = None) -> ScalingPolicy:
    """A fresh policy by its spec/CLI name; unknown names and config keys are errors."""
    if name not in POLICIES:
        raise ValueError(f"unknown autoscale policy {name!r}: choose one of {', '.join(POLICIES)}")
    cls, cfg = POLICIES[name]
    return cls(cfg.model_validate(dict(config or {})))


__all__ = [
    "CachewConfig", "CachewPolicy", "CpuConfig", "CpuUtilizationPolicy", "Decision", "Limits",
    "Measurement", "Observation", "POLICIES", "ScalingPolicy", "hpa_desired", "make_policy", "summarize",
]
