"""The report's figures: the loss curve with its fit and checkpoints, each policy's intervals,
each policy's overhead, and what each checkpoint cost. Drawn with matplotlib on pyplot-free
figures (the Agg canvas: no global backend switch, no display needed, a notebook's inline backend
left alone), imported only when a figure is drawn."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from coci.analysis.report.read import ReportData
    from coci.planning.fit import CurveFit

__all__ = ["FIGURES", "FIGURE_BUILDERS", "render_figures"]

#: Size (inches) and resolution (dots per inch) of the report's PNG figures: 8 x 4.5 in at 110 dpi
#: is 880 x 495 px, readable in a browser and in the README without zooming.
_REPORT_FIGURE_SIZE: tuple[float, float] = (8.0, 4.5)
_REPORT_FIGURE_DPI: int = 110

#: Figure file names, in display order.
FIGURES: dict[str, str] = {
    "loss": "report_loss.png",
    "intervals": "report_intervals.png",
    "overhead": "report_overhead.png",
    "costs": "report_checkpoint_costs.png",
}


def render_figures(data: ReportData) -> dict[str, bytes]:
    """PNG bytes of each figure, keyed as in ``FIGURES``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    result = {}
    for name, build in FIGURE_BUILDERS.items():
        figure = Figure(figsize=_REPORT_FIGURE_SIZE, layout="constrained")
        FigureCanvasAgg(figure)
        build(figure, data)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=_REPORT_FIGURE_DPI)
        result[name] = buffer.getvalue()
    return result


def _plot_loss(figure: Figure, data: ReportData) -> None:
    ax = figure.add_subplot()
    steps, losses = np.asarray(data.loss_steps), np.asarray(data.losses)
    if steps.size:
        ax.plot(steps, losses, ".", ms=3, color="0.55", label=f"loss ({data.loss_source})")
    plan = data.plan
    fit = plan.fit if plan is not None else None
    if plan is not None and fit is not None and fit.usable:
        last = max(float(steps.max()) if steps.size else 0.0, float(data.observed.steps))
        _draw_fit(ax, fit, last, float(plan.inputs.total_steps))
    _draw_checkpoint_marks(ax, data)
    if not steps.size and (fit is None or not fit.usable):
        ax.text(0.5, 0.5, "no loss trace or usable fit recorded", ha="center", va="center", transform=ax.transAxes)
    shown = losses[np.isfinite(losses)] if losses.size else np.empty(0)
    if shown.size and shown.min() > 0 and shown.max() / shown.min() > 20:
        ax.set_yscale("log")  # a loss falling by decades stays readable at the plateau
    ax.set_xlabel("training step (completed steps)")
    ax.set_ylabel("training loss (units of the job's loss)" + (", log scale" if ax.get_yscale() == "log" else ""))
    ax.set_title("Loss curve, fitted convergence law and checkpoints")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper right")


def _draw_fit(ax: Axes, fit: CurveFit, last: float, horizon: float) -> None:
    """The fitted law over the steps seen (up to ``last``), dashed beyond them up to ``horizon``."""
    start = max(float(fit.window_start or 1.0), 1.0)
    seen = np.linspace(start, max(last, start + 1), 200)
    ax.plot(seen, fit.loss(seen), "-", color="C0", lw=2, label=f"fit: {fit.family}")
    if horizon > last:
        ahead = np.linspace(last, horizon, 200)
        ax.plot(ahead, fit.loss(ahead), "--", color="C0", lw=1.5, label="fit, extrapolated")


def _draw_checkpoint_marks(ax: Axes, data: ReportData) -> None:
    """Vertical lines at the checkpoints (committed or not) and failures; ticks at planned steps ahead."""
    committed = [r.step for r in data.checkpoints if r.committed]
    other = [r.step for r in data.checkpoints if not r.committed]
    failures = [r.step for r in data.restores if r.failure]
    across = ax.get_xaxis_transform()  # each a full-height line, all of a kind one artist (not one per checkpoint)
    marks: list[tuple[list[int], str, float, Literal["-", ":", "--"], float, str]] = [
        (committed, "C2", 0.8, "-", 0.6, "checkpoint committed"),
        (other, "C3", 1.0, ":", 1.0, "checkpoint not committed"),
        (failures, "C3", 1.6, "--", 1.0, "failure: resumed from this checkpoint"),
    ]
    for steps, color, width, style, alpha, label in marks:
        if steps:
            ax.vlines(steps, 0.0, 1.0, transform=across, colors=color, linewidths=width, linestyles=style, alpha=alpha, label=label)
    future = [s for s in data.plan.steps if s > data.observed.steps] if data.plan is not None else []
    if future:
        ax.plot(future, np.zeros(len(future)), "|", color="C1", ms=12, transform=ax.get_xaxis_transform(),
                label="planned, not reached")


