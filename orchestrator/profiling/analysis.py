"""From one measured window to the profile's table, what bounds throughput, and the workers a job needs.

Pure arithmetic over the profiling process's records (runtime/profiling/record.py); every rule is here:

- CPU per transformation is TensorFlow's self time (its own code on a thread, its inputs excluded). That
  is CPU time while the thread has a core; with more busy threads than cores (a busy machine, parallel
  calls on two cores) it also holds the time they waited for one, and then the self times add up to more
  than the CPU the OS counted. Each is then scaled by (CPU ÷ self times), the same for all: the waiting
  falls on every busy thread alike. `self_coverage` says how far they were apart; where they add up to
  less, the rest is CPU no transformation holds (the reading loop, tf.data's own threads): `outside`.
- CPU per element is per element the transformation *produced* (a filter that keeps one in four costs four
  inputs' CPU per element); inflation is bytes produced ÷ bytes consumed (AutoOrder's ratio: above 1 it
  inflates the data, below 1 it shrinks it).
- What bounds throughput is found by operational analysis (the utilization law Plumber uses): each
  resource's utilization is batches/s × its time per batch ÷ its servers. The resources are the CPU (the
  process's cores), each thread that runs synchronous transformations one after another (the consumer's,
  each prefetch's and parallel transformation's input thread), and each parallel transformation's calls.
  The busiest one bounds it; a transformation in a busy thread that holds most of its time is named.
- The worker formula is TensorFlow's dispatcher's (auto_scaler.h): workers = ⌈consumers' batches/s ÷ one
  worker's batches/s⌉. One worker's rate is the least of its limits: its cores ÷ CPU-seconds per batch
  (CPU time measured here, not wall time: a process here on 2 shared cores says nothing of a worker's
  8), each sequential thread's 1 ÷ its time per batch, and each fixed-parallelism transformation's
  calls ÷ its time per batch (those do not grow with a worker's cores).
"""

from __future__ import annotations

import math

from dsctl.runtime.profiling.record import Measurement, OpMeasure

from .record import Bound, OpRow, Prediction, Rate

CPU_BOUND = 0.85  # the process used this share of its cores or more: CPU bounds throughput
CONSUMER = "consumer"


def scale_of(m: Measurement) -> tuple[float, float]:
    """(self_coverage, scale): TensorFlow's self times added up ÷ the OS's CPU, and the factor they get."""
    total = sum(op.self_s for op in m.ops) + m.root_self_s
    coverage = total / m.cpu_s if m.cpu_s > 0 else math.inf
    scale = min(1.0, m.cpu_s / total) if total > 0 else 1.0
    return coverage, scale


def threads(ops: tuple[OpMeasure, ...]) -> dict[str, str]:
    """Each transformation's thread: synchronous ones run on the thread that pulls from them (the consumer's,
    or the input thread of the nearest asynchronous transformation reading them); an asynchronous one's own
    work runs on its parallel calls (or its prefetch thread), named after it."""
    by_path = {op.path: op for op in ops}
    out: dict[str, str] = {}

    def thread(op: OpMeasure) -> str:
        if op.path in out:
            return out[op.path]
        if op.asynchronous:
            out[op.path] = f"calls:{op.path}"
            return out[op.path]
        parent = by_path.get(op.parent or "")
        if parent is None:
            out[op.path] = CONSUMER
        elif parent.asynchronous:
            out[op.path] = f"input:{parent.path}"
        else:
            out[op.path] = thread(parent)
        return out[op.path]

    for op in ops:
        thread(op)
    return out


def _servers(op: OpMeasure) -> float:
    """Parallel calls of an asynchronous transformation (1 for a prefetch's thread)."""
    return max(1.0, op.parallelism or 1.0)


def _thread_name(key: str, by_path: dict[str, OpMeasure]) -> str:
    if key == CONSUMER:
        return "consumer"
    kind, _, path = key.partition(":")
    label = by_path[path].label if path in by_path else path
    return f"parallel calls of {label}" if kind == "calls" else f"input thread of {label}"


