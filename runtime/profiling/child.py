"""The profiling process: a spec's pipeline run here as one tf.data service worker would run it.

    python -m dsctl.runtime.profiling.child --spec spec.json --base-dir DIR --cache-dir DIR --out results.jsonl

It imports TensorFlow once and answers requests, one JSON object a line on stdin, each with an `id`:

    {"cmd": "inspect"}                                   -> the pipeline's Structure (refuses py_function)
    {"cmd": "measure", "variant": {...}, "seconds": S, "warmup_s": W}   -> a Measurement of that Variant
    {"cmd": "steps"}                                     -> each reorderable section's steps run alone
    {"cmd": "quit"}

Answers go to the --out file, one JSON object a line: {"id", "event": "result", "data"}, {"id", "event":
"error", "kind": "user" | "internal", "message"}, and {"event": "progress", ...} while it measures. The
user's pipeline may print: stdout and stderr are the process's log, never the answers. The orchestrator
(orchestrator/profiling/process.py) runs it in a cgroup of its own and ends it, and all it started, when
the profile ends.

Like a worker, it runs the graph the spec's pipeline builds, with the spec's options and its parallelism as
configured, the builtin's or the user's code; unlike a worker it also sees the Python objects, which name
the transformations. A finite pipeline is repeated, so that the measurement is of its steady state.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import traceback
from pathlib import Path

from .record import Hint, SectionInfo, Structure, Variant, to_json, variant_from

WARMUP_S = 2.0


def op_message(exc) -> str:
    """A TensorFlow error's message without its wrapping: function nodes, op names, trailing `name:`."""
    text = " ".join(str(getattr(exc, "message", exc)).split())
    node = re.search(r"\[\[\{\{node ([^}]+)\}\}\]\]", text)
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*|\[\[\{\{node [^}]*\}\}\]\]|\[Op:[^\]]*\]|\s*name:\s*$", "", text).strip()
    text = re.sub(r"Error in user-defined function passed to (\w+?)Dataset:\d+ transformation with iterator: \S+: ",
                  lambda m: f"in the function of a {m.group(1).lower()}: ", text)
    return (text[:500] + (f" (in op {node.group(1)})" if node else "")).strip()


class UserError(Exception):
    """The pipeline's fault (it fails, calls Python, produces nothing): one paragraph for the user."""


