"""Rules that relate several spec fields; each error points at the line to change.

These encode what tf.data service in TensorFlow 2.21 requires, so a job fails
at `dsctl validate` rather than hanging on a cluster (see docs/spec-reference.md, "Rules").
"""

from __future__ import annotations

import os
import re

from .errors import Problems
from .places import places, quoted
from .schema import JobSpec
from .yamlsource import YamlSource

TPU_MACHINE_RE = re.compile(r"^tpu-v[0-9]+[a-z]*-[0-9]+$")


def _infinite(spec: JobSpec) -> bool | None:
    """True/False for builtin pipelines; None when only the runtime can tell (entrypoints)."""
    if spec.pipeline.builtin is None:
        return None
    return spec.pipeline.params.get("epochs") is None


def check_rules(spec: JobSpec, src: YamlSource) -> None:
    """Every rule is checked, and every problem found is reported (SpecErrors when there are several); each check
    stops at its own first problem."""
    problems = Problems()
    for check in (_check_pinning, _check_autoscale, _check_length, _check_source, _check_command, _check_model_kind,
                  _check_keras, _check_coordinated_reads, _check_cross_trainer_cache, _check_placement,
                  _check_gcp_rules):
        with problems.check():
            check(spec, src)
    problems.raise_any()


def _check_length(spec: JobSpec, src: YamlSource) -> None:
    """What ends the job: trainer.steps (a cap), trainer.duration_s, or, with neither, the pipeline's own end (an
    epoch program's own loop): then the pipeline must end."""
    trainer = spec.trainer
    if trainer.steps is not None and trainer.duration_s is not None:
        raise src.error(("trainer",), "give at most one of 'steps' (a cap on the training steps) or 'duration_s' "
                                      "(seconds to train); both were given.")
    if trainer.steps is None and trainer.duration_s is None and _infinite(spec):
        raise src.error(("trainer",), "give 'steps' (a number of training steps) or 'duration_s' (seconds to train): "
                        "the pipeline repeats forever (pipeline.params.epochs: null), so nothing else would end the "
                        "job. Or set pipeline.params.epochs, and the job (your program's epoch loop) ends with the "
                        "data.")


def _check_source(spec: JobSpec, src: YamlSource) -> None:
    pipe = spec.pipeline
    if (pipe.builtin is None) == (pipe.entrypoint is None):
        raise src.error(
            ("pipeline",),
            "give exactly one of 'builtin' (synthetic, images or text) or 'entrypoint' "
            "('package.module:function' returning a tf.data.Dataset); "
            + ("both were given." if pipe.builtin else "neither was given."),
        )


def _check_model_kind(spec: JobSpec, src: YamlSource) -> None:
    trainer = spec.trainer
    if trainer.model.kind == "python" and not trainer.model.entrypoint:
        raise src.error(("trainer", "model", "kind"), "model kind 'python' needs 'entrypoint: package.module:function', "
                                                      "the step function called with each batch.")
    if trainer.model.kind == "synthetic" and trainer.model.entrypoint:
        raise src.error(("trainer", "model", "entrypoint"),
                        "an entrypoint is only used with 'kind: python' or 'kind: keras'; remove it or set the kind.")


def _check_coordinated_reads(spec: JobSpec, src: YamlSource) -> None:
    svc, trainer, pipe = spec.service, spec.trainer, spec.pipeline
    coord = svc.coordinated_reads
    if coord is None:
        return
    where = ("service", "coordinated_reads")
    if not svc.job_name:
        raise src.error(where, "coordinated reads need a shared 'service.job_name' so that all consumers read the same job.")
    if coord.num_consumers != trainer.count:
        raise src.error(
            where + ("num_consumers",),
            f"num_consumers is {coord.num_consumers} but trainer.count is {trainer.count}; they must be equal, "
            "because tf.data service blocks every consumer until all of them have read each round.",
        )
    if svc.processing_mode not in ("parallel_epochs", "off"):
        raise src.error(("service", "processing_mode"), "coordinated reads work only with processing_mode: parallel_epochs.")
    if _infinite(spec) is False:
        raise src.error(
            ("pipeline", "params", "epochs"),
            "coordinated reads need an infinite dataset; set 'epochs: null' and bound the job with trainer.steps "
            "or trainer.duration_s.",
        )
    if pipe.builtin not in (None, "text"):
        raise src.error(("pipeline", "builtin"),
                        "coordinated reads bucket sequences by length; use the 'text' builtin or your own entrypoint.")
    max_len = pipe.params.get("max_length")
    if max_len is not None and coord.bucket_boundaries[-1] >= max_len:
        raise src.error(
            where + ("bucket_boundaries",),
            f"the last bucket boundary ({coord.bucket_boundaries[-1]}) must be below pipeline.params.max_length ({max_len}).",
        )
    if svc.cross_trainer_cache:
        raise src.error(("service", "cross_trainer_cache"),
                        "cross-trainer cache and coordinated reads cannot be combined; choose one.")


