"""What a run creates besides its machines' vCPUs, memory and accelerators, priced: additions to the paper's Equation 1.

Equation 1 (equation.py) prices a job's machines. A place bills for more: Google Cloud for external IPv4 addresses
and boot disks, another place for what it has. Its provider declares what a run creates (provisioners/contract.py
Bill: its extras), each extra as charges this module prices from the catalog's `extras:` (catalog.py). Nothing here
knows a place: the provider says what, how many, and under which catalog entry; this module multiplies.

An extra is priced over the job's time t (Equation 1's): a charge held only while its machines run (an ephemeral
address, given back while its VM is stopped) for the machine-seconds they ran; any other for all of t (a disk bills
while its VM is stopped). Start-up and teardown are left out, as they are from Equation 1. The additions are shown
beside Equation 1's total, labelled so, never inside it: the paper's figures stay reproducible, and what the bill
will also say is in sight.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .catalog import Catalog, PriceSource

LABEL = "not in Equation 1"  # how every addition is labelled wherever it is shown


@dataclass(frozen=True)
class Charge:
    """One priced part of an extra: `per_machine` units (addresses, GB of disk) for each of `machines` machines of
    `role`, at the catalog's price of `extra` under `key` (extras: {extra: {key: ...}})."""

    extra: str  # the catalog's name of the extra: external_ipv4, boot_disks, scratch-volumes
    key: str  # the entry priced: standard | spot, pd-balanced, ...
    machines: int  # how many machines hold one (or the run itself: 1)
    per_machine: float = 1.0  # units each holds: 1 address, 50 GB of disk
    role: str = ""  # whose machines: dispatcher | workers | trainers ("": the run's own)
    while_running: bool = False  # billed only while its machines run (a stopped one holds none)
    price_unit: Literal["per_hour", "per_gb_month"] = "per_hour"  # how a catalog gives its price (for the hint)
    what: str = ""  # what a missing price is of, in words: "external IPv4 addresses on Spot VMs"
    source_label: str = ""  # what the price is, as its source names it: "external IPv4 (Spot VMs)"


@dataclass(frozen=True)
class Extra:
    """Something a run creates that bills besides its machines (Equation 1 leaves it out), as its provider declares
    it: how it is shown, and its charges."""

    key: str  # its key in JSON output: "external_ipv4"
    column: str  # its column in flat output (csv): "ipv4_cost"
    name: str  # as shown: "external IPv4"
    quantity: str  # "18 addresses", "none (gcp.public_ips: false)"
    count: int  # addresses, disks
    charges: tuple[Charge, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Addition:
    """One extra priced: its dollars per hour while everything runs, and over the job.

    per_hour / cost are None when the catalog has no price for a part of it (`unpriced` says why); cost is None too
    when the job's length is not known (a plan without one).
    """

    name: str
    quantity: str
    count: int
    per_hour: float | None
    cost: float | None
    unpriced: str | None = None
    sources: tuple[PriceSource, ...] = ()
    notes: tuple[str, ...] = ()
    key: str = ""
    column: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "label": LABEL, "quantity": self.quantity, "count": self.count,
                "per_hour": self.per_hour, "cost": self.cost, "unpriced": self.unpriced,
                "sources": [s.to_dict() for s in self.sources], "notes": list(self.notes)}


@dataclass(frozen=True)
class Additions:
    """Every extra of one run or plan, priced."""

    items: tuple[Addition, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def per_hour(self) -> float | None:
        """All of them per hour; None when any is unpriced."""
        return priced_sum(a.per_hour for a in self.items)

    @property
    def cost(self) -> float | None:
        """All of them over the job; None when any is unpriced or the job's length is unknown."""
        return priced_sum(a.cost for a in self.items)

    @property
    def sources(self) -> tuple[PriceSource, ...]:
        return tuple(s for a in self.items for s in a.sources)

    def get(self, key: str) -> Addition | None:
        """The addition of the extra with this key (external_ipv4), if the run has it."""
        return next((a for a in self.items if a.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {"label": LABEL, **{a.key: a.to_dict() for a in self.items}, "per_hour": self.per_hour,
                "cost": self.cost, "notes": list(self.notes)}


def priced_sum(values: Iterable[float | None]) -> float | None:
    """The sum of prices, or None when any of them is unpriced (a part missing makes the total unknown)."""
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def price_extra(extra: Extra, catalog: Catalog, job_time_s: float | None = None,
                stopped_s: dict[str, float] | None = None) -> Addition:
    """One extra's dollars per hour and, when job_time_s is given, over the job. stopped_s: machine-seconds each
    role's machines spent stopped (a charge held while they run is not billed meanwhile)."""
    stopped_s = stopped_s or {}
    per_hour, cost, sources, missing = 0.0, 0.0, [], []
    for c in extra.charges:
        rate = catalog.extra_rate(c.extra, c.key)
        if rate is None:
            missing.append(c)
            continue
        source = PriceSource(c.source_label or f"{c.extra} {c.key}", rate.source, rate.date)
        if source not in sources:
            sources.append(source)
        per_hour += c.machines * c.per_machine * rate.per_hour
        if job_time_s is not None:
            machine_s = c.machines * job_time_s
            if c.while_running:
                machine_s = max(machine_s - min(stopped_s.get(c.role, 0.0), machine_s), 0.0)
            cost += machine_s / 3600.0 * c.per_machine * rate.per_hour
    at = {"key": extra.key, "column": extra.column}
    if missing:
        return Addition(extra.name, extra.quantity, extra.count, None, None, _unpriced(missing, catalog),
                        tuple(sources), extra.notes, **at)
    return Addition(extra.name, extra.quantity, extra.count, per_hour, cost if job_time_s is not None else None,
                    None, tuple(sources), extra.notes, **at)


def _unpriced(missing: list[Charge], catalog: Catalog) -> str:
    """Why an extra is not priced: the entries the catalog lacks, what it has, and what to add to a copy of it."""
    whats = list(dict.fromkeys(c.what or f"{c.extra} {c.key}" for c in missing))
    first = missing[0]
    have = ", ".join(catalog.extra_keys(first.extra)) or "none"
    entry = f"{first.extra}: {{{first.key}: {{{first.price_unit}: ..., source: ..., date: ...}}}}"
    return (f"catalog {catalog.name} has no price for {' or '.join(whats)} (it prices: {have}; add '{entry}' to a "
            "copy of it)")


def price_extras(extras: Iterable[Extra], catalog: Catalog, job_time_s: float | None = None,
                 stopped_s: dict[str, float] | None = None) -> Additions:
    """Every extra a run creates, per hour and (when job_time_s is given) over the job."""
    return Additions(tuple(price_extra(e, catalog, job_time_s, stopped_s) for e in extras))
