"""Price catalogs: a YAML schema, loading with file:line errors, and the prices of machines.

A catalog gives prices two ways, because that is how clouds publish them:
  rates:    per-resource rates by machine family or series ($ per vCPU-hour, per
            GB-hour, per accelerator-hour), e.g. Compute Engine's N2 and A2 rates;
  machines: whole-machine prices ($ per hour), e.g. a TPU VM, whose price includes
            its host, or the paper's "n2-standard-8 costs $0.08/h".

The utilization basis needs per-resource rates for workers and the dispatcher (it
charges what they used); everything else can be priced from either form. When a
machine has both, the whole-machine price wins and the rates only split it into
host CPU, host memory and accelerators; the two must agree within 1% (or, for an
accelerator VM, the host at those rates must not cost more than the machine).
An accelerator VM priced only whole (a TPU VM) is reported under accelerators with
its host included, which is how Google sells it; trainers cost the same on both
bases either way, since Equation 1 charges trainer hosts on everything they have.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from dsctl.specs.errors import SpecError
from dsctl.specs.validate import validate
from dsctl.specs.yamlsource import YamlSource, read_yaml

from .equation import Rates
from .machines import FAMILIES, MACHINES, MachineShape, known_list, shape

CATALOG_DIR = Path(__file__).parent / "catalogs"
AGREEMENT = 0.01  # whole-machine price vs family rates: relative tolerance


def _price(v: float) -> float:
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"a price must be a number of dollars per hour, zero or more; got {v}")
    return v


Price = Annotated[float, AfterValidator(_price)]


class _Strict(BaseModel):
    """Unknown keys are errors: a misspelt price must not silently become 'no price'."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FamilyRates(_Strict):
    vcpu_hour: Optional[Price] = Field(None, description="$ per vCPU-hour (C_CPU)")
    gb_hour: Optional[Price] = Field(None, description="$ per GB-hour of memory (C_MEM)")
    accelerator_hour: Optional[Price] = Field(None, description="$ per accelerator-hour (C_ACC)")


class CatalogFile(_Strict):
    name: str = Field(min_length=1)
    date: str = Field(description="when the prices were valid: YYYY-MM or YYYY-MM-DD")
    source: str = Field(min_length=1, description="where the numbers come from")
    currency: str
    region: Optional[str] = None
    rates: dict[str, FamilyRates] = Field(default_factory=dict)
    machines: dict[str, Price] = Field(default_factory=dict)

    @field_validator("date", mode="before")
    @classmethod
    def _date(cls, v):
        if isinstance(v, (datetime.date, datetime.datetime)):
            v = v.isoformat()[:10]
        if not isinstance(v, str) or not re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", v):
            raise ValueError(f"date must look like 2023-06 or 2023-06-30, got {v!r}")
        return v

    @field_validator("currency")
    @classmethod
    def _usd(cls, v: str) -> str:
        if v != "USD":
            raise ValueError(f"only USD catalogs are supported, got {v!r}; convert the prices to USD")
        return v


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


