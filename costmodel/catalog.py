"""Price catalogs: a YAML schema, loading with file:line errors, and the prices of machines.

A catalog gives prices two ways, because that is how clouds publish them:
  rates:    per-resource rates by machine family or series ($ per vCPU-hour, per
            GB-hour, per accelerator-hour), e.g. Compute Engine's N2 and A2 rates;
  machines: whole-machine prices ($ per hour), e.g. a TPU VM, whose price includes
            its host, or "an n2-standard-8 costs $0.39/h".

And for two provisioning models, because a machine's price depends on how it is bought:
the top-level `rates` and `machines` are on-demand prices (provisioning `standard`),
and an optional `spot:` section holds Spot prices with the same structure
(`spot: {rates: {...}, machines: {...}}`). Every lookup names the model it prices
(`provisioning="standard"` or `"spot"`), and a machine with no price for that model is
an error saying which model the catalog does have: never a silent fallback to the
other model (a Spot price for an on-demand VM under-prices it several times over).

The utilization basis needs per-resource rates for workers and the dispatcher (it
charges what they used); everything else can be priced from either form. When a
machine has both, the whole-machine price wins and the rates only split it into
host CPU, host memory and accelerators; the two must agree within 1% (or, for an
accelerator VM, the host at those rates must not cost more than the machine).
Within one model only: Spot rates split Spot machine prices, on-demand rates on-demand ones.
An accelerator VM priced only whole (a TPU VM) is reported under accelerators with
its host included, which is how Google sells it; trainers cost the same on both
bases either way, since Equation 1 charges trainer hosts on everything they have.

Where each price comes from. The catalog's `source` and `date` cover its prices as a whole,
but Spot prices move (Google may change them daily) and TPU prices were the least certain,
so every Spot price and every TPU price carries its own source and date beside it, and a
catalog that leaves one out is refused when it loads (`check_sources`):
    machines:  {tpu-v2-8: {per_hour: 4.50, source: "...", date: 2025-03}}
    spot:      {rates: {n2: {vcpu_hour: ..., gb_hour: ..., source: "...", date: 2025-03-06}}}
A figure nobody could check says so in its source ("not re-checked: <why>") rather than
pretending to a source. Plain numbers remain fine for other on-demand prices, which the
catalog's own source and date describe. `Catalog.source_of()` answers where a machine's
price comes from, for `dsctl cost` and the plan to show.

What a run creates besides its machines, which Equation 1 leaves out (a provider declares it:
addresses, disks, anything else that bills; costmodel/extras.py adds it up), is priced here too,
under `extras:`, by the extra's name and a key the provider gives (how the VM is bought, the
disk's type), each entry with its source and date and a price per unit-hour or per unit-month:
    extras:    {scratch-volumes: {ssd: {per_gb_month: 0.17, source: "...", date: 2026-01}}}
Catalogs written before `extras:` give Google Cloud's two under names of their own, read as
extras of those names: `external_ipv4` ($ per hour per in-use address, by the VM's provisioning
model) and `boot_disks` ($ per GB-month, by disk type).

A catalog may price machine types the cost model does not know (another place's): their shapes
(vCPUs, memory, accelerators) go under `shapes:`, and its prices then name them as any other.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, RootModel, field_validator, model_validator

from dsctl.specs.errors import SpecError
from dsctl.specs.validate import validate
from dsctl.specs.yamlsource import YamlSource, read_yaml

from .equation import Rates
from .machines import FAMILIES, MACHINES, MachineShape, known_list, shape
from .provisioning import PROVISIONING, PROVISIONING_LABEL, check_provisioning
from .storage import HOURS_PER_MONTH

CATALOG_DIR = Path(__file__).parent / "catalogs"
AGREEMENT = 0.01  # whole-machine price vs family rates: relative tolerance

_SECTION = {"standard": "the top-level rates and machines", "spot": "the spot section"}


def _date_text(v) -> str:
    """A price's date as written: YYYY-MM or YYYY-MM-DD (YAML reads 2025-03-06 as a date; it is kept as text)."""
    if isinstance(v, (datetime.date, datetime.datetime)):
        v = v.isoformat()[:10]
    if not isinstance(v, str) or not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", v):
        raise ValueError(f"date must look like 2023-06 or 2023-06-30, got {v!r}")
    return v


