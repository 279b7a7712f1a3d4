"""Data-path efficiency on the paper's input shape (issue 16), every figure measured in this one run.

    python benchmarks/bench_data_path.py [--quick] [--seconds 20] [--rounds 2] [--out data-path.json]

The `images` builtin at the shape of the paper's ResNet50 input (256-pixel JPEGs, random
224 crop, flip, batch 64), read as fast as the machine allows (a 0 ms model step), in these
configurations:
  - colocated: the pipeline on the trainer (`dsctl up --mode colocated`);
  - service with 1 and 2 workers through dsctl (`dsctl up`);
  - the same service through the raw tf.data service API, with no dsctl: a DispatchServer
    and WorkerServers with TensorFlow's defaults, each a process of its own started here, and
    a client that iterates `distribute(...)` of the same dataset graph (the pipeline's own
    `build` and `finish`) and only counts batches;
for both transfer dtypes (uint8, float32) and, for 1 worker, compression AUTO beside none
and two fixed client buffers (max_outstanding_requests) beside TensorFlow's autotuning.

Every process's CPU time is read here with psutil every 0.1 s, and the bytes on the
loopback interface of the run's network namespace from /proc/<pid>/net/dev; both are
interpolated to the trainer's own measured window (after the warm-up batches), so CPU-seconds
per batch, bytes per batch and batches/s cover the same batches. dsctl's runs also report
the CPU of `dsctl up` (metrics tailing, psutil sampling, supervision) and of its launcher,
per second. (Thread names do not show where the CPU goes: TensorFlow's threads inherit
"python" or "grpcpp_sync_ser"; docs/performance.md has `perf` profiles per role.)

The full run (two rounds of 20 s windows, medians reported) takes about 16 minutes on 2 cores;
--quick (under 2 minutes) runs colocated, and 1 worker through dsctl and the raw API, for both
dtypes, one round of 6 s windows; it skips 2 workers, compression and fixed buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import psutil

PAPER_SHAPE = {"image_size": 256, "crop_size": 224, "batch_size": 64, "num_files": 8, "images_per_file": 64,
               "epochs": None}
CACHEW = "1.3-1.5x (Cachew, paper)"
PROCESS_POLL_S = 0.1
OUTSTANDING = (2, 8)  # client buffers tried beside TensorFlow's autotuned default (full run only)


# -- sampling -------------------------------------------------------------------------------------------


def _lo_bytes(pid: int) -> int | None:
    """Bytes received on loopback in `pid`'s network namespace (each byte sent on lo is received once)."""
    try:
        for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Series:
    """One process's CPU seconds (and its namespace's loopback bytes) over time."""

    t: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def at(self, when: float) -> float | None:
        """Linear interpolation; past either end, extrapolated from the two nearest samples."""
        if not self.t:
            return None
        if len(self.t) == 1:
            return self.cpu[0]
        i = max(1, min(len(self.t) - 1, next((k for k, x in enumerate(self.t) if x >= when), len(self.t) - 1)))
        t0, t1, c0, c1 = self.t[i - 1], self.t[i], self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (when - t0) / (t1 - t0) if t1 > t0 else c1


