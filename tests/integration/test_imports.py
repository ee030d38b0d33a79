"""``import coci`` loads what a training loop needs and nothing heavier: the report, the simulator,
pandas, scipy and matplotlib load on first use (``coci.__getattr__``), so they cost a training job
nothing unless it asks for them. Checked in a fresh interpreter (this one has imported them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "scipy", "matplotlib", "coci.analysis.report", "coci.analysis.simulate")


def _loaded_after(code: str) -> set[str]:
    """Top-level and coci modules loaded by ``code`` in a fresh interpreter."""
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_coci_loads_no_report_simulator_pandas_scipy_or_matplotlib() -> None:
    loaded = _loaded_after("import coci")
    assert not {name for name in HEAVY if name in loaded}
    assert "coci.session" in loaded and "coci.planning.planner" in loaded  # what a training loop uses is there


def test_a_session_with_a_planning_policy_still_imports_nothing_heavy(tmp_path: Path) -> None:
    """Constructing ``Session(policy="auto")`` and stepping it before its first plan stays light too."""
    code = (
        "import torch, coci\n"
        f"s = coci.Session({str(tmp_path)!r}, {{'w': torch.zeros(2)}}, policy='auto', mtbf='8h', total_steps=100)\n"
        "s.step(1.0)\ns.close()"
    )
    assert not {name for name in HEAVY if name in _loaded_after(code)}


def test_lazy_names_load_on_first_use() -> None:
    loaded = _loaded_after("import coci\nassert callable(coci.report) and callable(coci.simulate)\nassert 'report' in dir(coci)")
    assert {"coci.analysis.report", "coci.analysis.simulate", "pandas"} <= loaded


_TRAIN = """
import torch
import coci

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
session = coci.Session("run", {"model": model, "optimizer": optimizer}, policy=coci.EveryN(3))
for _ in range(6):
    optimizer.zero_grad()
    loss = model(torch.ones(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    session.step(loss.item())
session.close()
print("trained", session.checkpoint_steps)
"""


@pytest.mark.parametrize("own_modules", [("profiler.py",), ("events.py", "planning.py"), ("profiler.py", "checkpoint.py", "knobs.py")])
def test_a_training_folder_with_its_own_profiler_or_events_module_imports_coci(tmp_path: Path, own_modules: tuple[str, ...]) -> None:
    """A user's ``profiler.py`` (or ``events.py``, ``planning.py``) beside the training script comes
    first on ``sys.path``: coci imports nothing by a name it could shadow, so the script trains."""
    for name in own_modules:
        (tmp_path / name).write_text("raise ImportError('the user module was imported by coci')\n")
    (tmp_path / "train.py").write_text(_TRAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "trained (3, 6)" in out.stdout
