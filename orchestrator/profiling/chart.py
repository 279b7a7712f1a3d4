"""The profile as a picture: one bar per transformation, its CPU per batch (and any wait), the bounding one marked.

Built on a bare Agg figure, never through pyplot (as plots.py), so nothing leaks into global state.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .record import Profile

CPU_COLOR, WAIT_COLOR, BOUND_COLOR = "tab:blue", "tab:gray", "tab:red"


def build_profile_figure(profile: Profile) -> Figure:
    rows = profile.rows
    fig = Figure(figsize=(9, 1.2 + 0.38 * max(len(rows), 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels = [("  " if r.inner else "") + r.label for r in rows]
    y = list(range(len(rows)))[::-1]  # the pipeline reads top to bottom: source first
    cpu = [r.cpu_s_per_batch * 1e3 for r in rows]
    wait = [r.wait_s_per_batch * 1e3 for r in rows]
    colors = [BOUND_COLOR if r.bounds else CPU_COLOR for r in rows]
    ax.barh(y, cpu, color=colors, label="CPU per batch (ms)")
    if any(wait):
        ax.barh(y, wait, left=cpu, color=[BOUND_COLOR if r.bounds else WAIT_COLOR for r in rows], hatch="//",
                label="waiting, no CPU (ms)")
    for yi, c, w, r in zip(y, cpu, wait, rows):
        ax.text(c + w, yi, f" {r.share:.0%}", va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("milliseconds per batch the pipeline produced (measured here)")
    rate = profile.rate
    ax.set_title(f"{profile.job}: {rate.batches_per_s:.3g} batches/s, {rate.cpu_s_per_batch * 1e3:.3g} ms CPU per batch "
                 f"(red: bounds throughput)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_profile(profile: Profile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    build_profile_figure(profile).savefig(path, format="png", dpi=110)
    return path
