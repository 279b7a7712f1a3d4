"""Hybrid placement (service.placement: hybrid): the spec rules that refuse what cannot work with it, at validate with
the field's line (unit); and real runs, whose trainers start tf.data service workers in their own processes and
record the batches they received by producing process (slow)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from dsctl.provisioners import load_deployment
from dsctl.specs import SpecError, load_spec
from helpers import TINY_KERAS_MODEL, dsctl, write_spec

HYBRID = "service: {workers: 1, placement: hybrid, local_workers: 1}\n"
BASE = """\
name: hybrid
{service}trainer: {{steps: 20}}
pipeline: {{builtin: text, params: {{epochs: null}}}}
{extra}"""

# (id, service line(s), extra top-level lines, the line the error is on, its field, what it must say)
REFUSED = [
    ("local-workers-without-hybrid", "service: {workers: 1, local_workers: 2}\n", "", 2, "service.local_workers",
     ["only service.placement: hybrid", "silently ignored"]),
    ("hybrid-without-local-workers", "service:\n  placement: hybrid\n", "", 3, "service.placement",
     ["needs service.local_workers: 1 or more"]),
    ("hybrid-with-zero-local-workers", "service:\n  placement: hybrid\n  local_workers: 0\n", "", 4,
     "service.local_workers", ["needs service.local_workers: 1 or more"]),
    ("hybrid-with-coordinated-reads",
     "service:\n  placement: hybrid\n  local_workers: 1\n  job_name: j\n"
     "  coordinated_reads: {num_consumers: 1, bucket_boundaries: [8]}\n", "", 6, "service.coordinated_reads",
     ["ignores target_workers", "other trainers' in-process workers"]),
    ("hybrid-with-cross-trainer-cache",
     "service:\n  placement: hybrid\n  local_workers: 1\n  job_name: j\n  cross_trainer_cache: true\n", "", 6,
     "service.cross_trainer_cache", ["read by its own trainer only"]),
    ("hybrid-with-static-sharding", "service:\n  placement: hybrid\n  local_workers: 1\n  processing_mode: data\n",
     "", 5, "service.processing_mode", ["static sharding", "parallel_epochs or distributed_epoch"]),
    ("hybrid-with-autoscale", HYBRID, "autoscale: {max_workers: 4}\n", 5, "autoscale",
     ["autoscaling cannot be combined with service.placement: hybrid"]),
    ("placement-typo", "service: {placement: hybird, local_workers: 1}\n", "", 2, "service.placement",
     ["'remote', 'hybrid' or 'auto'"]),
    ("auto-with-another-policy", "service: {placement: auto, local_workers: 2}\n", "autoscale: {policy: cachew}\n",
     5, "autoscale.policy", ["placed by the pecan policy", "remote workers only"]),
    ("pecan-without-auto", "", "autoscale: {policy: pecan}\n", 4, "autoscale.policy",
     ["service.placement: auto turns on (now remote)"]),
    ("auto-with-distributed-epoch", "service: {placement: auto, local_workers: 1, processing_mode: distributed_epoch}\n",
     "", 2, "service.processing_mode", ["in-flight splits would be lost"]),
    ("auto-on-gcp", "provider: gcp\nservice:\n  placement: auto\n  local_workers: 1\n", "", 4, "service.placement",
     ["service.placement: auto is not yet available with provider: gcp", "cannot change their in-process workers"]),
]


@pytest.mark.parametrize("case_id, service, extra, line, field, needles", REFUSED, ids=[c[0] for c in REFUSED])
def test_what_cannot_work_with_hybrid_placement_is_refused_at_its_line(tmp_path, case_id, service, extra, line,
                                                                      field, needles):
    path = tmp_path / "job.yaml"
    path.write_text(BASE.format(service=service, extra=extra))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: {field}: "), message
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"


def test_placement_is_remote_unless_asked_and_hybrid_loads_with_what_it_works_with(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(BASE.format(service="", extra=""))
    svc = load_spec(plain).spec.service
    assert (svc.placement, svc.local_workers) == ("remote", 0)
    hybrid = tmp_path / "hybrid.yaml"
    hybrid.write_text(BASE.format(service="service:\n  placement: hybrid\n  local_workers: 3\n  job_name: shared\n"
                                          "  processing_mode: distributed_epoch\n", extra=""))
    svc = load_spec(hybrid).spec.service
    assert (svc.placement, svc.local_workers, svc.processing_mode) == ("hybrid", 3, "distributed_epoch")


# -- real runs --------------------------------------------------------------------------------------------------------

def _events(run_dir: Path, trainer: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics" / f"trainer-{trainer}.jsonl").read_text().splitlines()]


def _placements(home: Path, run_id: str, trainers: int) -> tuple[list[dict], list[str], set[str]]:
    """Each trainer's placement record, each trainer's process and the remote workers' processes, as "host:pid"."""
    run_dir = home / "runs" / run_id
    host = socket.gethostname()
    records, trainer_procs = [], []
    for i in range(trainers):
        events = _events(run_dir, i)
        records.append(next(e for e in events if e["event"] == "placement"))
        trainer_procs.append(f"{host}:{next(e for e in events if e['event'] == 'start')['pid']}")
    remote = {f"{host}:{n.pid}" for n in load_deployment(run_dir).nodes if n.role == "worker"}
    return records, trainer_procs, remote


