"""The provider contract (provisioners/contract.py) as every provider must keep it, with real processes.

A provider's test module subclasses ProviderContract and says how to make the provider, how to kill one
of its server processes (as a crash would) and what of it is left running; the suite then walks one
deployment through its whole life: check, up, wait_ready, the state file read back as typed state,
trainers started and measured, a worker that dies reported by poll and restarted through the
orchestrator's supervisor, scaled up and down, sampled, and taken down by a new instance of the provider
from the state file alone (as `dsctl down` after `kill -9` of `dsctl up` does), with nothing left.
"""

from __future__ import annotations

import json
from pathlib import Path

from dsctl.orchestrator.supervision import Supervisor
from dsctl.provisioners import Deployment, Provider, TrainerLaunch, load_deployment
from dsctl.specs import LoadedSpec, load_spec
from helpers import wait_for, write_spec

JOB = """
name: contract
provider: {provider}
service: {{workers: 1}}
trainer: {{steps: 300, warmup_batches: 2, window_s: 0.5, model: {{step_time_ms: 5}}}}
pipeline: {{builtin: synthetic, params: {{elements: 64, batch_size: 4, epochs: null, latency_ms: 2}}}}
{extra}"""


class ProviderContract:
    """Subclass it as `TestX(ProviderContract)` and fill in the hooks."""

    spec_provider = "local"  # the spec's `provider:` (the suite drives the provider itself, whatever the spec names)
    extra_spec = ""  # more of the spec (e.g. a gcp: section)

    def provider(self) -> Provider:
        raise NotImplementedError

    def kill(self, dep: Deployment, role: str, index: int) -> None:
        """End that server's process abruptly (SIGKILL), as a crash would."""
        raise NotImplementedError

    def leftovers(self, dep: Deployment) -> list[str]:
        """What of the deployment still runs (or bills) after down: empty when nothing does."""
        raise NotImplementedError

    # -- the suite --------------------------------------------------------------------------------------------
    def loaded(self, tmp_path: Path) -> LoadedSpec:
        text = JOB.format(provider=self.spec_provider, extra=self.extra_spec)
        return load_spec(write_spec(tmp_path, text), check_entrypoints=False)

    def test_one_deployment_through_its_whole_life(self, home, tmp_path):
        p = self.provider()
        loaded = self.loaded(tmp_path)
        spec, events = loaded.spec, []
        sink = lambda kind, message: events.append((kind, message))  # noqa: E731
        run_dir = home / "runs" / "contract-1"
        run_dir.mkdir(parents=True)
        (run_dir / "spec.json").write_text(spec.model_dump_json())
        dep = Deployment(run_id="contract-1", provider=p.name, run_dir=str(run_dir))
        dep.save()
        try:
            p.check(spec, 2, loaded.base_dir)
            p.up(spec, dep, 1, sink)
            p.wait_ready(dep, sink)
            assert dep.dispatcher_address and [n.index for n in dep.by_role("worker")] == [0]

            # What `dsctl down` in a new process reads: the same nodes, their provider state typed by its codec.
            again = load_deployment(run_dir)
            assert [(n.role, n.index, n.address) for n in again.nodes] == [(n.role, n.index, n.address) for n in dep.nodes]
            assert all(type(n.state) is type(m.state) and n.state is not None for n, m in zip(again.nodes, dep.nodes))
            assert type(again.state) is type(dep.state)

            launch = TrainerLaunch(mode="service", spec_json=run_dir / "spec.json", metrics_dir=run_dir / "metrics",
                                   base_dir=loaded.base_dir, cache_dir=home / "cache", count=1)
            p.start_trainers(dep, launch, sink)
            [trainer] = dep.by_role("trainer")
            wait_for(lambda: Path(trainer.metrics).exists() and '"window"' in Path(trainer.metrics).read_text(),
                     timeout=120, what="the trainer's first window")

            # A worker that dies is reported by poll and restarted at its address by the supervisor.
            supervisor = Supervisor(p, dep, fault_tolerant=True, events=sink)
            address = dep.by_role("worker")[0].address
            self.kill(dep, "worker", 0)
            wait_for(lambda: supervisor.poll() and any(k == "worker-restarted" for k, _ in events), timeout=60,
                     what="the dead worker to be restarted")
            assert dep.by_role("worker")[0].address == address

            state = wait_for(lambda: (s := supervisor.poll()) and not s.running and s, timeout=180,
                             what="the trainer to finish")
            assert state.exit_codes == {0: 0}
            end = [json.loads(line) for line in Path(trainer.metrics).read_text().splitlines()][-1]
            assert end["event"] == "end" and end["batches"] == 300

            p.scale_workers(dep, 2, sink)
            assert len(dep.by_role("worker")) == 2
            assert any(s.role == "worker" for s in wait_for(lambda: p.sample(dep), timeout=10, what="a sample"))
            p.scale_workers(dep, 1, sink)
            assert len(dep.by_role("worker")) == 1
            assert isinstance(p.log_tail(dep, dep.by_role("worker")[0]), str)
            p.stop_trainers(dep)
        except BaseException:
            p.down(dep, sink)
            raise
        # Down from the state file alone, by a new instance: nothing of the run is left.
        type(p)().down(load_deployment(run_dir), sink)
        assert load_deployment(run_dir).status == "down"
        assert self.leftovers(load_deployment(run_dir)) == []
