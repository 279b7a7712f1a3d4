"""Run a user's own training program (trainer.command) as one of a run's trainers.

    python -m dsctl.runtime.command --spec spec.json --mode service --dispatcher HOST:PORT --index 0 \
        --metrics trainer-0.jsonl [the trainer harness's other flags]

The program is started from the spec's folder (--base-dir), never through a shell, with this
process's environment (the user's: `python` is the one PATH finds) plus trainer.env, and with
DSCTL_TRAINER, which tells `dsctl.train` (in the program) everything about the run: the spec,
the mode, the dispatcher, this trainer's index, its metrics file, the steps, its checkpoint
folder and the step a resumed run continues from. Its output goes to this process's own (the
trainer's log). What it measures (dsctl.train.batches, keras_callback) goes to the metrics file.

This process stays as the program's parent and watches over everything it starts: it is a child
subreaper (PR_SET_CHILD_SUBREAPER), so a daemon the program starts (double fork, setsid) stays
its descendant, and whatever of the program is still running when the program exits, or when
the run tears down (SIGTERM), is stopped before this process exits. On --resume, the trainer's
checkpoint folder is first filled with the one of the run it resumes, so the program restores
from checkpoint_dir() as on any other run.

Exit codes: 0 the program succeeded; 2 the spec or the program is at fault in a way the user
must fix (no such program, it read no data, it read past trainer.steps, it left processes);
1 the program failed (its code, or the signal that ended it, is in the error event).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from dsctl.errors import quoted
from dsctl.specs import exits
from dsctl.specs.command import activated, find_program
from dsctl.specs.schema import JobSpec

from . import logtail, saved, trainer_args
from .metrics import MetricsWriter

PR_SET_CHILD_SUBREAPER = 36
STOP_GRACE_S = 3.0  # for the program to end after SIGTERM; below the 5 s dsctl gives a trainer's whole group
TAIL_LINES = 6


class CommandError(Exception):
    """The command cannot run, or ran but broke the contract; the message is for the user. `user`: theirs to fix."""

    def __init__(self, message: str, user: bool = True):
        super().__init__(message)
        self.user = user


def show(argv: list[str]) -> str:
    """A command as a user reads it in an error: shell-quoted words, cut at 200 characters."""
    import shlex

    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:197] + "..."


def resolve(argv0: str, base_dir: Path, path_env: str | None) -> str:
    """The program a command's first word names (specs/command.py); CommandError when it cannot be run."""
    program, why = find_program(argv0, base_dir, path_env)
    if program is None:
        raise CommandError(f"trainer.command: {why}")
    return program


def environment(spec: JobSpec, args: trainer_args.TrainerArgs) -> dict[str, str]:
    """The program's environment: this process's, trainer.env, DSCTL_TRAINER; on a cloud VM the VM's Python first."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # its output reaches the trainer's log (and `dsctl logs`) as it is written
    if args.vm_python:
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", os.defpath)
    else:
        env = activated(env)
    env.update(spec.trainer.env)
    env[trainer_args.ENV_VAR] = args.to_env()
    return env


def seed_checkpoints(args: trainer_args.TrainerArgs) -> int:
    """On --resume: copy the resumed run's checkpoint folder for this trainer into its own, and return the step its
    note names (runtime/saved.py). The program then restores from checkpoint_dir() as on any other run."""
    if not args.restore_from:
        return 0
    if not args.checkpoint_dir:
        raise CommandError("--resume: this run has no checkpoint folder (trainer.checkpoint) to restore into.")
    import tensorflow as tf

    step = saved.read(args.restore_from)
    if step is None:
        raise CommandError(f"cannot resume from {args.restore_from}: it has no {saved.MARKER}, the note that "
                           "dsctl.train.checkpoint_saved(step) writes after each checkpoint. Call it after every save, "
                           "or start the run afresh without --resume.")
    src, dst = args.restore_from.rstrip("/"), args.checkpoint_dir.rstrip("/")
    for root, _dirs, files in tf.io.gfile.walk(src):
        rel = root[len(src):].lstrip("/")
        target = f"{dst}/{rel}" if rel else dst
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(f"{root.rstrip('/')}/{name}", f"{target}/{name}", overwrite=True)
    return step


def _subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def stop_all(grace_s: float) -> list[str]:
    """SIGTERM every descendant, SIGKILL what is left after `grace_s`, reap them; what was running, as text."""
    procs = descendants()
    described = []
    for p in procs:
        try:
            described.append(f"pid {p.pid} ({show(p.cmdline()) or p.name()})")
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=3.0)
    _reap_orphans()
    return described


def _reap_orphans() -> None:
    """Collect the exit status of orphans reparented to this subreaper, so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _events(path: str) -> list[dict]:
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _outcome(code: int, argv: list[str], metrics: str, log_tail: str, steps: int | None,
             left: list[str], ended: exits.Ending | None = None) -> CommandError | None:
    """What the program's end means for the run: None when it succeeded, else the error to report. `ended` is how
    its process ended, judged with the evidence of an out-of-memory kill (exits.judge; without it, the bare code)."""
    events = _events(metrics)
    ends = [e for e in events if e.get("event") == "end"]
    batches = sum(e.get("batches", 0) for e in events if e.get("event") == "window")
    errors = [e for e in events if e.get("event") == "error" and e.get("source") == "dsctl.train"]
    output = (f" The last lines it printed are below.{quoted(logtail.last(log_tail, TAIL_LINES))}" if log_tail
              else " It printed nothing.")
    if errors:
        return CommandError(f"{errors[-1]['message']} (The command `{show(argv)}` exited with code {code}.)",
                            user=errors[-1].get("kind") == "user")
    if code != 0:
        ended = ended or exits.judge(code)
        of = f" of {steps}" if steps else ""
        if ends:  # the measured loop ended (an exception in the program's step closes it)
            after = f" after {ends[-1].get('batches', 0)} batch(es){of}"
        elif any(e.get("event") == "first_batch" for e in events):  # killed: its last window was not written
            after = f" after at least {batches} batch(es){of}"
        else:
            after = " before reading any batch"
        why = f": {ended.why}" if ended.why else ""
        return CommandError(f"the command `{show(argv)}` {ended.how}{after}{why}.{output}", user=False)
    if not any(e.get("event") == "start" for e in events):
        return CommandError(f"trainer.command: `{show(argv)}` exited 0 without reading the run's data: it never called "
                            "dsctl.train.dataset(), so the run measured nothing. Read the batches through "
                            "`for batch in dsctl.train.batches(dsctl.train.dataset()):` (or model.fit with "
                            f"dsctl.train.keras_callback()).{output}")
    if not ends:
        return CommandError(f"trainer.command: `{show(argv)}` called dsctl.train.dataset() but read no batches through "
                            "dsctl.train.batches() or dsctl.train.keras_callback(), so the run measured nothing; "
                            f"iterate the dataset with `for batch in dsctl.train.batches(ds):`.{output}")
    if left:
        return CommandError(f"trainer.command: `{show(argv)}` exited 0 but left {len(left)} process(es) running: "
                            f"{'; '.join(left[:5])}. dsctl stopped them. Wait for what the program starts before it "
                            "exits (join its threads and processes), so that nothing outlives a run.")
    return None


