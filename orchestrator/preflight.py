"""Checks that need the user's code: do the entrypoints import and return what they should?

Run before anything is provisioned, so a typo in `module:function` is an exit-2
error pointing at the spec line, not a trainer failing on a cluster.
"""

from __future__ import annotations

from dsctl.specs import LoadedSpec


def check_entrypoints(loaded: LoadedSpec) -> None:
    spec = loaded.spec
    if spec.pipeline.entrypoint or spec.trainer.model.kind == "python":
        from dsctl.runtime.tfimport import import_tensorflow_quietly

        import_tensorflow_quietly()  # user modules import it; keep its notices off the terminal
    if spec.pipeline.entrypoint:
        from dsctl.runtime.pipelines import load_entrypoint_dataset
        from dsctl.runtime.pipelines.errors import PipelineError

        try:
            load_entrypoint_dataset(spec.pipeline.entrypoint, spec.pipeline.params, loaded.base_dir)
        except PipelineError as exc:
            raise loaded.error(("pipeline", "entrypoint"), str(exc)) from None
    if spec.trainer.model.kind == "python":
        from dsctl.runtime.models import ModelError, make_step

        try:
            make_step(spec.trainer.model, loaded.base_dir)
        except ModelError as exc:
            raise loaded.error(("trainer", "model", "entrypoint"), str(exc).split(": ", 1)[-1]) from None
