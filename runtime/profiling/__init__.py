"""Measuring a spec's pipeline as a tf.data service worker runs it, for `dsctl profile`.

    record.py   the typed records the profiling process sends and is sent (no TensorFlow)
    model.py    TensorFlow's autotune model read into snapshots, summed per transformation (pure)
    chain.py    the pipeline's Python chain: kinds, labels, hints; matched to the model's transformations
    rewrite.py  a sequential map made parallel in the dataset's graph (to measure what the code change gives)
    measure.py  one measured window: warm-up, snapshots, CPU from the OS
    steps.py    each step of a reorderable section run alone (Pecan's AutoOrder profile)
    child.py    the profiling process: requests in on stdin, records out in a JSON-lines file

What is measured here are facts; what they mean (shares, bounds, workers, recommendations) is
decided by the orchestrator (orchestrator/profiling/).
"""
