"""One paragraph for every bad home and name: a run id too long for a file name, a DSCTL_HOME
that is read-only, a file, under a file or missing; and a home dsctl did not create keeps its mode (a group's
shared folder stays 2775, setgid and all), with a warning saying how to close it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from dsctl.orchestrator.store import RunStore
from dsctl.provisioners import Deployment
from dsctl.specs import load_spec_text, spec_hash
from helpers import dsctl, processes_under, write_spec

pytestmark = pytest.mark.usefixtures("keep_umask")  # dsctl sets the umask of the process it runs in

SPEC = load_spec_text("name: rec\ntrainer: {steps: 100}\npipeline: {builtin: synthetic}\n").spec


def one_paragraph(err: str, kind: str = "error:") -> str:
    """stderr holds one paragraph starting with `kind` and no traceback; that paragraph, flattened."""
    assert "Traceback" not in err, err
    assert err.count(kind) == 1 and err.strip().startswith(kind), err
    return " ".join(err.split())


def recorded_run(home: Path, run_id: str = "rec-1") -> None:
    """A recorded run, and a deployment whose processes are gone (for `down` to take down and record)."""
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    store = RunStore()
    store.create_run(id=run_id, name="rec", provider="local", mode="service", status="running",
                     spec_json=SPEC.model_dump_json(), spec_hash=spec_hash(SPEC), workers=1, trainers=1,
                     run_dir=str(run_dir))
    store.close()
    Deployment(run_id=run_id, provider="local", run_dir=str(run_dir), status="up").save()






# -- names -----------------------------------------------------------------------------------------------------------

@pytest.mark.integration  # the CLI as a subprocess
@pytest.mark.parametrize("command", [["runs", "show"], ["down"], ["logs"]])
def test_a_run_id_too_long_for_a_file_name_is_one_paragraph(home, command):
    recorded_run(home)
    long_id = "r" * 300
    proc = dsctl(*command, long_id)
    assert proc.returncode == 2
    assert f"'{long_id}'" in one_paragraph(proc.stderr)


# -- homes -----------------------------------------------------------------------------------------------------------

@pytest.fixture
def read_only_home(home):
    """The test's DSCTL_HOME, with a recorded run and a deployment in it, bind-mounted read-only over itself."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    recorded_run(home)
    mounted = subprocess.run(["mount", "--bind", str(home), str(home)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"bind mounts are not permitted here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(home)], check=True, capture_output=True)
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


@pytest.mark.integration  # the CLI as a subprocess
def test_a_read_only_home_is_one_paragraph_for_every_command(read_only_home, tmp_path):
    spec = write_spec(tmp_path, "name: q\nservice: {workers: 1}\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\n")
    for command in (["runs"], ["runs", "show", "rec-1"], ["up", spec], ["tensorboard", "rec-1"]):
        proc = dsctl(*command)
        assert proc.returncode == 1, (command, proc.stderr)
        message = one_paragraph(proc.stderr)
        assert f"DSCTL_HOME ({read_only_home}) is on a read-only file system" in message, command
        assert "Remount it read-write, or set DSCTL_HOME" in message
    proc = dsctl("down", "rec-1")  # everything stopped (nothing runs), then said: its state cannot be written
    assert proc.returncode == 0
    assert "read-only file system: remount it read-write" in one_paragraph(proc.stderr, "warning:")
    assert processes_under(read_only_home) == []


@pytest.mark.integration  # the CLI as a subprocess
@pytest.mark.parametrize("shape", ["a file", "under a file"])
def test_a_home_that_is_a_file_or_under_one_is_one_paragraph(tmp_path, monkeypatch, shape):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    home = blocker if shape == "a file" else blocker / "dsctl-home"
    monkeypatch.setenv("DSCTL_HOME", str(home))
    spec = write_spec(tmp_path, "name: q\nservice: {workers: 1}\ntrainer: {steps: 10}\npipeline: {builtin: synthetic}\n")
    for command in (["runs"], ["up", spec, "--detach"]):
        proc = dsctl(*command)
        assert proc.returncode == 1, (command, proc.stderr)
        message = one_paragraph(proc.stderr)
        said = "is a file, not a folder" if shape == "a file" else f"{blocker} is a file, not a folder"
        assert said in message and "set DSCTL_HOME to a folder of yours" in message, command
    assert blocker.read_text() == "x"


@pytest.mark.integration  # the CLI as a subprocess
def test_a_missing_home_is_made_the_users_alone(tmp_path, monkeypatch):
    home = tmp_path / "not" / "yet" / "home"
    monkeypatch.setenv("DSCTL_HOME", str(home))
    proc = dsctl("runs", check=True)
    assert "no runs recorded yet" in proc.stdout and proc.stderr == ""
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


# -- a home dsctl did not create ----------------------------------------------------------------------------------

def test_a_shared_home_keeps_its_mode_and_setgid_and_is_warned_about(monkeypatch, notices):
    home = Path(tempfile.mkdtemp(prefix="dsctl-shared-home-"))  # in /tmp, which everyone can reach
    try:
        home.chmod(0o2775)
        monkeypatch.setenv("DSCTL_HOME", str(home))
        RunStore().close()
        RunStore().close()
        assert stat.S_IMODE(home.stat().st_mode) == 0o2775, "not dsctl's folder: its mode is the user's choice"
        assert stat.S_IMODE((home / "runs").stat().st_mode) & 0o777 == 0o700, "what dsctl writes is the user's alone"
        assert stat.S_IMODE((home / "runs.db").stat().st_mode) == 0o600
        [warning] = notices  # once per process
        assert f"DSCTL_HOME ({home}) is open to other users" in warning and f"chmod 700 {home}" in warning
    finally:
        shutil.rmtree(home)


def test_a_home_no_one_else_can_reach_is_not_warned_about(tmp_path, monkeypatch, notices):
    home = tmp_path / "home"  # open itself, but inside pytest's own folder (0700)
    home.mkdir()
    home.chmod(0o755)  # whatever umask an earlier test in this process left
    monkeypatch.setenv("DSCTL_HOME", str(home))
    RunStore().close()
    assert notices == [] and stat.S_IMODE(home.stat().st_mode) == 0o755


def test_a_write_refused_mid_run_names_its_real_cause_not_a_full_disk(tmp_path):
    """What `dsctl up`, `dsctl down` and the records say when a write to the home is refused (store.remedy): a
    read-only file system is told to remount, not to "free some space"."""
    import errno

    from dsctl.orchestrator.home import remedy

    assert remedy(OSError(errno.EROFS, "Read-only file system"), tmp_path).startswith(
        f"{tmp_path} is on a read-only file system: remount it read-write")
    assert remedy(OSError(errno.ENOSPC, "No space left on device"), tmp_path) == f"free some space in {tmp_path}"
    assert remedy(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path) == f"free some space in {tmp_path}"
    assert remedy(OSError(errno.EACCES, "Permission denied"), tmp_path) == f"make {tmp_path} writable by you"