DateText = Annotated[str, BeforeValidator(_date_text)]


def _price(v: float) -> float:
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"a price must be a number of dollars per hour, zero or more; got {v}")
    return v


Price = Annotated[float, AfterValidator(_price)]


class _Strict(BaseModel):
    """Unknown keys are errors: a misspelt price must not silently become 'no price'."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FamilyRates(_Strict):
    vcpu_hour: Price | None = Field(None, description="$ per vCPU-hour (C_CPU)")
    gb_hour: Price | None = Field(None, description="$ per GB-hour of memory (C_MEM)")
    accelerator_hour: Price | None = Field(None, description="$ per accelerator-hour (C_ACC)")
    source: str | None = Field(None, min_length=1, description="where these rates come from (required for Spot rates)")
    date: DateText | None = Field(None, description="when they were valid: YYYY-MM or YYYY-MM-DD")


class EntrySource(_Strict):
    """Where one price comes from and when it was valid."""

    source: str = Field(min_length=1, description="the page, bill or data the figure is from; or 'not re-checked: <why>'")
    date: DateText = Field(description="when the figure was valid: YYYY-MM or YYYY-MM-DD")


class MachinePrice(EntrySource):
    """A whole-machine price with its source and date: `tpu-v2-8: {per_hour: 4.50, source: ..., date: 2025-03}`."""

    per_hour: Price = Field(description="$ per hour for the whole machine")


class _PlainPrice(RootModel[Price]):
    """A whole-machine price written as a bare number (validated alone, for its own file:line error)."""


def _sourced_machines(data):
    """`machines` entries written as {per_hour, source, date} become the bare price, their source and date
    going to `machine_sources`, so every lookup reads `machines[name]` as a number."""
    if not isinstance(data, dict) or not isinstance(data.get("machines"), dict):
        return data
    machines, sources = {}, dict(data.get("machine_sources") or {})
    for name, entry in data["machines"].items():
        if isinstance(entry, dict):
            machines[name] = entry.get("per_hour")
            sources[name] = {k: entry[k] for k in ("source", "date") if k in entry}
        else:
            machines[name] = entry
    return {**data, "machines": machines, "machine_sources": sources}


class PriceList(_Strict):
    """The prices of one provisioning model: per-resource rates and whole-machine prices."""

    rates: dict[str, FamilyRates] = Field(default_factory=dict)
    machines: dict[str, Price] = Field(default_factory=dict)
    machine_sources: dict[str, EntrySource] = Field(
        default_factory=dict, description="filled from machines written as {per_hour, source, date}")

    @model_validator(mode="before")
    @classmethod
    def _split_sources(cls, data):
        return _sourced_machines(data)


class IpPrice(EntrySource):
    per_hour: Price = Field(description="$ per hour for one in-use external IPv4 address")


class DiskPrice(EntrySource):
    per_gb_month: Price = Field(description="$ per GB-month of disk (Google turns it into hours at 730 h a month)")


class ExtraPrice(EntrySource):
    """The price of one unit of an extra (an address, a GB of disk): per hour, or per month (730 hours)."""

    per_hour: Price | None = Field(None, description="$ per hour per unit")
    per_gb_month: Price | None = Field(None, description="$ per month per unit (a GB of disk), 730 hours a month")

    @model_validator(mode="after")
    def _one_price(self) -> ExtraPrice:
        if (self.per_hour is None) == (self.per_gb_month is None):
            raise ValueError("give the price as per_hour or as per_gb_month (one of them)")
        return self


class ShapeEntry(_Strict):
    """The shape of a machine type the cost model does not know (another place's), for the catalog that prices it."""

    vcpus: int = Field(ge=0, le=4096)
    memory_gb: float = Field(ge=0, le=65_536)
    accelerators: int = Field(0, ge=0, le=64)
    accelerator_type: str | None = Field(None, min_length=1)
    family: str = Field(min_length=1, description="the name its per-resource rates are given under")


class CatalogFile(PriceList):
    """A catalog file: its own rates, machines and their sources (a PriceList) are the on-demand prices."""

    name: str = Field(min_length=1)
    date: str = Field(description="when the prices were valid: YYYY-MM or YYYY-MM-DD")
    source: str = Field(min_length=1, description="where the numbers come from")
    currency: str
    region: str | None = None
    spot: PriceList | None = Field(None, description="Spot prices: rates and machines, as at the top level")
    storage: dict[Literal["local-disk", "persistent-disk", "gcs"], Price] = Field(
        default_factory=dict, description="$ per GB-month of cache storage, per storage kind (autocache)")
    # What a run creates besides its machines (not in Equation 1), as its provider declares it: costmodel/extras.py.
    extras: dict[str, dict[str, ExtraPrice]] = Field(
        default_factory=dict, description="$ per unit of each extra a run creates, by the extra's name and key")
    external_ipv4: dict[Literal["standard", "spot"], IpPrice] = Field(
        default_factory=dict, description="$ per hour per in-use external IPv4 address, by the VM's provisioning model "
                                          "(the extra external_ipv4, as catalogs gave it before extras:)")
    boot_disks: dict[str, DiskPrice] = Field(
        default_factory=dict, description="$ per GB-month of a VM's boot disk, by disk type (pd-balanced, ...; the "
                                          "extra boot_disks, as catalogs gave it before extras:)")
    shapes: dict[str, ShapeEntry] = Field(
        default_factory=dict, description="the shapes of machine types the cost model does not know, priced here")

    @field_validator("date", mode="before")
    @classmethod
    def _date(cls, v):
        return _date_text(v)

    @field_validator("currency")
    @classmethod
    def _usd(cls, v: str) -> str:
        if v != "USD":
            raise ValueError(f"only USD catalogs are supported, got {v!r}; convert the prices to USD")
        return v

    def prices(self, provisioning: str) -> PriceList:
        """The price list of one provisioning model (empty when the catalog has none)."""
        if provisioning == "spot":
            return self.spot or PriceList()
        return PriceList(rates=self.rates, machines=self.machines, machine_sources=self.machine_sources)

    def all_extras(self) -> dict[str, dict[str, ExtraPrice]]:
        """Every extra the catalog prices, by name and key: `extras:`, and the two it may give under names of their
        own (external_ipv4, boot_disks)."""
        named: dict[str, dict[str, ExtraPrice]] = {
            "external_ipv4": {k: ExtraPrice(per_hour=v.per_hour, source=v.source, date=v.date)
                              for k, v in self.external_ipv4.items()},
            "boot_disks": {k: ExtraPrice(per_gb_month=v.per_gb_month, source=v.source, date=v.date)
                           for k, v in self.boot_disks.items()}}
        return {**{k: v for k, v in named.items() if v}, **self.extras}

    def own_shapes(self) -> dict[str, MachineShape]:
        return {name: MachineShape(name, s.vcpus, s.memory_gb, s.accelerators, s.accelerator_type, s.family, s.family)
                for name, s in self.shapes.items()}


@dataclass(frozen=True)
class PriceSource:
    """Where one of a catalog's prices comes from: `what` is priced (e.g. "tpu-v2-8 (Spot)"), the source and
    the date beside it in the catalog; own False when the entry has none and the catalog's own are given."""

    what: str
    source: str
    date: str
    own: bool = True

    @property
    def rechecked(self) -> bool:
        """False for a figure its catalog says was not re-checked."""
        return not self.source.lower().startswith("not re-checked")

    def text(self) -> str:
        return f"{self.what}: {self.source} ({self.date})"

    def to_dict(self) -> dict:
        return {"price": self.what, "source": self.source, "date": self.date}


@dataclass(frozen=True)
class ExtraRate:
    """What one unit of an extra costs per hour (a per-month price turned into hours as clouds do: 730 a month),
    with where the price comes from."""

    per_hour: float
    source: str
    date: str


@dataclass(frozen=True)
class MachineSplit:
    """One machine's hourly price split into host CPU, host memory and accelerators."""

    cpu: float
    memory: float
    accelerators: float
    whole: bool = False  # priced only as a whole machine: the split is not known

    @property
    def total(self) -> float:
        return self.cpu + self.memory + self.accelerators


_RESOURCE = {
    "vcpu_hour": "vCPU (vCPU-hour)",
    "gb_hour": "memory (GB-hour)",
    "accelerator_hour": "accelerators (accelerator-hour)",
}


def _usd_hour(v: float) -> str:
    return f"${v:,.2f}/h" if v >= 1 or round(v, 2) == v else f"${v:.4g}/h"


def _role_hint(other: str) -> str:
    return (f"set service.provisioning: {other} (dispatcher and workers) or trainer.provisioning: {other} "
            f"(trainers) to price it as {'a Spot VM' if other == 'spot' else 'an on-demand VM'}")


class ProvisioningError(SpecError):
    """A machine the catalog prices, but not for the provisioning model asked for.

    `for_field()` names the spec field to change once the caller knows which part of
    the job the machine is (service.provisioning or trainer.provisioning).
    """

    def __init__(self, *, catalog: str, machine: str, asked: str, hourly: float, needed_by: str = "",
                 alternatives: tuple[str, ...] = (), field_hint: str | None = None):
        self.catalog, self.machine, self.asked, self.hourly = catalog, machine, asked, hourly
        self.needed_by, self.alternatives, self.field_hint = needed_by, alternatives, field_hint
        self.available = "spot" if asked == "standard" else "standard"
        super().__init__(self._text())

    def for_field(self, field: str, what: str) -> ProvisioningError:
        """The same error, telling users to set `field` (e.g. service.provisioning) to price `what` differently."""
        other = self.available
        hint = (f"set {field}: {other} to price {what} as "
                f"{'Spot VMs' if other == 'spot' else 'on-demand VMs'}")
        return ProvisioningError(catalog=self.catalog, machine=self.machine, asked=self.asked, hourly=self.hourly,
                                 needed_by=self.needed_by, alternatives=self.alternatives, field_hint=hint)

    def _text(self) -> str:
        have, want = PROVISIONING_LABEL[self.available], PROVISIONING_LABEL[self.asked]
        article = "a" if self.available == "spot" else "an"
        why = f", needed {self.needed_by}" if self.needed_by else ""
        hint = self.field_hint or _role_hint(self.available)
        if self.alternatives:
            names = " or ".join(self.alternatives)
            alt = f"or use pricing: {names} (--prices {self.alternatives[0]}) for {want} prices of it"
        else:
            where = "'spot: {machines: {" + self.machine + ": ...}}'" if self.asked == "spot" \
                else "'machines: {" + self.machine + ": ...}'"
            alt = f"or give a catalog (pricing: FILE) with {want} prices for it, e.g. {where}"
        return (f"catalog {self.catalog} has only {article} {have} price for {self.machine} "
                f"({_usd_hour(self.hourly)}), not the {want} price (provisioning: {self.asked}) asked for{why}: "
                f"{hint}, {alt}. A price for one provisioning model is never used for the other.")


class Catalog:
    """A validated catalog; answers 'what does this machine cost, bought this way' for the cost model."""

    def __init__(self, data: CatalogFile, path: str):
        self.data = data
        self.path = path
        self._lists = {p: data.prices(p) for p in PROVISIONING}
        self._extras = data.all_extras()
        self.shapes: dict[str, MachineShape] = {**MACHINES, **data.own_shapes()}  # every machine type it can price

    name = property(lambda self: self.data.name)
    date = property(lambda self: self.data.date)
    source = property(lambda self: self.data.source)
    currency = property(lambda self: self.data.currency)
    region = property(lambda self: self.data.region)

    def __repr__(self) -> str:
        return f"Catalog({self.name!r}, date={self.date!r}, path={self.path!r})"

    def source_of(self, name: str, provisioning: str = "standard") -> PriceSource:
        """Where the price of machine `name` for this provisioning model comes from: its own source and date when
        the catalog gives one (every Spot and TPU price has one), else the catalog's. The whole-machine price wins
        over the family rates, as in split()."""
        check_provisioning(provisioning)
        m = self.machine(name)
        p = self.prices(provisioning)
        label = PROVISIONING_LABEL[provisioning]
        own: EntrySource | None
        if name in p.machines:
            own = p.machine_sources.get(name)
            what = f"{name} ({label})"
        else:
            fam = m.series if m.series in p.rates else m.family
            rates = p.rates.get(fam)
            what = f"{fam} {label} rates"
            own = EntrySource(source=rates.source, date=rates.date) if rates and rates.source and rates.date else None
        if own is None:
            return PriceSource(what, self.source, self.date, own=False)
        return PriceSource(what, own.source, own.date)

    def extra_rate(self, extra: str, key: str) -> ExtraRate | None:
        """$ per hour of one unit of `extra` under `key` (e.g. external_ipv4 / spot: an address on a Spot VM), with
        its source; None when the catalog has no such price."""
        entry = self._extras.get(extra, {}).get(key)
        if entry is None:
            return None
        per_hour = entry.per_hour if entry.per_hour is not None else (entry.per_gb_month or 0.0) / HOURS_PER_MONTH
        return ExtraRate(per_hour, entry.source, entry.date)

    def extra_keys(self, extra: str) -> list[str]:
        """The keys the catalog prices `extra` under (sorted)."""
        return sorted(self._extras.get(extra, {}))

    def storage_price(self, kind: str) -> float | None:
        """$ per GB-month of cache storage of this kind, None when the catalog has no price for it."""
        return next((price for name, price in self.data.storage.items() if name == kind), None)

    def storage_gb_month(self, kind: str) -> float:
        """$ per GB-month of cache storage of this kind; an error naming the kinds the catalog prices."""
        if kind not in self.data.storage:
            have = ", ".join(self.data.storage) or "none"
            raise SpecError(f"price catalog {self.name} ({self.path}) has no price for {kind} storage (it prices: "
                            f"{have}); add 'storage: {{{kind}: DOLLARS_PER_GB_MONTH}}' to a copy of it")
        return self.data.storage[kind]

    @property
    def provisioning_models(self) -> tuple[str, ...]:
        """The provisioning models this catalog has any price for."""
        return tuple(p for p in PROVISIONING if self.prices(p).rates or self.prices(p).machines)

    def prices(self, provisioning: str = "standard") -> PriceList:
        """The rates and whole-machine prices of one provisioning model."""
        return self._lists[check_provisioning(provisioning)]

    def machine(self, name: str) -> MachineShape:
        """The shape of a machine type: the cost model's, or one this catalog gives (unknown → SpecError listing the
        known types, closest first)."""
        if name in self.shapes:
            return self.shapes[name]
        return shape(name) if not self.data.shapes else _unknown(name, self.shapes)

    def rates_for(self, m: MachineShape, provisioning: str = "standard") -> FamilyRates | None:
        """Rates for the machine's series if the catalog has them (for this model), else for its family."""
        rates = self.prices(provisioning).rates
        return rates.get(m.series) or rates.get(m.family)

    def split(self, name: str, *, provisioning: str = "standard", needed_by: str = "") -> MachineSplit:
        """The machine's $/h for this provisioning model, split into host CPU, host memory and accelerators."""
        check_provisioning(provisioning)
        m = self.machine(name)
        try:
            return self._split(m, provisioning, needed_by)
        except SpecError as exc:
            raise self._only_other(m, provisioning, needed_by) or exc from None

    def machine_hour(self, name: str, *, provisioning: str = "standard", needed_by: str = "") -> float:
        """Whole-machine $ per hour for this provisioning model."""
        return self.split(name, provisioning=provisioning, needed_by=needed_by).total

    def unit_rates(self, name: str, *, provisioning: str = "standard", needed_by: str = "") -> Rates:
        """C_CPU, C_MEM, C_ACC for this machine and model; needs per-resource rates for its family."""
        check_provisioning(provisioning)
        m = self.machine(name)
        r = self.rates_for(m, provisioning)
        for key in ("vcpu_hour", "gb_hour"):
            if r is None or getattr(r, key) is None:
                self.split(name, provisioning=provisioning, needed_by=needed_by)  # not priced at all: says so
                raise self._missing(key, m, provisioning, needed_by, whole_ok=False)
        s = self.split(name, provisioning=provisioning, needed_by=needed_by)
        return Rates(
            cpu=s.cpu / m.vcpus if m.vcpus else 0.0,
            mem=s.memory / m.memory_gb if m.memory_gb else 0.0,
            acc=s.accelerators / m.accelerators if m.accelerators else 0.0,
        )

    def priced_machines(self, provisioning: str = "standard") -> list[str]:
        """Every known machine type this catalog can price for this provisioning model."""
        check_provisioning(provisioning)
        out = []
        for name in self.shapes:
            try:
                self._split(self.shapes[name], provisioning)
            except SpecError:
                continue
            out.append(name)
        return out

    def _split(self, m: MachineShape, provisioning: str, needed_by: str = "") -> MachineSplit:
        """split() for one model only; a missing price is the plain 'no price for ...' error."""
        r = self.rates_for(m, provisioning)
        price = self.prices(provisioning).machines.get(m.name)
        if price is None:
            need = [("vcpu_hour", m.vcpus), ("gb_hour", m.memory_gb), ("accelerator_hour", m.accelerators)]
            for key, amount in need:
                if amount and (r is None or getattr(r, key) is None):
                    raise self._missing(key, m, provisioning, needed_by)
            rates = r or FamilyRates()  # no rates at all: the machine has none of the three to charge
            return MachineSplit(
                m.vcpus * (rates.vcpu_hour or 0.0),
                m.memory_gb * (rates.gb_hour or 0.0),
                m.accelerators * (rates.accelerator_hour or 0.0),
            )
        if r is not None and r.vcpu_hour is not None and r.gb_hour is not None:  # host-rated
            cpu, mem = m.vcpus * r.vcpu_hour, m.memory_gb * r.gb_hour
            if m.accelerators and cpu + mem <= price:
                return MachineSplit(cpu, mem, price - cpu - mem)
            scale = price / (cpu + mem) if cpu + mem > 0 else 0.0
            return MachineSplit(cpu * scale, mem * scale, 0.0)
        if m.accelerators:
            return MachineSplit(0.0, 0.0, price, whole=True)
        return MachineSplit(price, 0.0, 0.0, whole=True)

    def _only_other(self, m: MachineShape, asked: str, needed_by: str) -> ProvisioningError | None:
        """The error for a machine priced only for the other provisioning model, if it is."""
        other = "spot" if asked == "standard" else "standard"
        try:
            hourly = self._split(m, other).total
        except SpecError:
            return None
        return ProvisioningError(catalog=self.name, machine=m.name, asked=asked, hourly=hourly,
                                 needed_by=needed_by, alternatives=_shipped_pricing(m, asked, self.path))

    def _missing(self, key: str, m: MachineShape, provisioning: str, needed_by: str,
                 whole_ok: bool = True) -> SpecError:
        p = self.prices(provisioning)
        fams = ", ".join(sorted(p.rates)) or "none"
        whole = ", ".join(sorted(p.machines)) or "none"
        label = PROVISIONING_LABEL[provisioning]
        why = f", needed {needed_by}" if needed_by else ""
        nest = (lambda text: f"spot: {{{text}}}") if provisioning == "spot" else (lambda text: text)
        return SpecError(
            f"catalog {self.name} has no {label} price (provisioning: {provisioning}) for {_RESOURCE[key]} of "
            f"{m.family} machines ({m.name}){why}. Its {label} prices ({_SECTION[provisioning]}) have "
            f"per-resource rates for: {fams}; and whole-machine prices for: {whole}. "
            f"Use a catalog that prices it (--prices NAME|FILE), e.g. a copy of this one ({self.path}) "
            f"with '{nest(f'rates: {{{m.family}: {{{key}: ...}}}}')}'"
            + (f" or '{nest(f'machines: {{{m.name}: ...}}')}'." if whole_ok else ".")
        )


def _shipped_pricing(m: MachineShape, provisioning: str, exclude: str) -> tuple[str, ...]:
    """Shipped catalogs (other than `exclude`) that price `m` for this provisioning model."""
    out = []
    for name in shipped_catalogs():
        path = CATALOG_DIR / f"{name}.yaml"
        if str(path) == str(exclude):
            continue
        try:
            load_catalog(name)._split(m, provisioning)
        except SpecError:
            continue
        out.append(name)
    return tuple(out)


def shipped_catalogs() -> list[str]:
    """Names of the catalogs shipped with dsctl."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.endswith((".yaml", ".yml"))


def load_catalog(name_or_path: str | Path, base_dir: str | Path | None = None) -> Catalog:
    """A shipped catalog by name, or the user's catalog YAML by path (relative to base_dir)."""
    if isinstance(name_or_path, Path) or _looks_like_path(str(name_or_path)):
        path = Path(name_or_path)
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
    else:
        name = str(name_or_path)
        path = CATALOG_DIR / f"{name}.yaml"
        if not path.is_file():
            raise SpecError(
                f"unknown price catalog '{name}'. Shipped catalogs: {known_list(name, shipped_catalogs())}. "
                "To use your own prices, pass the path of a catalog YAML file (e.g. ./prices.yaml)."
            )
    return catalog_from_source(read_yaml(path))


def catalog_from_source(src: YamlSource) -> Catalog:
    """Validate a parsed catalog: schema first, then names and agreement between prices."""
    if not isinstance(src.data, dict):
        got = "an empty file" if src.data is None else f"a {type(src.data).__name__}"
        raise SpecError(
            "a price catalog is a mapping with name, date, source, currency and rates and/or machines "
            f"(on-demand prices), and optionally spot (Spot prices); got {got}.",
            where=src.where(()),
        )
    spot = src.data.get("spot")
    sections = [((), src.data)] + ([(("spot",), spot)] if isinstance(spot, dict) else [])
    for prefix, section in sections:
        rates = section.get("rates")
        if isinstance(rates, dict):
            # Validate each family's rates on its own first: errors inside a dict entry then
            # get the "did you mean 'vcpu_hour'?" hint that validate() gives for model fields.
            for fam, entry in rates.items():
                validate(FamilyRates, src, entry, prefix=(*prefix, "rates", fam))
        machines = section.get("machines")
        if isinstance(machines, dict):
            # Each machine price on its own too: a bare number, or {per_hour, source, date}.
            for name, entry in machines.items():
                model = MachinePrice if isinstance(entry, dict) else _PlainPrice
                validate(model, src, entry, prefix=(*prefix, "machines", name))
    if isinstance(spot, dict):
        validate(PriceList, src, spot, prefix=("spot",))
    data = validate(CatalogFile, src)
    shapes = _check_shapes(data, src)
    _check(data.prices("standard"), src, (), shapes)
    if data.spot is not None:
        _check(data.spot, src, ("spot",), shapes)
    check_sources(data, src, shapes)
    catalog = Catalog(data, src.path)
    _check_spot_not_dearer(catalog, src)
    return catalog


def _unknown(name: str, shapes: dict[str, MachineShape]) -> MachineShape:
    raise SpecError(f"unknown machine type '{name}'. Known machine types, closest first: {known_list(name, shapes)}.")


def _check_shapes(data: CatalogFile, src: YamlSource) -> dict[str, MachineShape]:
    """The catalog's own shapes are of machine types the cost model does not know (it never redefines one); returns
    every shape the catalog's prices may name."""
    for name in data.shapes:
        if name in MACHINES:
            raise src.error(("shapes", name), f"{name} is a machine type dsctl knows the shape of "
                                              f"({MACHINES[name].vcpus} vCPUs, {MACHINES[name].memory_gb:g} GB); "
                                              "shapes: is for machine types it does not know. Remove it here.")
    return {**MACHINES, **data.own_shapes()}


def _is_tpu(m: MachineShape | None) -> bool:
    return bool(m and (m.accelerator_type or "").startswith("TPU"))


def check_sources(data: CatalogFile, src: YamlSource, shapes: dict[str, MachineShape] = MACHINES) -> None:
    """Every Spot price and every TPU price has its own source and date beside it; a catalog without one is
    refused (file:line), so the rule holds for every catalog written later, the shipped ones included."""
    why = ("every Spot price and every TPU price in a price catalog says where it comes from and when, beside it "
           "(Spot prices change often; a figure you could not check says so: source: \"not re-checked: <why>\")")
    tpu_families = {m.family for m in shapes.values() if _is_tpu(m)} | {m.series for m in shapes.values() if _is_tpu(m)}
    for prefix, prices in (((), data.prices("standard")), (("spot",), data.spot)):
        if prices is None:
            continue
        spot = bool(prefix)
        for name, value in prices.machines.items():
            if (spot or _is_tpu(shapes.get(name))) and name not in prices.machine_sources:
                kind = f"the {'Spot' if spot else 'TPU'} price of {name}"
                raise src.error((*prefix, "machines", name),
                                f"{kind} has no source and date: write it as '{name}: {{per_hour: {value:g}, "
                                f"source: \"...\", date: YYYY-MM}}'; {why}.")
        for fam, r in prices.rates.items():
            if (spot or fam in tpu_families) and not (r.source and r.date):
                missing = " and ".join(k for k in ("source", "date") if not getattr(r, k))
                kind = f"the {'Spot' if spot else 'TPU'} rates of {fam}"
                raise src.error((*prefix, "rates", fam),
                                f"{kind} have no {missing}: add 'source: \"...\"' and 'date: YYYY-MM' to them; {why}.")


def _check(prices: PriceList, src: YamlSource, prefix: tuple, shapes: dict[str, MachineShape] = MACHINES) -> None:
    """Names known, and machine prices agreeing with the rates, within one provisioning model's prices."""
    families = FAMILIES | {m.family for m in shapes.values()} | {m.series for m in shapes.values()}
    for fam in prices.rates:
        if fam not in families:
            raise src.error(
                (*prefix, "rates", fam),
                f"unknown machine family or series '{fam}'. Known, closest first: {known_list(fam, families)}.",
            )
    for name, price in prices.machines.items():
        if name not in shapes:
            raise src.error(
                (*prefix, "machines", name),
                f"unknown machine type '{name}'. Known machine types, closest first: {known_list(name, shapes)}.",
            )
        m = shapes[name]
        r = prices.rates.get(m.series) or prices.rates.get(m.family)
        if r is None or r.vcpu_hour is None or r.gb_hour is None:
            continue
        host = m.vcpus * r.vcpu_hour + m.memory_gb * r.gb_hour
        full = host + m.accelerators * (r.accelerator_hour or 0.0)
        rated_whole = not m.accelerators or r.accelerator_hour is not None
        which = "Spot " if prefix else ""
        if m.accelerators and host > price * (1 + AGREEMENT):
            problem = f"its host alone costs ${host:.4f}/h at the {which}{m.family} rates"
        elif rated_whole and abs(full - price) > AGREEMENT * price:
            problem = f"its {which}{m.family} rates add up to ${full:.4f}/h"
        else:
            continue
        raise src.error(
            (*prefix, "machines", name),
            f"{name} is priced at ${price}/h but {problem} ({m.vcpus} vCPUs, {m.memory_gb:g} GB, "
            f"{m.accelerators} accelerators). Give the machine price or the rates, or make them agree within 1%.",
        )


def _check_spot_not_dearer(catalog: Catalog, src: YamlSource) -> None:
    """A Spot price above the on-demand one is a price in the wrong section: Spot VMs never cost more."""
    spot = catalog.data.spot
    if spot is None:
        return
    for name, m in catalog.shapes.items():
        try:
            s = catalog._split(m, "spot").total
            d = catalog._split(m, "standard").total
        except SpecError:
            continue
        if s <= d * (1 + 1e-9):
            continue
        if name in spot.machines:
            loc = ("spot", "machines", name)
        else:
            loc = ("spot", "rates", m.series if m.series in spot.rates else m.family)
        raise src.error(
            loc,
            f"{name} costs {_usd_hour(s)} as a Spot VM but {_usd_hour(d)} on demand in this catalog; Spot VMs "
            "never cost more than on-demand ones. On-demand prices go at the top level (rates, machines), "
            "Spot prices under spot.",
        )
