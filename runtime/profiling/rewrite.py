"""A sequential `map` made parallel in the dataset's graph, to measure what `num_parallel_calls` would give.

tf.data service ships a pipeline to its workers as a GraphDef; this does what a worker does with it
(`DatasetFromGraph`), after changing one node: MapDataset becomes ParallelMapDatasetV2 with the same
function, inputs and attributes, plus the number of parallel calls. TensorFlow's own map_parallelization
makes the same change, but only for stateless functions; a function with a stateful op (a stateful random
op, a nested dataset's `get_single_element`) stays sequential however the options are set, and only the
user's code can change it. This lets `dsctl profile` measure that change before the user makes it.

The graph's dataset nodes, walked post-order from its output, are the pipeline's Python chain in the same
order (chain.walk), so a chain index names the node.
"""

from __future__ import annotations

import re

DATASET_OP = re.compile(r"Dataset(V\d+)?$")


def _source(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def dataset_nodes(graph) -> list:
    """The graph's dataset nodes, post-order from its output (inputs first)."""
    by_name = {n.name: n for n in graph.node}
    retval = next(n for n in graph.node if n.op == "_Retval")
    out: list = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        node = by_name.get(_source(name))
        if node is None or node.name in seen or not DATASET_OP.search(node.op):
            return
        seen.add(node.name)
        for i in node.input:
            visit(i)
        out.append(node)

    visit(retval.input[0])
    return out


def parallelize(ds, chain_index: int, parallelism: int):
    """`ds` with its sequential map at `chain_index` run with `parallelism` parallel calls (-1: AUTOTUNE)."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2, types_pb2

    graph = graph_pb2.GraphDef()
    policy = tf.data.experimental.ExternalStatePolicy.WARN
    graph.ParseFromString(ds._as_serialized_graph(external_state_policy=policy).numpy())
    nodes = dataset_nodes(graph)
    if not 0 <= chain_index < len(nodes) or nodes[chain_index].op != "MapDataset":
        found = nodes[chain_index].op if 0 <= chain_index < len(nodes) else "nothing"
        raise ValueError(f"chain step {chain_index} is {found} in the graph, not a sequential MapDataset")
    node = nodes[chain_index]
    const = graph.node.add()
    const.name = f"dsctl_parallel_calls_{chain_index}"
    const.op = "Const"
    const.attr["dtype"].type = types_pb2.DT_INT64
    const.attr["value"].tensor.dtype = types_pb2.DT_INT64
    const.attr["value"].tensor.tensor_shape.SetInParent()
    const.attr["value"].tensor.int64_val.append(int(parallelism))
    node.op = "ParallelMapDatasetV2"
    node.input.append(const.name)
    if "force_synchronous" in node.attr:
        del node.attr["force_synchronous"]
    node.attr["deterministic"].s = b"default"
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
    return tf.data.experimental.from_variant(variant, ds.element_spec)
