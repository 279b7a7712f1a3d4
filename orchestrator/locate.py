"""Where a run is, when this machine may not have it: the options that locate runs (declared by the providers that
find runs by label, offered by `dsctl down`, `dsctl logs`, `dsctl runs show` and `dsctl check`), and a run supervised
on the cloud found by its local state or by its id there, its record brought up to date here.
"""

from __future__ import annotations

import importlib
from typing import cast

from dsctl.provisioners import Deployment, FindsByLabel, HandsOff, RunObjects, Where, get_provider, providers_with
from dsctl.provisioners.contract import LocateOption, LocateUse

__all__ = ["LocateOption", "LocateUse", "Where", "finder", "locate_options", "record_objects", "sync_record"]
from dsctl.specs import SpecError
from dsctl.specs.places import places

from . import cloudruns
from .deployments import find, handed_off
from .store import RunStore


def locate_options(use: LocateUse) -> list[LocateOption]:
    """The options that say where to look for `use`, as every provider that finds runs by label declares them (its
    registration says where: specs/places.py), one per name. Read without importing the providers themselves."""
    found: dict[str, LocateOption] = {}
    for place in places().values():
        if place.locate is None:
            continue
        module, _, name = place.locate.partition(":")
        for option in getattr(importlib.import_module(module), name):
            if use in option.uses:
                found.setdefault(option.name, option)
    return list(found.values())


def finder(where: Where) -> FindsByLabel | None:
    """The provider whose resources `where` (or the environment) names a place to look in, if any."""
    finders = cast("list[FindsByLabel]", providers_with(FindsByLabel))  # the providers that are FindsByLabel
    return next((p for p in finders if p.looks_there(where)), None)


def record_objects(run: str, where: Where) -> tuple[RunObjects | None, Deployment | None]:
    """Where a run supervised on the cloud publishes its record: from its local state (with it), or found by its id
    in `where` when this machine has none; (None, None) for any other run."""
    dep = find(run)
    if dep is not None and handed_off(dep):
        provider = get_provider(dep.provider)
        assert isinstance(provider, HandsOff)
        return provider.run_objects(dep), dep
    found = finder(where) if where.given else None
    return (found.run_objects_by_label(run, where), None) if found is not None else (None, None)


def sync_record(store: RunStore, run: str, where: Where) -> None:
    """A run supervised on the cloud: its record here brought up to date from what its supervisor published."""
    objects, dep = record_objects(run, where)
    if dep is not None:
        cloudruns.refresh(store, dep)
    elif objects is not None and cloudruns.sync(store, objects, run) is None:
        raise SpecError(f"run '{run}' has published no record where {where.said()} says; check those options.")
