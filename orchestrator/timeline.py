"""`dsctl runs show RUN --timeline`: workers and batch time over a run, like Cachew's Figure 9.

Built as a bare matplotlib Figure (no pyplot state), from the run's stored
metrics windows and its autoscale events.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

TIME_LABEL = "time since the trainer started (s)"
WORKERS_LABEL = "tf.data service workers"
BATCH_TIME_LABEL = "batch time (ms)"


def scaling_changes(windows: list[dict]) -> list[tuple[float, int]]:
    """(time, new worker count) wherever the first trainer's windows see the count change."""
    rows = _first_trainer(windows)
    return [(b["t_start"], b["workers"]) for a, b in zip(rows, rows[1:]) if a["workers"] != b["workers"]]


def placement_changes(windows: list[dict]) -> list[tuple[float, str]]:
    """(time, the new placement: "5", or "2 + 1 local" under hybrid placement) wherever the first trainer's windows
    see the remote or the in-process worker count change."""
    rows = _first_trainer(windows)

    def count(w: dict) -> str:
        return f"{w['workers']}" + (f" + {w['local_workers']} local" if w.get("local_workers") is not None else "")

    return [(b["t_start"], count(b)) for a, b in zip(rows, rows[1:]) if count(a) != count(b)]


def _first_trainer(windows: list[dict]) -> list[dict]:
    return sorted((w for w in windows if w["trainer"] == min(x["trainer"] for x in windows)), key=lambda w: w["t_end"])


def build_timeline_figure(windows: list[dict], title: str) -> Figure:
    """windows: stored metrics windows (t_start, t_end, workers, mean_batch_time_s, trainer)."""
    decisions = [(t, f"→ {n}") for t, n in placement_changes(windows)] if windows else []
    rows = sorted((w for w in windows if w.get("mean_batch_time_s")), key=lambda w: (w["trainer"], w["t_end"]))
    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax_w, ax_b = fig.subplots(2, 1, sharex=True)
    first = [w for w in rows if w["trainer"] == rows[0]["trainer"]] if rows else []
    ax_w.step([w["t_end"] for w in first], [w["workers"] for w in first], where="pre", color="tab:blue",
              label="remote")
    local = [w for w in first if w.get("local_workers") is not None]
    if local:  # hybrid placement: the trainer's in-process workers beside the remote ones
        ax_w.step([w["t_end"] for w in local], [w["local_workers"] for w in local], where="pre", color="tab:orange",
                  label="in each trainer process")
        ax_w.legend(fontsize="small")
    ax_w.set_ylabel(WORKERS_LABEL)
    ax_w.set_ylim(bottom=0, top=max([w["workers"] or 0 for w in first] + [w["local_workers"] for w in local] + [1]) + 1)
    ax_w.set_title(title)
    for trainer in sorted({w["trainer"] for w in rows}):
        mine = [w for w in rows if w["trainer"] == trainer]
        ax_b.plot([w["t_end"] for w in mine], [1e3 * w["mean_batch_time_s"] for w in mine], linewidth=1,
                  label=f"trainer {trainer}")
    ax_b.set_ylabel(BATCH_TIME_LABEL)
    ax_b.set_xlabel(TIME_LABEL)
    ax_b.set_ylim(bottom=0)
    for t, label in decisions:
        for ax in (ax_w, ax_b):
            ax.axvline(t, color="gray", linestyle=":", linewidth=0.8)
        ax_w.annotate(label, (t, 0.2), fontsize="x-small", rotation=90, va="bottom", ha="right", color="gray")
    for ax in (ax_w, ax_b):
        ax.grid(True, alpha=0.3)
    if len({w["trainer"] for w in rows}) > 1:
        ax_b.legend(fontsize="small")
    return fig


def plot_timeline(windows: list[dict], path: Path, title: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    build_timeline_figure(windows, title).savefig(path, dpi=120)
    return path
