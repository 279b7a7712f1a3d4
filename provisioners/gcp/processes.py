"""The run's processes on its VMs: started over SSH, watched from a background thread, stopped.

Each process (the dispatcher, a worker, a trainer) runs in its node's directory on its VM under a
wrapper that records its pid and exit code (remote.py), and is recorded in the state (remote pid
and start time) the moment it runs. From then on the watcher (watch.py) reads it, a trainer every
second and a ready server every 5 s (past 10 servers, 2 readings a second spread over all of
them): liveness, CPU and memory, its ready file, a trainer's new metrics lines, which it copies
home. What is read here (a server ready, a server or trainer that ended) is taken from the
watcher's latest readings and never waits on SSH; a reading from before a process was started
(its predecessor's, for a restarted server) is not its own and is never judged.
"""

from __future__ import annotations

import time
from pathlib import Path

from dsctl.runtime.logtail import useful_lines
from dsctl.runtime.sampler import Sample

from ..contract import ServerExit, TrainerLaunch
from ..state import Node
from . import remote
from .context import Context
from .errors import CloudTimeout, RemoteError
from .state import gcp
from .storage import Staging
from .threads import parallel
from .watch import Watched


def layout(node: Node) -> remote.Layout:
    return remote.Layout(gcp(node).vm.dir)


def _free_port(ctx: Context, node: Node) -> int:
    vm = gcp(node).vm
    res = ctx.ssh.run(vm.ssh_host, remote.free_port(ctx.settings.python), doing="choosing a port")
    try:
        return int(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"could not choose a free port on {vm.name}: {res.stderr.strip()[-200:]}") from None


def launch(ctx: Context, node: Node, module: str, args: list[str], *, metrics_local: str | None = None,
           on_exit: list[tuple[str, str]] | None = None, file_env: dict[str, dict[str, str]] | None = None,
           tree: bool = False) -> None:
    """Start `python -m module args` on the node's VM, record it, and watch it from now on."""
    state, where = gcp(node), layout(node)
    res = ctx.ssh.run(state.vm.ssh_host, remote.launch(where, ctx.settings.python, module, args, file_env=file_env,
                                                   tree=tree),
                      doing=f"starting the {node.role}")
    if res.code != 0:
        raise RemoteError(f"could not start the {node.role} {node.index} on {state.vm.name}: "
                          f"{(res.stderr or res.stdout).strip()[-300:]}")
    pid, start = remote.parse_launch(res.stdout)
    launched = time.monotonic()
    with ctx.lock:  # several launches run in parallel; state is saved whole
        state.remote_pid, state.start_time, state.launched_at, state.ready = pid, start, launched, False
        node.log = str(Path(ctx.dep.run_dir) / "logs" / f"{node.role}-{node.index}.log")
        ctx.dep.save()
    ctx.watching().watch(Watched(key=(node.role, node.index), host=state.vm.ssh_host, layout=where, launched_at=launched,
                                 metrics_local=metrics_local, on_exit=on_exit or []))


def start_dispatcher(ctx: Context, node: Node) -> None:
    """At its recorded port (a restart keeps it), from its journal if it is fault-tolerant."""
    state = gcp(node)
    state.port = state.port or ctx.settings.dispatcher_port or _free_port(ctx, node)
    node.address = f"{state.vm.internal_ip}:{state.port}"
    ctx.dep.dispatcher_address = node.address
    where = layout(node)
    args = ["--port", str(state.port), "--ready-file", where.ready]
    if state.fault_tolerant:
        args += ["--fault-tolerant", "--work-dir", where.journal]
    launch(ctx, node, "dsctl.runtime.dispatcher", args)


def start_worker(ctx: Context, node: Node) -> None:
    """At its recorded port (a restart keeps it: its clients know only that address)."""
    state = gcp(node)
    port = state.port or ctx.settings.worker_port or _free_port(ctx, node)
    with ctx.lock:
        state.port = port
        node.address = f"{state.vm.internal_ip}:{port}"
    assert ctx.dep.dispatcher_address is not None, "workers start after the dispatcher"
    assert state.vm.internal_ip is not None, f"VM {state.vm.name} runs, so it has its internal address"
    args = ["--dispatcher", ctx.dep.dispatcher_address, "--host", state.vm.internal_ip,
            "--port", str(port), "--ready-file", layout(node).ready]
    if state.cache_mb:
        args += ["--cross-trainer-cache-mb", str(state.cache_mb)]
    launch(ctx, node, "dsctl.runtime.worker", args)


