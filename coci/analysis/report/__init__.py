"""The interval plan report: where a run's checkpoints went, why, what they cost, and the alternatives.

[``report``][coci.report] reads a run directory written by [``coci.Session``][coci.Session] (``.read``), re-plans
every policy with what the run measured (``.compare``) and returns a [``Report``][coci.Report], which
shows it as text (``.text``) and figures (``.figures``); nothing is written unless asked
([``Report.write``][coci.analysis.report.Report.write], [``Report.plot``][coci.analysis.report.Report.plot]).
"""

from __future__ import annotations

from coci.analysis.report.compare import compare_policies, simulated_into
from coci.analysis.report.figures import FIGURES
from coci.analysis.report.read import CheckpointRow, ObservedCosts, PolicyRow, ReportData, read_run
from coci.analysis.report.restores import RestoreRow
from coci.analysis.report.run_report import Report, report
from coci.analysis.report.text import format_bytes, format_seconds, step_list

__all__ = [
    "FIGURES",
    "CheckpointRow",
    "ObservedCosts",
    "PolicyRow",
    "Report",
    "ReportData",
    "RestoreRow",
    "compare_policies",
    "format_bytes",
    "format_seconds",
    "read_run",
    "report",
    "simulated_into",
    "step_list",
]