class Sampler:
    """Polls the CPU time of the processes `discover()` names, in a thread of the benchmark's own."""

    def __init__(self, discover):
        self.discover = discover  # () -> ({key: pid}, namespace pid or None)
        self.series: dict[str, Series] = {}
        self.lo = Series()
        self._procs: dict[tuple[str, int], psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids, netns_pid = self.discover()
            now = time.time()
            for key, pid in pids.items():
                proc = self._procs.get((key, pid))
                try:
                    if proc is None:
                        proc = self._procs[(key, pid)] = psutil.Process(pid)
                    t = proc.cpu_times()
                except psutil.Error:
                    continue
                s = self.series.setdefault(key, Series())
                s.t.append(now)
                s.cpu.append(t.user + t.system)
            if netns_pid:
                got = _lo_bytes(netns_pid)
                if got is not None:
                    self.lo.t.append(now)
                    self.lo.cpu.append(got)
            self._stop.wait(PROCESS_POLL_S)


# -- one measured configuration ---------------------------------------------------------------------------


@dataclass
class Config:
    runner: str  # dsctl | raw
    mode: str  # colocated | service
    workers: int
    dtype: str  # uint8 | float32
    compression: str | None = None
    outstanding: int | None = None  # the client's max_outstanding_requests; None: TensorFlow's autotuning

    @property
    def label(self) -> str:
        where = "colocated" if self.mode == "colocated" else f"service {self.workers}w"
        comp = f" {self.compression}" if self.compression else ""
        mor = f" mor={self.outstanding}" if self.outstanding else ""
        return f"{where} {self.dtype}{comp}{mor} ({self.runner})"

    def params(self, cache: Path) -> dict:
        return {**PAPER_SHAPE, "transfer_dtype": self.dtype, "cache_dir": str(cache)}


ROLES = ("dispatcher", "worker", "trainer")


def measure(cfg: Config, sampler: Sampler, start: float, end: float, batches: int, isolated: bool) -> dict:
    """Per role: CPU-seconds per batch in [start, end]; bytes per batch on loopback; batches/s."""
    cpu: dict[str, float] = {}
    for key, s in sampler.series.items():
        a, b = s.at(start), s.at(end)
        if a is not None and b is not None:
            role = key.split("-")[0]
            cpu[role] = cpu.get(role, 0.0) + (b - a)
    seconds = end - start
    lo = (sampler.lo.at(end) - sampler.lo.at(start)) if cfg.mode == "service" and len(sampler.lo.t) >= 2 else None
    data_path = sum(cpu.get(r, 0.0) for r in ROLES)
    dsctl_own = cpu.get("up", 0.0) + cpu.get("launcher", 0.0)
    return {
        "label": cfg.label, "config": cfg.__dict__, "batches": batches, "seconds": seconds,
        "batches_per_s": batches / seconds,
        "cpu_s_per_batch": {r: cpu.get(r, 0.0) / batches for r in ROLES},
        "data_path_cpu_s_per_batch": data_path / batches,
        "all_cpu_s_per_batch": (data_path + dsctl_own) / batches,
        "supervision_cores": {"up": cpu.get("up", 0.0) / seconds, "launcher": cpu.get("launcher", 0.0) / seconds},
        "wire_bytes_per_batch": lo / batches if lo is not None else None,
        "tensor_bytes_per_batch": PAPER_SHAPE["batch_size"] * (224 * 224 * 3 * (1 if cfg.dtype == "uint8" else 4) + 8),
        "isolated_loopback": isolated or cfg.mode == "colocated",  # colocated sends nothing
    }


def _events(path: Path) -> dict:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["event"], rec)
    return out


def run_dsctl(cfg: Config, home: Path, cache: Path, seconds: float, warmup: int) -> dict:
    spec = {
        "name": "bench-data-path",
        "service": {"workers": max(cfg.workers, 1), "compression": cfg.compression, "max_outstanding_requests": cfg.outstanding},
        "trainer": {"duration_s": seconds, "warmup_batches": warmup, "model": {"step_time_ms": 0}},
        "pipeline": {"builtin": "images", "params": cfg.params(cache)},
    }
    path = home / "spec.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    runs = home / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    env = {**os.environ, "DSCTL_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "dsctl.cli.main", "up", str(path), "--mode", cfg.mode, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    run_dir: list[Path] = []

    def discover():
        if not run_dir and runs.exists():
            run_dir.extend(set(runs.iterdir()) - before)
        pids = {"up": proc.pid}
        netns = None
        if run_dir:
            try:
                state = json.loads((run_dir[0] / "state.json").read_text())
            except (OSError, ValueError):
                state = {"nodes": []}
            for n in state["nodes"]:
                if n.get("pid") and n["role"] in ("launcher", *ROLES):
                    pids[f"{n['role']}-{n['index']}"] = n["pid"]
                    if n["role"] == "launcher":
                        netns = n["pid"]
        return pids, netns

    with Sampler(discover) as sampler:
        out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"dsctl up failed for {cfg.label}:\n{err[-3000:]}")
    ev = _events(run_dir[0] / "metrics" / "trainer-0.jsonl")
    isolation = json.loads((run_dir[0] / "launcher" / "isolation.json").read_text()).get("isolated", False) \
        if (run_dir[0] / "launcher" / "isolation.json").exists() else False
    end = ev["end"]
    result = measure(cfg, sampler, ev["measure_start"]["wall"], end["wall"], end["measured_batches"], isolation)
    result["dsctl_summary_batches_per_s"] = json.loads(out)["summary"].get("batches_per_s")
    return result