def _one_hybrid_trainer_read_both(home: Path, spec: Path, steps: int, remote_workers: int, local_workers: int) -> dict:
    """Run a one-trainer hybrid job: it trains its steps, and its placement record counts batches from its own
    process and from the remote workers, from no other process, and at least every batch trained. Its run record."""
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    assert record["status"] == "succeeded" and record["summary"]["batches"] == steps
    [rec], [own], remote = _placements(home, record["id"], 1)
    assert len(remote) == remote_workers and rec["local_workers"] == local_workers and rec["process"] == own
    assert set(rec["by_producer"]) <= {own, *remote}, rec
    assert rec["local_batches"] > 0 and rec["remote_batches"] > 0, rec
    assert rec["local_batches"] + rec["remote_batches"] >= steps, rec
    return record


@pytest.mark.slow
def test_two_hybrid_trainers_each_read_their_own_and_the_remote_workers_never_each_others(home, tmp_path):
    """Two trainers of dsctl's harness, one in-process worker each, one remote worker, parallel_epochs (every worker
    serves every trainer's job). Each trainer trains its steps and its placement record counts batches from its own
    process and from the remote worker, and from no other process. Reading with target_workers ANY instead of AUTO
    (runtime/placement.py TARGET_WORKERS) makes each trainer read the other's in-process worker too: the assertion
    `set(record["by_producer"]) <= {own, *remote}` fails, naming the other trainer's process; so does starting the
    in-process workers untagged (worker_tags=[]). The run is a few seconds long because a client learns of a task on
    a worker that registered after its job began only at its next heartbeat (about a second): in 80 steps neither
    bug showed."""
    spec = write_spec(tmp_path, """
        name: hybrid-two
        service: {workers: 1, processing_mode: parallel_epochs, placement: hybrid, local_workers: 1}
        trainer: {count: 2, model: {step_time_ms: 10}, steps: 400, warmup_batches: 2}
        pipeline: {builtin: synthetic, params: {elements: 4096, shards: 16, batch_size: 8, latency_ms: 1, epochs: null}}
    """)
    record = json.loads(dsctl("up", spec, "--json", check=True).stdout)
    assert record["status"] == "succeeded" and record["summary"]["batches"] == 800
    placements, trainers, remote = _placements(home, record["id"], 2)
    assert len(remote) == 1 and not remote & set(trainers)
    for own, rec in zip(trainers, placements):
        assert rec["local_workers"] == 1 and rec["process"] == own
        assert set(rec["by_producer"]) <= {own, *remote}, f"{own} read another trainer's worker: {rec['by_producer']}"
        assert rec["local_batches"] == rec["by_producer"].get(own, 0) > 0, rec
        assert rec["remote_batches"] > 0, rec
        assert rec["local_batches"] + rec["remote_batches"] >= 400  # every batch trained was counted (plus prefetched)
    # The run's record (runs show --json) keeps them, and prices the pipeline by where it ran: local workers are
    # never counted as remote ones (the record's workers, and what the workers are charged for, are the remote one).
    shown = json.loads(dsctl("runs", "show", record["id"], "--json", check=True).stdout)["summary"]
    kept = shown["placement"]
    assert (kept["placement"], kept["local_workers"]) == ("hybrid", 1)
    assert [t["by_producer"] for t in kept["trainers"]] == [p["by_producer"] for p in placements]
    assert kept["local_batches"] == sum(p["local_batches"] for p in placements)
    assert kept["remote_batches"] == sum(p["remote_batches"] for p in placements)
    assert shown["local_cpu_source"].startswith("estimated: ") and shown["local_cpu_cores"] > 0
    [row] = json.loads(dsctl("cost", "report", record["id"], "--format", "json", check=True).stdout)
    assert row["n_workers"] == 1 and row["local_workers"] == 1 and row["n_trainers"] == 2
    assert row["remote_preprocessing"] == row["workers"] + row["dispatcher"] == shown["cost"]["remote_preprocessing"]
    assert 0 < row["local_preprocessing"] < row["trainer_cpu"]
    assert row["local_cpu_source"] == shown["cost"]["local_cpu_source"] == shown["local_cpu_source"]


