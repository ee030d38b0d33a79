"""Tests of coci.analysis.report: the plan report read back from real and hand-written run directories."""

from __future__ import annotations

import base64
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from report_run import CRASH_AT, PNG_MAGIC, TOTAL_STEPS, make_run, toy_job, toy_plan, train_until

import coci
from coci.analysis.report import FIGURES, Report, ReportData, report
from coci.analysis.report.restores import _restores
from coci.analysis.report.text import display_checkpoints, failure_count_flag
from coci.checkpoint import layout
from coci.errors import ConfigError
from coci.events import read_events
from coci.planning.config import POLICIES
from coci.planning.planner import plan
from coci.planning.records import Plan


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Plan, dict[int, float]]:
    run_dir = tmp_path_factory.mktemp("report") / "run"
    the_plan, logged = make_run(run_dir)
    return run_dir, the_plan, logged


@pytest.fixture(scope="module")
def built(run: tuple[Path, Plan, dict[int, float]]) -> Report:
    return report(run[0])


def test_checkpoint_table_matches_the_event_log_and_the_disk(run, built) -> None:
    run_dir, the_plan, _ = run
    events = list(read_events(run_dir))
    frame = built.to_frame()
    started = sorted({e["step"] for e in events if e["event"] == "snapshot_start"})
    assert frame["step"].tolist() == started
    taken = [s for s in the_plan.steps if s <= TOTAL_STEPS]
    assert started == taken  # the session followed the plan exactly
    assert frame["planned"].tolist() == [True] * len(taken)
    commits = {e["step"]: e for e in events if e["event"] == "commit"}
    assert frame["committed"].tolist() == [s in commits for s in started]
    for row in frame.itertuples():
        if row.committed:
            assert row.persist_seconds == commits[row.step]["seconds"]
            assert row.bytes == commits[row.step]["bytes"]
    on_disk = [s for s, _ in layout.committed_steps(layout.checkpoints_dir(run_dir))]
    assert frame.loc[frame["on_disk"], "step"].tolist() == on_disk
    assert len(on_disk) == 2  # keep_last


def test_the_crash_is_counted_as_a_failure_with_its_restore_step(run, built) -> None:
    _, the_plan, _ = run
    restores = built.data.restores
    assert len(restores) == 1
    restored = max(s for s in the_plan.steps if s <= CRASH_AT)
    assert restores[0].step == restored and restores[0].failure
    assert restores[0].reached_step is not None and restores[0].reached_step >= restored
    assert built.data.observed.failures == 1


def test_lost_work_is_counted_per_failed_segment_and_not_after_a_clean_close() -> None:
    events = [
        {"event": "snapshot_start", "step": 10}, {"event": "commit", "step": 10},
        {"event": "plan", "step": 17},
        {"event": "restore", "step": 10, "seconds": 0.5},  # crash after step 17: 7 steps lost at least
        {"event": "snapshot_start", "step": 30}, {"event": "commit", "step": 30},
        {"event": "close", "step": 40},
        {"event": "restore", "step": 30, "seconds": 0.4},  # a re-run after a clean close: no failure
    ]
    rows = _restores(events, step_seconds=0.5)
    assert [(r.step, r.failure, r.reached_step, r.lost_steps) for r in rows] == [(10, True, 17, 7), (30, False, 40, None)]
    assert rows[0].lost_seconds == pytest.approx(3.5)


def _write_run(run_dir: Path, events: list[dict], profile: coci.Profile | None = None, the_plan: Plan | None = None) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if profile is not None:
        (run_dir / "profile.json").write_text(profile.model_dump_json())
    if the_plan is not None:
        (run_dir / "plan.json").write_text(the_plan.model_dump_json())