def run(args: trainer_args.TrainerArgs, spec: JobSpec, writer: MetricsWriter) -> int:
    argv = list(spec.trainer.command or [])
    base_dir = Path(args.base_dir).resolve()
    stopping = threading.Event()

    def on_signal(signum, _frame):
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    resume_step = seed_checkpoints(args)
    env = environment(spec, args)
    program = resolve(argv[0], base_dir, env.get("PATH"))
    reaping = _subreaper()
    writer.emit("command", argv=argv, program=program, resume_step=resume_step, subreaper=reaping)
    env[trainer_args.ENV_VAR] = args.with_(resume_step=resume_step).to_env()
    log = _own_log()
    try:
        proc = subprocess.Popen([program, *argv[1:]], cwd=base_dir, env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        if exc.errno == errno.E2BIG:  # `dsctl validate` refuses what it can see; the machine's environment added more
            raise CommandError(f"trainer.command: `{show(argv)}` could not be started: its words and environment are "
                               "more than execve takes (E2BIG: one string over 131,072 bytes, or all of them over "
                               "ARG_MAX), counting trainer.env and this machine's environment. Shorten trainer.env "
                               "or trainer.command, or leave large variables out of the environment.") from None
        raise CommandError(f"trainer.command: `{show(argv)}` could not be started: {exc.strerror}.") from None
    watched = exits.watch(proc.pid)  # its memory cgroups' out-of-memory kill counts, before it can be killed
    while proc.poll() is None and not stopping.is_set():
        time.sleep(0.1)
    if stopping.is_set():  # the run is tearing down: the program first, then anything it left
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        stop_all(0.5)
        return 0 if proc.returncode == 0 else 1
    code = proc.returncode
    left = stop_all(STOP_GRACE_S)
    ended = exits.judge(code, pid=proc.pid, watch=watched)
    error = _outcome(code, argv, args.metrics, logtail.tail(log, 40), args.steps or spec.trainer.steps, left, ended)
    if error is None:
        return 0
    writer.emit("error", kind="user" if error.user else "runtime", message=str(error))
    print(f"dsctl: {error}", file=sys.stderr, flush=True)
    return 2 if error.user else 1


def _own_log() -> str | None:
    """The trainer's log: where this process's stdout goes (the launcher and the cloud VMs point it at a file)."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return target if target.startswith("/") and os.path.isfile(target) else None


def main(argv: list[str] | None = None) -> int:
    args = trainer_args.parse(argv, "dsctl-command", __doc__)
    spec = JobSpec.model_validate_json(Path(args.spec).read_text())
    writer = MetricsWriter(args.metrics, args.index)
    try:
        return run(args, spec, writer)
    except CommandError as exc:
        writer.emit("error", kind="user" if exc.user else "runtime", message=str(exc))
        print(f"dsctl: {exc}", file=sys.stderr, flush=True)
        stop_all(0.5)
        return 2 if exc.user else 1
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
