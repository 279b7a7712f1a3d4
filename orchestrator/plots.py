"""Sweep plots in the style of the paper's Figure 9: speedup (9a) and cost saving (9b) over
colocated processing against the worker count.

Figures are built as bare `matplotlib.figure.Figure`s on an Agg canvas, never through pyplot,
so nothing leaks into global state (safe in tests, threads and a CLI without a display), and
`build_sweep_figures` hands them to tests before `plot_sweep` writes them. Predicted points are
hollow markers on dashed lines, labelled "predicted"; measured ones are filled and solid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullLocator

WORKERS_LABEL = "tf.data service workers"
SPEEDUP_LABEL = "speedup over colocated (×)"
COST_LABEL = "cost saving over colocated (×)"
LOG_SPAN = 8            # worker counts spanning more than this factor get a log2 axis
MAX_LABELLED_TICKS = 16
COLOR = "tab:blue"
FILES = {"speedup": "sweep-speedup.png", "cost_saving": "sweep-cost-saving.png", "surface": "sweep-surface.png"}


def plot_sweep(points: Iterable[Any], *, colocated_bps: float, ideal_bps: float, out_dir: Path,
               title: str) -> list[Path]:
    """Write sweep-speedup.png and, when any point has a cost_saving, sweep-cost-saving.png."""
    figs = build_sweep_figures(points, colocated_bps=colocated_bps, ideal_bps=ideal_bps, title=title)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figs.items():
        path = out_dir / FILES[name]
        fig.savefig(path, format="png", dpi=120)
        paths.append(path)
    return paths


def build_sweep_figures(points: Iterable[Any], *, colocated_bps: float, ideal_bps: float,
                        title: str) -> dict[str, Figure]:
    """{"speedup": Figure, "cost_saving": Figure}; the second only when some point has a cost saving.

    Points are dicts or objects with workers, batches_per_s, predicted and optionally cost_saving.
    """
    if not colocated_bps or colocated_bps <= 0 or not ideal_bps or ideal_bps <= 0:
        raise ValueError(f"colocated and ideal rates must be positive (got {colocated_bps!r}, {ideal_bps!r})")
    rows = sorted((_row(p) for p in points), key=lambda r: r[0])
    speed = [(n, bps / colocated_bps, pred) for n, bps, pred, _ in rows if bps is not None]
    if not speed:
        raise ValueError("no sweep point has a throughput to plot")
    figs = {"speedup": _figure(speed, f"{title}: speedup", SPEEDUP_LABEL, ideal=ideal_bps / colocated_bps)}
    saving = [(n, cs, pred) for n, _, pred, cs in rows if cs is not None]
    if saving:
        figs["cost_saving"] = _figure(saving, f"{title}: cost saving", COST_LABEL, ideal=None)
    return figs


def plot_surface(points: Iterable[Any], *, out_dir: Path, title: str, pick: Any | None = None) -> Path:
    """Write sweep-surface.png: sweep --local-workers' cost surface (build_surface_figure)."""
    path = Path(out_dir) / FILES["surface"]
    path.parent.mkdir(parents=True, exist_ok=True)
    build_surface_figure(points, title=title, pick=pick).savefig(path, format="png", dpi=120)
    return path