def table(m: Measurement) -> tuple[list[OpRow], Rate]:
    """The profile's rows, in pipeline order, and the process's rate (see the module docstring)."""
    coverage, scale = scale_of(m)
    bps = m.batches_per_s
    batches = max(m.batches, 1)
    by_path = {op.path: op for op in m.ops}
    thread_of = threads(m.ops)
    # time per batch of every thread: synchronous work adds up on its thread; parallel calls divide by their number
    busy: dict[str, float] = {}
    for op in m.ops:
        t = thread_of[op.path]
        busy[t] = busy.get(t, 0.0) + (op.self_s + op.wait_s) / batches / (_servers(op) if t.startswith("calls:") else 1)
    util = {t: bps * per for t, per in busy.items()}
    cpu = {op.path: op.self_s * scale for op in m.ops}
    total_cpu = sum(cpu.values()) or 1.0
    cpu_util = m.cpu_s / (m.seconds * m.cores) if m.seconds > 0 and m.cores else 0.0
    busiest = max(util, key=lambda t: util[t], default=None)
    if cpu_util >= CPU_BOUND:
        bounding_op = max(m.ops, key=lambda op: cpu[op.path], default=None)
        bound = (f"CPU: the process used {m.cpu_s / m.seconds:.2f} of {m.cores} cores"
                 + (f"; {bounding_op.label} holds {cpu[bounding_op.path] / total_cpu:.0%} of it" if bounding_op else ""))
    elif busiest is not None and util[busiest] >= 0.5:
        in_it = [op for op in m.ops if thread_of[op.path] == busiest]
        bounding_op = max(in_it, key=lambda op: op.self_s + op.wait_s)
        bound = (f"the {_thread_name(busiest, by_path)} is busy {min(util[busiest], 1.0):.0%} of the time; "
                 f"{bounding_op.label} holds the most of it")
    else:
        bounding_op = None
        bound = (f"no transformation's thread is busy (the busiest {util[busiest]:.0%}) and the CPU is at "
                 f"{cpu_util:.0%}: the reader is" if busiest else "nothing measured")
        if m.consumer_step_s:
            bound += f" (it waits {m.consumer_step_s * 1e3:g} ms per batch, as the trainer's step)"
    rows = []
    for op in m.ops:
        t = thread_of[op.path]
        rows.append(OpRow(
            label=op.label, name=op.name, kind=op.kind, inner=op.inner,
            cpu_s_per_element=cpu[op.path] / op.elements_out if op.elements_out else None,
            cpu_s_per_batch=cpu[op.path] / batches, wait_s_per_batch=op.wait_s / batches,
            share=cpu[op.path] / total_cpu, elements_in=op.elements_in, elements_out=op.elements_out,
            bytes_in=op.bytes_in, bytes_out=op.bytes_out, inflation=op.bytes_out / op.bytes_in if op.bytes_in else None,
            parallelism=_parallelism(op), buffer=_buffer(op), thread=_thread_name(t, by_path),
            utilization=util[t], bound_bps=1.0 / busy[t] if busy[t] > 0 else None,
            bounds=bounding_op is not None and op.path == bounding_op.path, correction=op.correction))
    rate = Rate(seconds=m.seconds, batches=m.batches, batches_per_s=bps,
                examples_per_s=bps * m.examples_per_batch if m.examples_per_batch else None,
                cpu_s_per_batch=m.cpu_s / batches, wall_s_per_batch=m.seconds / batches, cores_here=m.cores,
                cores_used=m.cpu_s / m.seconds if m.seconds > 0 else 0.0, self_coverage=coverage, scale=scale,
                outside_cpu_s_per_batch=max(0.0, m.cpu_s - total_cpu) / batches if total_cpu else m.cpu_s / batches,
                bound=bound, batch_bytes=m.batch_bytes)
    return rows, rate


def _parallelism(op: OpMeasure) -> str:
    if op.parallelism is None:
        return "-"
    n = f"{op.parallelism:g}"
    if op.tunable:
        return f"{n} (autotuned)"
    return f"{n} (sequential)" if op.parallelism <= 1 else n