class Profiler:
    def __init__(self, spec, base_dir: Path, cache_dir: Path, out: Path):
        self.spec, self.base_dir, self.cache_dir = spec, base_dir, cache_dir
        self.out = open(out, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        self.chain: list | None = None  # the as-written chain's steps, which label what the model measures
        self.sections = None
        self.cache_root = out.parent / "profile-cache"  # scratch caches, removed after each measurement
        self.scratch = 0

    def _cached_hint(self) -> str | None:
        """The hint the spec's autocache.mode names, if it names one (the job caches there)."""
        ac = self.spec.autocache
        return ac.mode if ac is not None and ac.mode not in ("auto", "compute", "profile") else None

    def emit(self, **record) -> None:
        self.out.write(json.dumps(record) + "\n")

    # -- building ----------------------------------------------------------------------------------------------
    def build(self, variant: Variant):
        """(dataset as measured, its Python dataset objects, the autocache plan, the reorder plan, whether the
        pipeline ends: it is then repeated here)."""
        from dsctl.runtime import autocache, reorder
        from dsctl.runtime.pipelines import PipelineError, is_infinite
        from dsctl.runtime.pipelines.spec_pipeline import build_spec_pipeline

        from .chain import walk

        p = self.spec.pipeline
        update: dict = {}
        if variant.options is not None:
            update["options"] = variant.options
        if variant.order:
            update["order"] = {**(p.order or {}), **variant.order}
        spec = self.spec.model_copy(update={"pipeline": p.model_copy(update=update)}) if update else self.spec
        hint = variant.cache or self._cached_hint()
        if variant.replay:
            plan = autocache.Plan(mode=autocache.REPLAY + variant.replay)
        elif hint:  # as a job caches: the first epoch writes a snapshot, later ones read it
            self.scratch += 1
            plan = autocache.Plan(mode=hint, cache_root=str(self.cache_root / str(self.scratch)))
        else:
            plan = autocache.Plan(mode="profile")
        sections = reorder.Plan()
        try:
            with autocache.active(plan):
                ds = build_spec_pipeline(spec, cache_dir=self.cache_dir, base_dir=self.base_dir, plan=sections)
        except PipelineError as exc:
            raise UserError(exc.message) from None
        wanted = variant.replay or hint
        if wanted and wanted not in plan.points:
            raise UserError(f"the pipeline has no autocache hint {wanted!r}; its hints are: "
                            f"{', '.join(plan.points) or 'none'}")
        finite = not is_infinite(ds)
        if finite:
            ds = ds.repeat()
        objects = walk(ds)
        if variant.parallelize is not None:
            from .rewrite import parallelize

            ds = parallelize(ds, *variant.parallelize)
        return ds, objects, plan, sections, finite

    # -- requests ----------------------------------------------------------------------------------------------
    def inspect(self) -> dict:
        import tensorflow as tf

        from .chain import py_function_use, python_chain

        ds, objects, plan, sections, finite = self.build(Variant())
        uses = py_function_use(ds)
        if uses:
            raise UserError(f"the pipeline calls Python ({uses}: tf.py_function, tf.numpy_function or "
                            "Dataset.from_generator). tf.data service workers receive the dataset's graph, not the "
                            "Python it calls, so they cannot run it (TensorFlow issue #50252), and dsctl does not "
                            "profile what no worker could run. Express that step with TensorFlow ops.")
        _, chain = python_chain(ds)
        if finite:  # the repeat build() added is not the pipeline's own
            last = chain[-1]
            chain[-1] = type(last)(**{**last.__dict__, "label": "repeat() (added: the profile repeats a finite pipeline)"})
        self.chain = list(chain)
        self.sections = sections
        hints = []
        for name, hinted in plan.points.items():
            index = next((i for i, o in enumerate(objects) if o is hinted), None)
            if index is not None:
                hints.append(Hint(name=name, after_index=index, cardinality=int(hinted.cardinality())))
        options = ds.options()
        opt = options.experimental_optimization
        defaults = opt.apply_default_optimizations is not False
        structure = Structure(
            chain=tuple(chain), hints=tuple(hints),
            sections=tuple(SectionInfo(name=s.name, written=tuple(s.written), used=tuple(s.used))
                           for s in sections.sections.values()),
            map_parallelization=opt.map_parallelization if opt.map_parallelization is not None else defaults,
            inject_prefetch=opt.inject_prefetch if opt.inject_prefetch is not None else defaults,
            autotune=options.autotune.enabled is not False, finite=finite,
            element=str(tf.nest.map_structure(lambda s: f"{s.dtype.name}{list(s.shape)}", ds.element_spec)))
        return to_json(structure)

    def measure(self, request: dict, rid) -> dict:
        import tensorflow as tf

        from .measure import ModelUnavailable, measure

        if self.chain is None:
            self.inspect()
        variant = variant_from(request.get("variant") or {})
        seconds = float(request.get("seconds", 5.0))
        warmup = float(request.get("warmup_s", WARMUP_S))
        ds = self.build(variant)[0]

        def progress(phase: str, done: float, total: float, batches: int) -> None:
            self.emit(event="progress", id=rid, label=variant.label, phase=phase, done=done, total=total,
                      batches=batches)

        notes: tuple[str, ...] = ()
        if variant.cache or self._cached_hint():
            notes += (f"cached at the autocache hint {variant.cache or self._cached_hint()!r} as a job does: the warm-up "
                      "wrote one epoch into a snapshot, the window read it (a scratch folder, removed after)",)
        try:
            try:
                m = measure(ds, label=variant.label, seconds=seconds, warmup_s=warmup,
                            consumer_step_s=variant.consumer_step_s, chain=self.chain, progress=progress)
            except ModelUnavailable:
                options = tf.data.Options()
                options.autotune.enabled = True
                notes = ("the pipeline's options turn autotuning off, and TensorFlow keeps its per-transformation "
                         "model only with it on: measured with autotuning on (parallelism set to AUTOTUNE may differ)",)
                m = measure(ds.with_options(options), label=variant.label, seconds=seconds, warmup_s=warmup,
                            consumer_step_s=variant.consumer_step_s, chain=self.chain, progress=progress, notes=notes)
        except StopIteration:
            raise UserError("the pipeline produced no element: it is empty (a filter that keeps nothing, no input "
                            "files, a take(0)), so there is nothing to profile.") from None
        except tf.errors.OpError as exc:
            raise UserError(f"the pipeline failed while dsctl ran it: {type(exc).__name__}: {op_message(exc)}") from None
        finally:
            shutil.rmtree(self.cache_root, ignore_errors=True)
        return to_json(m)

    def steps(self) -> dict:
        from .steps import measure_steps

        if self.sections is None:
            self.inspect()
        assert self.sections is not None, "inspect() sets it"
        measured, refused = [], []
        for section in self.sections.sections.values():
            found, cannot = measure_steps(section)
            measured += [to_json(s) for s in found]
            refused += [f"{section.name}.{c}" for c in cannot]
        return {"steps": measured, "refused": refused}

    def serve(self, requests) -> None:
        self.emit(event="ready", pid=os.getpid())
        for line in requests:
            if not line.strip():
                continue
            request = json.loads(line)
            rid, cmd = request.get("id"), request.get("cmd")
            if cmd == "quit":
                return
            try:
                if cmd == "inspect":
                    data = self.inspect()
                elif cmd == "measure":
                    data = self.measure(request, rid)
                elif cmd == "steps":
                    data = self.steps()
                else:
                    raise ValueError(f"unknown request {cmd!r}")
                self.emit(id=rid, event="result", data=data)
            except UserError as exc:
                self.emit(id=rid, event="error", kind="user", message=str(exc))
            except Exception as exc:  # noqa: BLE001 - reported whole, the process goes on answering
                traceback.print_exc()
                self.emit(id=rid, event="error", kind="internal", message=f"{type(exc).__name__}: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsctl-profile-child", description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--base-dir", required=True)
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dsctl.specs.schema import JobSpec

    spec = JobSpec.model_validate_json(Path(args.spec).read_text())
    profiler = Profiler(spec, Path(args.base_dir), Path(args.cache_dir), Path(args.out))
    profiler.serve(sys.stdin)
    profiler.out.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the user's pipeline may have started threads that would keep the process alive