def _check_cross_trainer_cache(spec: JobSpec, src: YamlSource) -> None:
    svc = spec.service
    if not svc.cross_trainer_cache:
        return
    if not svc.job_name:
        raise src.error(("service", "cross_trainer_cache"),
                        "the cross-trainer cache needs a shared 'service.job_name' naming the job the trainers share.")
    if svc.processing_mode not in ("parallel_epochs", "off"):
        raise src.error(("service", "processing_mode"),
                        "the cross-trainer cache works only with processing_mode: parallel_epochs.")
    if _infinite(spec) is False:
        raise src.error(
            ("pipeline", "params", "epochs"),
            "the cross-trainer cache needs an infinite dataset; set 'epochs: null' and bound the job with "
            "trainer.steps or trainer.duration_s.",
        )


STATIC_SHARDING = ("file", "data", "file_or_data", "hint")


def _check_placement(spec: JobSpec, src: YamlSource) -> None:
    """Hybrid placement reads with target_workers AUTO: the trainer's own in-process workers (tagged COLOCATED) and the
    untagged remote ones, never another trainer's (runtime/placement.py). What ignores that choice, or needs every
    worker known before the trainers start, cannot be combined with it."""
    svc = spec.service
    if svc.placement == "remote":
        if svc.local_workers:
            raise src.error(("service", "local_workers"),
                            f"local_workers ({svc.local_workers}) starts workers inside each trainer process, which only "
                            "service.placement: hybrid does; with placement: remote they would be silently ignored. Set "
                            "placement: hybrid, or remove local_workers.")
        return
    said = f"service.placement: {svc.placement}"
    if svc.local_workers < 1:
        raise src.error(("service", "local_workers") if "local_workers" in svc.model_fields_set else ("service", "placement"),
                        f"{said} runs the pipeline on workers inside each trainer process beside the remote ones, so it "
                        "needs service.local_workers: 1 or more (" + ("how many per trainer" if svc.placement == "hybrid"
                                                                       else "the most per trainer") +
                        "); with 0 it is placement: remote.")
    if svc.coordinated_reads is not None:
        raise src.error(("service", "coordinated_reads"),
                        f"coordinated reads cannot be combined with {said}: a coordinated read "
                        "ignores target_workers and takes each round from every worker in turn, so a trainer would "
                        "read the other trainers' in-process workers too (or wait on them). Use placement: remote "
                        "with coordinated reads, or remove coordinated_reads.")
    if svc.cross_trainer_cache:
        raise src.error(("service", "cross_trainer_cache"),
                        f"the cross-trainer cache cannot be combined with {said}: it shares each "
                        "worker's elements between the trainers reading it, and an in-process worker is read by its "
                        "own trainer only, so its cache would be filled for nobody else. Use placement: remote with "
                        "the cache, or remove cross_trainer_cache.")
    if svc.processing_mode in STATIC_SHARDING:
        raise src.error(("service", "processing_mode"),
                        f"processing_mode: {svc.processing_mode} is static sharding, which gives each worker its shard "
                        "by its place in a list of worker addresses fixed when the dispatcher starts; in-process "
                        "workers start later, with their trainers, at addresses not known then. Use parallel_epochs "
                        f"or distributed_epoch with {said}.")
    if svc.placement == "auto":
        _check_auto_placement(spec, src)
        return
    if spec.autoscale is not None:
        raise src.error(("autoscale",),
                        "autoscaling cannot be combined with service.placement: hybrid yet: its policies scale the "
                        "remote workers from measurements that do not tell the in-process workers' share apart. Use "
                        "placement: remote with autoscale, placement: auto (Pecan's policy scales both), or remove the "
                        "autoscale section and fix service.workers.")
    able = [name for name, place in places().items() if place.in_process_workers]
    if spec.provider not in able:
        raise src.error(("service", "placement"),
                        f"service.placement: hybrid is not yet available with provider: {spec.provider}, whose "
                        f"trainers do not start in-process workers; it runs with provider: {quoted(able)}. Use "
                        "placement: remote here.")


