"""Every ```python block of README.md and docs/**/*.md runs, so the docs cannot drift from the code.

The blocks of one Markdown file run in order in one namespace, in a fresh temporary directory (what
a reader who pastes them into one script would get); after each block, every ``coci.Session`` it left
open is closed, as the script's end would. A block may use the names a reader's script has already
built (:func:`reader_namespace`: a small ``model``, ``opt``, ``sched``, ``state``, ``loader``,
``loss`` and a loss curve ``losses``). Two comments may precede a block (the line before it):

- ``<!-- not-run: REASON -->``: the block is not run here (it needs a process group, an S3 server,
  a GPU, the reader's own model); the reason must say why, and should name what runs it instead.
- ``<!-- setup: finished-run -->``: the block runs where ``runs/exp1`` holds a finished run (a
  toy model trained under a session), for blocks that read a run (``coci.report``).

A block that raises fails its file's test, naming the file and the block's first line.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import coci

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").is_file():  # the test's folder may move under tests/
    ROOT = ROOT.parent

NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->$")
SETUP = re.compile(r"^<!--\s*setup:\s*(?P<what>[\w-]+)\s*-->$")
SETUPS = ("finished-run",)
FENCE_OPEN = re.compile(r"^```python\s*$")


@dataclass(frozen=True)
class Block:
    """One ```python block: where it is, its code, and the comment before it."""

    source: str
    line: int
    code: str
    not_run: str | None
    setup: str | None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


class DocsBlockError(AssertionError):
    """A block of the docs raised, or a marker before it is malformed."""


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str, source: str) -> Iterator[Block]:
    """The ```python blocks of ``text``; ``line`` is the 1-based line of the opening fence."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        if FENCE_OPEN.match(lines[index].strip()):
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            if end == len(lines):
                raise DocsBlockError(f"{source}:{index + 1}: a ```python block that never closes")
            yield _block(lines, index, end, source)
            index = end
        index += 1


def _block(lines: list[str], start: int, end: int, source: str) -> Block:
    before = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
    not_run = NOT_RUN.match(before)
    setup = SETUP.match(before)
    if not_run and not not_run["reason"]:
        raise DocsBlockError(f"{source}:{start + 1}: <!-- not-run: --> needs a reason")
    if setup and setup["what"] not in SETUPS:
        raise DocsBlockError(f"{source}:{start + 1}: unknown setup {setup['what']!r} (known: {', '.join(SETUPS)})")
    return Block(
        source=source,
        line=start + 1,
        code=textwrap.dedent("\n".join(lines[start + 1 : end]) + "\n"),  # a block inside a list item is indented
        not_run=not_run["reason"] if not_run else None,
        setup=setup["what"] if setup else None,
    )


