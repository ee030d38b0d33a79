"""The [``Report``][coci.analysis.report.run_report.Report] of one run: its data (``.read``), the policy comparison (``.compare``),
and its text (``.text``) and figures (``.figures``), written on request."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from coci import safe_files
from coci.analysis.report import text
from coci.analysis.report.compare import compare_policies
from coci.analysis.report.figures import FIGURES, render_figures
from coci.analysis.report.read import PolicyRow, ReportData, read_run
from coci.planning.records import Plan

__all__ = ["REPORT_HTML_FILENAME", "REPORT_JSON_FILENAME", "Report", "report"]

#: Monte Carlo trials per policy for the report's overhead confidence intervals
#: (coci.analysis.simulate); 0 shows the planner's expected values only.
_REPORT_SIMULATE_TRIALS: int = 1000

REPORT_JSON_FILENAME = "report.json"
REPORT_HTML_FILENAME = "report.html"


def report(
    run_dir: str | os.PathLike[str],
    *,
    compare: bool = True,
    simulate_trials: int | None = None,
    seed: int = 0,
) -> Report:
    """Read the run directory ``run_dir`` and build its [``Report``][coci.analysis.report.run_report.Report].

    Args:
        run_dir: a directory written by [``coci.Session``][coci.Session].
        compare: re-plan every policy with the run's measured inputs for the comparison.
        simulate_trials: Monte Carlo trials per policy for the comparison's confidence intervals
            (default ``_REPORT_SIMULATE_TRIALS``; 0 uses expected values only).
        seed: seed of the simulation.
    """
    result = Report(read_run(Path(run_dir)))
    if compare:
        trials = _REPORT_SIMULATE_TRIALS if simulate_trials is None else simulate_trials
        result.compare(trials=trials, seed=seed)
    return result


class Report:
    """A run's plan report: [``summary``][coci.analysis.report.run_report.Report.summary], [``to_frame``][coci.analysis.report.run_report.Report.to_frame], [``plot``][coci.analysis.report.run_report.Report.plot], [``to_html``][coci.analysis.report.run_report.Report.to_html],
    [``to_json``][coci.analysis.report.run_report.Report.to_json], [``write``][coci.analysis.report.run_report.Report.write]. ``data`` is the underlying ``ReportData``."""

    def __init__(self, data: ReportData) -> None:
        self.data = data
        self._plans: dict[str, Plan] = {}
        self._figures: dict[str, bytes] | None = None

    def compare(self, *, trials: int = 0, seed: int = 0) -> list[PolicyRow]:
        """(Re)compute the policy comparison; needs the run's plan."""
        plan = self.data.plan
        if plan is None:
            self.data.comparison = []
            return []
        rows, plans = compare_policies(plan, trials=trials, seed=seed)
        self._plans = plans
        self._figures = None
        self.data.comparison = rows
        self.data.comparison_steps = {name: list(p.steps) for name, p in plans.items()}
        return rows

    def to_frame(self) -> pd.DataFrame:
        """One row per checkpoint: step, planned (True/False/None = earlier plan), stall, staging
        and persist seconds, bytes, committed, still on disk, error."""
        return text.checkpoint_frame(self.data)

    def comparison_frame(self) -> pd.DataFrame:
        """One row per policy: checkpoints, first/last interval, expected overheads (s and %)."""
        return text.comparison_frame(self.data)

    def summary(self) -> str:
        """A readable plain-text summary (what ``coci report`` prints)."""
        return text.summary(self.data, self._plans)

    def figures(self) -> dict[str, bytes]:
        """PNG bytes of each figure, keyed as in ``FIGURES`` (rendered once, then cached)."""
        if self._figures is None:
            self._figures = render_figures(self.data)
        return dict(self._figures)

    def plot(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write the figures as PNG files into ``directory``; return their paths."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, png in self.figures().items():
            path = target / FIGURES[name]
            safe_files.replace_file(path, png, follow_dir=True)  # never through a link planted there
            paths.append(path)
        return paths

    def to_json(self) -> str:
        """The report as JSON (``ReportData`` plus the figure file names)."""
        return text.to_json(self.data, self.summary())

    def to_html(self, figures: dict[str, bytes] | None = None) -> str:
        """A self-contained HTML page: summary, tables and every figure embedded as base64 PNG."""
        return text.to_html(self.data, self.summary(), self.figures() if figures is None else figures)

    def write(self, run_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
        """Write ``report.json``, ``report.html`` and the PNG figures into ``run_dir`` (default: the
        run's own directory); return the paths by name."""
        target = Path(self.data.run_dir if run_dir is None else run_dir)
        figures, summary_text = self.figures(), self.summary()
        paths: dict[str, Path] = dict(zip(figures, self.plot(target)))
        paths["json"] = target / REPORT_JSON_FILENAME
        pieces = (piece.encode("utf-8") for piece in text.json_pieces(self.data, summary_text))
        safe_files.replace_file(paths["json"], pieces, follow_dir=True)  # streamed: never the whole text at once
        paths["html"] = target / REPORT_HTML_FILENAME
        pages = (piece.encode("utf-8") for piece in text.html_pieces(self.data, summary_text, figures))
        safe_files.replace_file(paths["html"], pages, follow_dir=True)
        return paths

    def _repr_html_(self) -> str:  # Jupyter
        return self.to_html()

    def __repr__(self) -> str:
        return self.summary()