def _check_auto_placement(spec: JobSpec, src: YamlSource) -> None:
    """placement: auto is Pecan's policy changing the remote and the in-process worker counts while the job runs."""
    auto = spec.autoscale
    if auto is not None and auto.policy != "pecan":
        raise src.error(("autoscale", "policy"),
                        f"service.placement: auto is placed by the pecan policy, which scales the remote workers and "
                        f"the in-process ones together; autoscale.policy: {auto.policy} scales remote workers only. "
                        "Set autoscale.policy: pecan (or leave it out), or use placement: remote with "
                        f"{auto.policy}.")
    able = [name for name, place in places().items() if place.adjusts_local_workers]
    if spec.provider not in able:
        raise src.error(("service", "placement"),
                        f"service.placement: auto is not yet available with provider: {spec.provider}, whose trainers "
                        f"cannot change their in-process workers while they run; it runs with provider: "
                        f"{quoted(able)}. Use placement: hybrid with a fixed local_workers here.")


def _check_gcp_rules(spec: JobSpec, src: YamlSource) -> None:
    if spec.provider == "gcp":
        problems = Problems()
        for check in (_check_gcp, _check_gcp_autocache):
            with problems.check():
                check(spec, src)
        problems.raise_any()


def _check_gcp_autocache(spec: JobSpec, src: YamlSource) -> None:
    """Workers on other VMs write and read the cache, so it must be somewhere they all reach."""
    ac = spec.autocache
    if ac is None or ac.mode == "compute":
        return
    if not (ac.cache_dir or "").startswith("gs://"):
        raise src.error(("autocache", "cache_dir"),
                        "with provider: gcp each worker VM writes and reads the cache, so it must be a Cloud Storage "
                        "folder they all reach, e.g. gs://my-bucket/autocache.")


def _check_command(spec: JobSpec, src: YamlSource) -> None:
    """A command is the whole trainer: it brings its own model, so trainer.model is not given with it; trainer.env
    is the command's environment and means nothing without one."""
    trainer = spec.trainer
    if trainer.command is None:
        if trainer.framework != "tensorflow":
            raise src.error(("trainer", "framework"), f"framework: {trainer.framework} describes your own program "
                            "(trainer.command); dsctl's own trainers train with TensorFlow. Remove it, or give the "
                            "command.")
        if trainer.env:
            raise src.error(("trainer", "env"), "env sets environment variables for trainer.command, and this spec has "
                            "no command; remove env, or give the command that should see it.")
        return
    if "model" in trainer.model_fields_set:
        raise src.error(("trainer", "model"), "a trainer runs either dsctl's model (trainer.model) or your own command "
                        "(trainer.command), which trains its own model; remove one of them.")


def _check_keras(spec: JobSpec, src: YamlSource) -> None:
    """A keras model needs its builder and labels to learn from; params belong to keras models only, checkpoints to
    keras models and commands."""
    model, trainer, pipe = spec.trainer.model, spec.trainer, spec.pipeline
    if model.kind != "keras":
        if model.params:
            raise src.error(("trainer", "model", "params"), "params are the keyword arguments of a Keras model function; "
                            "they are only used with 'kind: keras'. Remove them or set kind: keras.")
        if trainer.checkpoint is not None and trainer.command is None:
            raise src.error(("trainer", "checkpoint"), "checkpoints save a training state, which a synthetic or python "
                            "model does not have: they are only used with 'trainer.model.kind: keras' or a "
                            "trainer.command. Remove the checkpoint section, train a keras model, or run your own "
                            "command.")
        return
    if not model.entrypoint:
        raise src.error(("trainer", "model", "kind"), "model kind 'keras' needs 'entrypoint: package.module:function', "
                        "a function that returns a compiled Keras model (called with trainer.model.params).")
    if model.step_time_ms or model.padded_token_time_us or model.phases:
        raise src.error(("trainer", "model"), "step_time_ms, padded_token_time_us and phases describe the synthetic "
                        "model; a keras model's step is the model's own. Remove them.")
    if trainer.checkpoint is not None and trainer.checkpoint.every_steps is None:
        raise src.error(("trainer", "checkpoint", "every_steps"), "this field is required for a keras model, which dsctl "
                        "saves every N steps (e.g. checkpoint: {dir: checkpoints, every_steps: 100}); a command saves "
                        "when it chooses, without it.")
    if pipe.builtin == "synthetic" and pipe.params.get("label_classes") is None:
        raise src.error(("pipeline", "params"), "the synthetic pipeline yields no label unless 'label_classes' is set "
                        "(e.g. label_classes: 10), and model.fit needs one; set it, or use the images or text builtin.")