HYBRID_PROGRAM = """
from dsctl import train
ds = train.dataset()
for batch in train.batches(ds):
    pass
"""


@pytest.mark.slow
def test_a_hybrid_program_trains_its_steps_from_its_in_process_and_remote_workers(home, tmp_path):
    """A user's program (trainer.command, reading with dsctl.train) with two in-process workers and two remote ones:
    it trains its steps, and its placement record shows batches from its own process and from the remote workers."""
    (tmp_path / "train.py").write_text(HYBRID_PROGRAM)
    spec = write_spec(tmp_path, """
        name: hybrid-cmd
        service: {workers: 2, processing_mode: distributed_epoch, placement: hybrid, local_workers: 2}
        trainer: {command: python train.py, steps: 60, warmup_batches: 2, timeout_s: 120}
        pipeline: {builtin: synthetic, params: {elements: 100000, shards: 64, batch_size: 8, latency_ms: 1,
                                                epochs: null}}
    """)
    _one_hybrid_trainer_read_both(home, spec, steps=60, remote_workers=2, local_workers=2)


@pytest.mark.slow
def test_a_hybrid_keras_trainer_fits_from_its_in_process_and_remote_workers(home, tmp_path):
    """dsctl's Keras runner (model.fit) with one in-process and one remote worker: it trains its steps, its placement
    record (written when fit ends, before the process exits) counts batches from its own process and from the remote
    worker and from no other, and the run's summary carries the model's own step time per batch."""
    (tmp_path / "tiny.py").write_text(TINY_KERAS_MODEL)
    spec = write_spec(tmp_path, """
        name: hybrid-keras
        service: {workers: 1, placement: hybrid, local_workers: 1}
        trainer: {steps: 60, warmup_batches: 2, model: {kind: keras, entrypoint: "tiny:build_model"}}
        pipeline: {builtin: synthetic, params: {feature_size: 8, label_classes: 4, batch_size: 16, latency_ms: 1,
                                                epochs: null}}
    """)
    record = _one_hybrid_trainer_read_both(home, spec, steps=60, remote_workers=1, local_workers=1)
    assert next(e for e in _events(home / "runs" / record["id"], 0) if e["event"] == "start")["strategy"]
    step_ms = record["summary"]["model_step_s"] * 1e3
    assert step_ms > 0
    shown = dsctl("runs", "show", record["id"], check=True).stdout
    assert any("model step" in line and f"{step_ms:,.2f} ms" in line for line in shown.splitlines()), shown


# -- the trainer host's cores (orchestrator/localworkers.py) -----------------------------------------------------------

GCP_HYBRID = """\
name: hybrid-vm
provider: gcp
service:
  workers: 2
  placement: hybrid
  local_workers: {local}
trainer: {{machine: {machine}, steps: 20}}
pipeline: {{builtin: synthetic, params: {{epochs: null}}}}
gcp: {{project: my-project-123, zone: us-central1-b}}
"""


def _loaded(tmp_path, text):
    from dsctl.orchestrator.preflight import load_job

    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path, (lambda: load_job(path, check_entrypoints=False))


def test_in_process_workers_a_trainer_vm_has_no_vcpus_for_are_refused_at_their_line(tmp_path):
    """e2-standard-2: 2 vCPUs, one left to the training step, so one in-process worker fits and two do not."""
    path, load = _loaded(tmp_path, GCP_HYBRID.format(local=2, machine="e2-standard-2"))
    with pytest.raises(SpecError) as info:
        load()
    message = str(info.value)
    assert message.startswith(f"{path}:6: service.local_workers: "), message
    assert "e2-standard-2 (2 vCPUs)" in message and "at most 1 fit" in message
    assert "Use service.local_workers: 1 or fewer" in message, message
    _, load = _loaded(tmp_path, GCP_HYBRID.format(local=1, machine="e2-standard-2"))
    assert not [w for w in load().warnings if "local_workers" in str(w)]


