"""The report's HTML page rendered by headless Chromium (a process): a screenshot and every figure
embedded. The report's in-process tests: ``tests/unit/test_report.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from report_run import PNG_MAGIC, make_run

from coci.analysis.report import FIGURES, Report, report
from coci.planning.records import Plan

#: Set by .ci/run where it installed Chromium: the browser test must then run, never skip.
CHROMIUM_REQUIRED = os.environ.get("COCI_REQUIRE_CHROMIUM") == "1"


CHROMIUM_MISSING = shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists()


@pytest.mark.slow  # runs headless chromium as a process
@pytest.mark.skipif(CHROMIUM_MISSING and not CHROMIUM_REQUIRED, reason="chromium is not installed")
def test_html_renders_in_headless_chromium(built, tmp_path: Path) -> None:
    assert not CHROMIUM_MISSING, "COCI_REQUIRE_CHROMIUM=1 but chromium is not installed"
    page = tmp_path / "report.html"
    page.write_text(built.to_html())
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    shot = tmp_path / "shot.png"
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1100,2000", page.as_uri()],
        capture_output=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes().startswith(PNG_MAGIC)
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()], capture_output=True, timeout=120, text=True)
    assert dom.stdout.count("data:image/png;base64,") == len(FIGURES)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Plan, dict[int, float]]:
    run_dir = tmp_path_factory.mktemp("report") / "run"
    the_plan, logged = make_run(run_dir)
    return run_dir, the_plan, logged


@pytest.fixture(scope="module")
def built(run: tuple[Path, Plan, dict[int, float]]) -> Report:
    return report(run[0])