def start_trainer(ctx: Context, node: Node, run: TrainerLaunch, objects: list[str], with_code: bool) -> None:
    """Fetch the staged spec (and code) onto the trainer's VM, then start the trainer; its metrics, and at its end
    its log, steps and ids, come home to run.metrics_dir."""
    s, state, where = ctx.settings, gcp(node), layout(node)
    staging = Staging(ctx.clients, ctx.dep.run_id)
    res = ctx.ssh.run(state.vm.ssh_host, remote.fetch(s.python, s.bucket, staging.staging_prefix, where.dir, objects,
                                                  s.storage_host),
                      doing="fetching the spec and code from Cloud Storage", timeout=300)
    if res.code != 0:
        raise RemoteError(f"trainer {node.index} ({state.vm.name}) could not fetch the spec"
                          f"{' and code' if with_code else ''} from {staging.url('')}: "
                          f"{(res.stderr or res.stdout).strip()[-400:]}")
    home = run.metrics_dir
    with ctx.lock:
        node.metrics = str(home / f"trainer-{node.index}.jsonl")
    args = run.harness_args(node.index, spec=where.spec, metrics=where.metrics,
                            cache_dir=ctx.state.data_root or where.cache,
                            base_dir=where.code if with_code else where.dir, dispatcher=ctx.dep.dispatcher_address)
    # run.cpus pins local processes to cores; a trainer VM has its cores to itself.
    on_exit = [(where.log, str(home / f"trainer-{node.index}.log"))]
    if run.record_steps:
        with ctx.lock:
            state.steps = str(home / f"trainer-{node.index}.steps.json")
        args += ["--record-steps", f"{where.dir}/steps.json"]
        on_exit.append((f"{where.dir}/steps.json", state.steps))
    if run.record_ids:
        with ctx.lock:
            state.ids = str(home / f"trainer-{node.index}.ids.json")
        args += ["--record-ids", where.ids]
        on_exit.append((where.ids, state.ids))
    if run.command:
        args.append("--vm-python")  # the command's `python` is the VM's, which has TensorFlow and dsctl
    # TensorFlow's PJRT TPU runtime on a TensorFlow TPU VM (software.PJRT_ENV); a command runner's program and
    # what it starts count in the trainer's CPU and memory (remote.status).
    launch(ctx, node, run.module, args, metrics_local=node.metrics, on_exit=on_exit,
           file_env=s.run_software.for_kind(state.vm.kind).trainer_file_env, tree=run.command)


def _tail(ctx: Context, node: Node) -> str:
    """The last useful lines of the node's log, read over SSH."""
    if not ctx.has_ssh:
        return "(log not readable: the run has no SSH key here)"
    host = gcp(node).vm.host
    if host is None:
        return "(log not readable: its VM has no address yet)"
    try:
        res = ctx.ssh.run(host, remote.tail(layout(node).log), doing="reading a log")
        return "\n".join(useful_lines(res.stdout)[-12:])
    except RemoteError as exc:
        return f"(log not readable: {exc})"


def log_tail(ctx: Context, node: Node) -> str:
    """Where the node's log is, and its last useful lines."""
    return f"({layout(node).log} on {gcp(node).vm.name})\n{_tail(ctx, node)}"


