"""Places to run a deployment, behind one contract (contract.py): local/ processes, gcp/ VMs.

    state.py     what a deployment is (typed, saved to the run's state file)
    contract.py  what every provider implements, and the capabilities some declare
    registry.py  the providers by name
"""

from __future__ import annotations

from .contract import (
    Bill,
    Billed,
    BillRole,
    Capacity,
    CheckResult,
    ChecksPlace,
    Contains,
    Contents,
    EventSink,
    FindsByLabel,
    HandOffLimits,
    HandsOff,
    MachineBack,
    MachineGroup,
    MachineLost,
    Outage,
    Plans,
    Poll,
    Provider,
    RunObjects,
    ServerExit,
    TrainerLaunch,
    TrainerState,
    Where,
)
from .registry import get_provider, load_deployment, providers_with, register
from .state import STATE_FILE, Deployment, Node, ProcessRef

__all__ = ["Bill", "BillRole", "Billed", "Capacity", "CheckResult", "ChecksPlace", "Contains", "Contents", "Deployment",
           "EventSink", "FindsByLabel", "HandOffLimits", "HandsOff", "MachineBack", "MachineGroup", "MachineLost", "Node",
           "Outage", "Plans", "Poll", "ProcessRef", "Provider", "RunObjects", "STATE_FILE", "ServerExit", "TrainerLaunch",
           "TrainerState", "Where", "get_provider", "load_deployment", "providers_with", "register"]
