"""``import coci`` loads no submodule at all (not even pydantic); the first public name a job uses
(``coci.Session``) loads what a training loop needs and nothing heavier, and the report, the
simulator, pandas, scipy and matplotlib load only when one of their names is used
(``coci.__getattr__``), so they cost a training job nothing unless it asks for them. Checked in a
fresh interpreter (this one has imported them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "scipy", "matplotlib", "coci.analysis.report", "coci.analysis.simulate")


def _loaded_after(code: str) -> set[str]:
    """Top-level and coci modules loaded by ``code`` in a fresh interpreter."""
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_coci_loads_none_of_its_modules_nor_pydantic() -> None:
    loaded = _loaded_after("import coci")
    assert not {name for name in loaded if name.startswith(("coci.", "profiler", "pydantic"))}
    assert not {name for name in HEAVY if name in loaded}


def test_the_first_public_name_loads_the_training_path_and_nothing_heavy() -> None:
    loaded = _loaded_after("import coci\nassert coci.Session.__name__ == 'Session'")
    assert not {name for name in HEAVY if name in loaded}
    assert {"coci.session", "coci.planning.planner", "coci.checkpoint.format", "profiler"} <= loaded
    # from then on submodules resolve as attributes, as when ``import coci`` loaded them eagerly
    chained = _loaded_after("import coci\ncoci.EveryN\nassert coci.checkpoint.local.Manifest and coci.events.read_events")
    assert "coci.checkpoint.local" in chained


def test_a_submodule_looked_up_alone_loads_alone() -> None:
    loaded = _loaded_after("import coci\nassert coci.knobs.WRITE_DIRECT in (True, False)\nfrom coci import units")
    assert {"coci.knobs", "coci.units"} <= loaded
    assert not {name for name in loaded if name.startswith(("coci.session", "coci.planning", "coci.checkpoint"))}
    missing = "import coci\ntry:\n    coci.no_such_name\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)"
    _loaded_after(missing)


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
