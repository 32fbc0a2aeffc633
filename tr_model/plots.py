"""Figures of predicted throughput: B over the feasible set, B* marked, the eager baseline drawn.

Everything here builds :class:`matplotlib.figure.Figure` objects directly
(never ``matplotlib.pyplot``), so no global figure registry or interactive
backend is touched: the module is safe on headless servers and inside other
applications.  Files are written atomically (a temp file in the target folder,
then ``os.replace``), the format chosen by the extension: ``.png``, ``.svg`` or
``.pdf``.

What is plotted (:func:`throughput_figure`), one panel per concurrency N:

* **M = 2, few B0 values** (at most :data:`MAX_LINES`): one line per ``B0``,
  throughput ``T(B0, B1)`` in tokens/s over ``B1``;
* **M = 2, many B0 values**: a heatmap over ``(B1, B0)`` (the feasible set
  ``B0 + B1 - 2 < N`` is a triangle; infeasible cells are blank);
* **M > 2**: a ranked dot plot of the best :data:`MAX_RANKED` vectors.

Simulated optima (``simulator.optimize_by_simulation``) are drawn the same way, with 95%
error bars.  In every panel B* (the argmax, with the optimizer's tie rule) is marked with a
star and the eager baseline ``B = (1, ..., 1)`` is a dashed line (or a ring on
the heatmap).  Other figures used by the notebooks: :func:`gain_figure`
(B* and eager throughput over N), :func:`presets_figure` and
:func:`bstar_heatmap_figure`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence

import numpy as np

from tr_core.errors import SpecError

FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
MAX_LINES = 6
MAX_RANKED = 15
THROUGHPUT_LABEL = "throughput (tokens/s, all N requests)"

__all__ = ["FORMATS", "check_plot_path", "plot_throughput", "throughput_figure", "gain_figure", "presets_figure",
           "bstar_heatmap_figure", "sensitivity_figure", "latency_figure", "save_figure"]


def _new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas; no pyplot, no global registry
    return fig


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise SpecError(f"plot file {path!r}: unsupported extension {ext or '(none)'!r}; "
                        f"use one of {', '.join(sorted(FORMATS))}")
    return FORMATS[ext]


def check_plot_path(path: str | os.PathLike) -> str:
    """Validate a plot path before any computation: a known extension and an existing, writable folder.

    Returns the format name (``png``, ``svg`` or ``pdf``); raises :class:`SpecError` otherwise.
    """
    path = os.fspath(path)
    fmt = _format_of(path)
    if os.path.isdir(path):  # found now, not when the figure is saved after all the work and the other outputs
        raise SpecError(f"plot file {path!r} is a folder, not a file")
    if os.path.exists(path) and not os.path.isfile(path):
        raise SpecError(f"plot file {path!r} is not a regular file (a device, pipe or socket); give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SpecError(f"plot file {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"plot file {path!r}: folder {folder!r} is not writable")
    return fmt


def save_figure(fig, path: str | os.PathLike, dpi: int = 120) -> None:
    """Write ``fig`` to ``path`` atomically, in the format its extension names (png, svg, pdf).

    SVG text is kept as text (not glyph outlines) so that labels stay searchable.
    """
    import matplotlib

    path = os.fspath(path)
    fmt = _format_of(path)
    from tr_core.fileio import atomic_write

    def draw(f):
        # rc_context restores every setting on exit: nothing leaks into the caller's matplotlib state
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tr-model", "pdf.fonttype": 42}):
            fig.savefig(f, format=fmt, dpi=dpi, metadata=_metadata(fmt))

    atomic_write(path, draw, binary=True, what="plot")


def _metadata(fmt: str) -> dict:
    # no creation dates: the same optima give the same file
    if fmt == "svg":
        return {"Date": None}
    if fmt == "pdf":
        return {"CreationDate": None}
    return {}


def _check_optima(optima: Any) -> list:
    if optima is None:
        raise SpecError("plot: no optimization results to plot")
    opts = [optima] if hasattr(optima, "best_B") else list(optima)
    if not opts:
        raise SpecError("plot: no optimization results to plot")
    for o in opts:
        if not all(hasattr(o, k) for k in ("N", "best_B", "throughput_tok_s", "eager_throughput_tok_s")):
            raise SpecError(f"plot: expected optimizer.search.Optimum (or simulator SimulatedOptimum) objects, "
                            f"got {type(o).__name__}")
    return opts


def _fmt_B(B: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(b)) for b in B) + ")"


def _points(o) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]]:
    """Throughput per evaluated B, and a 95% half-width per B where the source has one.

    Sources, first found: ``evaluations`` (exact search), ``table`` rows with
    ``B``/``throughput_tok_s``/``ci95_tok_s`` (simulated search: each
    candidate's last estimate), ``ranking.entries`` (simulated finalists).
    """
    pts: dict[tuple[int, ...], float] = {}
    ci: dict[tuple[int, ...], float] = {}
    rows: list = []
    if getattr(o, "evaluations", None):
        rows = [{"B": e.B, "throughput_tok_s": e.throughput_tok_s} for e in o.evaluations]
    elif getattr(o, "table", None) is not None and hasattr(o.table, "to_dict") and len(o.table):
        rows = o.table.to_dict("records")
    elif isinstance(getattr(o, "table", None), list) and o.table:
        rows = list(o.table)
    elif getattr(o, "ranking", None) is not None:
        rows = [{"B": e.B, "throughput_tok_s": e.throughput_tok_s, "ci95_tok_s": e.ci95_tok_s}
                for e in o.ranking.entries]
    for r in rows:
        B = tuple(int(b) for b in r["B"])
        pts[B] = float(r["throughput_tok_s"])
        if r.get("ci95_tok_s") is not None and math.isfinite(float(r["ci95_tok_s"])):
            ci[B] = float(r["ci95_tok_s"])
    pts.setdefault(tuple(int(b) for b in o.best_B), float(o.throughput_tok_s))
    pts.setdefault((1,) * len(o.best_B), float(o.eager_throughput_tok_s))
    return pts, ci


def _gain(o) -> float:
    # the ratio, computed here: the simulator reports its gain as a relative difference
    return o.throughput_tok_s / o.eager_throughput_tok_s


def _panel_title(o) -> str:
    how = " (simulated)" if str(getattr(o, "method", "exact")).startswith("simulate") else ""
    return (f"N = {o.N}: B* = {_fmt_B(o.best_B)}, {o.throughput_tok_s:.1f} tok/s "
            f"({_gain(o):.3f}x eager){how}")


def _lines_panel(ax, o, pts, ci) -> None:
    b0s = sorted({B[0] for B in pts})
    for b0 in b0s:
        xs = sorted(B[1] for B in pts if B[0] == b0)
        ys = [pts[(b0, x)] for x in xs]
        if ci:
            ax.errorbar(xs, ys, yerr=[ci.get((b0, x), 0.0) for x in xs], marker="o", markersize=3, linewidth=1.3,
                        capsize=2, label=f"B0 = {b0}")
        else:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.3, label=f"B0 = {b0}")
    ax.axhline(o.eager_throughput_tok_s, color="0.35", linestyle="--", linewidth=1.0,
               label=f"eager B = (1, 1): {o.eager_throughput_tok_s:.1f}")
    ax.plot([o.best_B[1]], [o.throughput_tok_s], marker="*", markersize=15, color="crimson",
            markeredgecolor="black", linestyle="none", zorder=5,
            label=f"B* = {_fmt_B(o.best_B)}" + ("" if o.best_B[0] in b0s else f" (B0 = {o.best_B[0]})"))
    ax.set_xlabel("B1: large-model threshold (requests)")
    ax.set_ylabel(THROUGHPUT_LABEL)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="best")


def _heatmap_panel(fig, ax, o, pts) -> None:
    n0 = max(B[0] for B in pts)
    n1 = max(B[1] for B in pts)
    grid = np.full((n0, n1), np.nan)
    for (b0, b1), v in pts.items():
        grid[b0 - 1, b1 - 1] = v
    im = ax.imshow(np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis",
                   extent=(0.5, n1 + 0.5, 0.5, n0 + 0.5), interpolation="nearest")
    cb = fig.colorbar(im, ax=ax, shrink=0.9)
    cb.set_label(THROUGHPUT_LABEL)
    ax.plot([o.best_B[1]], [o.best_B[0]], marker="*", markersize=16, color="crimson", markeredgecolor="white",
            linestyle="none", label=f"B* = {_fmt_B(o.best_B)}: {o.throughput_tok_s:.1f} tok/s")
    ax.plot([1], [1], marker="o", markersize=11, markerfacecolor="none", markeredgecolor="black",
            markeredgewidth=1.8, linestyle="none", label=f"eager (1, 1): {o.eager_throughput_tok_s:.1f} tok/s")
    ax.set_xlabel("B1: large-model threshold (requests)")
    ax.set_ylabel("B0: small-model threshold (requests)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize="x-small", loc="upper right")


def _ranked_panel(ax, o, pts, ci) -> None:
    ranked = sorted(pts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_RANKED]
    eager = (1,) * len(o.best_B)
    if eager not in dict(ranked):
        ranked.append((eager, pts[eager]))
    ys = np.arange(len(ranked))[::-1]
    vals = [v for _, v in ranked]
    colors = ["crimson" if B == tuple(o.best_B) else ("0.35" if B == eager else "tab:blue") for B, _ in ranked]
    ax.hlines(ys, min(vals) * 0.98, vals, color="0.85", linewidth=1)
    ax.scatter(vals, ys, c=colors, s=30, zorder=3)
    if ci:
        ax.errorbar(vals, ys, xerr=[ci.get(B, 0.0) for B, _ in ranked], fmt="none", ecolor="0.4", capsize=2)
    best_y = ys[[B for B, _ in ranked].index(tuple(o.best_B))]
    ax.plot([o.throughput_tok_s], [best_y], marker="*", markersize=15, color="crimson", markeredgecolor="black",
            linestyle="none", zorder=4, label=f"B* = {_fmt_B(o.best_B)}")
    ax.axvline(o.eager_throughput_tok_s, color="0.35", linestyle="--", linewidth=1.0,
               label=f"eager {_fmt_B(eager)}: {o.eager_throughput_tok_s:.1f}")
    ax.set_yticks(ys)
    ax.set_yticklabels([_fmt_B(B) for B, _ in ranked], fontsize="x-small")
    ax.set_xlabel(THROUGHPUT_LABEL)
    ax.set_ylabel(f"threshold vector B (top {min(MAX_RANKED, len(pts))} of {len(pts)})")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="x-small", loc="lower right")


def throughput_figure(optima: Iterable[Any] | Any, *, max_lines: int = MAX_LINES,
                      b0: Sequence[int] | None = None):
    """A figure of throughput over the evaluated thresholds, one panel per N (see the module docstring).

    ``optima``: ``optimizer.search.Optimum`` objects (``tr_model.optimize`` /
    ``optimize_many``) or ``simulator.SimulatedOptimum`` objects
    (``optimize_by_simulation``: points carry 95% error bars), or one of them.  ``b0`` (M = 2): draw lines for these
    B0 values only, whatever their number (B* is marked even when its B0 is
    not among them).
    """
    opts = _check_optima(optima)
    M = len(opts[0].best_B)
    n = len(opts)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(5.2 * ncols, 4.0 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    both = [_points(o) for o in opts]
    all_pts = [p for p, _ in both]
    all_ci = [c for _, c in both]
    if b0 is not None and M == 2:
        keep = {int(x) for x in b0}
        all_pts = [{B: v for B, v in pts.items() if B[0] in keep} for pts in all_pts]
    # one panel kind for the whole figure, so that panels compare at a glance
    lines = M == 2 and (b0 is not None or max(len({B[0] for B in pts}) for pts in all_pts) <= max_lines)
    for k, (o, pts, ci) in enumerate(zip(opts, all_pts, all_ci)):
        ax = axes[k // ncols][k % ncols]
        if lines:
            _lines_panel(ax, o, pts, ci)
        elif M == 2:
            _heatmap_panel(fig, ax, o, pts)
        else:
            _ranked_panel(ax, o, pts, ci)
        ax.set_title(_panel_title(o), fontsize="small")
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    fig.suptitle(f"Predicted decode throughput by delayed-batching thresholds (M = {M})", fontsize="medium")
    return fig


def plot_throughput(optima: Iterable[Any], path: str | os.PathLike) -> None:
    """Write :func:`throughput_figure` of ``optima`` to ``path`` (.png, .svg or .pdf), atomically.

    An unsupported extension raises :class:`~tr_core.errors.SpecError` before anything is computed.
    """
    _format_of(os.fspath(path))
    save_figure(throughput_figure(optima), path)


def gain_figure(optima: Iterable[Any]):
    """B* and eager throughput over N (left) and the gain of delayed batching (right)."""
    opts = sorted(_check_optima(optima), key=lambda o: o.N)
    Ns = [o.N for o in opts]
    fig = _new_figure(10.5, 4.0)
    a1, a2 = fig.subplots(1, 2)
    a1.plot(Ns, [o.throughput_tok_s for o in opts], marker="o", label="delayed batching, B*")
    a1.plot(Ns, [o.eager_throughput_tok_s for o in opts], marker="s", linestyle="--", color="0.35",
            label="eager, B = (1, ..., 1)")
    a1.set_xlabel("concurrency N (requests)")
    a1.set_ylabel(THROUGHPUT_LABEL)
    a1.legend(fontsize="small")
    a1.grid(True, alpha=0.3)
    a2.plot(Ns, [_gain(o) for o in opts], marker="o", color="tab:green")
    step = max(1, math.ceil(len(opts) / 16))  # keep the B* labels legible on long sweeps
    for k, o in enumerate(opts):
        if k % step == 0 or k == len(opts) - 1:
            a2.annotate(_fmt_B(o.best_B), (o.N, _gain(o)), textcoords="offset points", xytext=(0, 7),
                        fontsize="x-small", ha="center", rotation=60 if len(opts) > 10 else 0)
    a2.margins(y=0.2)
    a2.set_title("labels: B*", fontsize="small")
    a2.axhline(1.0, color="0.35", linestyle="--", linewidth=1.0)
    a2.set_xlabel("concurrency N (requests)")
    a2.set_ylabel("gain over eager (x)")
    a2.grid(True, alpha=0.3)
    return fig


def presets_figure(table):
    """Throughput and gain over N for several systems.

    ``table``: a pandas DataFrame with columns ``system``, ``N``,
    ``throughput_tok_s``, ``eager_throughput_tok_s``, ``gain_vs_eager`` (as
    returned by :func:`tr_model.sensitivity.compare_systems`).
    """
    fig = _new_figure(11.0, 4.2)
    a1, a2 = fig.subplots(1, 2)
    for name, g in table.groupby("system", sort=False):
        g = g.sort_values("N")
        line, = a1.plot(g["N"], g["throughput_tok_s"], marker="o", label=f"{name} (B*)")
        a1.plot(g["N"], g["eager_throughput_tok_s"], linestyle="--", color=line.get_color(), linewidth=1.0)
        a2.plot(g["N"], g["gain_vs_eager"], marker="o", color=line.get_color(), label=name)
    a1.set_xlabel("concurrency N (requests)")
    a1.set_ylabel(THROUGHPUT_LABEL)
    a1.set_title("solid: B*, dashed: eager", fontsize="small")
    a1.legend(fontsize="x-small")
    a1.grid(True, alpha=0.3)
    a2.axhline(1.0, color="0.35", linestyle="--", linewidth=1.0)
    a2.set_xlabel("concurrency N (requests)")
    a2.set_ylabel("gain of delayed batching over eager (x)")
    a2.legend(fontsize="x-small")
    a2.grid(True, alpha=0.3)
    return fig


def bstar_heatmap_figure(table, *, value: str = "gain_vs_eager"):
    """Heatmap over (escalation probability p, latency ratio L1/L0), cells annotated with B*.

    ``table``: a DataFrame with columns ``p``, ``latency_ratio``, ``best_B``
    and ``value`` (as returned by :func:`tr_model.sensitivity.bstar_grid`).
    """
    ps = sorted(table["p"].unique())
    rs = sorted(table["latency_ratio"].unique())
    grid = np.full((len(rs), len(ps)), np.nan)
    labels = {}
    for _, row in table.iterrows():
        i, j = rs.index(row["latency_ratio"]), ps.index(row["p"])
        grid[i, j] = row[value]
        labels[(i, j)] = ",".join(str(b) for b in row["best_B"])
    fig = _new_figure(1.0 + 0.75 * len(ps) + 1.5, 1.0 + 0.5 * len(rs) + 0.8)
    ax = fig.subplots()
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="magma")
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("gain of B* over eager (x)" if value == "gain_vs_eager" else value)
    lo, hi = np.nanmin(grid), np.nanmax(grid)
    for (i, j), s in labels.items():
        dark = (grid[i, j] - lo) < 0.55 * (hi - lo) if hi > lo else True
        ax.text(j, i, s, ha="center", va="center", fontsize="x-small", color="white" if dark else "black")
    ax.set_xticks(range(len(ps)))
    ax.set_xticklabels([f"{p:g}" for p in ps])
    ax.set_yticks(range(len(rs)))
    ax.set_yticklabels([f"{r:g}" for r in rs])
    ax.set_xlabel("escalation probability p (per token)")
    ax.set_ylabel("latency ratio L1 / L0")
    N = table["N"].iloc[0] if "N" in table else None
    ax.set_title(f"B* = (B0, B1) at N = {N}" if N is not None else "B* = (B0, B1)", fontsize="small")
    return fig


def sensitivity_figure(table):
    """Threshold regret (left) and prediction error (right) against the relative profiling error.

    ``table``: the DataFrame of :func:`tr_model.sensitivity.profiling_sensitivity`.
    """
    fig = _new_figure(10.5, 4.0)
    a1, a2 = fig.subplots(1, 2)
    for name, g in table.groupby("parameter", sort=False):
        g = g.sort_values("rel_error")
        a1.plot(100 * g["rel_error"], 100 * g["regret"], marker="o", label=name)
        a2.plot(100 * g["rel_error"], 100 * g["prediction_error"], marker="o", label=name)
    a1.set_xlabel("error of the profiled value (%)")
    a1.set_ylabel("throughput lost by tuned B vs true B* (%)")
    a2.set_xlabel("error of the profiled value (%)")
    a2.set_ylabel("predicted / achieved throughput - 1 (%)")
    for a in (a1, a2):
        a.axhline(0.0, color="0.35", linewidth=0.8)
        a.grid(True, alpha=0.3)
        a.legend(fontsize="small", title="parameter", title_fontsize="small")
    return fig


def latency_figure(profiles: Sequence[Any], names: Sequence[str] | None = None):
    """Measured step latency over batch size (median, p10-p90 band) and the affine fit, per model.

    ``profiles``: ``profiler.latency.LatencyProfile`` objects (``load_latency_profile``).
    """
    if not profiles:
        raise SpecError("latency_figure: no profiles given")
    fig = _new_figure(5.0 * len(profiles), 3.8)
    axes = fig.subplots(1, len(profiles), squeeze=False)[0]
    for k, (ax, prof) in enumerate(zip(axes, profiles)):
        bs = [s.batch_size for s in prof.batches]
        ax.plot(bs, [s.median_ms for s in prof.batches], marker="o", label="median")
        ax.fill_between(bs, [s.min_ms for s in prof.batches], [s.p90_ms for s in prof.batches], alpha=0.2,
                        label="min to p90")
        if prof.fit is not None:
            xs = np.linspace(min(bs), max(bs), 50)
            ax.plot(xs, prof.fit.intercept_ms + prof.fit.per_request_ms * xs, linestyle="--", color="0.3",
                    label=f"fit {prof.fit.intercept_ms:.3g} + {prof.fit.per_request_ms:.3g} b "
                          f"(R^2 {prof.fit.r_squared:.2f})")
        ax.set_xlabel("batch size b (requests)")
        ax.set_ylabel("step latency L(b) (ms)")
        ax.set_title(f"model {k}: {names[k] if names else prof.model} ({prof.device}, {prof.mode})",
                     fontsize="small")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    return fig