def _buffer(op: OpMeasure) -> str:
    if op.buffer_size is not None:
        return f"{op.buffer_size:g}"
    return str(op.buffered_elements) if op.asynchronous else "-"


# -- the worker formula --------------------------------------------------------------------------------------------

def worker_bounds(m: Measurement, cores_per_worker: int) -> list[Bound]:
    """One worker's limits on the spec's worker machine: its cores over CPU time per batch, each sequential
    thread's time per batch, each fixed-parallelism transformation's calls (module docstring)."""
    batches = max(m.batches, 1)
    cpu_per_batch = m.cpu_s / batches
    out = []
    if cpu_per_batch > 0:
        out.append(Bound("CPU", cores_per_worker / cpu_per_batch,
                         f"{cores_per_worker} cores ÷ {cpu_per_batch * 1e3:.3g} ms CPU per batch"))
    thread_of = threads(m.ops)
    by_path = {op.path: op for op in m.ops}
    sequential: dict[str, float] = {}
    for op in m.ops:
        t = thread_of[op.path]
        if t.startswith("calls:"):
            per = (op.self_s + op.wait_s) / batches
            if per <= 0:
                continue
            if op.parallelism is None:  # a prefetch's thread: one
                out.append(Bound(f"{op.label}'s thread", 1.0 / per, f"1 ÷ {per * 1e3:.3g} ms per batch"))
            elif not op.tunable:  # a fixed number of calls does not grow with the worker's cores
                out.append(Bound(f"{op.label}'s {op.parallelism:g} call(s)", op.parallelism / per,
                                 f"{op.parallelism:g} ÷ {per * 1e3:.3g} ms per batch"))
            elif op.wait_s > 0:  # autotuned calls that wait: up to one per core
                out.append(Bound(f"{op.label}'s calls", cores_per_worker / per,
                                 f"{cores_per_worker} calls ÷ {per * 1e3:.3g} ms per batch"))
            continue
        sequential[t] = sequential.get(t, 0.0) + (op.self_s + op.wait_s) / batches
    for t, per in sequential.items():
        if per > 0:
            out.append(Bound(_thread_name(t, by_path), 1.0 / per, f"1 ÷ {per * 1e3:.3g} ms per batch, one thread"))
    return out


def predict(m: Measurement, *, target_bps: float | None, target_source: str, worker_machine: str,
            cores_per_worker: int, here_cap: bool = False) -> Prediction:
    """Workers = ⌈target ÷ one worker's batches/s⌉, one worker's rate the least of its bounds."""
    bounds = worker_bounds(m, cores_per_worker)
    limit = min(bounds, key=lambda b: b.bps) if bounds else None
    per_worker = limit.bps if limit else math.inf
    cpu = next((b for b in bounds if b.what == "CPU"), None)
    shown = ", ".join(f"{b.what}: {b.how} = {b.bps:.3g}" for b in dict.fromkeys(x for x in (cpu, limit) if x))
    if target_bps is None or not math.isfinite(per_worker):
        workers = None
        formula = f"one worker: min({shown}) = {per_worker:.3g} batches/s"
    else:
        need = target_bps / per_worker
        workers = max(1, math.ceil(need - 1e-9))
        formula = (f"workers = ⌈ {target_bps:.3g} batches/s ÷ min({shown}) batches/s ⌉ = ⌈ {target_bps:.3g} ÷ "
                   f"{per_worker:.3g} ⌉ = ⌈ {need:.2f} ⌉ = {workers}")
    cap = None
    if here_cap and m.cpu_s > 0:
        cap = m.cores * max(m.batches, 1) / m.cpu_s
    return Prediction(target_bps=target_bps, target_source=target_source, worker_machine=worker_machine,
                      cores_per_worker=cores_per_worker, per_worker_bps=per_worker,
                      limit=limit.what if limit else "none", bounds=tuple(bounds), workers=workers, formula=formula,
                      here_cap_bps=cap)
