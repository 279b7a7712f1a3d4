"""The places a spec's `provider:` may name, each registered once: its name, the module that implements it, and the
price catalog its runs are priced from when the spec names none.

The providers shipped with dsctl are registered below (SHIPPED), one line each. A provider written elsewhere (a
plugin, a test's toy) registers itself with one entry point of its package, in the group `dsctl.provisioners`, naming
a Place; pip installing the package is all it takes, and nothing of dsctl changes:

    [project.entry-points."dsctl.provisioners"]
    toy = "toy_provider.place:PLACE"       # PLACE = Place(module="toy_provider.provider", pricing=".../toy.yaml")

The spec only checks the name (specs/schema.py) and fills in the default catalog; the module is imported where the
provider is used (provisioners/registry.py), never here, so loading a spec imports no provider.
"""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from functools import lru_cache

ENTRY_POINTS = "dsctl.provisioners"


@dataclass(frozen=True)
class Place:
    """A provider as a spec sees it: the module that implements it (importing it registers its class with
    provisioners/registry.py), the catalog (a shipped name, or a file's path) its runs are priced from by default, and,
    for one that finds runs by label, where its options that say where to look are."""

    module: str
    pricing: str
    # A provider that finds runs by label: where the options that say where to look are, "module:NAME" (a tuple of
    # provisioners.contract.LocateOption), read without importing the provider's module.
    locate: str | None = None
    # Its trainers start tf.data service workers inside their own processes (service.placement: hybrid).
    in_process_workers: bool = False
    # ... and change how many while they run, as the run's placement policy asks (service.placement: auto).
    adjusts_local_workers: bool = False


SHIPPED: dict[str, Place] = {
    # priced as the machines it stands for
    "local": Place("dsctl.provisioners.local", pricing="gcp-us-central1-2025", in_process_workers=True,
                   adjusts_local_workers=True),
    "gcp": Place("dsctl.provisioners.gcp.provider", pricing="gcp-us-central1-2025",
                 locate="dsctl.provisioners.gcp.locating:OPTIONS", in_process_workers=True),
}


def places() -> dict[str, Place]:
    """Every place a spec may name here: the shipped ones, then those the installed packages register (a plugin
    whose entry point cannot be loaded is left out: its provider is not available)."""
    return dict(_places(tuple(sys.path)))


@lru_cache(maxsize=8)
def _places(path: tuple[str, ...]) -> tuple[tuple[str, Place], ...]:
    """places(), for this sys.path (what is installed changes with it)."""
    found = dict(SHIPPED)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if entry.name in found:
            continue
        try:
            place = entry.load()
        except Exception:  # noqa: BLE001 - a plugin that cannot be imported is a provider that is not available
            continue
        if isinstance(place, Place):
            found[entry.name] = place
    return tuple(found.items())


def quoted(names: list[str]) -> str:
    """'local' or 'gcp'; 'local', 'gcp' or 'toy': the names as a choice is said."""
    shown = [f"'{n}'" for n in names]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
