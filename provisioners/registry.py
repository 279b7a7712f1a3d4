"""The providers dsctl knows, by the name a spec gives them (`provider: local`).

Each is registered once (specs/places.py: the shipped ones there, a plugin's by its package's entry point), with the
module that implements it; that module is imported on first use (importing Google Cloud's costs a tenth of a second,
and local runs never need it), and registers its class here (`register`, a class decorator). A provider class
registered in this process alone (a test's) is known here too, but a spec names only the registered places.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from dsctl.specs.places import places

from .state import Deployment, StateCodec

if TYPE_CHECKING:
    from .contract import Provider

_CLASSES: dict[str, type[Provider]] = {}
P = TypeVar("P", bound="type[Provider]")


def register(cls: P) -> P:
    """Make a provider class known by its `name` (usable as a class decorator)."""
    _CLASSES[cls.name] = cls
    return cls


def provider_class(name: str) -> type[Provider] | None:
    if name not in _CLASSES:
        place = places().get(name)
        if place is not None:
            importlib.import_module(place.module)
    return _CLASSES.get(name)


def get_provider(name: str) -> Provider:
    cls = provider_class(name)
    if cls is None:
        from dsctl.specs import SpecError

        raise SpecError(f"provider '{name}' is not available in this version of dsctl; use one of "
                        f"{', '.join(names())}.", field="provider")
    return cls()


def codec_of(name: str) -> StateCodec | None:
    """How the named provider's state is read back; None for a provider this dsctl does not have."""
    cls = provider_class(name)
    return cls.codec if cls is not None else None


def load_deployment(run_dir: str | Path) -> Deployment:
    """The deployment in `run_dir`'s state file, its provider's own state typed by that provider's codec (and a state
    file written before the typed state converted by it): what `dsctl down` in a new process reads."""
    return Deployment.load(run_dir, codec_of)


def names() -> list[str]:
    return sorted(set(places()) | set(_CLASSES))


def providers_with(capability: type) -> list[Provider]:
    """An instance of every known provider that has `capability` (a protocol of contract.py)."""
    found = []
    for name in names():
        provider = get_provider(name)
        if isinstance(provider, capability):
            found.append(provider)
    return found
