"""What dsctl keeps to the user (DSCTL_HOME 0700, records and logs 0600) and which ports its servers take."""

from __future__ import annotations

import os
import socket
import sqlite3
import stat
from pathlib import Path

import pytest

from dsctl.orchestrator.home import private_umask
from dsctl.orchestrator.store import RunStore
from dsctl.runtime import readiness

pytestmark = pytest.mark.usefixtures("keep_umask")  # dsctl sets the umask of the process it runs in


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_new_home_and_everything_written_after_it_are_the_users_alone(tmp_path, monkeypatch):
    os.umask(0o022)
    home = tmp_path / "new" / "home"
    monkeypatch.setenv("DSCTL_HOME", str(home))
    store = RunStore()
    store.add_event("r", "k", "m")
    assert (mode(home), mode(home / "runs"), mode(home / "runs.db")) == (0o700, 0o700, 0o600)
    assert all(mode(p) == 0o600 for p in home.glob("runs.db-*"))
    run = home / "runs" / "r1"
    run.mkdir()
    (run / "state.json").write_text("{}")
    assert (mode(run), mode(run / "state.json")) == (0o700, 0o600), "the process umask is 0o077 from here on"


def test_a_store_at_a_path_of_its_own_keeps_its_directory_private_too(tmp_path):
    os.umask(0o022)
    RunStore(tmp_path / "elsewhere" / "runs.db")
    (tmp_path / "elsewhere" / "f").write_text("x")
    assert (mode(tmp_path / "elsewhere"), mode(tmp_path / "elsewhere" / "f")) == (0o700, 0o600)


def test_the_clis_first_step_sets_the_umask(tmp_path, monkeypatch):
    """`dsctl down` writes state files before it opens the store: every command starts private (cli/errors.py)."""
    os.umask(0o022)
    monkeypatch.setenv("DSCTL_HOME", str(tmp_path))
    private_umask()
    (tmp_path / "f").write_text("x")
    assert mode(tmp_path / "f") == 0o600


def test_what_an_older_dsctl_wrote_open_is_closed_on_first_open_but_the_home_itself_is_left_as_it_is(
        tmp_path, monkeypatch):
    """Issue 26 changed this on purpose: dsctl never changes the mode of a folder it did not create, and the home
    may be the user's own (a group's shared folder); what dsctl itself wrote below it is closed."""
    os.umask(0o022)
    home = tmp_path / "home"
    run = home / "runs" / "old-run"
    (run / "logs").mkdir(parents=True)
    for path in (run / "state.json", run / "spec.yaml", run / "logs" / "worker-0.log"):
        path.write_text("x")
    sqlite3.connect(home / "runs.db").close()
    shared = tmp_path / "shared-cache"  # a cache elsewhere, linked in (as the tests do): not dsctl's to close
    shared.mkdir()
    (home / "cache").symlink_to(shared)
    for path in (home, home / "runs", run, run / "logs"):
        path.chmod(0o755)
    assert mode(run / "state.json") == 0o644 and mode(home / "runs.db") == 0o644

    monkeypatch.setenv("DSCTL_HOME", str(home))
    RunStore()
    assert mode(home) == 0o755, "the home is the user's folder: left as it is"
    for path in (home / "runs", run, run / "logs"):
        assert mode(path) == 0o700, path
    for path in (home / "runs.db", run / "state.json", run / "spec.yaml", run / "logs" / "worker-0.log"):
        assert mode(path) == 0o600, path
    assert mode(shared) == 0o755


def test_a_shared_sticky_directory_named_as_home_is_left_open_but_its_records_are_not(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("DSCTL_HOME", str(shared))
    RunStore()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert (mode(shared / "runs"), mode(shared / "runs.db")) == (0o700, 0o600)


# -- ports ------------------------------------------------------------------------------------------------

def test_service_ports_come_from_below_the_ephemeral_range_and_not_twice():
    low = readiness.ephemeral_port_low()
    taken: set[int] = set()
    for _ in range(50):
        port = readiness.pick_service_port(exclude=taken)
        assert readiness.SERVICE_PORT_FLOOR <= port < low and port not in taken
        taken.add(port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_a_port_in_the_exclusions_or_in_use_is_skipped(monkeypatch):
    excluded, free = _free_port(), _free_port()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        in_use = busy.getsockname()[1]
        candidates = iter([excluded, in_use, free])
        monkeypatch.setattr(readiness.random, "randrange", lambda a, b: next(candidates))
        monkeypatch.setattr(readiness, "ephemeral_port_low", lambda: 65000)
        assert readiness.pick_service_port(exclude={excluded}) == free


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(readiness, "ephemeral_port_low", lambda: readiness.SERVICE_PORT_FLOOR + 10)
    monkeypatch.setattr(readiness.random, "randrange", lambda a, b: pytest.fail("no room to pick from"))
    assert readiness.port_is_free(readiness.pick_service_port())