def run_raw(cfg: Config, home: Path, cache: Path, seconds: float, warmup: int) -> dict:
    """The raw API in a network namespace of its own (as dsctl's runs are), so loopback counts only its bytes."""
    work = Path(tempfile.mkdtemp(prefix="raw-", dir=home))
    conf = {**cfg.__dict__, "params": cfg.params(cache), "seconds": seconds, "warmup": warmup, "work": str(work)}
    cmd = [sys.executable, __file__, "_raw-group", json.dumps(conf)]
    isolated = bool(shutil.which("unshare")) and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    if isolated:
        cmd = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    def discover():
        try:
            pids = json.loads((work / "pids.json").read_text())
        except (OSError, ValueError):
            pids = {}
        return pids, (proc.pid if isolated else None)

    with Sampler(discover) as sampler:
        _, err = proc.communicate()
    ev = _events(work / "client.jsonl")
    if proc.returncode != 0 or "end" not in ev:
        raise SystemExit(f"the raw run failed for {cfg.label}:\n{err[-3000:]}")
    end = ev["end"]
    return measure(cfg, sampler, ev["measure_start"]["wall"], end["wall"], end["batches"], isolated)


# -- the raw tf.data service API, no dsctl: processes of this file ----------------------------------------


def _raw_group(conf: dict) -> None:
    """Start a DispatchServer, the WorkerServers and the client, as separate processes (TensorFlow's default
    configs); stop the servers after the client."""
    work = Path(conf["work"])
    me = [sys.executable, __file__]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    pids, servers = {}, []
    log = open(work / "servers.log", "w")
    try:
        d = subprocess.Popen([*me, "_raw-dispatcher", str(work / "port")], env=env, stdout=log, stderr=log)
        servers.append(d)
        pids["dispatcher-0"] = d.pid
        (work / "pids.json").write_text(json.dumps(pids))
        while not (work / "port").exists():
            if d.poll() is not None:
                raise SystemExit("the raw dispatcher exited")
            time.sleep(0.05)
        conf["dispatcher"] = address = f"localhost:{(work / 'port').read_text()}"
        for i in range(conf["workers"]):
            w = subprocess.Popen([*me, "_raw-worker", address], env=env, stdout=log, stderr=log)
            servers.append(w)
            pids[f"worker-{i}"] = w.pid
        client = subprocess.Popen([*me, "_raw-client", json.dumps(conf)], env=env, stdout=log, stderr=log)
        pids["trainer-0"] = client.pid
        (work / "pids.json").write_text(json.dumps(pids))
        code = client.wait()
    finally:
        for s in servers:
            s.send_signal(signal.SIGKILL)
            s.wait()
    if code != 0:
        log.flush()
        sys.stderr.write((work / "servers.log").read_text()[-3000:])
        raise SystemExit(code)


def _raw_dispatcher(port_file: str) -> None:
    import tensorflow as tf

    server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=0))
    Path(port_file + ".tmp").write_text(server.target.rsplit(":", 1)[1])
    os.replace(port_file + ".tmp", port_file)
    server.join()


def _raw_worker(dispatcher: str) -> None:
    import tensorflow as tf

    server = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher))
    server.join()