def test_stall_overhead_and_planned_marks_from_a_hand_written_log(tmp_path: Path) -> None:
    the_plan = toy_plan()
    first, second = the_plan.steps[:2]
    events = [
        {"event": "plan", "step": 0, "steps": [first, second + 1]},
        {"event": "snapshot_start", "step": first, "bytes": 1000},
        {"event": "stall", "step": first, "seconds": 0.25},
        {"event": "commit", "step": first, "seconds": 2.0, "bytes": 1000},
        {"event": "plan", "step": first, "steps": [second + 1]},
        {"event": "snapshot_start", "step": second, "bytes": 1000},  # taken, but the plan said second + 1
        {"event": "stall", "step": second, "seconds": 0.75},
        {"event": "error", "step": second, "phase": "persist", "message": "OSError: disk full"},
        {"event": "close", "step": 100},
    ]
    profile = coci.Profile(
        steps=100,
        step_seconds=coci.Estimate(value=0.1, count=50),
        stall_seconds=coci.Estimate(value=0.5, count=2),
        persist_seconds=coci.Estimate(value=2.0, count=1),
        interference=coci.Estimate(value=1.25, count=10),
    )
    _write_run(tmp_path / "run", events, profile, the_plan)
    result = report(tmp_path / "run", compare=False)
    frame = result.to_frame()
    assert frame["planned"].tolist() == [True, False]
    assert frame["committed"].tolist() == [True, False]
    assert frame["error"].tolist() == [None, "OSError: disk full"]
    observed = result.data.observed
    # interference per checkpoint: P (1 - 1/r) = 2.0 * (1 - 1/1.25) = 0.4 s; two checkpoints
    assert observed.stall_seconds == pytest.approx(1.0) and not observed.stall_estimated
    assert observed.interference_seconds == pytest.approx(0.8)
    assert observed.compute_seconds == pytest.approx(10.0)
    assert observed.overhead_percent == pytest.approx(100 * 1.8 / 10.0)
    summary = result.summary()
    assert "OSError: disk full" in summary and "18.00% of" in summary
    assert "interference: the median step during a persist took 1.25x the others' (+25%) = 400 ms per checkpoint" in summary


def test_a_plan_made_on_the_planner_thread_is_compared_from_the_step_it_took_effect(tmp_path: Path) -> None:
    """A background plan observed at step 22 takes effect at a later step (30 here, the planner
    thread's lag; its plan event's step); until then the previous plan governs. At the step it
    takes effect both plans are asked. The report neither flags the earlier plan's checkpoints as
    unplanned nor the new plan's steps that were already past when it took effect as missed."""
    made = toy_plan()
    current = made.model_copy(update={"steps": [25, 30, 38], "inputs": made.inputs.model_copy(update={"start_step": 22})})
    events: list[dict] = [{"event": "plan", "step": 10, "steps": [20, 28, 40]}]
    for step in (20, 28, 30, 38):
        if step == 30:
            events.append({"event": "plan", "step": 30, "steps": [25, 30, 38]})  # made at 22, in effect from 30
        events += [
            {"event": "snapshot_start", "step": step, "bytes": 1000},
            {"event": "stall", "step": step, "seconds": 0.01},
            {"event": "commit", "step": step, "seconds": 0.02, "bytes": 1000},
        ]
    events.append({"event": "close", "step": 40})
    _write_run(tmp_path / "run", events, the_plan=current)
    result = report(tmp_path / "run", compare=False)
    assert result.data.plan_applied_step == 30
    assert result.to_frame()["planned"].tolist() == [True, True, True, True]
    summary = result.summary()
    assert "current plan (made at step 22, in effect from step 30)" in summary, summary
    assert "taken from step 30: 30, 38" in summary, summary
    assert "not taken" not in summary, summary


@pytest.mark.slow  # renders every figure
def test_missing_stall_events_fall_back_to_the_profile_median_and_say_so(tmp_path: Path) -> None:
    events = [{"event": "snapshot_start", "step": s, "bytes": 10} for s in (5, 9, 13)]
    profile = coci.Profile(steps=20, step_seconds=coci.Estimate(value=0.5, count=5), stall_seconds=coci.Estimate(value=0.1, count=3))
    _write_run(tmp_path / "run", events, profile)
    result = report(tmp_path / "run")
    assert result.data.observed.stall_seconds == pytest.approx(0.3) and result.data.observed.stall_estimated
    assert any("no stall" in n for n in result.data.notes)
    assert result.data.plan is None and result.data.comparison == []
    assert "plan: none recorded" in result.summary()
    assert set(result.figures()) == set(FIGURES)  # every figure still renders without a plan