def _plot_intervals(figure: Figure, data: ReportData) -> None:
    ax = figure.add_subplot()
    step_seconds = data.observed.step_seconds or (data.plan.inputs.step_seconds if data.plan else None)
    chosen = data.plan.policy if data.plan is not None else None
    styles = ("-", "--", ":", "-.", (0, (5, 1, 1, 1)))  # Young and Daly often coincide: tell them apart
    for index, (name, steps) in enumerate(data.comparison_steps.items()):
        if not steps:
            continue
        x = np.asarray(steps)
        y = np.diff(np.concatenate([[0], x]))
        bold = name == chosen
        ax.step(x, y, where="pre", lw=2.6 if bold else 1.5, color=f"C{index}", ls="-" if bold else styles[index % len(styles)],
                label=f"{name} (this run's policy)" if bold else name, zorder=3 if bold else 2)
    taken = np.asarray([r.step for r in data.checkpoints if r.bytes is not None or r.committed])
    if taken.size:
        ax.plot(taken, np.diff(np.concatenate([[0], taken])), "ko", ms=4, label="taken in this run", zorder=4)
    if not data.comparison_steps and not taken.size:
        ax.text(0.5, 0.5, "no plan or checkpoints recorded", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_yscale("log")
    ax.set_xlabel("checkpoint step (completed steps)")
    ax.set_ylabel("interval since previous checkpoint (steps)")
    if step_seconds:
        secondary = ax.secondary_yaxis(
            "right", functions=(lambda s: np.asarray(s) * step_seconds, lambda t: np.asarray(t) / step_seconds)
        )
        secondary.set_ylabel("interval (seconds of training)")
    ax.set_title("Checkpoint intervals: each policy planned over the whole run")
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _plot_overhead(figure: Figure, data: ReportData) -> None:
    ax = figure.add_subplot()
    rows = [r for r in data.comparison if r.wall_percent is not None]
    if not rows:
        ax.text(0.5, 0.5, "no policy comparison (no plan recorded)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("expected overhead (% of failure-free run time)")
        return
    y = np.arange(len(rows))
    height = 0.38
    for offset, metric, label, color in ((-height / 2, "wall", "wall-clock", "C0"), (height / 2, "progress", "progress-weighted", "C1")):
        values = np.array([getattr(r, f"{metric}_percent") or 0.0 for r in rows])
        cis = [getattr(r, f"{metric}_ci_percent") for r in rows]
        error = None
        if all(ci is not None for ci in cis):
            error = np.array([[v - ci[0], ci[1] - v] for v, ci in zip(values, cis)]).T.clip(min=0)
        bars = ax.barh(y + offset, values, height, xerr=error, capsize=3, color=color, label=label)
        ax.bar_label(bars, fmt="%.3g%%", label_type="center", color="white", fontsize=8, fontweight="bold")
    ax.set_yticks(y, [r.policy + (" (this run)" if r.chosen else "") for r in rows])
    ax.invert_yaxis()
    source = rows[0].source
    ax.set_xlabel(f"overhead, % of the failure-free run time ({source})")
    ax.set_ylabel("policy")
    ax.set_title(("Simulated" if "simulated" in source else "Expected") + " fault-tolerance overhead per policy")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)


def _plot_costs(figure: Figure, data: ReportData) -> None:
    ax = figure.add_subplot()
    rows = [r for r in data.checkpoints if r.persist_seconds is not None or r.stall_seconds is not None]
    if not rows:
        ax.text(0.5, 0.5, "no checkpoint costs recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("checkpoint step (completed steps)")
        return
    values = [v for r in rows for v in (r.stall_seconds, r.persist_seconds, r.staging_seconds) if v is not None]
    if data.profile is not None and data.profile.stall_seconds.value:
        values.append(float(data.profile.stall_seconds.value))
    scale, unit = (1e3, "ms") if max(values) < 1.0 else (1.0, "s")
    for attr, label, marker, color in (
        ("stall_seconds", "stall (training blocked)", "o", "C3"),
        ("staging_seconds", "host copy (background)", "^", "C0"),
        ("persist_seconds", "persist: write + commit (background)", "s", "C1"),
    ):
        points = [(r.step, getattr(r, attr) * scale) for r in rows if getattr(r, attr) is not None]
        if points:
            x, v = zip(*points)
            ax.plot(x, v, marker, ls="-", lw=0.8, ms=4, color=color, label=label)
    profile = data.profile
    if not any(r.stall_seconds is not None for r in rows) and profile is not None and profile.stall_seconds.value:
        ax.axhline(profile.stall_seconds.value * scale, color="C3", ls="--", lw=1.2,
                   label="stall (training blocked), profile median")
    ax.set_xlabel("checkpoint step (completed steps)")
    ax.set_ylabel(f"time per checkpoint ({unit})")
    positive = [v * scale for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")
    ax.set_title("What each checkpoint cost")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


#: How each figure of ``FIGURES`` is drawn onto a blank matplotlib ``Figure``.
FIGURE_BUILDERS: dict[str, Callable[[Figure, ReportData], None]] = {
    "loss": _plot_loss,
    "intervals": _plot_intervals,
    "overhead": _plot_overhead,
    "costs": _plot_costs,
}
