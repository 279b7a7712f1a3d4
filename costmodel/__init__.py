"""The cost model: Equation 1 of the tf.data service paper, price catalogs, estimates.

Pure functions over numbers (no TensorFlow, no network); the only files read are
price catalogs. Every price is for a provisioning model: on-demand ('standard') or Spot.
Data flows: catalog + RunUsage -> price() -> CostBreakdown; measured sweep
points -> ThroughputModel.calibrate() -> predicted points. What a run creates besides
its machines (external IPv4 addresses, boot disks) is priced apart, as additions to
Equation 1: Created + catalog -> price_additions() -> Additions.
"""

from .additions import Additions, Created, created_from_spec, price_additions
from .catalog import Catalog, MachineSplit, PriceList, PriceSource, ProvisioningError, load_catalog, shipped_catalogs
from .equation import BASES, CostBreakdown, Rates, equation_1, vm_hours
from .estimate import Comparison, compare, estimate, usage_from_spec
from .machines import MACHINES, MachineShape
from .provisioning import (
                           PROVISIONING,
                           PROVISIONING_LABEL,
                           check_provisioning,
                           describe_provisioning,
                           dispatcher_provisioning,
                           provisioning_label,
)
from .throughput import ThroughputModel
from .usage import RunUsage, price

__all__ = [
    "Additions", "Created", "created_from_spec", "price_additions", "PriceSource",
    "BASES", "Catalog", "Comparison", "CostBreakdown", "MACHINES", "MachineShape", "MachineSplit",
    "PROVISIONING", "PROVISIONING_LABEL", "PriceList", "ProvisioningError", "Rates", "RunUsage",
    "check_provisioning", "compare", "describe_provisioning", "dispatcher_provisioning", "equation_1", "estimate",
    "load_catalog", "price",
    "provisioning_label", "shipped_catalogs", "ThroughputModel", "usage_from_spec", "vm_hours",
]