def test_summary_names_plan_fit_failure_model_and_costs(run, built) -> None:
    _, the_plan, _ = run
    text = built.summary()
    taken = [s for s in the_plan.steps if s <= TOTAL_STEPS]
    assert ", ".join(map(str, taken[:3])) in text
    assert f"fit: {the_plan.fit.family}" in text
    assert the_plan.inputs.failures.describe() in text
    for heading in ("checkpoints:", "costs:", "lost work:", "fallbacks:", "policies over the whole run"):
        assert heading in text
    assert "1 failure(s)" in text


def test_comparison_agrees_with_the_planner(run) -> None:
    run_dir, the_plan, _ = run
    built = report(run_dir, simulate_trials=0)
    rows = {r.policy: r for r in built.data.comparison}
    assert set(rows) == set(POLICIES)
    assert [r.policy for r in built.data.comparison if r.chosen] == ["auto"]
    inputs = the_plan.inputs
    young = plan(
        "young", failures=inputs.failures, total_steps=inputs.total_steps, step_seconds=inputs.step_seconds,
        stall_seconds=inputs.stall_seconds, persist_seconds=inputs.persist_seconds,
        restart_seconds=inputs.restart_seconds, curve=the_plan.fit,
    )
    assert rows["young"].checkpoints == len(young.steps)
    assert built.data.comparison_steps["young"] == young.steps
    assert rows["young"].source == "expected"
    assert rows["young"].wall_seconds == pytest.approx(young.expected["wall_seconds"])
    run_seconds = young.expected["run_seconds"]
    assert rows["young"].wall_percent == pytest.approx(100 * young.expected["wall_seconds"] / run_seconds)
    assert rows["young"].progress_seconds == pytest.approx(young.expected["progress_seconds"])
    assert rows["auto"].checkpoints == len(the_plan.steps)  # same inputs, same fit: the same plan


def test_loss_trace_is_read_back_from_the_newest_checkpoint(run) -> None:
    """Without loss_curve.json (a run killed before close), the trace comes from the newest
    checkpoint's profiler state."""
    run_dir, _, logged = run
    copy = run_dir.parent / "no-loss-curve"
    shutil.copytree(run_dir, copy)
    (copy / "loss_curve.json").unlink()
    built = report(copy)
    steps, losses = np.asarray(built.data.loss_steps), np.asarray(built.data.losses)
    assert built.data.loss_source.startswith("profiler trace in checkpoint step_")
    newest = int(built.data.loss_source.rsplit("_", 1)[1])
    assert steps.size > 10 and steps.max() <= newest
    exact = steps == np.round(steps)  # single-step buckets hold the logged loss itself
    for step, loss in zip(steps[exact][:20], losses[exact][:20]):
        assert loss == pytest.approx(logged[int(step)], rel=1e-6)


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "src" and tag == "img":
                self.images.append(value or "")
            elif name in ("src", "href") and value and not value.startswith("data:"):
                self.external.append(value)


@pytest.mark.slow  # renders every figure
def test_html_is_self_contained_with_every_figure_embedded(built) -> None:
    page = built.to_html()
    parser = _Images()
    parser.feed(page)
    parser.close()
    assert len(parser.images) == len(FIGURES) and not parser.external
    for src in parser.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert "<pre>" in page and "Policies over the whole run" in page


@pytest.mark.slow  # renders every figure
def test_write_produces_json_html_and_pngs_that_round_trip(run, built, tmp_path: Path) -> None:
    paths = built.write(tmp_path / "out")
    for name, file_name in FIGURES.items():
        assert paths[name] == tmp_path / "out" / file_name
        assert paths[name].read_bytes().startswith(PNG_MAGIC)
    payload = json.loads(paths["json"].read_text())
    assert payload["figures"] == FIGURES
    again = ReportData.model_validate({k: v for k, v in payload.items() if k in ReportData.model_fields})
    assert again.checkpoints == built.data.checkpoints and again.plan == built.data.plan
    assert paths["html"].read_text().startswith("<!DOCTYPE html>")


