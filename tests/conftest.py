"""Shared fixtures: an isolated DSCTL_HOME per test that also fails the test if it leaves processes behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import processes_under


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh DSCTL_HOME; the builtin data cache is shared across tests to save generation time."""
    h = tmp_path / "dsctl-home"
    h.mkdir()
    shared_cache = Path(os.environ.get("DSCTL_TEST_CACHE", "/tmp/dsctl-test-cache"))
    shared_cache.mkdir(parents=True, exist_ok=True)
    (h / "cache").symlink_to(shared_cache)
    monkeypatch.setenv("DSCTL_HOME", str(h))
    yield h
    leftovers = processes_under(h)
    for p in leftovers:
        p.kill()
    assert not leftovers, f"processes left running: {[p.cmdline() for p in leftovers]}"