def _raw_client(conf: dict) -> None:
    """Count batches of the same graph dsctl builds (the builtin's build + finish), with a bare loop."""
    import tensorflow as tf

    from dsctl.runtime.pipelines import images
    from dsctl.specs.pipelines import ImagesParams

    p = ImagesParams.model_validate(conf["params"])
    ds = images.build(p, conf["params"]["cache_dir"]).apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=f"grpc://{conf['dispatcher']}", compression=conf["compression"],
        max_outstanding_requests=conf["outstanding"]))
    it = iter(images.finish(ds, p))
    for _ in range(conf["warmup"]):
        next(it)
    with open(Path(conf["work"]) / "client.jsonl", "w") as out:
        out.write(json.dumps({"event": "measure_start", "wall": time.time()}) + "\n")
        out.flush()
        n, deadline = 0, time.perf_counter() + conf["seconds"]
        while time.perf_counter() < deadline:
            next(it)
            n += 1
        out.write(json.dumps({"event": "end", "wall": time.time(), "batches": n}) + "\n")
    os._exit(0)  # destroying a service iterator waits on its outstanding requests


# -- the report ---------------------------------------------------------------------------------------------


def configs(quick: bool) -> list[list[Config]]:
    """Groups run back to back; a dsctl configuration and its raw twin are neighbours."""
    groups = []
    for dtype in ("uint8", "float32"):
        groups.append([Config("dsctl", "colocated", 0, dtype)])
        for workers in ((1,) if quick else (1, 2)):
            groups.append([Config("dsctl", "service", workers, dtype), Config("raw", "service", workers, dtype)])
    if not quick:
        for dtype in ("uint8", "float32"):
            groups.append([Config("dsctl", "service", 1, dtype, "AUTO")])
        groups += [[Config("dsctl", "service", 1, "uint8", outstanding=n)] for n in OUTSTANDING]
    return groups