def _check_gcp(spec: JobSpec, src: YamlSource) -> None:
    """What Google Cloud needs that field checks cannot see; project and zone may come from the
    environment, so they are checked when a run starts, not here."""
    gcp = spec.gcp
    if gcp is not None and gcp.dispatcher_port and gcp.dispatcher_port == gcp.worker_port:
        raise src.error(
            ("gcp", "worker_port"),
            f"the dispatcher and the workers both use port {gcp.worker_port}; give them different ports "
            "(or 0 to let each VM choose), because the firewall rule and the trainers address them separately.",
        )
    machine = spec.trainer.machine
    if machine.startswith("tpu") and not TPU_MACHINE_RE.match(machine):
        raise src.error(
            ("trainer", "machine"),
            f"'{machine}' is not a TPU VM type; TPU trainers are named like tpu-v2-8, tpu-v3-8, tpu-v4-8 or "
            "tpu-v5litepod-4 (tpu- followed by the accelerator type).",
        )
    if machine == "local":
        raise src.error(("trainer", "machine"), "with provider: gcp the trainer is a VM: name a TPU VM type (tpu-v2-8), "
                        "a GPU machine type (a2-highgpu-1g) or a CPU machine type (n2-standard-8).")
    _check_gcp_folders(spec, src)


def _check_gcp_folders(spec: JobSpec, src: YamlSource) -> None:
    """Checkpoints and event copies must outlive the run's VMs, which are deleted when it ends: Cloud Storage."""
    ck, board = spec.trainer.checkpoint, spec.trainer.tensorboard_dir
    if ck is not None and not ck.dir.startswith("gs://"):
        raise src.error(("trainer", "checkpoint", "dir"),
                        f"with provider: gcp checkpoints are written by the trainer VMs, which are deleted when the "
                        f"run ends, so a local folder ({ck.dir!r}) would be lost with them and the run could not be "
                        "resumed; give a Cloud Storage folder the VMs' service account can write, e.g. "
                        "gs://my-bucket/checkpoints.")
    if board is not None and not board.startswith("gs://"):
        raise src.error(("trainer", "tensorboard_dir"),
                        f"with provider: gcp the run's TensorBoard event files are written on its dispatcher VM, which "
                        f"is deleted when the run ends, so a local folder ({board!r}) would be lost with it; give a "
                        "Cloud Storage folder, e.g. gs://my-bucket/tensorboard.")


def _check_pinning(spec: JobSpec, src: YamlSource) -> None:
    """Core pinning (the way Cachew limits cores with taskset) exists only for local processes."""
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    for loc, cores in ((("service", "worker_cpus"), spec.service.worker_cpus), (("trainer", "cpus"), spec.trainer.cpus)):
        if cores is None:
            continue
        if spec.provider != "local":
            raise src.error(loc, "pinning to cores applies to the local provider only; remove it for provider: gcp.")
        missing = [c for c in cores if c not in available]
        if missing:
            raise src.error(loc, f"core(s) {missing} do not exist here; this machine has cores {available}.")


def _check_autoscale(spec: JobSpec, src: YamlSource) -> None:
    auto = spec.autoscale
    if auto is None:
        return
    if auto.policy == "pecan" and spec.service.placement != "auto":
        raise src.error(("autoscale", "policy"),
                        "the pecan policy places work on workers inside the trainer processes as well as remote ones, "
                        f"which service.placement: auto turns on (now {spec.service.placement}). Set "
                        "service.placement: auto and service.local_workers (the most per trainer), or choose "
                        "autoscale.policy: cachew or cpu.")
    if auto.max_workers < auto.min_workers:
        raise src.error(("autoscale", "max_workers"),
                        f"max_workers ({auto.max_workers}) is below min_workers ({auto.min_workers}).")
    if spec.service.processing_mode not in ("parallel_epochs", "off"):
        raise src.error(("service", "processing_mode"),
                        "autoscaling adds and removes workers while the job runs; with distributed_epoch a removed "
                        "worker's in-flight splits would be lost. Use processing_mode: parallel_epochs.")
    if spec.service.coordinated_reads is not None:
        raise src.error(("autoscale",),
                        "coordinated reads pin each round to one worker; autoscaling cannot be combined with them.")
    if _infinite(spec) is False:
        # Checked with TensorFlow 2.21: a parallel_epochs client of a finite dataset waits for every worker's
        # epochs to end, and a removed worker's never do, so the trainers hang at the end of the data.
        raise src.error(
            ("pipeline", "params", "epochs"),
            "autoscaling removes workers while the job runs, and a trainer reading a finite dataset waits for a "
            "removed worker's epochs to end, which never happens (and each added worker serves every epoch again). "
            "Set 'epochs: null' and bound the job with trainer.steps or trainer.duration_s.")