def wait_servers(ctx: Context, nodes: list[Node]) -> None:
    """Until each server has written its ready file; a server that exits first fails the run with its log's tail."""
    s = ctx.settings
    deadline = time.monotonic() + s.ready_timeout_s
    pending = list(nodes)
    while pending:
        snap = ctx.watching().snapshot()
        for node in list(pending):
            state = gcp(node)
            st = snap.get((node.role, node.index))
            if st is None:
                continue
            if st.ready and st.ready.get("pid") == state.remote_pid:
                state.ready, state.port = True, st.ready["port"]
                node.address = f"{state.vm.internal_ip}:{st.ready['port']}"
                pending.remove(node)
            elif not st.running(state.start_time):
                raise RemoteError(
                    f"the {node.role} {node.index} on {state.vm.name} exited (code {st.exit_code}) before it was "
                    f"ready. Its log ({state.vm.dir}/out.log on the VM) ends with:\n{_tail(ctx, node)}")
        if pending and time.monotonic() > deadline:
            names = ", ".join(f"{n.role} {n.index}" for n in pending[:8])
            raise CloudTimeout(f"{names} not ready after {s.ready_timeout_s:.0f} s (gcp.ready_timeout_s); their logs "
                               f"are in {s.remote_dir}/{ctx.dep.run_id} on the VMs.")
        if pending:
            time.sleep(0.2)
    ctx.save()


def exited_servers(ctx: Context, unseen: set[str | None]) -> list[ServerExit]:
    """The dispatcher and workers found ended, by a reading taken after they were started, on VMs that answer and
    are not being brought back (recovery.py: what cannot be seen now is not judged on an old reading)."""
    snap = ctx.watching().snapshot()
    out = []
    for node in ctx.dep.by_role("dispatcher") + ctx.dep.by_role("worker"):
        state = gcp(node)
        st = snap.get((node.role, node.index))
        if state.remote_pid is None or state.vm.host in unseen or st is None \
                or st.at < (state.launched_at or 0.0) or st.running(state.start_time):
            continue
        out.append(ServerExit(node, st.exit_code))
    return out


def trainers(ctx: Context, unseen: set[str | None]) -> tuple[list[int], dict[int, int]]:
    """(the trainers running, the exit code of each that ended); one that cannot be seen now counts as running."""
    snap = ctx.watching().snapshot()
    running, codes = [], {}
    for node in ctx.dep.by_role("trainer"):
        state = gcp(node)
        if state.remote_pid is None:
            continue
        st = snap.get(("trainer", node.index))
        if state.vm.host in unseen or st is None or st.running(state.start_time):
            running.append(node.index)
        else:
            codes[node.index] = st.exit_code
    return running, codes


def sample(ctx: Context) -> list[Sample]:
    """CPU (cores busy between the watcher's two latest readings of it, however far apart) and RSS of every remote
    process."""
    if ctx.watcher is None:
        return []
    out = []
    for (role, index), (prev, cur) in ctx.watcher.readings().items():
        if cur.state is None or cur.pid is None or cur.state in ("Z", "X"):
            continue
        cores = max((cur.cpu_seconds - prev.cpu_seconds) / (cur.at - prev.at), 0.0)
        out.append(Sample(role, index, cur.pid, cores, cur.rss_bytes, cur.cpu_seconds))
    return out


def _started(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if gcp(n).remote_pid and gcp(n).vm.host]


def stop(ctx: Context, nodes: list[Node], grace_s: float) -> None:
    """SIGTERM each node's process (if it is still the one started), SIGKILL its group after grace_s; an unreachable
    VM is left to its deletion."""
    def one(node: Node) -> None:
        state = gcp(node)
        try:
            ctx.ssh.run(state.vm.ssh_host, remote.stop(layout(node), state.start_time, grace_s),
                        doing=f"stopping the {node.role}", timeout=grace_s + 15)
        except RemoteError:
            pass  # an unreachable VM is deleted anyway
        if ctx.watcher is not None:
            ctx.watcher.forget((node.role, node.index))

    live = _started(nodes)
    if live and ctx.has_ssh:
        parallel(one, live)


def collect_logs(ctx: Context, nodes: list[Node]) -> None:
    """Servers' logs to <run>/logs, trainers' to <run>/metrics (unless the watcher already brought them)."""
    run_dir = Path(ctx.dep.run_dir)

    def get(node: Node) -> None:
        if node.role == "trainer":
            local = run_dir / "metrics" / f"trainer-{node.index}.log"
            if local.exists():
                return
        else:
            local = run_dir / "logs" / f"{node.role}-{node.index}.log"
        try:
            ctx.ssh.get(gcp(node).vm.ssh_host, layout(node).log, local)
        except RemoteError:
            pass

    live = _started(nodes)
    if live and ctx.has_ssh:
        parallel(get, live)
