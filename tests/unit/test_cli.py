"""Tests of the ``coci`` command line: every command on a run directory from a real training run."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
from report_run import make_run  # the short real run of the report tests (a crash, a restore, a clean close)

from coci.cli import main, read_curve
from coci.planning.config import POLICIES
from coci.planning.records import Plan

PLAN_ARGS = [
    "--mtbf", "8h", "--step-seconds", "0.25", "--stall-seconds", "0.4", "--persist-seconds", "6",
    "--total-steps", "10000", "--restart-seconds", "60",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "run"
    make_run(path)
    return path


@pytest.fixture
def curve_csv(tmp_path: Path) -> Path:
    steps = np.arange(1, 801)
    losses = 1.5 + 4.0 * (1.0 + steps / 50.0) ** -0.7 + 0.01 * np.random.default_rng(0).standard_normal(steps.size)
    path = tmp_path / "losses.csv"
    path.write_text("step,loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in zip(steps, losses)))
    return path


def _one_line_error(captured: pytest.CaptureResult, *words: str) -> None:
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("coci") and "error" in lines[0]
    assert "Traceback" not in captured.err
    for word in words:
        assert word in lines[0]


def test_plan_json_parses_as_a_plan_with_increasing_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *PLAN_ARGS, "--json"]) == 0
    plan = Plan.model_validate_json(capsys.readouterr().out)
    assert plan.policy == "auto" and plan.inputs.total_steps == 10000
    assert len(plan.steps) > 2 and all(b > a for a, b in zip(plan.steps, plan.steps[1:]))
    assert plan.inputs.failures.mean_seconds == pytest.approx(8 * 3600)
    assert plan.inputs.restart_seconds == 60


@pytest.mark.slow  # a full plan for every policy (~2.5 s)
def test_plan_all_compares_every_policy(capsys: pytest.CaptureFixture[str], curve_csv: Path) -> None:
    assert main(["plan", *PLAN_ARGS, "--policy", "all", "--curve", str(curve_csv), "--json"]) == 0
    plans = {name: Plan.model_validate(value) for name, value in json.loads(capsys.readouterr().out).items()}
    assert set(plans) == set(POLICIES)
    assert plans["auto"].fit is not None and plans["auto"].fit.usable
    # Young with the same inputs is periodic at round(sqrt(2 C / lambda) / t) steps
    interval = round(np.sqrt(2 * 0.4 * 8 * 3600) / 0.25)
    assert plans["young"].intervals[1] == interval
    assert main(["plan", *PLAN_ARGS, "--policy", "all", "--curve", str(curve_csv)]) == 0
    table = capsys.readouterr().out
    width = max(len(name) for name in POLICIES)
    for name in POLICIES:
        assert f"\n{name.rjust(width)} " in table
    assert "wall %" in table and "progress %" in table


def test_plan_text_describes_the_plan(capsys: pytest.CaptureFixture[str], curve_csv: Path) -> None:
    assert main(["plan", *PLAN_ARGS, "--policy", "daly"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("policy daly") and "expected wall-clock overhead" in text and "intervals:" in text


def test_read_curve_formats(tmp_path: Path, curve_csv: Path) -> None:
    steps, losses = read_curve(curve_csv)
    assert steps[0] == 1 and steps.size == losses.size == 800
    bare = tmp_path / "bare.csv"
    bare.write_text("3.0\n2.5\n2.2\n2.0\n")
    steps, losses = read_curve(bare)
    assert steps.tolist() == [1, 2, 3, 4] and losses.tolist() == [3.0, 2.5, 2.2, 2.0]
    multi = tmp_path / "multi.csv"
    multi.write_text("run_id,step,train_loss\n" + "".join(f"{r},{s},{5 - s / 10 - r}\n" for r in (0, 1) for s in range(1, 6)))
    steps, losses = read_curve(multi, run="1")
    assert steps.tolist() == [1, 2, 3, 4, 5] and losses[0] == pytest.approx(3.9)


def test_plan_reads_a_real_gpt2_curve(capsys: pytest.CaptureFixture[str], external_data: str) -> None:
    path = os.path.join(external_data, "modded-nanogpt", "mng_train_loss_dense.csv")
    assert main(["plan", *PLAN_ARGS, "--curve", path, "--curve-run", "2", "--json"]) == 0
    plan = Plan.model_validate_json(capsys.readouterr().out)
    assert plan.fit is not None and plan.fit.n_points == 1530


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--mtbf", "-1"], ("mtbf",)),
        (["--mtbf", "8h", "--curve", "/nonexistent/losses.csv"], ("curve file", "does not exist")),
        (["--mtbf", "soon"], ("mtbf",)),
        (["--mtbf", "8h", "--policy", "bogus"], ("--policy",)),
        (["--mtbf", "8h", "--restart-seconds", "-5"], ("restart_seconds",)),
        (["--mtbf", "8h", "--time-budget", "lots"], ("--time-budget",)),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str], words: tuple[str, ...]) -> None:
    base = ["--step-seconds", "0.25", "--stall-seconds", "0.4", "--persist-seconds", "6", "--total-steps", "1000"]
    assert main(["plan", *base, *extra]) == 2
    _one_line_error(capsys.readouterr(), *words)


def test_multi_run_curve_needs_a_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    multi = tmp_path / "multi.csv"
    multi.write_text("curve_id,step,val_loss\n" + "".join(f"{r},{s},{5 - s / 10}\n" for r in (7, 8) for s in range(1, 6)))
    assert main(["plan", *PLAN_ARGS, "--curve", str(multi)]) == 2
    _one_line_error(capsys.readouterr(), "--curve-run", "curve_id")


@pytest.mark.slow  # renders every figure
def test_report_prints_the_summary_and_writes_the_files(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["report", str(run_dir), "--out", str(out), "--trials", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"coci report: {run_dir}")
    assert "checkpoints:" in text and "lost work:" in text and "1 failure(s)" in text
    for name in ("report.json", "report.html", "report_loss.png", "report_intervals.png", "report_overhead.png"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "report.json").read_text())
    assert payload["observed"]["failures"] == 1
    assert main(["report", str(run_dir), "--no-files", "--json", "--trials", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["run_dir"] == str(run_dir)


def test_ls_lists_every_committed_checkpoint_verified(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    committed = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert main(["ls", str(run_dir)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[1:]
    assert [int(r.split()[0]) for r in rows] == committed
    assert all(r.endswith("verified; exports model, optimizer as safetensors, torch") for r in rows)  # and what `coci export` writes of it
    assert main(["ls", str(run_dir), "--no-verify"]) == 0
    assert "not verified" in capsys.readouterr().out


def test_ls_on_a_parent_folder_lists_its_runs(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    committed = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert main(["ls", str(run_dir.parent)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    row = next(line.split() for line in lines[1:] if line.startswith(run_dir.name + " "))
    assert row[1:] == [str(committed[-1]), str(len(committed)), "yes"]


def test_verify_passes_then_fails_on_a_corrupted_byte(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(run_dir)]) == 0
    assert "2 of 2 committed checkpoints verified" in capsys.readouterr().out
    import shutil

    copy = tmp_path / "corrupt"
    shutil.copytree(run_dir, copy)
    newest = max((copy / "checkpoints").iterdir(), key=lambda p: int(p.name.split("_")[1]))
    data = newest / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert main(["verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT  {newest.name}" in out and "checksum" in out and "1 CORRUPT" in out
    data.write_bytes(bytes(raw[:-10]))  # truncated
    assert main(["verify", str(copy)]) == 1
    assert "size" in capsys.readouterr().out
    assert main(["ls", str(copy)]) == 0
    assert "CORRUPT" in capsys.readouterr().out


def test_commands_on_a_missing_run_directory_fail_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("report", "ls", "verify"):
        assert main([command, str(tmp_path / "nowhere")]) == 2
        _one_line_error(capsys.readouterr(), "run_dir")


def test_simulate_reports_the_simulator_means_and_intervals(capsys: pytest.CaptureFixture[str]) -> None:
    from coci.analysis.simulate import simulate
    from coci.planning.planner import plan

    args = ["simulate", *PLAN_ARGS, "--policy", "young", "--trials", "50", "--seed", "1"]
    assert main([*args, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["young"]
    young = plan("young", failures="8h", total_steps=10000, step_seconds=0.25, stall_seconds=0.4, persist_seconds=6, restart_seconds=60)
    direct = simulate(young, failures=young.inputs.failures, trials=50, seed=1).metrics["wall_percent"]
    assert row["wall_percent"] == pytest.approx(direct.mean)
    assert row["wall_ci_percent"] == pytest.approx([direct.ci_low, direct.ci_high])
    assert main([*args, "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "young" in text and f"{direct.mean:.3g} [" in text and "50 trials" in text
    assert main([*args[:-4], "--trials", "0"]) == 2
    _one_line_error(capsys.readouterr(), "trials")


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["plan"], ["simulate"], ["report"], ["ls"], ["verify"]):
        assert main([*command, "--help"]) == 0
        assert "usage: coci" in capsys.readouterr().out
    assert main([]) == 2  # no command: usage error
    assert "required" in capsys.readouterr().err


def test_plan_configs_read_the_config_file_once_for_every_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--policy all``: one PlanConfig per policy, from one read of ``--config`` (not one per policy)."""
    from coci import cli
    from coci.integrations import _options

    config = tmp_path / "options.json"
    config.write_text('{"keep_last": 3}')
    reads: list[str] = []
    read = _options.read_options
    monkeypatch.setattr(_options, "read_options", lambda path: reads.append(path) or read(path))
    args = cli.build_parser().parse_args(["plan", *PLAN_ARGS, "--policy", "all", "--config", str(config)])
    configs = cli._plan_configs(args, list(POLICIES))
    assert [c.policy for c in configs] == list(POLICIES)
    assert all(c.total_steps == 10000 and c.restart_seconds == 60 for c in configs)
    assert reads == [str(config)]


def test_python_dash_m_coci_runs_the_command_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m coci ls RUN_DIR`` is the ``coci`` script (a venv whose bin folder is not on the PATH)."""
    monkeypatch.setattr(sys, "argv", ["coci", "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("coci", run_name="__main__")
    assert exited.value.code == 0
    assert "usage: coci" in capsys.readouterr().out
