"""The cost model: Equation 1 of the tf.data service paper, price catalogs, estimates.

Pure functions over numbers (no TensorFlow, no network); the only files read are
price catalogs. Data flows: catalog + RunUsage -> price() -> CostBreakdown; measured sweep
points -> ThroughputModel.calibrate() -> predicted points.
"""

from .catalog import Catalog, MachineSplit, load_catalog, shipped_catalogs
from .equation import BASES, CostBreakdown, Rates, equation_1, vm_hours
from .estimate import Comparison, compare, estimate, usage_from_spec
from .machines import MACHINES, MachineShape
from .throughput import ThroughputModel
from .usage import RunUsage, price

__all__ = [
    "BASES", "Catalog", "Comparison", "CostBreakdown", "MACHINES", "MachineShape", "MachineSplit",
    "Rates", "RunUsage", "compare", "equation_1", "estimate", "load_catalog", "price",
    "shipped_catalogs", "ThroughputModel", "usage_from_spec", "vm_hours",
]
