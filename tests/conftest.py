"""Shared fixtures: an isolated DSCTL_HOME per test that also fails the test if it leaves processes behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import processes_under


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items) -> None:
    """Two groups for pytest-xdist (--dist loadgroup, pyproject.toml): the tests marked `background`, which
    mostly wait, in one test process; all others, in order, in the other. Timing-sensitive tests thus share
    the machine only with tests that barely use it."""
    for item in items:
        group = "background" if item.get_closest_marker("background") else "main"
        item.add_marker(pytest.mark.xdist_group(group))


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