def test_a_tpu_vm_takes_as_many_in_process_workers_as_its_vcpus_leave_the_step(tmp_path):
    """tpu-v2-8: 96 vCPUs; the schema's cap (64) fits, and nothing is said."""
    _, load = _loaded(tmp_path, GCP_HYBRID.format(local=64, machine="tpu-v2-8"))
    assert not [w for w in load().warnings if "local_workers" in str(w)]


LOCAL_PINNED = """\
name: hybrid-here
service: {{workers: 1, placement: hybrid, local_workers: {local}}}
trainer: {{count: {count}, cpus: {cpus}, steps: 20}}
pipeline: {{builtin: synthetic, params: {{epochs: null}}}}
"""


def test_local_trainers_sharing_too_few_cores_are_warned_with_what_fits(tmp_path):
    """Local trainers share this machine's cores (here trainer.cpus: [0]): in-process workers beyond them are a
    warning at service.local_workers saying how many fit, and the spec still loads (a slow run, not a broken one)."""
    path, load = _loaded(tmp_path, LOCAL_PINNED.format(local=2, count=1, cpus="[0]"))
    [warning] = [w for w in load().warnings if "local_workers" in str(w)]
    text = str(warning)
    assert text.startswith(f"{path}:2: service.local_workers: "), text
    assert "2 in-process worker(s) (2 in each of 1 trainer process(es))" in text and "the 1 core(s) of trainer.cpus" in text
    assert "at most 0 per trainer" in text and "Use placement: remote" in text, text


def test_the_local_check_counts_every_trainer_on_the_cores_they_share(tmp_path):
    """Pinned to cores 0 and 1 (every machine running these tests has them): one trainer with one in-process worker
    fits (one core for its step, one for the worker); two trainers with one each do not (1 core each, for the step)."""
    _, load = _loaded(tmp_path, LOCAL_PINNED.format(local=1, count=1, cpus="[0, 1]"))
    assert not [w for w in load().warnings if "local_workers" in str(w)]
    _, load = _loaded(tmp_path, LOCAL_PINNED.format(local=1, count=2, cpus="[0, 1]"))
    [warning] = [w for w in load().warnings if "local_workers" in str(w)]
    assert "2 in-process worker(s) (1 in each of 2 trainer process(es))" in str(warning), str(warning)


def test_the_local_memory_check_counts_the_in_process_workers_and_names_local_workers(tmp_path):
    """A worker count that fits this machine's memory without in-process workers, and not with 64 in the trainer
    (64 x 64 MB: about 8 workers' worth): refused naming service.local_workers, with what fits. The margin (3 workers,
    1.5 GB) keeps the test steady while other work on the machine moves its free memory."""
    from dsctl.provisioners.local import LocalProvider, local_capacity

    fits = local_capacity(1)
    if fits < 12:
        pytest.skip(f"this machine has memory for {fits} local workers; the check needs room for 12")
    path = tmp_path / "job.yaml"
    path.write_text(BASE.format(service=f"service: {{workers: {fits - 3}, placement: hybrid, local_workers: 64}}\n",
                                extra=""))
    spec = load_spec(path).spec
    with pytest.raises(SpecError) as info:
        LocalProvider().check(spec, fits - 3, tmp_path)
    assert info.value.field == "service.local_workers", str(info.value)
    message = str(info.value)
    assert f"{fits - 3} workers and 64 in-process worker(s) in each of 1 trainer(s) do not fit" in message, message
    local_fit = int(message.split("Use service.local_workers: ")[1].split()[0])
    assert 0 <= local_fit < 64 and f"or fewer beside {fits - 3} workers, or at most" in message, message
    LocalProvider().check(spec.model_copy(update={"service": spec.service.model_copy(
        update={"placement": "remote", "local_workers": 0})}), fits - 3, tmp_path)  # without them, they fit


def test_a_local_dry_run_says_the_in_process_workers_each_trainer_starts(tmp_path):
    from dsctl.orchestrator.up import UpOptions, approved

    said: list[str] = []

    class Talk:
        def say(self, text: str) -> None:
            said.append(text)

    path = tmp_path / "job.yaml"
    path.write_text(BASE.format(service="service: {workers: 2, placement: hybrid, local_workers: 3}\n", extra=""))
    assert approved(load_spec(path), UpOptions(path=path, dry_run=True), Talk()) is False  # type: ignore[arg-type]
    assert said == ["provider local: 2 worker process(es), 1 trainer(s), each with 3 in-process worker(s) "
                    "(service.local_workers) on this machine; nothing bills. Nothing was started."], said
