"""Each step of a reorderable section run alone on one sample of the section's input (AutoOrder's profile).

Pecan's AutoOrder ranks transformations by bytes produced ÷ bytes consumed. Inside a running pipeline a
step's bytes depend on the steps before it (a filter after an upscale sees bigger elements), so each step
is measured on the same sample: the section's input, read once into memory (`take(n).cache()`), then
passed through that step alone, a few times (the fastest kept: a shared machine's bursts stay out). A step
that cannot take the section's input elements (it needs another step first) is reported as such.
"""

from __future__ import annotations

import time

from ..autocache_profile import element_bytes
from ..reorder import Section
from .record import StepMeasure

SAMPLE_ELEMENTS = 256
FILL_LIMIT_S = 10.0  # reading the sample stops here, with what it has
ROUNDS = 3


def _sample(section: Section, elements: int):
    """The section's input, up to `elements` of it (fewer if reading them passes FILL_LIMIT_S), in memory."""
    start = time.monotonic()
    count = 0
    for _ in section.input.take(elements):
        count += 1
        if time.monotonic() - start > FILL_LIMIT_S:
            break
    sample = section.input.take(max(count, 1)).cache()
    size = sum(element_bytes(e)[1] for e in sample)  # fills the cache, and counts its bytes
    return sample, count, size


def measure_steps(section: Section, elements: int = SAMPLE_ELEMENTS) -> tuple[list[StepMeasure], list[str]]:
    """(each step's measure, the steps that cannot run first: their reasons)."""
    sample, count, size = _sample(section, elements)
    out, refused = [], []
    for name in section.written:
        try:
            ds = section.steps[name](sample)
        except Exception as exc:  # noqa: BLE001 - a step that needs another first
            refused.append(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
            continue
        produced = produced_bytes = 0
        for element in ds:  # counted apart: converting elements to count bytes is not the step's CPU
            produced += 1
            produced_bytes += element_bytes(element)[1]
        cpu = None
        for _ in range(ROUNDS):
            cpu0 = time.process_time()
            for _element in ds:
                pass
            spent = time.process_time() - cpu0
            cpu = spent if cpu is None else min(cpu, spent)
        out.append(StepMeasure(section=section.name, step=name, elements_in=count, elements_out=produced,
                               bytes_in=size, bytes_out=produced_bytes, cpu_s=cpu or 0.0))
    return out, refused
