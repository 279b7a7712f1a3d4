"""Worker-scaling policies: pure objects the orchestrator feeds metrics windows, one decision each.

`cachew` watches the trainers (batch time, input stall, queue fill); `cpu` is the Kubernetes
HPA baseline on worker CPU. `simulate` closes the loop against a synthetic job for tests and
experiments.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, get_args

from dsctl.specs.schema import AutoscalePolicy

from .base import Decision, Limits, Measurement, Observation, Policy, ReadsQueue, ScalingPolicy, summarize
from .cachew import CachewConfig, CachewPolicy
from .cpu import CpuConfig, CpuUtilizationPolicy, hpa_desired

# Each policy by the name a spec (autoscale.policy) and --autoscale give it: the module of that name in this folder,
# whose POLICY says its class and its settings' model. A new policy is a module here and its name in
# specs/schema.py AutoscalePolicy.
POLICIES: dict[str, Policy] = {name: importlib.import_module(f".{name}", __name__).POLICY
                               for name in get_args(AutoscalePolicy)}


def make_policy(name: str, config: Mapping[str, Any] | None = None) -> ScalingPolicy:
    """A fresh policy by its spec/CLI name; unknown names and config keys are errors."""
    if name not in POLICIES:
        raise ValueError(f"unknown autoscale policy {name!r}: choose one of {', '.join(POLICIES)}")
    policy = POLICIES[name]
    return policy.make(policy.settings.model_validate(dict(config or {})))


__all__ = [
    "CachewConfig", "CachewPolicy", "CpuConfig", "CpuUtilizationPolicy", "Decision", "Limits",
    "Measurement", "Observation", "POLICIES", "Policy", "ReadsQueue", "ScalingPolicy", "hpa_desired", "make_policy", "summarize",
]
