"""`dsctl validate` checks what execve will take (specs/command.py exec_problem): an environment string over
MAX_ARG_STRLEN, or words and environment over ARG_MAX, is refused at its line before anything starts, not after the
service is up with an error that blames trainer.command."""

from __future__ import annotations

import errno
import subprocess

import pytest

from dsctl.orchestrator.preflight import check_command
from dsctl.specs import SpecError, load_spec
from dsctl.specs.command import MAX_ARG_STRLEN, exec_problem
from helpers import write_spec


def test_an_environment_value_execve_cannot_take_is_named_with_its_size():
    field, why = exec_problem(["python", "train.py"], {"SMALL": "x", "BIG": "a" * 200_000}, {}, 2 * 2**20)
    assert field == ("trainer", "env", "BIG") and "BIG is 200,005 bytes" in why and "131,072" in why
    assert exec_problem(["python", "train.py"], {"OK": "a" * 100_000}, {}, 2 * 2**20) is None


def test_words_and_environment_over_arg_max_are_refused_counting_what_dsctl_runs_in():
    inherited = {f"V{i}": "x" * 1000 for i in range(100)}  # about 100 KB the command would inherit
    field, why = exec_problem(["python", "train.py"], {"A": "1"}, inherited, arg_max=64 * 1024)
    assert field == ("trainer", "env") and "over the 65,536 bytes execve takes here (ARG_MAX)" in why
    assert exec_problem(["python", "train.py"], {}, inherited, arg_max=2 * 2**20) is None


def test_validate_points_at_the_line_of_the_value(tmp_path):
    (tmp_path / "train.py").write_text("")
    spec = write_spec(tmp_path, f"""
        name: big-env
        trainer:
          command: python train.py
          steps: 10
          env:
            SMALL: x
            BIG: {"a" * 200_000}
        pipeline: {{builtin: synthetic}}
    """)
    with pytest.raises(SpecError) as refused:
        check_command(load_spec(spec, check_entrypoints=False))
    assert refused.value.exit_code == 2 and "trainer.env.BIG" in str(refused.value.for_user())
    assert f"{spec}:8" in refused.value.for_user(), refused.value.for_user()


@pytest.mark.integration  # runs a program: the limit is the kernel's, not a guess
def test_the_limit_is_what_the_kernel_refuses():
    at_limit = "V=" + "a" * (MAX_ARG_STRLEN - len("V=") - 1)  # with its NUL: exactly MAX_ARG_STRLEN bytes
    subprocess.run(["/bin/true"], env={at_limit[:1]: at_limit[2:]}, check=True)
    with pytest.raises(OSError) as refused:
        subprocess.run(["/bin/true"], env={"V": at_limit[2:] + "a"})
    assert refused.value.errno == errno.E2BIG
    assert exec_problem(["/bin/true"], {"V": at_limit[2:]}, {}, 2 * 2**20) is None
    assert exec_problem(["/bin/true"], {"V": at_limit[2:] + "a"}, {}, 2 * 2**20) is not None
