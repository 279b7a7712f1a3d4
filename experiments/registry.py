"""The experiments by name, in the order the report lists them; each is imported only when asked for."""

from __future__ import annotations

import importlib
from types import ModuleType

from dsctl.specs import SpecError

# name -> module; the report lists them in this order.
REGISTRY = {
    "fig8": "dsctl.experiments.fig8",
    "fig9": "dsctl.experiments.fig9",
    "fig10": "dsctl.experiments.fig10",
    "fig11": "dsctl.experiments.fig11",
    "cachew-autoscale": "dsctl.experiments.cachew_autoscale",
    "cachew-autocache": "dsctl.experiments.cachew_autocache",
    "pecan": "dsctl.experiments.pecan",
}


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> ModuleType:
    if name not in REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise SpecError(f"no experiment named '{name}'.{hint} Experiments: {', '.join(REGISTRY)} "
                        "(`dsctl experiments list` describes them).", field="NAME")
    return importlib.import_module(REGISTRY[name])
