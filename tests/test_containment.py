"""Nothing a run or a spec check starts escapes it.

A process that starts a daemon (setsid, or a double fork) moves it out of its process group, and
teardown used to stop process groups: the daemon outlived `dsctl validate` and `dsctl up`, and
`dsctl down` could not find it. Now every process dsctl starts for a run, and the entrypoint check's
child, is in a cgroup of its own (provisioners/containment.py), ended with the run or the check.
These tests start real daemons (`sleep` with a number no other process uses in its command line)
from a pipeline entrypoint and from a user's script, and look for them afterwards.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dsctl.provisioners import Deployment, load_deployment
from dsctl.provisioners.containment import (
    CHECK_PREFIX,
    CONTAINMENT_ENV,
    RUN_PREFIX,
    Cgroup,
    Containment,
    NotContained,
    cgroup_name,
    container_of,
    make_run,
    own_cgroup_dir,
    plan_run,
)
from helpers import dsctl, wait_for, write_spec


def cgroups_unavailable() -> str | None:
    """Why this machine lets dsctl make no cgroup here, or None (the containment tests then skip)."""
    group, why = Cgroup.make(f"{CHECK_PREFIX}probe-{os.getpid()}")
    if group is None:
        return why
    group.remove()
    return None


needs_cgroups = pytest.mark.skipif("cgroups_unavailable() is not None", reason="no cgroup v2 that dsctl may write here")


def daemons(mark: str) -> list[psutil.Process]:
    """The daemons a test's code started: `sleep <mark>...`, alive (not zombies)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) == 2 and cmd[0].endswith("sleep") and cmd[1].startswith(mark) and p.info["status"] != "zombie":
            out.append(p)
    return out


@pytest.fixture
def mark():
    """A number for the daemons' command lines; whatever is left of them is killed after the test, so a failing
    test (or today's code) does not leave them to the next."""
    value = f"{random.randint(100000, 999999)}"
    yield value
    for p in daemons(value):
        p.kill()


DAEMONS = """
    import os, subprocess

    def start_daemons(tag):
        # A new session (setsid): out of the caller's process group.
        subprocess.Popen(["setsid", "sleep", "{mark}.1" + tag], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        # A double fork: the daemon's parent exits, so it is nobody's child either.
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{mark}.2" + tag])
            os._exit(0)
"""


def write_daemon_module(folder: Path, mark: str, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(DAEMONS.format(mark=mark)) + textwrap.dedent(body))


# -- where a cgroup is made: from this process's own ------------------------------------------------------------------

