"""A run's ending is judged once, from evidence (orchestrator/endings.py): the trainers' own end and error records,
their exit statuses, and whether `dsctl down` asked for the teardown. The real-process scenarios (a trainer
SIGTERM'd mid-run, a launcher killed under a finished trainer, `dsctl down` racing `dsctl up`) are in
tests/test_local_job.py and tests/test_signals.py."""

from __future__ import annotations

from dsctl.orchestrator.endings import LOST, DownRequest, Trainer, down_requested, judge, request_down


def end(reason: str, batches: int, wall: float = 100.0, **more) -> dict:
    return {"reason": reason, "batches": batches, "step": batches, "wall": wall, **more}


def test_an_end_record_of_the_last_step_decides_over_an_exit_status_lost_with_the_launcher():
    """The launcher that forked it was killed after it trained all 1,500 steps: its status is lost, not failed."""
    done = [Trainer(0, LOST, end("steps", 1500), ending="ended, and its exit status is lost: the launcher ended")]
    assert judge(done, count=1, steps=1500).status == "succeeded"
    # Without the end record, the lost status is all there is: the run failed, saying so.
    lost = judge([Trainer(0, LOST, ending="ended, and its exit status is lost: the launcher ended")], count=1)
    assert lost.status == "failed" and "exit status is lost" in lost.message


def test_a_trainer_stopped_by_a_signal_before_its_last_step_never_succeeds():
    """Exit 0, an end record, but reason "signal" at step 247 of 1,500: failed, the signal named."""
    verdict = judge([Trainer(0, 0, end("signal", 247, signal="SIGTERM"))], count=1, steps=1500)
    assert verdict.status == "failed" and verdict.index == 0
    assert "SIGTERM" in verdict.message and "step 247 of 1500" in verdict.message
    assert verdict.message.startswith("trainer 0 failed: ")


def test_a_teardown_asked_for_by_down_is_interrupted_whatever_the_trainers_did_after():
    down = DownRequest(pid=77, at=200.0)
    after = [Trainer(0, 0, end("signal", 247, wall=201.0, signal="SIGTERM")), Trainer(1, -15)]
    verdict = judge(after, count=2, steps=1500, down=down, phase="training")
    assert verdict.status == "interrupted" and "`dsctl down` (pid 77)" in verdict.message
    assert "while the run was training" in verdict.message
    # A launcher that down stopped before any trainer started: no evidence at all, still down's doing.
    assert judge([], count=1, down=down, phase="provisioning").status == "interrupted"


def test_what_a_trainer_recorded_before_down_asked_still_decides():
    down = DownRequest(pid=77, at=200.0)
    failed = [Trainer(0, 1, error={"kind": "runtime", "message": "boom", "wall": 150.0})]
    assert judge(failed, count=1, down=down).status == "failed"
    signalled = [Trainer(0, 0, end("signal", 10, wall=150.0, signal="SIGINT"))]
    assert judge(signalled, count=1, down=down).status == "failed"
    # Every trainer had finished its job when down came: the job was done.
    assert judge([Trainer(0, None, end("steps", 1500, wall=150.0))], count=1, down=down).status == "succeeded"


def test_errors_the_user_must_fix_are_bad_input_and_other_exits_are_failures():
    user = judge([Trainer(0, 2, error={"kind": "user", "message": "trainer.command: no such program"})], count=1)
    assert user.status == "failed" and user.user and user.message == "trainer.command: no such program"
    killed = judge([Trainer(0, -9, ending="was killed by the kernel's out-of-memory killer")], count=1)
    assert killed.status == "failed" and "out-of-memory" in killed.message
    after_end = judge([Trainer(0, 1, end("steps", 10))], count=1, steps=10)
    assert after_end.status == "failed" and "ended its loop (steps, 10 batches) but then exited with code 1" in \
        after_end.message


def test_a_trainer_nothing_saw_end_and_that_did_not_finish_is_interrupted():
    """`dsctl down` closing a run whose `dsctl up` is gone, with no request file (a full disk refused it)."""
    verdict = judge([Trainer(0, None, end("closed", 5)), Trainer(1, None)], count=2)
    assert verdict.status == "interrupted" and "trainer 0 ended (closed, 5 batches)" in verdict.message
    stopped = judge([Trainer(0, None, end("signal", 5, signal="SIGTERM"))], count=1, steps=100)
    assert stopped.status == "interrupted" and "stopped by SIGTERM after step 5 of 100" in stopped.message


def test_the_down_request_is_a_file_in_the_run_dir(tmp_path):
    assert down_requested(tmp_path) is None
    request_down(tmp_path)
    request = down_requested(tmp_path)
    assert request is not None and request.pid > 0 and request.at > 0
    request_down(tmp_path / "missing")  # a run dir that cannot be written: no error, the teardown goes on