def test_figures_carry_axis_labels_with_units(built) -> None:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from coci.analysis.report.figures import FIGURE_BUILDERS

    for build in FIGURE_BUILDERS.values():
        figure = Figure()
        FigureCanvasAgg(figure)
        build(figure, built.data)
        axis = figure.axes[0]
        assert "(" in axis.get_xlabel() and ")" in axis.get_xlabel(), axis.get_xlabel()
        assert axis.get_ylabel(), build.__name__
    assert matplotlib.get_backend()  # the global backend was not switched by the report


def test_bad_run_directories_get_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="run_dir"):
        report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no coci run"):
        report(tmp_path / "empty")
    _write_run(tmp_path / "broken", [{"event": "close", "step": 3}])
    (tmp_path / "broken" / "plan.json").write_text("{not json")
    result = report(tmp_path / "broken")
    assert any("plan.json is unreadable" in n for n in result.data.notes)


HUGE = "1" + "0" * 400  # a JSON integer no float holds


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("close", "overhead_close_wait", HUGE),
        ("close", "step", HUGE),
        ("commit", "step", HUGE),
        ("commit", "bytes", HUGE),
        ("commit", "seconds", "-5"),
        ("snapshot_end", "seconds", "Infinity"),
        ("stall", "seconds", "NaN"),
        ("restore", "seconds", "1e400"),
        ("close", "pid", "[]"),
        ("plan", "steps", '[1, "x", 1e308]'),
    ],
)
@pytest.mark.slow  # renders every figure of `coci report` per case
def test_hostile_event_fields_are_dropped_with_a_note_naming_them(
    run, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, field: str, value: str
) -> None:
    """A number no real run records (huge, infinite, NaN, negative) or a field of the wrong type in
    events.jsonl: the report and ``coci report`` (figures included) drop that field and say so."""
    from coci.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(run[0], run_dir)
    lines = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == kind:
            event[field] = "__HOSTILE__"
            line = json.dumps(event).replace('"__HOSTILE__"', value)
        lines.append(line)
    (run_dir / "events.jsonl").write_text("\n".join([*lines, "[1, 2]", "7", "{" + HUGE * 12 + "}"]) + "\n")
    assert main(["report", str(run_dir), "--trials", "0"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    notes = report(run_dir).data.notes
    assert any(f"{kind}.{field} = " in note and "ignored" in note for note in notes), notes
    assert any("not a JSON object; skipped" in note for note in notes), notes


@pytest.mark.parametrize(
    ("name", "path", "value", "said"),
    [
        ("profile.json", ("state_bytes",), HUGE, "profile.json is unreadable"),
        ("profile.json", ("steps",), HUGE, "profile.json is unreadable"),
        ("plan.json", ("inputs", "total_steps"), HUGE, "plan.json is unreadable"),
        ("plan.json", ("inputs", "persist_seconds"), "1e308", "OverflowError"),
        ("plan.json", ("fit", "params", "a"), "1e308", None),
        ("plan.json", ("inputs", "failures", "nodes"), HUGE, "plan.json is unreadable"),
        ("plan.json", ("inputs", "failures", "scale_seconds"), HUGE, "plan.json is unreadable"),
        ("plan.json", ("inputs", "failures", "warned_fraction"), HUGE, "plan.json is unreadable"),
        ("loss_curve.json", ("losses", 3), HUGE, "loss_curve.json unreadable"),
    ],
)
@pytest.mark.slow  # renders every figure of `coci report` per case
def test_hostile_numbers_in_plan_and_profile_never_crash_the_report(
    run, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, path: tuple[str | int, ...], value: str, said: str | None
) -> None:
    """An integer no run reaches, or a value the model refuses, makes the file unreadable (a note);
    a float the planner's arithmetic overflows on (the comparison re-plans from plan.json's inputs)
    puts the error in the policy's row; ``coci report`` prints its summary and exits 0 either way."""
    from coci.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(run[0], run_dir)
    document = json.loads((run_dir / name).read_text())
    node = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = "__HOSTILE__"
    (run_dir / name).write_text(json.dumps(document).replace('"__HOSTILE__"', value))
    assert main(["report", str(run_dir), "--trials", "0"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    data = report(run_dir, simulate_trials=0).data
    if said is not None:
        assert any(said in text for text in [*data.notes, *(row.error or "" for row in data.comparison)]), data


def test_simulated_confidence_intervals_bracket_the_means(run, built) -> None:
    result = report(run[0], simulate_trials=50, seed=0)
    rows = result.data.comparison
    assert all(r.source.startswith("simulated, 50 trials") for r in rows if r.error is None)
    for r in rows:
        if r.wall_ci_percent is not None:
            assert r.wall_ci_percent[0] <= r.wall_percent <= r.wall_ci_percent[1]


def test_a_run_that_ended_before_its_first_plan_says_so(tmp_path: Path) -> None:
    """A planning policy whose run ends before the first plan arrives has no plan.json: the report
    says no plan was made yet, not that the policy does not plan; EveryN's report still says that."""
    for policy, expected in (("auto", "plan: none made: the run ended after 3 steps"), (coci.EveryN(2), "the policy does not plan")):
        run_dir = tmp_path / str(policy)
        model, opt, x, y = toy_job()
        session = coci.Session(run_dir, state={"model": model, "optimizer": opt}, policy=policy, mtbf="1h", total_steps=3)
        train_until(session, model, opt, x, y, 3, {})
        session.close()
        assert session.plan is None
        text = report(run_dir).summary()
        assert expected in text, text


def test_checkpoints_the_plan_did_not_ask_for_say_why_they_were_taken(tmp_path: Path) -> None:
    """A real session logs why each checkpoint was taken: the policy's at 4 and 8, the user's
    ``session.checkpoint()`` at 6, ``save_last`` at ``close()`` at 10. The report's table names the
    off-plan ones instead of "no", and none of them is counted as "taken but not planned"."""
    model, opt, x, y = toy_job()
    run_dir = tmp_path / "run"
    session = coci.Session(run_dir, state={"model": model, "optimizer": opt}, policy=coci.EveryN(4), total_steps=10)
    train_until(session, model, opt, x, y, 6, {})
    session.checkpoint()
    train_until(session, model, opt, x, y, 10, {})
    session.close()
    logged = {e["step"]: e["reason"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
              if e["event"] == "snapshot_start"}
    assert logged == {4: "policy", 6: "request", 8: "policy", 10: "close"}
    frame = report(run_dir, compare=False).to_frame()
    assert frame["reason"].tolist() == ["policy", "request", "policy", "close"]
    table = display_checkpoints(frame)
    assert table["planned"].tolist()[1::2] == ["session.checkpoint()", "save_last"]
    with coci.Session(tmp_path / "other", state={"model": model}, policy=coci.EveryN(1000)) as other, pytest.raises(ConfigError, match="reason"):
        other.checkpoint(reason="whim")  # type: ignore[arg-type]


def test_the_plan_against_taken_lists_off_plan_checkpoints_apart_and_drops_an_unknown_reason(tmp_path: Path) -> None:
    """Against the current plan (25, 30, 38): 30 and 38 are the plan's, 33 a request, 40 the final
    checkpoint at close(), 35 carries a reason coci never writes (dropped: a log is untrusted input),
    so only 35 is "taken but not planned"."""
    made = toy_plan()
    current = made.model_copy(update={"steps": [25, 30, 38], "inputs": made.inputs.model_copy(update={"start_step": 22})})
    events: list[dict] = [{"event": "plan", "step": 22, "steps": [25, 30, 38]}]
    for step, reason in ((30, "policy"), (33, "request"), (35, "<script>"), (38, "policy"), (40, "close")):
        events += [
            {"event": "snapshot_start", "step": step, "bytes": 1000, "reason": reason},
            {"event": "commit", "step": step, "seconds": 0.02, "bytes": 1000},
        ]
    events.append({"event": "close", "step": 40})
    _write_run(tmp_path / "run", events, the_plan=current)
    result = report(tmp_path / "run", compare=False)
    assert [row.reason for row in result.data.checkpoints] == ["policy", "request", None, "policy", "close"]
    summary = result.summary()
    assert "planned but not taken: 25; taken but not planned: 35" in summary, summary
    assert "also taken: 33 (session.checkpoint()), 40 (save_last)" in summary, summary


def test_lost_steps_are_timed_at_the_pace_of_the_process_that_lost_them() -> None:
    """A process that ran 0.45 s a step (its progress and snapshot events say so) and was killed
    at step 28 after a checkpoint at 20 lost 8 steps = 3.6 s, whatever the run's final step time
    (1.6 s here); a process whose events span too few steps falls back to the final step time."""
    events = [
        {"event": "session", "step": 0, "time": 100.0},
        {"event": "progress", "step": 5, "time": 102.25},
        {"event": "snapshot_start", "step": 20, "time": 109.0},
        {"event": "progress", "step": 25, "time": 111.25},
        {"event": "session", "step": 0, "time": 130.0},
        {"event": "reached", "step": 28, "time": 130.1},
        {"event": "restore", "step": 20, "seconds": 0.1, "time": 130.2},
        {"event": "snapshot_start", "step": 22, "time": 131.0},
        {"event": "session", "step": 0, "time": 150.0},
        {"event": "reached", "step": 23, "time": 150.1},
        {"event": "restore", "step": 22, "seconds": 0.1, "time": 150.2},
    ]
    rows = _restores(events, step_seconds=1.6)
    assert [(r.lost_steps, r.lost_exact) for r in rows] == [(8, True), (1, True)]
    assert rows[0].lost_seconds == pytest.approx(8 * 0.45)
    assert rows[1].lost_seconds == pytest.approx(1.6)  # one event in that process: no pace of its own


def test_a_process_killed_before_its_first_checkpoint_is_timed_to_the_next_start() -> None:
    """Restored at step 10 at t=100 and killed at step 30 (its step mark) with no event since: its
    20 lost steps took until the next process started (t=160 less 2 s of start-up), 2.9 s a step,
    not the run's final 0.5 s."""
    events = [
        {"event": "session", "step": 0, "time": 90.0, "startup_seconds": 2.0},
        {"event": "restore", "step": 10, "seconds": 0.1, "time": 100.0},
        {"event": "reached", "step": 30, "time": 160.0},
        {"event": "session", "step": 0, "time": 160.0, "startup_seconds": 2.0},
        {"event": "restore", "step": 10, "seconds": 0.1, "time": 160.2},
    ]
    rows = _restores(events, step_seconds=0.5)
    assert [(r.lost_steps, r.lost_exact) for r in rows[1:]] == [(20, True)]
    assert rows[1].lost_seconds == pytest.approx(20 * 2.9)


def test_a_restore_lists_each_nodes_source_and_refuses_a_malformed_one() -> None:
    from coci.analysis.report.text import _restore_lines

    events = [
        {"time": 1.0, "event": "session", "step": 0},
        {"time": 2.0, "event": "progress", "step": 9},
        {"time": 3.0, "event": "session", "step": 0},
        {"time": 4.0, "event": "restore", "step": 8, "seconds": 0.5, "tier": "local", "node_tiers": {"1": "local", "0": "remote"}},
        {"time": 5.0, "event": "restore", "step": 8, "seconds": 0.5, "tier": "local", "node_tiers": {"x": "local", "0": "tape"}},
    ]
    first, second = _restores(events, step_seconds=0.5)
    assert first.failure and first.lost_steps == 1 and first.node_tiers == {0: "remote", 1: "local"}
    assert second.node_tiers is None and second.tier == "local"  # an untrusted field that is not one: left out
    data = ReportData.model_construct(restores=[first, second])
    lines = _restore_lines(data)
    assert "node 0 from the remote tier, node 1 local tier" in lines[1]
    assert lines[-1] == "  by source: local 2, remote 1"
    unknown = first.model_copy(update={"lost_steps": 0, "lost_exact": False})
    assert "lost steps unknown" in _restore_lines(ReportData.model_construct(restores=[unknown]))[1]  # never "at least 0"


def test_far_more_failures_than_the_model_expects_are_flagged() -> None:
    flag = failure_count_flag(4, 0.38)  # the count a trial saw, with no flag
    assert flag is not None and "4 observed against 0.38 expected" in flag and "mtbf=" in flag
    assert failure_count_flag(1, 0.38) is None and failure_count_flag(3, 2.5) is None
    assert failure_count_flag(2, 0.0) is not None  # none expected at all