def build_surface_figure(points: Iterable[Any], *, title: str, pick: Any | None = None) -> Figure:
    """The measured points of a sweep over remote (x) and local (y) workers as a grid: each cell coloured by its cost
    per 1,000 batches (darker is cheaper) and labelled with that cost and its batches/s; the recommended point
    (`pick`: workers and local_workers) outlined. A cell never measured stays blank."""
    get = _getter
    cells = {(int(get(p, "workers")), int(get(p, "local_workers") or 0)): (get(p, "cost_per_1000_batches"),
                                                                           get(p, "batches_per_s"))
             for p in points if not get(p, "predicted", False) and get(p, "batches_per_s")}
    if not cells:
        raise ValueError("no measured sweep point to plot")
    remote, local = sorted({r for r, _ in cells}), sorted({k for _, k in cells})
    grid = [[cells.get((r, k), (None, None))[0] for r in remote] for k in local]
    costs = [c for row in grid for c in row if c is not None]
    fig = Figure(figsize=(max(6.4, 1.2 * len(remote) + 3.0), 0.8 * len(local) + 2.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    masked = [[float("nan") if c is None else c for c in row] for row in grid]
    image = ax.imshow(masked, cmap="viridis", origin="lower", aspect="auto",
                      vmin=min(costs) if costs else None, vmax=max(costs) if costs else None)
    fig.colorbar(image, ax=ax, label="$ per 1,000 batches")
    middle = (min(costs) + max(costs)) / 2 if costs else 0.0
    for (r, k), (cost, bps) in cells.items():
        text = ("not priced" if cost is None else f"${cost:.3g}") + f"\n{bps:.3g} b/s"
        bright = cost is not None and cost > middle  # viridis is light at its top: dark text there
        ax.text(remote.index(r), local.index(k), text, ha="center", va="center", fontsize=8,
                color="black" if bright else "white")
    if pick is not None:
        at = (int(get(pick, "workers")), int(get(pick, "local_workers") or 0))
        if at in cells:
            ax.add_patch(Rectangle((remote.index(at[0]) - 0.5, local.index(at[1]) - 0.5), 1, 1, fill=False,
                                   edgecolor="tab:red", linewidth=2.5, label="recommended"))
    ax.set_xticks(range(len(remote)), [str(r) for r in remote])
    ax.set_yticks(range(len(local)), [str(k) for k in local])
    ax.set_xlabel("remote " + WORKERS_LABEL)
    ax.set_ylabel("local workers per trainer")
    fig.suptitle(f"{title}: cost surface (measured)" + ("\nred outline: recommended" if pick is not None else ""),
                 fontsize=10)
    return fig


def _getter(p: Any, key: str, default: Any = None) -> Any:
    return p.get(key, default) if isinstance(p, dict) else getattr(p, key, default)


def _figure(series: list[tuple[int, float, bool]], title: str, ylabel: str, ideal: float | None) -> Figure:
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    # Segments: solid between two measured points, dashed where either end is predicted.
    for (n1, y1, p1), (n2, y2, p2) in zip(series, series[1:]):
        ax.plot([n1, n2], [y1, y2], color=COLOR, linestyle="--" if (p1 or p2) else "-", linewidth=1.5)
    handles = []
    for predicted, label in ((False, "measured"), (True, "predicted")):
        mine = [(n, y) for n, y, p in series if p == predicted]
        if mine:
            style: dict[str, Any] = dict(color=COLOR, marker="o", markersize=6, markerfacecolor="white" if predicted else COLOR,
                                         linestyle="--" if predicted else "-", linewidth=1.5, label=label)
            ax.plot([n for n, _ in mine], [y for _, y in mine], **{**style, "linestyle": "none", "label": None})
            handles.append(Line2D([], [], **style))  # the legend shows marker and line style together
    if ideal is not None:
        handles.append(ax.axhline(ideal, color="tab:green", linestyle=":", linewidth=1.5,
                                  label=f"ideal ({ideal:.3g}×)"))
    handles.append(ax.axhline(1.0, color="gray", linestyle="-.", linewidth=1, label="colocated (1×)"))
    _worker_axis(ax, [n for n, _, _ in series])
    top = max([y for _, y, _ in series] + [ideal or 0.0, 1.0])
    ax.set_ylim(bottom=0, top=top * 1.1)  # headroom, so the ideal line is not hidden in the frame
    ax.set_xlabel(WORKERS_LABEL)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(handles=handles, loc="best", fontsize="small")
    return fig


def _worker_axis(ax, counts: list[int]) -> None:
    """Log base 2 when the counts span decades (8..640), linear otherwise; ticks at the counts."""
    lo, hi = min(counts), max(counts)
    if hi / lo > LOG_SPAN:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(lo / 1.25, hi * 1.25)
    elif hi > lo:
        pad = (hi - lo) * 0.05
        ax.set_xlim(lo - pad, hi + pad)
    ticks = sorted(set(counts))
    if len(ticks) <= MAX_LABELLED_TICKS:
        ax.set_xticks(ticks, [str(t) for t in ticks])
        # 512 and 640 sit a third of an octave apart on a log axis: tilt labels rather than overlap them.
        if ax.get_xscale() == "log" and any(b / a < 1.5 for a, b in zip(ticks, ticks[1:])):
            ax.tick_params(axis="x", labelrotation=45)


def _row(p: Any) -> tuple[int, float | None, bool, float | None]:
    get: Callable[..., Any] = p.get if isinstance(p, dict) else (lambda k, d=None: getattr(p, k, d))
    bps, cs = get("batches_per_s"), get("cost_saving")
    return (int(get("workers")), None if bps is None else float(bps), bool(get("predicted", False)),
            None if cs is None else float(cs))