MOUNTINFO = """\
24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_cgroup_is_made_below_this_process_own_on_the_cgroup2_mount():
    assert own_cgroup_dir(MOUNTINFO, "4:memory:/x\n0::/user.slice/app.scope\n") == (
        Path("/sys/fs/cgroup/unified/user.slice/app.scope"), "")
    # A mount of a subtree (a container's cgroup namespace): the path below the mount's root.
    sub = "50 31 0:38 /kube/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert own_cgroup_dir(sub, "0::/kube/pod1/c\n") == (Path("/sys/fs/cgroup/c"), "")
    # A mount point with a space (mountinfo writes it \\040).
    spaced = "50 31 0:38 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"
    assert own_cgroup_dir(spaced, "0::/\n") == (Path("/mnt/cg two"), "")


@pytest.mark.parametrize("mountinfo, cgroup, says", [
    (MOUNTINFO, "4:memory:/\n1:cpu:/\n", "only cgroup v1"),
    ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "0::/\n", "no cgroup v2 file system is mounted"),
    ("50 31 0:38 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "0::/mine\n", "outside every cgroup v2 mount"),
    ("50 31 0:38 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n", "0::/\n", "mounted read-only"),
])
def test_where_no_cgroup_can_be_made_it_says_why(mountinfo, cgroup, says):
    where, why = own_cgroup_dir(mountinfo, cgroup)
    assert where is None and says in why


def test_a_cgroup_name_fits_a_folder_name_whatever_the_run_id():
    assert cgroup_name("dsctl-run-", "job-1126-0101-ab12") == "dsctl-run-job-1126-0101-ab12"
    assert cgroup_name("dsctl-run-", "a/b c") == "dsctl-run-a_b_c"
    long = cgroup_name("dsctl-run-", "x" * 400)
    assert len(long) == 255 and long != cgroup_name("dsctl-run-", "x" * 399)


def test_none_and_an_unknown_mode(monkeypatch):
    from dsctl.specs import SpecError

    monkeypatch.setenv(CONTAINMENT_ENV, "none")
    assert plan_run("r") == Containment(contained=False, reason=f"{CONTAINMENT_ENV}=none")
    monkeypatch.setenv(CONTAINMENT_ENV, "sometimes")
    with pytest.raises(SpecError, match="auto .* none .* require"):
        plan_run("r")


@pytest.mark.integration  # a forked child tries to join
def test_require_refuses_where_no_process_can_join(tmp_path, monkeypatch):
    """A folder that is not a cgroup (a plain directory): made, but no process can join it."""
    planned = Containment(contained=True, cgroup=str(tmp_path / "dsctl-run-x"))
    monkeypatch.setenv(CONTAINMENT_ENV, "auto")
    made, group = make_run(planned)
    assert group is None and not made.contained and "moving a process into a cgroup" in made.reason
    assert not (tmp_path / "dsctl-run-x").exists()
    monkeypatch.setenv(CONTAINMENT_ENV, "require")
    with pytest.raises(NotContained, match=f"{CONTAINMENT_ENV}=require"):
        make_run(planned)


# -- the entrypoint check of `validate` and `up` --------------------------------------------------------------------

@pytest.mark.integration  # the CLI and the entrypoint check as real processes
@needs_cgroups
def test_daemons_a_pipeline_starts_do_not_outlive_validate_nor_the_check_of_up(home, tmp_path, mark):
    """A pipeline function that starts a daemon with setsid and one with a double fork, then returns no dataset:
    `validate` and `up` refuse it (exit 2) and nothing it started is left."""
    write_daemon_module(tmp_path, mark, "dpipe", """
        def make(**params):
            start_daemons("")
            return []
    """)
    spec = write_spec(tmp_path, "name: d\ntrainer: {steps: 10}\npipeline: {entrypoint: 'dpipe:make'}\n")
    for command in ("validate", "up"):
        proc = dsctl(command, spec, timeout=120)
        assert proc.returncode == 2 and "not a tf.data.Dataset" in proc.stderr, proc.stderr
        assert daemons(mark) == [], f"`dsctl {command}` left {[p.cmdline() for p in daemons(mark)]}"
    assert not any(p.name.startswith(CHECK_PREFIX) for p in _dsctl_cgroups())


@pytest.mark.integration  # the CLI and the entrypoint check as real processes
@needs_cgroups
def test_a_check_that_passes_its_time_limit_ends_the_daemons_it_started(home, tmp_path, mark, monkeypatch):
    write_daemon_module(tmp_path, mark, "slowpipe", """
        import time
        start_daemons("")
        time.sleep(300)

        def make(**params):
            return []
    """)
    spec = write_spec(tmp_path, "name: d\ntrainer: {steps: 10}\npipeline: {entrypoint: 'slowpipe:make'}\n")
    monkeypatch.setenv("DSCTL_ENTRYPOINT_TIMEOUT_S", "3")
    proc = dsctl("validate", spec, timeout=120)
    assert proc.returncode == 2 and "did not finish within 3 s" in proc.stderr, proc.stderr
    assert daemons(mark) == []


@pytest.mark.integration  # the CLI killed with SIGKILL mid-check
@needs_cgroups
def test_a_check_whose_dsctl_was_killed_is_ended_by_the_next_check(home, tmp_path, mark):
    """`kill -9` of `dsctl validate` while the user's module runs: the check's child dies with it (a parent-death
    signal), and the daemon it started, held in the check's cgroup, is ended by the next entrypoint check."""
    started = tmp_path / "started"
    write_daemon_module(tmp_path, mark, "hang", f"""
        import time
        start_daemons("")
        open({str(started)!r}, "w").close()
        time.sleep(300)

        def make(**params):
            return []
    """)
    spec = write_spec(tmp_path, "name: d\ntrainer: {steps: 10}\npipeline: {entrypoint: 'hang:make'}\n")
    validate = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "validate", str(spec)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: started.exists() and len(daemons(mark)) == 2, timeout=60, what="the module's daemons")
    child = [p for p in psutil.Process(validate.pid).children() if "entrypoint_child" in " ".join(p.cmdline())]
    validate.kill()
    validate.wait()
    wait_for(lambda: not any(p.is_running() and p.status() != "zombie" for p in child), timeout=10,
             what="the check's child to die with dsctl")
    assert len(daemons(mark)) == 2, "the daemons wait in the abandoned check's cgroup"
    (tmp_path / "fine.py").write_text("def make(**params):\n    return []\n")
    fine = write_spec(tmp_path, "name: f\ntrainer: {steps: 10}\npipeline: {entrypoint: 'fine:make'}\n", "fine.yaml")
    dsctl("validate", fine, timeout=120)
    assert daemons(mark) == []


