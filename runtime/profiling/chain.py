"""The pipeline as its Python objects show it, and its transformations matched to the autotune model's.

The autotune model names iterators (ParallelMapV2, MapAndBatch) after TensorFlow has optimized the graph:
a `map` without num_parallel_calls may have become parallel (map_parallelization), a map and the batch
after it one MapAndBatch, a prefetch added at the end (inject_prefetch). Users think in the code they
wrote, `map(_decode)` and `batch(32)`, so each model transformation gets the label of the Python
transformation it came from: both lists are walked in pipeline order (post-order, inputs first) and
matched by kind, a fused one taking two; what tf.data added keeps its own name. The Python chain is
also where dsctl reads what the model cannot tell: whether a sequential map's function is stateless
(so TensorFlow's map_parallelization may take it), and where the autocache hints and reorderable
sections sit.

`kind_of_model` and `align` are pure (unit-tested); the rest reads TensorFlow objects.
"""

from __future__ import annotations

import re
from typing import Any

from .record import ChainStep

PY_FUNCTION_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
NOT_STATEFUL = ("Assert",)  # stateful to the op registry, yet TensorFlow's own map_parallelization ignores it
LOOKAHEAD = 6  # Python steps an optimization may have removed between two matched ones


def kind_of_model(name: str, has_inputs: bool) -> tuple[str, ...]:
    """The Python kinds one autotune-model iterator stands for (two for a fused one)."""
    n = name.lower()
    table = (("mapandbatch", ("map", "batch")), ("shuffleandrepeat", ("shuffle", "repeat")),
             ("flatmap", ("flat_map",)), ("interleave", ("interleave",)), ("map", ("map",)),
             ("filter", ("filter",)), ("unbatch", ("other",)), ("batch", ("batch",)), ("prefetch", ("prefetch",)),
             ("repeat", ("repeat",)), ("shuffle", ("shuffle",)), ("zip", ("zip",)), ("take", ("take",)),
             ("skip", ("skip",)), ("snapshot", ("snapshot",)), ("cache", ("cache",)), ("sleep", ("sleep",)))
    for key, kinds in table:
        if key in n:
            return kinds
    return ("source",) if not has_inputs else ("other",)


def kind_of_python(class_name: str, has_inputs: bool) -> str:
    n = class_name.lower().lstrip("_")
    for key, kind in (("flatmap", "flat_map"), ("interleave", "interleave"), ("map", "map"), ("filter", "filter"),
                      ("unbatch", "other"), ("batch", "batch"), ("prefetch", "prefetch"), ("repeat", "repeat"),
                      ("shuffle", "shuffle"), ("zip", "zip"), ("take", "take"), ("skip", "skip"),
                      ("snapshot", "snapshot"), ("cache", "cache"), ("options", "options"), ("sleep", "sleep")):
        if key in n:
            return kind
    return "source" if not has_inputs else "other"


def align(model: list[tuple[str, tuple[str, ...]]], python: list[tuple[str, str]]) -> dict[str, tuple[int | None, str]]:
    """Match model transformations (path, kinds), in pipeline order, to Python steps (kind, label), in pipeline
    order: {path: (python index or None, label)}. A fused transformation takes as many steps as it has kinds;
    one no step matches within LOOKAHEAD (added by tf.data) keeps None and its TensorFlow name (the caller's)."""
    out: dict[str, tuple[int | None, str]] = {}
    j = 0
    for path, kinds in model:
        found = None
        for i in range(j, min(j + LOOKAHEAD, len(python))):
            if python[i][0] == kinds[0]:
                found = i
                break
        if found is None:
            continue
        labels, last = [python[found][1]], found
        for kind in kinds[1:]:
            nxt = next((i for i in range(last + 1, min(last + 1 + LOOKAHEAD, len(python))) if python[i][0] == kind), None)
            if nxt is not None:
                labels.append(python[nxt][1])
                last = nxt
        out[path] = (found, " + ".join(labels))
        j = last + 1
    return out


# -- reading TensorFlow objects ------------------------------------------------------------------------------------

def walk(ds) -> list[Any]:
    """The Python dataset objects of a pipeline, post-order (inputs first, in input order)."""
    out: list[Any] = []
    seen: set[int] = set()

    def visit(d) -> None:
        if id(d) in seen:
            return
        seen.add(id(d))
        try:
            inputs = list(d._inputs())
        except Exception:  # noqa: BLE001 - a dataset class without inputs (a source)
            inputs = []
        for i in inputs:
            visit(i)
        out.append(d)

    visit(ds)
    return out