def reader_namespace() -> dict[str, Any]:
    """What a reader's script has built before the docs' snippets: a model, its optimizer and
    scheduler, ``state`` holding them, a few batches, a loss and a falling loss curve."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(3)]
    losses = [2.0 / (1.0 + step) ** 0.5 + 0.5 for step in range(2_000)]
    return {
        "coci": coci,
        "torch": torch,
        "model": model,
        "opt": opt,
        "sched": sched,
        "state": {"model": model, "optimizer": opt},
        "loader": loader,
        "loss": torch.tensor(1.0),
        "losses": losses,
    }


def make_finished_run(run_dir: str) -> None:
    """A toy model trained for 20 steps under a session that checkpoints every 5."""
    names = reader_namespace()
    with coci.Session(run_dir, state=names["state"], policy=coci.EveryN(5), total_steps=20) as session:
        for step in range(20):
            session.step(2.0 / (1.0 + step))


def run_blocks(blocks: list[Block], workdir: Path) -> list[Block]:
    """Run ``blocks`` in order in one namespace with ``workdir`` as the current directory; return
    the blocks skipped as not runnable. DocsBlockError names the block that raised."""
    names = reader_namespace()
    skipped = []
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        for block in blocks:
            if block.not_run is not None:
                skipped.append(block)
                continue
            if block.setup == "finished-run" and not Path("runs/exp1").exists():
                make_finished_run("runs/exp1")
            _run(block, names)
    finally:
        os.chdir(previous)
        _close_sessions(names)
    return skipped


def _run(block: Block, names: dict[str, Any]) -> None:
    try:
        exec(compile(block.code, block.where, "exec"), names)  # the docs' own code, from this repository
    except Exception as exc:
        raise DocsBlockError(f"the block at {block.where} raised {type(exc).__name__}: {exc}") from exc
    finally:
        _close_sessions(names)


def _close_sessions(names: dict[str, Any]) -> None:
    for value in list(names.values()):
        if isinstance(value, coci.Session):
            value.close()


#: The pages whose training loop says "kill it after its first checkpoints" (it writes runs/exp1).
KILLABLE_LOOPS = ("README.md", "quickstart.md")

#: That loop's warm-up checkpoints come by this step (``knobs.PLAN_WARMUP_CHECKPOINT_STEPS``' last) ...
FIRST_CHECKPOINTS_BY = 16

#: ... and it trains at least this many times as many steps, so that a reader has the time to kill it
#: after them (a step count, not a wall time: a wall time would depend on the machine).
STEPS_AFTER_FIRST_CHECKPOINTS = 40


@pytest.mark.slow  # sessions, plans and simulations: seconds per file, out of the quick tier
@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_python_block_runs(path: Path, tmp_path: Path) -> None:
    blocks = list(python_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
    skipped = run_blocks(blocks, tmp_path)
    assert all(block.not_run for block in skipped)
    for block in skipped:  # a fragment that is not run must still parse: its syntax cannot drift either
        compile(block.code, block.where, "exec")
    if path.name in KILLABLE_LOOPS:
        check_killable_after_first_checkpoints(tmp_path / "runs" / "exp1", path.name)


def check_killable_after_first_checkpoints(run_dir: Path, source: str) -> None:
    """The loop committed a checkpoint by step ``FIRST_CHECKPOINTS_BY`` and trained on for at least
    ``STEPS_AFTER_FIRST_CHECKPOINTS`` times as many steps: killed after its first checkpoints, it
    has most of its run ahead and resumes mid-run."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines()]
    commits = sorted(event["step"] for event in events if event.get("event") == "commit")
    assert commits and commits[0] <= FIRST_CHECKPOINTS_BY, f"{source}: the loop's commits {commits}"
    assert commits[-1] >= STEPS_AFTER_FIRST_CHECKPOINTS * FIRST_CHECKPOINTS_BY, (
        f"{source}: the loop ends at step {commits[-1]}, too soon after its first checkpoints to be killed between them"
    )


def test_the_docs_have_python_blocks_and_they_run() -> None:
    """The collection is not empty and not all skipped (a broken fence pattern would pass every file)."""
    blocks = [block for path in markdown_files() for block in python_blocks(path.read_text(encoding="utf-8"), path.name)]
    run = [block for block in blocks if block.not_run is None]
    assert len(blocks) >= 10
    assert len(run) >= 5


def test_a_block_that_raises_fails_naming_its_line(tmp_path: Path) -> None:
    text = "# Page\n\n```python\nx = 1\n```\n\nText.\n\n```python\nraise ValueError('the docs drifted')\n```\n"
    with pytest.raises(DocsBlockError, match=r"page\.md:9 raised ValueError: the docs drifted"):
        run_blocks(list(python_blocks(text, "page.md")), tmp_path)


def test_a_marked_block_is_skipped_and_an_unmarked_one_runs(tmp_path: Path) -> None:
    text = (
        "<!-- not-run: needs a cluster -->\n```python\nraise RuntimeError\n```\n\n"
        "```python\nPath = __import__('pathlib').Path\nPath('ran').write_text('yes')\n```\n"
    )
    skipped = run_blocks(list(python_blocks(text, "page.md")), tmp_path)
    assert [block.not_run for block in skipped] == ["needs a cluster"]
    assert (tmp_path / "ran").read_text() == "yes"


def test_a_not_run_marker_needs_a_reason() -> None:
    with pytest.raises(DocsBlockError, match="needs a reason"):
        list(python_blocks("<!-- not-run: -->\n```python\nx = 1\n```\n", "page.md"))


def test_blocks_share_a_namespace_and_sessions_left_open_are_closed(tmp_path: Path) -> None:
    text = (
        '```python\nsession = coci.Session("runs/a", state=state, policy=coci.EveryN(1))\n```\n\n'
        '```python\nagain = coci.Session("runs/a", state=state, policy=coci.EveryN(1))\n```\n'
    )
    run_blocks(list(python_blocks(text, "page.md")), tmp_path)  # the second would find the first's lock


def test_the_finished_run_setup_gives_a_run_to_read(tmp_path: Path) -> None:
    text = "<!-- setup: finished-run -->\n```python\nsteps = [c.step for c in coci.verify_run('runs/exp1')]\nassert steps, steps\n```\n"
    run_blocks(list(python_blocks(text, "page.md")), tmp_path)