# -- a run -----------------------------------------------------------------------------------------------------------

@pytest.mark.integration  # the launcher as a real process (stopped before it has imported TensorFlow)
@needs_cgroups
@pytest.mark.parametrize("how", ["auto", "none"])
def test_the_run_says_whether_its_processes_are_contained(home, tmp_path, monkeypatch, how):
    from dsctl.provisioners.local.provider import LocalProvider
    from dsctl.specs import load_spec

    monkeypatch.setenv(CONTAINMENT_ENV, how)
    loaded = load_spec(write_spec(tmp_path, "name: c\nservice: {workers: 1}\ntrainer: {steps: 10}\n"
                                            "pipeline: {builtin: synthetic}\n"))
    run_dir = home / "runs" / "contained-1"
    run_dir.mkdir(parents=True)
    dep = Deployment(run_id="contained-1", provider="local", run_dir=str(run_dir))
    events: list[tuple[str, str]] = []
    p = LocalProvider()
    try:
        p.up(loaded.spec, dep, 1, lambda kind, message: events.append((kind, message)))
        again = load_deployment(run_dir)  # what `dsctl down` in a new process reads
        group = container_of(again.state)
        if how == "auto":
            assert group is not None and group.path.name == "dsctl-run-contained-1"
            assert again.state.launcher.pid in group.pids()
            held = p.contents(again)
            assert held is not None and held.container == str(group.path) and held.processes >= 1
            assert held.others == []  # the launcher and its forks: nothing else
            assert [k for k, _ in events if "contained" in k] == ["contained"]
        else:
            assert group is None and p.contents(again) is None
            [(kind, message)] = [(k, m) for k, m in events if "contained" in k]
            assert kind == "not-contained" and f"{CONTAINMENT_ENV}=none" in message and "daemon" in message
    finally:
        p.down(dep, lambda kind, message: events.append((kind, message)))
    assert group is None or not group.exists()


RUN_PIPELINE = """
    def make(batch_size=4):
        start_daemons("")
        import tensorflow as tf
        return tf.data.Dataset.range(100000).batch(batch_size)
"""


