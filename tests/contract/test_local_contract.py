"""The local provider keeps the provider contract (suite.py)."""

from __future__ import annotations

import os
import signal

import pytest

from contract.suite import ProviderContract
from dsctl.provisioners import Deployment
from dsctl.provisioners.local import LocalProvider
from dsctl.provisioners.processes import is_ours

pytestmark = pytest.mark.slow


class TestLocalProvider(ProviderContract):
    def provider(self):
        return LocalProvider()

    def kill(self, dep: Deployment, role: str, index: int) -> None:
        node = next(n for n in dep.by_role(role) if n.index == index)
        os.kill(node.pid, signal.SIGKILL)

    def leftovers(self, dep: Deployment) -> list[str]:
        processes = [*dep.nodes, *([dep.state.launcher] if dep.state and dep.state.launcher else [])]
        return [f"pid {n.pid}" for n in processes if is_ours(n)]
