"""Model steps for experiments, used as `trainer.model: {kind: python, entrypoint: ...}`.

`cpu_step` stands for a training step whose host side needs the trainer's CPU (fig8): it burns
STEP_CPU_S of this thread's CPU time, however long that takes in wall time. On a core shared with
a colocated input pipeline the step therefore takes longer, as a real host-bound step would; the
synthetic model's sleep, by contrast, leaves the core free to the pipeline.
"""

from __future__ import annotations

import time

STEP_CPU_S = 0.020


def cpu_step(batch) -> None:
    end = time.thread_time() + STEP_CPU_S
    while time.thread_time() < end:
        pass
