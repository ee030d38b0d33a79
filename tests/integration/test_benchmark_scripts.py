"""Benchmark scripts run as processes: ``benchmarks/cuda_path.py`` exits cleanly where there is no CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # runs benchmarks/cuda_path.py as a process
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_cuda_script_exits_cleanly_without_cuda() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cuda_path.py")], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0
    assert "CUDA is not available" in result.stdout
