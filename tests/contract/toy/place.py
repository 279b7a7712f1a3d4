"""The toy provider's registration (specs/places.py): the module that implements it and its own price catalog.

Its package's entry point (dsctl_toy_provider-0.1.dist-info/entry_points.txt, group dsctl.provisioners) names this
PLACE: a folder on the Python path holding that dist-info is an installed plugin, and `provider: toy` a place a spec
may name, in every dsctl process, with nothing of dsctl changed.
"""

from __future__ import annotations

from pathlib import Path

from dsctl.specs.places import Place

PLACE = Place(module="contract.toy.provider", pricing=str(Path(__file__).with_name("toy-prices.yaml")))
