"""A recorded process is recognised by pid and start time (provisioners/processes.py is_ours).

The start time psutil reports is the kernel's boot-relative start plus a boot time the kernel recomputes, in whole
seconds, on every read: after an NTP adjustment the same process reads a second off what was recorded. That must
still be the same process; a start time further off is another process that reuses the pid.
"""

from __future__ import annotations

import os

import psutil

from dsctl.provisioners import ProcessRef
from dsctl.provisioners.processes import is_ours


def recorded(shift_s: float) -> ProcessRef:
    """This process as a record would name it, its start time read with the boot time `shift_s` off."""
    return ProcessRef(pid=os.getpid(), pgid=os.getpgid(0), create_time=psutil.Process().create_time() + shift_s)


def test_a_start_time_read_with_the_boot_time_a_second_off_is_the_same_process():
    assert is_ours(recorded(0.0))
    assert is_ours(recorded(1.0)) and is_ours(recorded(-1.0))


def test_a_start_time_seconds_off_is_another_process_that_reuses_the_pid():
    assert not is_ours(recorded(5.0)) and not is_ours(recorded(-5.0))
    assert not is_ours(ProcessRef(pid=None, pgid=None, create_time=None))