def prepare(cache: Path) -> None:
    """Generate the TFRecords once, in a child (the benchmark's own process stays free of TensorFlow)."""
    code = ("import sys, json; from dsctl.runtime.pipelines import prepare_data; "
            "prepare_data('images', json.loads(sys.argv[1]), cache_dir=sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, json.dumps({**PAPER_SHAPE, "cache_dir": str(cache)}), str(cache)],
                   check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _med(results: list[dict], get) -> float | None:
    vals = [get(r) for r in results]
    vals = [v for v in vals if v is not None]
    return median(vals) if vals else None


def summarize(by_label: dict[str, list[dict]]) -> dict[str, dict]:
    """Medians over rounds, figure by figure."""
    out = {}
    for label, rs in by_label.items():
        out[label] = {
            "rounds": len(rs), "config": rs[0]["config"],
            "batches_per_s": _med(rs, lambda r: r["batches_per_s"]),
            "cpu_s_per_batch": {k: _med(rs, lambda r, k=k: r["cpu_s_per_batch"][k]) for k in ROLES},
            "data_path_cpu_s_per_batch": _med(rs, lambda r: r["data_path_cpu_s_per_batch"]),
            "all_cpu_s_per_batch": _med(rs, lambda r: r["all_cpu_s_per_batch"]),
            "supervision_cores": {k: _med(rs, lambda r, k=k: r["supervision_cores"][k]) for k in ("up", "launcher")},
            "wire_bytes_per_batch": _med(rs, lambda r: r["wire_bytes_per_batch"]),
            "tensor_bytes_per_batch": rs[0]["tensor_bytes_per_batch"],
            "isolated_loopback": all(r["isolated_loopback"] for r in rs),
        }
    return out


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def report(s: dict[str, dict], quick: bool) -> list[str]:
    lines = ["All figures measured here, from this one run (medians over rounds where rounds > 1).", ""]
    head = (f"{'configuration':34} {'b/s':>6} {'CPU-s/batch:':>12} {'disp':>6} {'workers':>7} {'trainer':>7} "
            f"{'total':>6} {'+dsctl':>6}  {'MB/batch wire':>13} {'tensor':>6}  {'up %core':>8} {'launcher':>8}")
    lines.append(head)
    for label, r in s.items():
        c = r["cpu_s_per_batch"]
        sup = r["supervision_cores"]
        own = r["config"]["runner"] == "dsctl"
        lines.append(
            f"{label:34} {r['batches_per_s']:6.2f} {'':12} {c['dispatcher']:6.4f} {c['worker']:7.4f} {c['trainer']:7.4f} "
            f"{r['data_path_cpu_s_per_batch']:6.4f} {r['all_cpu_s_per_batch']:6.4f}  {_mb(r['wire_bytes_per_batch']):>13} "
            f"{_mb(r['tensor_bytes_per_batch']):>6}  "
            + (f"{sup['up'] * 100:8.2f} {sup['launcher'] * 100:8.2f}" if own else f"{'-':>8} {'-':>8}"))
    lines.append("  total = dispatcher + workers + trainer; +dsctl adds `dsctl up` and its launcher; "
                 "wire = loopback bytes of the run's network namespace" +
                 ("" if all(r["isolated_loopback"] for r in s.values())
                  else " (NOT isolated in some runs: includes other traffic)"))
    lines.append("")

    def get(runner, mode, workers, dtype, comp=None, outstanding=None):
        return s.get(Config(runner, mode, workers, dtype, comp, outstanding).label)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    default = "uint8"
    for dtype in ("uint8", "float32"):
        col = get("dsctl", "colocated", 0, dtype)
        for w in ((1,) if quick else (1, 2)):
            svc = get("dsctl", "service", w, dtype)
            if col and svc:
                ratio = svc["data_path_cpu_s_per_batch"] / col["data_path_cpu_s_per_batch"]
                goal = f"goal <= 1.3x: {verdict(ratio <= 1.3)}; stretch <= 1.15x: {verdict(ratio <= 1.15)}" \
                    if dtype == default else "for comparison"
                lines.append(f"service {w}w / colocated, CPU-s per batch, {dtype} (measured here): {ratio:.2f}x "
                             f"({goal}; {CACHEW})")
    lines.append("")
    for dtype in ("uint8", "float32"):
        for w in ((1,) if quick else (1, 2)):
            d, r = get("dsctl", "service", w, dtype), get("raw", "service", w, dtype)
            if d and r:
                cpu = d["all_cpu_s_per_batch"] / r["data_path_cpu_s_per_batch"]
                cpu_dp = d["data_path_cpu_s_per_batch"] / r["data_path_cpu_s_per_batch"]
                rate = d["batches_per_s"] / r["batches_per_s"]
                lines.append(f"dsctl / raw API, service {w}w {dtype} (measured here): CPU per batch {cpu:.3f} "
                             f"(data path alone {cpu_dp:.3f}; goal <= 1.05: {verdict(cpu <= 1.05)}), "
                             f"batches/s {rate:.3f} (goal >= 0.97: {verdict(rate >= 0.97)})")
    lines.append("")
    u, f = get("dsctl", "service", 1, "uint8"), get("dsctl", "service", 1, "float32")
    if u and f:
        faster = "uint8" if u["batches_per_s"] >= f["batches_per_s"] else "float32"
        lines.append(f"transfer dtype, service 1w (measured here): uint8 {u['batches_per_s']:.2f} b/s, "
                     f"{u['data_path_cpu_s_per_batch']:.4f} CPU-s/batch, {_mb(u['wire_bytes_per_batch'])} MB/batch; "
                     f"float32 {f['batches_per_s']:.2f} b/s, {f['data_path_cpu_s_per_batch']:.4f} CPU-s/batch, "
                     f"{_mb(f['wire_bytes_per_batch'])} MB/batch. Faster: {faster}; dsctl's default: {default} "
                     f"({'agrees' if faster == default else 'DISAGREES'})")
    for dtype in ("uint8", "float32"):
        a, n = get("dsctl", "service", 1, dtype, "AUTO"), get("dsctl", "service", 1, dtype)
        if a and n:
            lines.append(f"compression AUTO / none, service 1w {dtype} (measured here): CPU per batch "
                         f"{a['data_path_cpu_s_per_batch'] / n['data_path_cpu_s_per_batch']:.2f}x, bytes per batch "
                         f"{a['wire_bytes_per_batch'] / n['wire_bytes_per_batch']:.2f}x, batches/s "
                         f"{a['batches_per_s'] / n['batches_per_s']:.2f}x")
    n = get("dsctl", "service", 1, "uint8")
    for mor in OUTSTANDING:
        o = get("dsctl", "service", 1, "uint8", outstanding=mor)
        if o and n:
            lines.append(f"max_outstanding_requests {mor} / autotuned, service 1w uint8 (measured here): CPU per batch "
                         f"{o['data_path_cpu_s_per_batch'] / n['data_path_cpu_s_per_batch']:.2f}x, batches/s "
                         f"{o['batches_per_s'] / n['batches_per_s']:.2f}x")
    sup = [(label, r["supervision_cores"]) for label, r in s.items() if r["config"]["runner"] == "dsctl"]
    if sup:
        worst = max(sup, key=lambda x: x[1]["up"] + x[1]["launcher"])
        total = worst[1]["up"] + worst[1]["launcher"]
        lines.append(f"dsctl's sampling and supervision, worst run ({worst[0]}, measured here): `dsctl up` "
                     f"{worst[1]['up'] * 100:.2f}% + launcher {worst[1]['launcher'] * 100:.2f}% of one core = "
                     f"{total * 100:.2f}% (goal <= 1%: {verdict(total <= 0.01)})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="under 2 minutes: 1 worker, no compression, one round of 6 s windows")
    ap.add_argument("--seconds", type=float, default=None, help="measured window per configuration (default 20, quick 6)")
    ap.add_argument("--warmup", type=int, default=None, help="batches left out first (default 20, quick 8)")
    ap.add_argument("--rounds", type=int, default=None, help="repeat every configuration, medians reported (default 2, quick 1)")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    args = ap.parse_args()
    seconds = args.seconds or (6.0 if args.quick else 20.0)
    warmup = args.warmup or (8 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 2)
    home = Path(tempfile.mkdtemp(prefix="dsctl-bench-data-path-"))
    cache = home / "cache"
    t0 = time.time()
    try:
        prepare(cache)
        by_label: dict[str, list[dict]] = {}
        for _ in range(rounds):
            for group in configs(args.quick):
                for cfg in group:
                    run = run_dsctl if cfg.runner == "dsctl" else run_raw
                    r = run(cfg, home, cache, seconds, warmup)
                    by_label.setdefault(cfg.label, []).append(r)
                    print(f"# {cfg.label}: {r['batches_per_s']:.2f} batches/s, "
                          f"{r['data_path_cpu_s_per_batch']:.4f} CPU-s/batch", file=sys.stderr, flush=True)
        s = summarize(by_label)
        shape = ", ".join(f"{k} {v}" for k, v in PAPER_SHAPE.items() if k != "epochs")
        print(f"images at the paper's shape ({shape}); {seconds:g} s windows after {warmup} warm-up batches, "
              f"{rounds} round(s), {time.time() - t0:.0f} s in all; {os.cpu_count()} cores")
        print("\n".join(report(s, args.quick)))
        if args.out:
            args.out.write_text(json.dumps({"summary": s, "runs": by_label}, indent=1))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1].startswith("_raw-"):
        {"_raw-group": lambda a: _raw_group(json.loads(a)),
         "_raw-dispatcher": _raw_dispatcher,
         "_raw-worker": _raw_worker,
         "_raw-client": lambda a: _raw_client(json.loads(a))}[sys.argv[1]](sys.argv[2])
    else:
        main()