def function_name(wrapper) -> str:
    """The user's function behind a tf.data function wrapper, as written (`_decode`, `lambda`, a class)."""
    fn = getattr(wrapper, "_func", None)
    name = getattr(fn, "__name__", None)
    if name:
        return "lambda" if name == "<lambda>" else name
    traced = getattr(getattr(wrapper, "function", None), "name", b"")
    traced = traced.decode() if isinstance(traced, bytes) else str(traced)
    m = re.match(r"__inference_Dataset_[a-z_]+?_(.+)_\d+$", traced)
    return m.group(1) if m else "fn"


def _number(tensor) -> int | None:
    try:
        return int(tensor.numpy()) if hasattr(tensor, "numpy") else int(tensor)
    except Exception:  # noqa: BLE001 - a symbolic or missing value: the label goes without it
        return None


def label_of(d, kind: str) -> str:
    """`map(_decode)`, `batch(32)`, `prefetch(AUTOTUNE)`, `TFRecordDataset`, ... for one Python dataset."""
    wrapper = getattr(d, "_map_func", None) or getattr(d, "_predicate", None)
    if kind in ("map", "filter", "flat_map", "interleave") and wrapper is not None:
        return f"{kind}({function_name(wrapper)})"
    if kind == "batch":
        n = _number(getattr(d, "_batch_size", None))
        return f"batch({n})" if n is not None else "batch"
    if kind in ("prefetch", "shuffle"):
        n = _number(getattr(d, "_buffer_size", None))
        return f"{kind}({'AUTOTUNE' if n == -1 else n})" if n is not None else kind
    if kind in ("repeat", "take", "skip"):
        n = _number(getattr(d, "_count", None))
        return f"{kind}()" if n in (None, -1) else f"{kind}({n})"
    if kind == "sleep":
        us = _number(getattr(d, "_sleep_microseconds", None))
        return f"sleep({us / 1000:g} ms)" if us is not None else "sleep"
    name = type(d).__name__.lstrip("_")
    return {"RangeDataset": "range", "TensorSliceDataset": "from_tensor_slices", "TensorDataset": "from_tensors",
            "RandomDataset": "random", "ZipDataset": "zip", "CacheDataset": "cache",
            "SnapshotDataset": "snapshot"}.get(name, name.removesuffix("V2"))


def stateful(wrapper) -> bool:
    """Whether a function has a stateful op (as TensorFlow's map_parallelization judges, Assert aside)."""
    graph = getattr(getattr(wrapper, "function", None), "graph", None)
    if graph is None:
        return True
    for op in graph.get_operations():
        if op.type in NOT_STATEFUL:
            continue
        if op.op_def.is_stateful:
            return True
    return False


def python_chain(ds) -> tuple[list[Any], list[ChainStep]]:
    """(the dataset objects, their steps), both post-order."""
    objects = walk(ds)
    steps = []
    for i, d in enumerate(objects):
        try:
            has_inputs = bool(list(d._inputs()))
        except Exception:  # noqa: BLE001 - as walk()
            has_inputs = False
        kind = kind_of_python(type(d).__name__, has_inputs)
        sequential = type(d).__name__.lstrip("_") == "MapDataset"
        wrapper = getattr(d, "_map_func", None)
        delay = _number(getattr(d, "_sleep_microseconds", None)) if kind == "sleep" else None
        steps.append(ChainStep(index=i, kind=kind, label=label_of(d, kind), sequential_map=sequential,
                               stateless=(not stateful(wrapper)) if sequential and wrapper is not None else None,
                               force_synchronous=bool(getattr(d, "_force_synchronous", False)),
                               delay_s=(delay or 0) / 1e6))
    return objects, steps


def py_function_use(ds) -> str | None:
    """Where the pipeline calls Python (tf.py_function, tf.numpy_function, from_generator), or None. tf.data
    service workers cannot run such a function: they receive the graph, not the Python it calls (#50252)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    policy = tf.data.experimental.ExternalStatePolicy.WARN
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    for node in graph.node:
        if node.op in PY_FUNCTION_OPS:
            return node.op
    for fn in graph.library.function:
        for node in fn.node_def:
            if node.op in PY_FUNCTION_OPS:
                m = re.match(r"__inference_Dataset_(map|filter|flat_map|interleave|[a-z_]+?)_(.+)_\d+$", fn.signature.name)
                return f"{node.op} in {m.group(1)}({m.group(2)})" if m else f"{node.op} in {fn.signature.name}"
    return None