class Catalog:
    """A validated catalog; answers 'what does this machine cost' for the cost model."""

    def __init__(self, data: CatalogFile, path: str):
        self.data = data
        self.path = path

    name = property(lambda self: self.data.name)
    date = property(lambda self: self.data.date)
    source = property(lambda self: self.data.source)
    currency = property(lambda self: self.data.currency)
    region = property(lambda self: self.data.region)

    def __repr__(self) -> str:
        return f"Catalog({self.name!r}, date={self.date!r}, path={self.path!r})"

    def machine(self, name: str) -> MachineShape:
        """The shape of a machine type (unknown → SpecError listing known types, closest first)."""
        return shape(name)

    def rates_for(self, m: MachineShape) -> FamilyRates | None:
        """Rates for the machine's series if the catalog has them, else for its family."""
        return self.data.rates.get(m.series) or self.data.rates.get(m.family)

    def split(self, name: str, *, needed_by: str = "") -> MachineSplit:
        """The machine's $/h split into host CPU, host memory and accelerators (sums to its price)."""
        m = self.machine(name)
        r = self.rates_for(m)
        price = self.data.machines.get(name)
        host_rated = r is not None and r.vcpu_hour is not None and r.gb_hour is not None
        if price is None:
            need = [("vcpu_hour", m.vcpus), ("gb_hour", m.memory_gb), ("accelerator_hour", m.accelerators)]
            for key, amount in need:
                if amount and (r is None or getattr(r, key) is None):
                    raise self._missing(key, m, needed_by)
            return MachineSplit(
                m.vcpus * (r.vcpu_hour or 0.0),
                m.memory_gb * (r.gb_hour or 0.0),
                m.accelerators * (r.accelerator_hour or 0.0),
            )
        if host_rated:
            cpu, mem = m.vcpus * r.vcpu_hour, m.memory_gb * r.gb_hour
            if m.accelerators and cpu + mem <= price:
                return MachineSplit(cpu, mem, price - cpu - mem)
            scale = price / (cpu + mem) if cpu + mem > 0 else 0.0
            return MachineSplit(cpu * scale, mem * scale, 0.0)
        if m.accelerators:
            return MachineSplit(0.0, 0.0, price, whole=True)
        return MachineSplit(price, 0.0, 0.0, whole=True)

    def machine_hour(self, name: str, *, needed_by: str = "") -> float:
        """Whole-machine $ per hour."""
        return self.split(name, needed_by=needed_by).total

    def unit_rates(self, name: str, *, needed_by: str = "") -> Rates:
        """C_CPU, C_MEM, C_ACC for this machine; needs per-resource rates for its family."""
        m = self.machine(name)
        r = self.rates_for(m)
        for key in ("vcpu_hour", "gb_hour"):
            if r is None or getattr(r, key) is None:
                raise self._missing(key, m, needed_by, whole_ok=False)
        s = self.split(name, needed_by=needed_by)
        return Rates(
            cpu=s.cpu / m.vcpus if m.vcpus else 0.0,
            mem=s.memory / m.memory_gb if m.memory_gb else 0.0,
            acc=s.accelerators / m.accelerators if m.accelerators else 0.0,
        )

    def priced_machines(self) -> list[str]:
        """Every known machine type this catalog can price."""
        out = []
        for name in MACHINES:
            try:
                self.split(name)
            except SpecError:
                continue
            out.append(name)
        return out

    def _missing(self, key: str, m: MachineShape, needed_by: str, whole_ok: bool = True) -> SpecError:
        fams = ", ".join(sorted(self.data.rates)) or "none"
        whole = ", ".join(sorted(self.data.machines)) or "none"
        why = f", needed {needed_by}" if needed_by else ""
        return SpecError(
            f"catalog {self.name} has no price for {_RESOURCE[key]} of {m.family} machines "
            f"({m.name}){why}. It has per-resource rates for: {fams}; and whole-machine prices for: {whole}. "
            f"Use a catalog that prices it (--prices NAME|FILE), e.g. a copy of this one ({self.path}) "
            f"with 'rates: {{{m.family}: {{{key}: ...}}}}'"
            + (f" or 'machines: {{{m.name}: ...}}'." if whole_ok else ".")
        )


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
            f"a price catalog is a mapping with name, date, source, currency and rates and/or machines; got {got}.",
            where=src.where(()),
        )
    rates = src.data.get("rates")
    if isinstance(rates, dict):
        # Validate each family's rates on its own first: errors inside a dict entry then
        # get the "did you mean 'vcpu_hour'?" hint that validate() gives for model fields.
        for fam, entry in rates.items():
            validate(FamilyRates, src, entry, prefix=("rates", fam))
    data = validate(CatalogFile, src)
    _check(data, src)
    return Catalog(data, src.path)


def _check(data: CatalogFile, src: YamlSource) -> None:
    for fam in data.rates:
        if fam not in FAMILIES:
            raise src.error(
                ("rates", fam),
                f"unknown machine family or series '{fam}'. Known, closest first: {known_list(fam, FAMILIES)}.",
            )
    for name, price in data.machines.items():
        if name not in MACHINES:
            raise src.error(
                ("machines", name),
                f"unknown machine type '{name}'. Known machine types, closest first: {known_list(name, MACHINES)}.",
            )
        m = MACHINES[name]
        r = data.rates.get(m.series) or data.rates.get(m.family)
        if r is None or r.vcpu_hour is None or r.gb_hour is None:
            continue
        host = m.vcpus * r.vcpu_hour + m.memory_gb * r.gb_hour
        full = host + m.accelerators * (r.accelerator_hour or 0.0)
        rated_whole = not m.accelerators or r.accelerator_hour is not None
        if m.accelerators and host > price * (1 + AGREEMENT):
            problem = f"its host alone costs ${host:.4f}/h at the {m.family} rates"
        elif rated_whole and abs(full - price) > AGREEMENT * price:
            problem = f"its {m.family} rates add up to ${full:.4f}/h"
        else:
            continue
        raise src.error(
            ("machines", name),
            f"{name} is priced at ${price}/h but {problem} ({m.vcpus} vCPUs, {m.memory_gb:g} GB, "
            f"{m.accelerators} accelerators). Give the machine price or the rates, or make them agree within 1%.",
        )