@pytest.mark.slow
@needs_cgroups
def test_daemons_a_pipeline_starts_in_a_run_are_stopped_with_it(home, tmp_path, mark):
    """`dsctl up` of a job whose pipeline function starts daemons (in the entrypoint check, and in the trainer):
    the run ends as it should, its teardown stops the trainer's daemons with the run's cgroup (and says so), and
    nothing is left. Colocated: the pipeline runs in the trainer either way, and no servers are needed for that."""
    write_daemon_module(tmp_path, mark, "dpipe", RUN_PIPELINE)
    spec = write_spec(tmp_path, """
        name: daemons
        service: {workers: 1}
        trainer: {steps: 40, warmup_batches: 2, model: {step_time_ms: 1}}
        pipeline: {entrypoint: 'dpipe:make', params: {batch_size: 4}}
    """)
    proc = dsctl("up", spec, "--mode", "colocated", "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["id"]
    assert daemons(mark) == [], f"left running: {[p.cmdline() for p in daemons(mark)]}"
    from dsctl.orchestrator.store import RunStore

    stopped = [e["message"] for e in RunStore().events(run_id) if e["kind"] == "strays-stopped"]
    assert stopped and f"sleep {mark}" in stopped[0], RunStore().events(run_id)
    assert not any(run_id in p.name for p in _dsctl_cgroups())


SCRIPT = """
    import subprocess, sys, time
    from pathlib import Path
    start_daemons("")
    Path(sys.argv[1]).write_text("started")
    time.sleep(600)
"""


@pytest.mark.slow
@needs_cgroups
def test_a_daemon_of_a_users_script_is_counted_and_stopped_by_down_after_its_runner_is_killed(home, tmp_path, mark):
    """trainer.command's program starts a daemon; then `dsctl up` and the command's runner (the subreaper that
    would stop the daemon) are killed with SIGKILL, as the kernel's OOM killer or a `kill -9` would. The daemons are
    still in the run's cgroup: `dsctl status` counts them and names them as not dsctl's own servers and trainers
    (the program, in its runner's session, is the trainer's), and `dsctl down` stops them."""
    write_daemon_module(tmp_path, mark, "train", SCRIPT)
    started = tmp_path / "started"
    spec = write_spec(tmp_path, f"""
        name: script
        service: {{workers: 1}}
        trainer: {{command: "{sys.executable} train.py {started}", steps: 100}}
        pipeline: {{builtin: synthetic}}
    """)
    up = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(spec)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: started.exists() and len(daemons(mark)) == 2, timeout=120, what="the script's daemons")
        [run_dir] = (home / "runs").iterdir()
        dep = wait_for(lambda: (d := load_deployment(run_dir)).by_role("trainer")[0].pid and d, timeout=30,
                       what="the trainer's pid in the state file")
        [trainer] = dep.by_role("trainer")
        up.kill()
        up.wait()
        # As if `up` had been killed after the launcher forked the worker but before `up` wrote its pid down (the
        # launcher's own record of the fork says which process it is).
        dep = wait_for(lambda: (d := load_deployment(run_dir)).by_role("worker")[0].pid and d, timeout=5,
                       what="the worker's pid in the state file")
        dep.by_role("worker")[0].pid = dep.by_role("worker")[0].pgid = None
        dep.save()
        os.kill(trainer.pid, signal.SIGKILL)  # the runner: its program and the daemons run on
        time.sleep(0.5)
        group = container_of(dep.state)
        assert group is not None and {p.pid for p in daemons(mark)} <= set(group.pids())
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    try:
        status = dsctl("status", "--json", timeout=120)
        assert status.returncode == 0, status.stderr
        [row] = [r for r in json.loads(status.stdout) if r["run"] == run_dir.name]
        assert row["processes"] >= 5, row  # the launcher, the dispatcher, the worker, the program, the daemons
        others = sorted(row["other_processes"])
        assert [o.split(" (", 1)[1] for o in others] == [f"sleep {mark}.1)", f"sleep {mark}.2)"], row
        assert {int(o.split()[1]) for o in others} == {p.pid for p in daemons(mark)}
        table = dsctl("status", timeout=120)
        said = " ".join(table.stderr.split())
        assert f"{run_dir.name}: 2 other process(es) in its cgroup" in said and f"sleep {mark}.1" in said, table.stderr
        assert f"`dsctl down {run_dir.name}` ends them" in said, said
    finally:
        proc = dsctl("down", "--all", timeout=120)
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stdout.split())
    assert said.startswith(f"{run_dir.name}: down; ") and f"sleep {mark}.1" in said and f"sleep {mark}.2" in said, said
    assert daemons(mark) == [], f"left running: {[p.cmdline() for p in daemons(mark)]}"
    assert not group.exists()
    from dsctl.orchestrator.store import RunStore

    stopped = [e["message"] for e in RunStore().events(run_dir.name) if e["kind"] == "strays-stopped"]
    assert stopped and f"sleep {mark}.1" in stopped[0] and f"sleep {mark}.2" in stopped[0], stopped


def _dsctl_cgroups() -> list[Path]:
    from dsctl.provisioners.containment import leftover_cgroups

    return leftover_cgroups()


@pytest.mark.integration  # makes a cgroup
@needs_cgroups
def test_an_empty_cgroup_of_a_run_whose_state_is_garbled_is_removed_by_down_all(home):
    """A `dsctl down` killed before it removed the run's cgroup leaves it empty, with nothing else of the run: the next
    `down --all` still finds it (by the run's name) and removes it."""
    from dsctl.orchestrator import deployments, takedown
    from dsctl.provisioners import Where

    run_dir = home / "runs" / "empty-1129-040000-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text('{"run_id": "empty-1129-04')  # cut short
    group, _ = Cgroup.make(cgroup_name(RUN_PREFIX, run_dir.name))
    assert group is not None and group.exists() and group.pids() == []
    said: list[str] = []
    takedown.down(None, True, Where(), say=said.append)
    assert not group.exists(), said
    assert said and said[0].startswith(f"{run_dir.name}: down (its state file could not be read: rebuilt from its "
                                       f"cgroup {group.path} (0 process(es) in it)"), said
    assert deployments.active_deployments() == []
