"""The cost model: Equation 1 of the tf.data service paper, price catalogs, estimates.

Pure functions over numbers (no TensorFlow, no network); the only files read are
price catalogs. Every price is for a provisioning model: on-demand ('standard') or Spot.
Data flows: catalog + RunUsage -> price() -> CostBreakdown; measured sweep
points -> ThroughputModel.calibrate() -> predicted points. What a run creates besides
its machines (its provider declares them: addresses, disks, ...) is priced apart, as
additions to Equation 1: extras + catalog -> price_extras() -> Additions.
"""

from .catalog import Catalog, MachineSplit, PriceList, PriceSource, ProvisioningError, load_catalog, shipped_catalogs
from .equation import BASES, CostBreakdown, Rates, equation_1, vm_hours
from .estimate import Comparison, compare, estimate, usage_from_spec
from .extras import Addition, Additions, Charge, Extra, price_extras
from .machines import MACHINES, MachineShape
from .provisioning import (
                           PROVISIONING,
                           PROVISIONING_LABEL,
                           check_provisioning,
                           describe_provisioning,
                           provisioning_label,
)
from .throughput import ThroughputModel
from .usage import RunUsage, price

__all__ = [
    "Addition", "Additions", "Charge", "Extra", "price_extras", "PriceSource",
    "BASES", "Catalog", "Comparison", "CostBreakdown", "MACHINES", "MachineShape", "MachineSplit",
    "PROVISIONING", "PROVISIONING_LABEL", "PriceList", "ProvisioningError", "Rates", "RunUsage",
    "check_provisioning", "compare", "describe_provisioning", "equation_1", "estimate",
    "load_catalog", "price",
    "provisioning_label", "shipped_catalogs", "ThroughputModel", "usage_from_spec", "vm_hours",
]
