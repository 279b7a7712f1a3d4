"""A provider written in this folder alone keeps the contract: the next provider is a folder."""

from __future__ import annotations

import pytest

from contract.suite import ProviderContract
from contract.toy.provider import ToyProvider, kill
from dsctl.provisioners import Deployment
from dsctl.provisioners.processes import is_ours

pytestmark = pytest.mark.slow


class TestToyProvider(ProviderContract):
    def provider(self):
        return ToyProvider()

    def kill(self, dep: Deployment, role: str, index: int) -> None:
        kill(next(n for n in dep.by_role(role) if n.index == index))

    def leftovers(self, dep: Deployment) -> list[str]:
        return [f"{n.role} {n.index} (pid {n.pid})" for n in dep.nodes if is_ours(n)]
