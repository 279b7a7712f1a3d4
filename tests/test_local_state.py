"""A local run's state file as older dsctl wrote it (provisioners/local/state.py LocalCodec.from_legacy): read back as
today's typed state, and taken down by `dsctl down`.

legacy_local_state.json is a detached local run mid-training as dsctl wrote it before the typed state (`git show
c608d42~1:provisioners/local/provider.py`, launcher.py and orchestrator/run.py): every detail of a node in its
`extra` dict (a server's port, ready file and launch id, the dispatcher's argv to restart it from its journal, a
trainer's metrics, steps and ids files, pinned cores), the launcher a `launcher` pseudo-node whose `extra` holds
its request folder and what it said of the run's network, and the detached `dsctl up` a `monitor` pseudo-node.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from dsctl.provisioners import ProcessRef, load_deployment
from dsctl.provisioners.local.state import Isolation, LocalDeployment, LocalNode

RUN = "legacy-local-0001"
LEGACY = Path(__file__).parent / "legacy_local_state.json"


def legacy_run(home: Path, pids: dict[str, psutil.Process] | None = None) -> Path:
    """The legacy state file in `home`'s runs; with `pids` (role-index -> a live process), naming those processes
    instead of the ones it was written with."""
    run_dir = home / "runs" / RUN
    run_dir.mkdir(parents=True)
    data = json.loads(LEGACY.read_text().replace("{home}", str(home)))
    for node in data["nodes"]:
        proc = (pids or {}).get(f"{node['role']}-{node['index']}")
        if proc is not None:
            node.update(pid=proc.pid, pgid=proc.pid, create_time=proc.create_time())
    (run_dir / "state.json").write_text(json.dumps(data, indent=1))
    return run_dir


def test_an_old_local_state_file_reads_as_typed_state(tmp_path):
    run_dir = legacy_run(tmp_path)
    dep = load_deployment(run_dir)
    assert [(n.role, n.index) for n in dep.nodes] == [("dispatcher", 0), ("worker", 0), ("worker", 1), ("trainer", 0)]
    assert all(isinstance(n.state, LocalNode) for n in dep.nodes)
    assert dep.monitor == ProcessRef(pid=381502, pgid=381502, create_time=1764146912.41, log=f"{run_dir}/up.log")
    assert dep.state == LocalDeployment(
        launcher=ProcessRef(pid=381519, pgid=381519, create_time=1764146913.02, log=f"{run_dir}/logs/launcher.log"),
        isolation=Isolation(isolated=True, userns=True, netns=None))
    disp = dep.by_role("dispatcher")[0]
    assert (disp.pid, disp.pgid, disp.create_time) == (381544, 381544, 1764146917.88)
    assert disp.address == dep.dispatcher_address == "127.0.0.1:40113"
    assert (disp.state.port, disp.state.ready_file, disp.state.status_file) == (
        40113, f"{run_dir}/ready/dispatcher.json", f"{run_dir}/dispatcher-status.json")
    assert disp.state.argv[-3:] == ["--fault-tolerant", "--work-dir", f"{run_dir}/journal"]
    worker = dep.by_role("worker")[1]
    assert (worker.state.port, worker.state.served, worker.state.port_picks, worker.state.cpus) == (40139, True, 1, [1])
    assert worker.state.launch_id == "worker-1-90311521877950"
    trainer = dep.by_role("trainer")[0]
    assert trainer.metrics == f"{run_dir}/metrics/trainer-0.jsonl"
    assert (trainer.state.steps, trainer.state.ids) == (f"{run_dir}/metrics/trainer-0.steps.json",
                                                        f"{run_dir}/metrics/trainer-0.ids.json")
    assert trainer.state.cpus == [0] and trainer.state.command is False
    # Saved again, it is in today's form, and reads back the same.
    dep.save()
    assert '"extra"' not in (run_dir / "state.json").read_text()
    assert load_deployment(run_dir) == dep


@pytest.mark.integration
def test_dsctl_down_of_an_old_local_state_file_stops_every_process_it_names(home):
    """The monitor, the launcher, the servers and the trainer the old file names, each a live process group here,
    are all stopped by `dsctl down RUN`, which then records the deployment as down."""
    from dsctl.orchestrator.takedown import down
    from dsctl.provisioners import Where

    keys = ["monitor-0", "launcher-0", "dispatcher-0", "worker-0", "worker-1", "trainer-0"]
    # Each names the run's folder on its command line, as dsctl's processes do (the home fixture finds leftovers).
    popens = {k: subprocess.Popen(["sh", "-c", "sleep 600", f"{home}/runs/{RUN}/proc-{k}"],
                                 start_new_session=True)
              for k in keys}
    try:
        procs = {k: psutil.Process(p.pid) for k, p in popens.items()}
        run_dir = legacy_run(home, procs)
        said: list[str] = []
        down(RUN, False, Where(), said.append)
        assert said == [f"{RUN}: down"]
        for key, proc in procs.items():
            assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE, f"{key} (pid {proc.pid}) still runs"
        dep = load_deployment(run_dir)
        assert dep.status == "down"
    finally:
        for p in popens.values():
            if p.poll() is None:
                p.kill()
            p.wait()
