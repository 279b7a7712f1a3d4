"""Ctrl-C (SIGINT) at any moment of a dsctl command: exit 130, one line, no traceback.

Real processes and real signals. Where the moment matters, the signal is sent from inside the
process by an import hook (when a named module starts importing), so the test does not depend
on how fast this machine is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import EXAMPLES, wait_for

pytestmark = pytest.mark.integration  # real processes and real signals

QUICKSTART = str(EXAMPLES / "quickstart.yaml")


def _assert_interrupted(proc: subprocess.CompletedProcess | subprocess.Popen, err: str) -> None:
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted"), err


def _run_with_sigint_when_importing(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`dsctl ARGS` (as the console script runs it: dsctl.cli.entry), sent SIGINT the moment `module` starts to
    import."""
    code = textwrap.dedent(f"""
        import os, runpy, signal, sys

        class SigintOnImport:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    sys.meta_path.remove(self)
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, SigintOnImport())
        sys.argv = ["dsctl", *{list(args)!r}]
        runpy.run_module("dsctl.cli.entry", run_name="__main__")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_ctrl_c_during_a_command_stops_its_child_and_exits_130(tmp_path, home):
    """SIGINT while `validate` waits for the entrypoint check: the check's process is killed too."""
    pid_file = tmp_path / "child.pid"
    (tmp_path / "sleepy.py").write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                        "time.sleep(120)\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ntrainer: {steps: 10}\npipeline: {entrypoint: 'sleepy:make'}\n")
    proc = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "validate", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=30, what="the entrypoint check"))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    _assert_interrupted(proc, err)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_ctrl_c_during_an_import_inside_a_command_exits_130(home):
    proc = _run_with_sigint_when_importing("dsctl.orchestrator.deployments", "status")  # `status` imports it lazily
    _assert_interrupted(proc, proc.stderr)


def test_ctrl_c_in_main_outside_any_command_exits_130(home):
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        import dsctl.cli.main as cli

        def run_app(app):  # Ctrl-C after main() started, before typer runs a command
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)

        cli.run_app = run_app
        sys.argv = ["dsctl", "validate", {QUICKSTART!r}]
        cli.main()
    """)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 10, "the interrupt did not end the process"
    _assert_interrupted(proc, proc.stderr)


def test_ctrl_c_right_after_start_during_the_clis_own_imports_exits_130(home):
    proc = _run_with_sigint_when_importing("typer", "validate", QUICKSTART)
    _assert_interrupted(proc, proc.stderr)
