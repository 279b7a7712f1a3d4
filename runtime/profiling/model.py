"""TensorFlow's autotune model of a running pipeline, read as snapshots and summed per transformation.

`tf.data.experimental.get_model_proto(iterator)` returns the model the iterator keeps for autotuning:
one node per live iterator, each with its own (self) processing time, elements produced and bytes
consumed and produced, all cumulative since the node was made. Two facts shape this module:

- Iterators come and go. A `repeat` makes its input's iterators anew every epoch and an interleave
  makes one per input element; the model forgets a node when its iterator ends, with all it counted.
  So the window is sampled often (every few tens of milliseconds; a snapshot costs well under a
  millisecond) and counted per *place in the tree* (a path such as Root/Prefetch/BatchV2/ParallelMapV2):
  every node seen at a path adds what it counted while seen.
- What a node counted after its last snapshot is still lost. Its consumer, which lives on, counted
  every byte it received; so each path's counts are scaled by (bytes its consumer received) ÷ (bytes
  seen produced below it) when that is above 1 (`correction`, reported per transformation). Per-element
  figures (time and bytes per element) are what was seen, and need no scaling.

Pure code over `NodeSample`s: `read` is the only function that touches a proto (duck-typed, so tests
build samples without TensorFlow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# tensorflow/core/framework/model.proto NodeClass
INTERLEAVE_MANY, ASYNC_INTERLEAVE_MANY = 1, 2
ASYNC_CLASSES = {2, 4, 6}  # ASYNC_INTERLEAVE_MANY, ASYNC_KNOWN_RATIO, ASYNC_UNKNOWN_RATIO
MAX_CORRECTION = 50.0  # beyond this the snapshots saw too little to scale from; the row says so


@dataclass(frozen=True)
class NodeSample:
    """One node of one snapshot (counts cumulative since the node's iterator was made)."""

    id: int
    name: str
    node_class: int
    inputs: tuple[int, ...]
    processing_ns: int
    elements: int
    bytes_in: int
    bytes_out: int
    buffered_elements: int = 0
    parameters: tuple[tuple[str, float, bool], ...] = ()  # (name, value, tunable)


def read(proto) -> tuple[int, dict[int, NodeSample]]:
    """(the output node's id, every node) of a ModelProto."""
    nodes = {}
    for nid, n in proto.nodes.items():
        nodes[int(nid)] = NodeSample(
            id=int(nid), name=n.name, node_class=int(n.node_class), inputs=tuple(int(i) for i in n.inputs),
            processing_ns=int(n.processing_time), elements=int(n.num_elements), bytes_in=int(n.bytes_consumed),
            bytes_out=int(n.bytes_produced), buffered_elements=int(n.buffered_elements),
            parameters=tuple((p.name, float(p.value), bool(p.tunable)) for p in n.parameters))
    return int(proto.output), nodes


@dataclass
class PathTotal:
    """Everything seen at one place in the tree over the window."""

    path: str
    name: str
    node_class: int
    parent: str | None
    inner: bool
    position: tuple[int, ...]  # input positions from the root: orders the rows
    self_ns: float = 0.0
    elements: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    parameters: tuple[tuple[str, float, bool], ...] = ()
    buffered_elements: int = 0
    instances: int = 0
    correction: float = 1.0
    newest: int = -1  # the newest node id seen here (its parameters and buffer are reported)

    def param(self, name: str) -> tuple[float, bool] | None:
        for n, v, t in self.parameters:
            if n == name:
                return v, t
        return None


@dataclass
class _Place:
    path: str
    parent: str | None
    inner: bool
    position: tuple[int, ...]


def places(output: int, nodes: dict[int, NodeSample]) -> dict[int, _Place]:
    """Where each node reachable from the output sits: its path, its consumer's path, whether it is an
    interleave's per-element iterator. An interleave's or flat_map's inputs after the first are such
    iterators: they share one path (their name, starred); a zip's inputs after the first get their position."""
    out: dict[int, _Place] = {}
    if output not in nodes:
        return out
    root = nodes[output]
    out[output] = _Place(root.name, None, False, ())
    stack = [output]
    while stack:
        nid = stack.pop()
        node, here = nodes[nid], out[nid]
        interleave = node.node_class in (INTERLEAVE_MANY, ASYNC_INTERLEAVE_MANY)
        for i, child in enumerate(node.inputs):
            if child not in nodes or child in out:
                continue
            inner = interleave and i >= 1
            name = nodes[child].name
            if inner:
                key, pos = f"{name}*", 1
            else:  # a zip's later inputs by position; the first has none, as it has while the others are made
                key, pos = (name if i == 0 else f"{name}[{i}]"), i
            out[child] = _Place(f"{here.path}/{key}", here.path, inner or here.inner, (*here.position, pos))
            stack.append(child)
    return out


@dataclass
class Tracker:
    """Sums what each place in the tree counted between `start` and the last `observe`."""

    base: dict[int, NodeSample] = field(default_factory=dict)  # counts at the window's start
    last: dict[int, NodeSample] = field(default_factory=dict)
    where: dict[int, _Place] = field(default_factory=dict)
    started: bool = False

    def start(self, output: int, nodes: dict[int, NodeSample]) -> None:
        self.base = dict(nodes)
        self.last = dict(nodes)
        self.where = places(output, nodes)
        self.started = True

    def observe(self, output: int, nodes: dict[int, NodeSample]) -> None:
        for nid, place in places(output, nodes).items():
            self.where.setdefault(nid, place)
        self.last.update(nodes)

    def totals(self) -> list[PathTotal]:
        """One total per path, corrected, in pipeline order (sources first, the root last)."""
        by_path: dict[str, PathTotal] = {}
        for nid, place in self.where.items():
            node = self.last[nid]
            base = self.base.get(nid)
            total = by_path.get(place.path)
            if total is None:
                total = by_path[place.path] = PathTotal(place.path, node.name, node.node_class, place.parent,
                                                        place.inner, place.position)
            total.self_ns += node.processing_ns - (base.processing_ns if base else 0)
            total.elements += node.elements - (base.elements if base else 0)
            total.bytes_in += node.bytes_in - (base.bytes_in if base else 0)
            total.bytes_out += node.bytes_out - (base.bytes_out if base else 0)
            total.instances += 1
            if nid > total.newest:
                total.newest, total.parameters = nid, node.parameters
                total.buffered_elements = node.buffered_elements
        correct(by_path)
        return pipeline_order(by_path)


def correct(by_path: dict[str, PathTotal]) -> None:
    """Scale each path below a consumer by (bytes the consumer received) ÷ (bytes seen produced below it), top
    down, when that is above 1: what iterators counted after their last snapshot (module docstring)."""
    children: dict[str | None, list[PathTotal]] = {}
    for t in by_path.values():
        children.setdefault(t.parent, []).append(t)
    todo = list(children.get(None, []))
    while todo:
        parent = todo.pop()
        kids = children.get(parent.path, [])
        seen = sum(k.bytes_out for k in kids)
        factor = 1.0
        if seen > 0 and parent.bytes_in > seen:
            factor = min(parent.bytes_in / seen, MAX_CORRECTION)
        for kid in kids:
            if factor != 1.0:
                kid.correction = factor
                kid.self_ns *= factor
                kid.elements *= factor
                kid.bytes_in *= factor
                kid.bytes_out *= factor
            todo.append(kid)


def pipeline_order(by_path: dict[str, PathTotal]) -> list[PathTotal]:
    """Post-order: a transformation's inputs before it, real inputs before an interleave's inner iterators."""
    children: dict[str | None, list[PathTotal]] = {}
    for t in by_path.values():
        children.setdefault(t.parent, []).append(t)
    for kids in children.values():
        kids.sort(key=lambda t: t.position)
    out: list[PathTotal] = []

    def visit(t: PathTotal) -> None:
        for kid in children.get(t.path, []):
            visit(kid)
        out.append(t)

    for root in children.get(None, []):
        visit(root)
    return out


def elements_in(total: PathTotal, by_parent: dict[str, list[PathTotal]]) -> float:
    """Elements a transformation received: from its inner iterators for an interleave, else from its inputs."""
    kids = by_parent.get(total.path, [])
    if total.node_class in (INTERLEAVE_MANY, ASYNC_INTERLEAVE_MANY):
        kids = [k for k in kids if k.position[-1:] == (1,) and k.path.endswith("*")]
    return sum(k.elements for k in kids)
