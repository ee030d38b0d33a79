"""Inputs a hostile probe found accepted, each now a ConfigError naming it: a horizon past any
step count, a fault signal as a preemption notice, a policy of 10**18 steps, a reader that is not
one, and a ``coci plan --config`` file that is a FIFO or oversized (never waited on, never read
whole)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from ckpt_helpers import build_state

import coci
from coci import knobs
from coci.cli import main
from coci.integrations._options import read_options


@pytest.mark.parametrize("total_steps", [2**64, 2**53 + 1])
def test_a_horizon_past_any_step_count_is_refused(tmp_path: Path, total_steps: int, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(coci.ConfigError, match="total_steps"):
        coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2), total_steps=total_steps)
    with pytest.raises(coci.ConfigError, match="total_steps"):
        coci.Session(tmp_path / "run", state=build_state(), policy="young", mtbf="8h", total_steps=total_steps)
    with pytest.raises(coci.ConfigError, match="total_steps"):
        coci.PlanConfig(policy="young", total_steps=total_steps)
    args = ["plan", "--mtbf", "8h", "--step-seconds", "0.25", "--stall-seconds", "0.4", "--persist-seconds", "6"]
    assert main([*args, "--total-steps", str(total_steps)]) == 2  # an error, on one line
    assert "total_steps" in capsys.readouterr().err


@pytest.mark.parametrize("fault", ["SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP"])
def test_a_fault_signal_is_not_a_preemption_notice(tmp_path: Path, fault: str) -> None:
    with pytest.raises(coci.ConfigError, match=f"preemption_signals.*{fault}"):
        coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2), preemption_signals=(signal.SIGTERM, getattr(signal, fault)))
    assert signal.getsignal(getattr(signal, fault)) == signal.SIG_DFL  # nothing installed


def test_a_policy_of_more_steps_than_a_plan_may_hold_is_refused_without_expanding_it(tmp_path: Path) -> None:
    with pytest.raises(coci.ConfigError, match="PLAN_MAX_CHECKPOINTS"):
        coci.Session(tmp_path / "run", state=build_state(), policy=range(1, 10**18))
    with knobs.override(PLAN_MAX_CHECKPOINTS=1000), pytest.raises(coci.ConfigError, match="PLAN_MAX_CHECKPOINTS"):
        coci.Session(tmp_path / "run", state=build_state(), policy=iter(range(1, 10**18)))  # unsized: counted as read, up to the cap
    with pytest.raises(coci.ConfigError, match="policy steps"):
        coci.Session(tmp_path / "run", state=build_state(), policy=[2**64])


@pytest.mark.parametrize("reader", [object(), "coci", coci.checkpoint.local.LocalWriter])
def test_register_reader_refuses_what_is_not_a_reader(reader: object) -> None:
    with pytest.raises(coci.ConfigError, match="CheckpointReader"):
        coci.register_reader("mine", reader)  # type: ignore[arg-type]


def test_a_config_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_options(fifo)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)  # generous: the machine may be loaded
    if reader.is_alive():  # it blocked on the FIFO: unblock it, then fail
        with open(fifo, "w") as writer:
            writer.write("{}")
        reader.join(timeout=60)
    assert outcome and isinstance(outcome[0], coci.ConfigError) and "not a regular file" in str(outcome[0])


def test_an_oversized_config_file_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"mtbf": "8h"' + " " * (4 << 20) + "}")
    assert main(["plan", "--config", str(config), "--step-seconds", "0.25", "--stall-seconds", "0.4", "--persist-seconds", "6",
                 "--total-steps", "1000"]) == 2
    assert "over the limit" in capsys.readouterr().err
    link = tmp_path / "link.json"
    (tmp_path / "small.json").write_text('{"mtbf": "8h"}')
    link.symlink_to(tmp_path / "small.json")  # the user's own link to their config: followed
    assert read_options(link) == {"mtbf": "8h"}


def test_a_failed_session_start_leaves_the_run_directory_free(tmp_path: Path) -> None:
    def broken_writer(root: Path, context: object) -> coci.checkpoint.checkpointer.CheckpointWriter:
        raise RuntimeError("the user's writer factory failed")

    failures = []  # kept, as a caller that logs or re-raises them later does (their tracebacks hold the sessions)
    for _ in range(2):  # the retry in the same process meets the same error, not RunDirLockedError
        with pytest.raises(RuntimeError, match="writer factory") as failed:
            coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2), writer=broken_writer)  # type: ignore[arg-type]
        failures.append(failed)
    with coci.Session(tmp_path / "run", state=build_state(), policy=coci.EveryN(2)):
        pass
