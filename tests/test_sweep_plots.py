"""Figure 9-style sweep plots: valid PNGs, readable labels, a log2 worker axis when counts span
decades, predicted points told apart, and no pyplot state left behind."""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.image
import pytest

from dsctl.orchestrator.plots import COST_LABEL, SPEEDUP_LABEL, WORKERS_LABEL, build_sweep_figures, plot_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The paper's M1 sweep (Figure 9): 8 and 16 measured, the rest as a simulated sweep would predict them.
M1 = [dict(workers=w, batches_per_s=b, predicted=p, cost_saving=c) for w, b, p, c in [
    (8, 0.30, False, 0.55), (16, 0.64, False, 1.1), (32, 1.2, True, 2.1), (64, 2.3, True, 4.0),
    (128, 4.77, True, 8.2), (256, 6.4, True, 11.0), (512, 6.47, True, 11.4), (640, 6.47, True, 11.2)]]
LINEAR = [dict(workers=n, batches_per_s=min(n / 4, 1.0), predicted=False) for n in range(1, 7)]


def legend_labels(fig):
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def test_writes_two_valid_pngs(tmp_path):
    paths = plot_sweep(M1, colocated_bps=0.55, ideal_bps=6.47, out_dir=tmp_path / "plots", title="M1")
    assert [p.name for p in paths] == ["sweep-speedup.png", "sweep-cost-saving.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_SIGNATURE
        img = matplotlib.image.imread(p)
        assert img.shape[0] > 100 and img.shape[1] > 100


def test_figure_9a_speedup_axes_and_reference_lines():
    fig = build_sweep_figures(M1, colocated_bps=0.55, ideal_bps=6.47, title="M1")["speedup"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == WORKERS_LABEL == "tf.data service workers"
    assert ax.get_ylabel() == SPEEDUP_LABEL == "speedup over colocated (×)"
    assert ax.get_xscale() == "log"                                     # 8..640 spans decades
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16", "32", "64", "128", "256", "512", "640"]
    labels = legend_labels(fig)
    assert labels == ["measured", "predicted", "ideal (11.8×)", "colocated (1×)"]
    hlines = {round(line.get_ydata()[0], 2) for line in ax.get_lines() if line.get_label().startswith(("ideal", "coloc"))}
    assert hlines == {1.0, round(6.47 / 0.55, 2)}


def test_figure_9b_cost_saving_axes():
    fig = build_sweep_figures(M1, colocated_bps=0.55, ideal_bps=6.47, title="M1")["cost_saving"]
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale()) == (WORKERS_LABEL, COST_LABEL, "log")
    assert "predicted" in legend_labels(fig) and "colocated (1×)" in legend_labels(fig)


def test_predicted_points_are_hollow_and_dashed_measured_solid():
    ax = build_sweep_figures(M1, colocated_bps=0.55, ideal_bps=6.47, title="M1")["speedup"].axes[0]
    handles = {h.get_label(): h for h in ax.get_legend().legend_handles}
    assert handles["predicted"].get_markerfacecolor() == "white"
    assert handles["predicted"].get_linestyle() == "--"
    assert handles["measured"].get_markerfacecolor() != "white" and handles["measured"].get_linestyle() == "-"
    segments = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2 and ln.get_marker() in ("None", None, "")]
    styles = {tuple(ln.get_xdata()): ln.get_linestyle() for ln in segments}
    assert styles[(8, 16)] == "-" and styles[(16, 32)] == "--" and styles[(512, 640)] == "--"


def test_small_span_is_linear_and_cost_plot_skipped_without_costs(tmp_path):
    figs = build_sweep_figures(LINEAR, colocated_bps=0.4, ideal_bps=1.0, title="latency-bound")
    assert list(figs) == ["speedup"]
    ax = figs["speedup"].axes[0]
    assert ax.get_xscale() == "linear"
    assert "predicted" not in legend_labels(figs["speedup"])
    paths = plot_sweep(LINEAR, colocated_bps=0.4, ideal_bps=1.0, out_dir=tmp_path, title="latency-bound")
    assert [p.name for p in paths] == ["sweep-speedup.png"]


def test_partial_costs_plot_what_exists_and_objects_work():
    @dataclass
    class Point:
        workers: int
        batches_per_s: float
        predicted: bool = False
        cost_saving: float | None = None

    pts = [Point(1, 0.25), Point(2, 0.5, cost_saving=1.2), Point(64, 1.0, True, 2.0)]
    figs = build_sweep_figures(pts, colocated_bps=0.4, ideal_bps=1.0, title="t")
    assert set(figs) == {"speedup", "cost_saving"}
    xs = sorted(x for ln in figs["cost_saving"].axes[0].get_lines() if ln.get_marker() == "o" for x in ln.get_xdata())
    assert xs == [2, 64]


def test_no_pyplot_figures_leak_and_bad_baselines_refused(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plot_sweep(M1, colocated_bps=0.55, ideal_bps=6.47, out_dir=tmp_path, title="M1")
    assert plt.get_fignums() == before
    with pytest.raises(ValueError):
        build_sweep_figures(M1, colocated_bps=0, ideal_bps=6.47, title="M1")
    with pytest.raises(ValueError):
        build_sweep_figures([], colocated_bps=0.55, ideal_bps=6.47, title="M1")
