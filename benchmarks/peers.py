"""Against the checkpointers users pick instead: coci next to ``torch.save``, DCP ``save`` and DCP
``async_save`` on the same model, training loop and disk.

Arms (each in its own child process, so that memory high-water marks and allocator state are its own):

* ``torch_save``: ``torch.save({model, optimizer})`` into a temporary file, ``fsync``, rename, ``fsync``
  of the directory (the crash-safe way to use it); synchronous.
* ``dcp_save``: ``torch.distributed.checkpoint.save`` of ``get_state_dict(model, optimizer)``
  (``FileSystemWriter`` fsyncs its files and renames ``.metadata`` last); synchronous.
* ``dcp_async_thread``: ``dcp.async_save`` as the documentation calls it (its default stager copies
  the state on the caller's thread into fresh memory; a thread writes).
* ``dcp_async_stager``: ``dcp.async_save`` with one long-lived ``DefaultStager`` (cached staging
  memory, the copy on the stager's thread while the next forward/backward runs, pinned on CUDA); a
  thread writes. The loop waits for ``staging_completion`` before the next optimizer step (as coci's
  fence does), so the checkpoint stays consistent.
* ``dcp_async_process``: the same stager with shared memory, and DCP's process-based writer
  (``AsyncCheckpointerType.PROCESS``, torchtitan's choice for large jobs) on a one-rank gloo group.
  The helper process's own memory (its peak RSS less the shared staging pages) is added to the arm's.
* ``coci``: a ``coci.Session`` with ``policy=coci.EveryN(every)``.

Lightning's ``CheckpointIO`` is not an arm: ``TorchCheckpointIO`` is ``torch.save`` without an
``fsync`` (the ``torch_save`` arm, made durable), and ``AsyncCheckpointIO`` clones every tensor on
the caller's thread into fresh memory and runs that ``torch.save`` in a thread, which is the
``dcp_async_thread`` arm's structure with ``torch.save``'s file and loader.

Per arm and checkpoint (the first checkpoint of each process is reported apart, as ``first``):

* stall: wall time of the checkpoint step plus the step after, less twice the median clean step (steps
  of the same process before any checkpoint); interval: the ``every`` steps from the checkpoint step,
  less ``every`` clean steps (what a background writer takes from the loop on a busy CPU as well);
* durable: from the checkpoint call to the checkpoint being committed (files fsynced);
* restore: a fresh process (new model and optimizer, imports done) loading the last checkpoint:
  ``torch.load(weights_only=True)`` + ``load_state_dict``, DCP ``get_state_dict`` + ``load`` +
  ``set_state_dict``, coci ``Session(...)`` + ``restore()``; its state must match the saved state
  bitwise (sha256 of every tensor's bytes);
* extra RSS: the process's RSS high-water mark (``VmHWM``) at the end less the one before the first
  checkpoint.

Arms and repeats are interleaved (the arm order rotates every repeat) so the shared machine's noise
hits every arm alike. The loop runs one intra-op thread (``--threads``): on a 2-core machine shared
with other jobs, two OpenMP threads made a 2 ms step take up to 900 ms. ``--cold-restore`` drops the
page cache before each timed restore (root only; coci writes its data file with ``O_DIRECT``, so
its restore reads from the disk either way, the peers otherwise from the page cache their writes
filled). ``--device cuda`` moves the model to the GPU (DCP staging
pinned); without CUDA it says so and exits. Results: benchmarks/README.md, "Against the
checkpointers users pick instead".

    .venv/bin/python benchmarks/peers.py [--sizes 10 100 300] [--repeats 2] [--every 10] [--checkpoints 8]
    .venv/bin/python benchmarks/peers.py --quick          # under a minute: one small size
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from common import MB, AdamStack, drop_page_cache, remove, scratch_dir, steady_heap_env

ROOT = Path(__file__).resolve().parent.parent

ARMS = ("torch_save", "dcp_save", "dcp_async_thread", "dcp_async_stager", "dcp_async_process", "coci")
PEERS = ARMS[:-1]
LABELS = {
    "torch_save": "torch.save (fsync, rename)",
    "dcp_save": "DCP save",
    "dcp_async_thread": "DCP async_save, thread",
    "dcp_async_stager": "DCP async_save, thread + DefaultStager",
    "dcp_async_process": "DCP async_save, process + DefaultStager (shm)",
    "coci": "coci Session, EveryN",
}
#: Process start-up, imports and model construction of one child are not measured; this bounds them.
CHILD_TIMEOUT_S = 1800


# -- the training state ------------------------------------------------------------------------------


def width_for(mb: float) -> int:
    """The widest square layer (256..2048) that still gives the state at least four layers."""
    for width in (2048, 1024, 512, 256, 128, 64):
        if 4 * 3 * (width * width + width) * 4 <= mb * MB:
            return width
    return 32


def build_stack(mb: float, device: str, seed: int, batch: int, with_state: bool) -> AdamStack:
    """A ~``mb``-MB Adam state (parameters + exp_avg + exp_avg_sq) on ``device``; ``with_state``
    takes one step so that Adam's state exists (a restoring process starts without it)."""
    torch.manual_seed(seed)
    width = width_for(mb)
    per_layer = 3 * (width * width + width) * 4
    blocks: list[torch.nn.Module] = []
    for _ in range(max(1, round(mb * MB / per_layer))):
        blocks += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*blocks).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    stack = AdamStack(model, optimizer, torch.randn(batch, width, device=device), torch.randn(batch, width, device=device))
    if with_state:
        stack.train_step()
    return stack


def state_digest(stack: AdamStack) -> str:
    """sha256 over the bytes of every parameter and every optimizer state tensor, in parameter order."""
    digest = hashlib.sha256()
    for param in stack.model.parameters():
        tensors = [param.detach()] + [value for _, value in sorted(stack.optimizer.state[param].items()) if isinstance(value, torch.Tensor)]
        for tensor in tensors:
            flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            digest.update(memoryview(flat.numpy()))
    return digest.hexdigest()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def vm_kib(field: str, pid: int | str = "self") -> int:
    """A ``VmHWM``/``VmRSS``/``RssShmem`` line of ``/proc/<pid>/status``, in KiB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# -- the arms: each saves at a step and reports when that checkpoint is durable ----------------------


class Arm:
    """One checkpointer. ``save`` returns at once for async arms; ``durable`` maps a call's start time
    to the time its checkpoint was committed."""

    def __init__(self, root: Path, stack: AdamStack, device: str) -> None:
        self.root = root
        self.stack = stack
        self.device = device
        self.durable_at: dict[int, float] = {}
        self.pending: Future[Any] | None = None

    def save(self, step: int) -> None:
        raise NotImplementedError

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def close(self) -> None:
        self.wait()

    def last_path(self) -> Path:
        raise NotImplementedError

    def track(self, step: int, future: Future[Any]) -> None:
        future.add_done_callback(lambda _: self.durable_at.__setitem__(step, time.perf_counter()))
        self.pending = future


class TorchSave(Arm):
    def save(self, step: int) -> None:
        final = self.root / f"step_{step}.pt"
        temporary = final.with_suffix(".tmp")
        payload = {"model": self.stack.model.state_dict(), "optimizer": self.stack.optimizer.state_dict(), "step": step}
        with open(temporary, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.durable_at[step] = time.perf_counter()
        self.latest = final

    def last_path(self) -> Path:
        return self.latest


def dcp_state(stack: AdamStack) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(stack.model, stack.optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


class DcpSave(Arm):
    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp

        self.latest = self.root / f"step_{step}"
        dcp.save(dcp_state(self.stack), checkpoint_id=self.latest)
        self.durable_at[step] = time.perf_counter()

    def last_path(self) -> Path:
        return self.latest


class DcpAsync(Arm):
    """``dcp.async_save``; ``stager`` (a long-lived ``DefaultStager``) or DCP's default per-call one."""

    def __init__(self, root: Path, stack: AdamStack, device: str, stager: Any = None, process: bool = False) -> None:
        super().__init__(root, stack, device)
        self.stager = stager
        self.process = process
        self.staging: Future[Any] | None = None
        if stager is not None:  # the fence: the next optimizer step waits for the staging copy
            stack.optimizer.register_step_pre_hook(lambda *_: self.wait_staging())

    def wait_staging(self) -> None:
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def save(self, step: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

        self.wait()  # one checkpoint in flight, as with coci (torchtitan waits the same way)
        self.latest = self.root / f"step_{step}"
        kind = AsyncCheckpointerType.PROCESS if self.process else AsyncCheckpointerType.THREAD
        response = dcp.async_save(dcp_state(self.stack), checkpoint_id=self.latest, async_checkpointer_type=kind, async_stager=self.stager)
        if isinstance(response, AsyncSaveResponse):
            self.staging = response.staging_completion
            self.track(step, response.upload_completion)
        else:
            self.track(step, response)

    def close(self) -> None:
        self.wait()
        self.wait_staging()
        if self.stager is not None:
            self.stager.close()

    def last_path(self) -> Path:
        return self.latest

    def helper_private_kib(self) -> int:
        """The DCP writer process's peak RSS less the shared staging pages it maps (0 without one)."""
        if not self.process:
            return 0
        from torch.distributed.checkpoint import _async_process_executor as executor

        helper = executor._CHECKPOINT_PROCESS
        if helper is None:
            return 0
        pid = helper._save_process.pid
        return max(0, vm_kib("VmHWM", pid) - vm_kib("RssShmem", pid))


def default_stager(device: str, shared: bool) -> Any:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = device == "cuda"
    return DefaultStager(
        StagingOptions(use_pinned_memory=cuda, use_shared_memory=shared, use_async_staging=True, use_non_blocking_copy=cuda)
    )


def one_rank_gloo_group() -> None:
    """DCP's process-based writer needs a process group: one rank, gloo, on a free local port."""
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


class Coci(Arm):
    def __init__(self, root: Path, stack: AdamStack, device: str, every: int) -> None:
        super().__init__(root, stack, device)
        import coci

        self.session = coci.Session(root, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(every))

    def step(self, loss: torch.Tensor, step: int) -> bool:
        pending = self.session.step(loss)
        if pending is not None:
            self.track(step, pending.upload_completion)
        return pending is not None

    def save(self, step: int) -> None:
        self.track(step, self.session.checkpoint().upload_completion)

    def close(self) -> None:
        self.session.wait()
        self.session.close()

    def last_path(self) -> Path:
        return self.root

    def arena_bytes(self) -> int:
        return int(self.session._checkpointer.arena.capacity)  # the staging buffer the session reuses

    def committed_at(self) -> dict[int, float]:
        """When each checkpoint was committed (its ``commit`` event, on this clock): the future
        resolves later, after retention has deleted the checkpoint before the previous one."""
        offset = time.time() - time.perf_counter()
        events = [json.loads(line) for line in (self.root / "events.jsonl").read_text().splitlines() if line.strip()]
        return {event["step"]: event["time"] - offset for event in events if event["event"] == "commit"}


def make_arm(name: str, root: Path, stack: AdamStack, device: str, every: int) -> Arm:
    if name == "torch_save":
        return TorchSave(root, stack, device)
    if name == "dcp_save":
        return DcpSave(root, stack, device)
    if name == "dcp_async_thread":
        return DcpAsync(root, stack, device)
    if name == "dcp_async_stager":
        return DcpAsync(root, stack, device, stager=default_stager(device, shared=False))
    if name == "dcp_async_process":
        one_rank_gloo_group()
        return DcpAsync(root, stack, device, stager=default_stager(device, shared=True), process=True)
    if name == "coci":
        return Coci(root, stack, device, every)
    raise ValueError(f"unknown arm {name!r}")


# -- child processes -----------------------------------------------------------------------------------


def timed_step(stack: AdamStack, device: str) -> tuple[torch.Tensor, float]:
    began = time.perf_counter()
    loss = stack.train_step()
    sync(device)
    return loss, began


def train_child(args: argparse.Namespace) -> dict[str, Any]:
    """Clean steps, then ``checkpoints`` checkpoints ``every`` steps apart (``every`` steps after each),
    then one more checkpoint of the final state (at the last step), awaited and digested for the
    restore check."""
    stack = build_stack(args.mb, args.device, seed=0, batch=args.batch, with_state=True)
    root = Path(args.dir)
    arm = make_arm(args.arm, root, stack, args.device, args.every)
    clean = []
    for _ in range(args.clean_steps):
        _, began = timed_step(stack, args.device)
        clean.append(time.perf_counter() - began)
    baseline_kib = vm_kib("VmHWM")
    step_seconds: list[float] = []
    called: dict[int, float] = {}
    for step in range(1, (args.checkpoints + 1) * args.every + 1):
        if step == 2 * args.every:  # untimed: the first checkpoint (start-up costs) ends before the measured ones
            arm.wait()
        loss, began = timed_step(stack, args.device)
        due = step % args.every == 0 and step <= args.checkpoints * args.every
        if isinstance(arm, Coci):
            called_at = time.perf_counter()
            if arm.step(loss, step):
                called[step] = called_at
        elif due:
            called[step] = time.perf_counter()
            arm.save(step)
        sync(args.device)
        step_seconds.append(time.perf_counter() - began)
    final_step = (args.checkpoints + 1) * args.every  # coci's EveryN checkpointed it in its last step
    if not isinstance(arm, Coci):
        arm.wait()
        called[final_step] = time.perf_counter()
        arm.save(final_step)
    arm.wait()
    digest = state_digest(stack)
    peak_kib = vm_kib("VmHWM") + (arm.helper_private_kib() if isinstance(arm, DcpAsync) else 0)
    arena = arm.arena_bytes() if isinstance(arm, Coci) else None
    path = arm.last_path()
    arm.close()
    resolved = {step: arm.durable_at[step] - called[step] for step in called}
    durable = resolved
    if isinstance(arm, Coci):
        committed = arm.committed_at()
        durable = {step: committed[step] - called[step] for step in called}
    return {
        "arm": args.arm,
        "state_bytes": stack.state_bytes,
        "clean_seconds": clean,
        "step_seconds": step_seconds,
        "checkpoint_steps": sorted(called),
        "durable_seconds": [durable[step] for step in sorted(called)],
        "resolved_seconds": [resolved[step] for step in sorted(called)],
        "extra_rss_bytes": (peak_kib - baseline_kib) * 1024,
        "arena_bytes": arena,
        "digest": digest,
        "path": str(path),
    }


def restore_child(args: argparse.Namespace) -> dict[str, Any]:
    """A fresh model and optimizer (other seed, no Adam state) load the arm's last checkpoint."""
    stack = build_stack(args.mb, args.device, seed=1, batch=args.batch, with_state=False)
    path = Path(args.path)
    load, cleanup = restorer(args.arm, stack, path, args.device)
    sync(args.device)
    cold = args.cold_restore and drop_page_cache()  # root only: the checkpoint is read from the disk
    began = time.perf_counter()
    load()
    sync(args.device)
    seconds = time.perf_counter() - began
    cleanup()
    return {"arm": args.arm, "restore_seconds": seconds, "cold": cold, "digest": state_digest(stack)}


def restorer(arm: str, stack: AdamStack, path: Path, device: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """What a user of ``arm`` runs to resume (imports done beforehand, so only the load is timed),
    and what it runs afterwards (not timed: closing coci's session)."""
    if arm == "torch_save":

        def load_torch() -> None:
            saved = torch.load(path, map_location=device, weights_only=True)
            stack.model.load_state_dict(saved["model"])
            stack.optimizer.load_state_dict(saved["optimizer"])

        return load_torch, lambda: None
    if arm == "coci":
        import coci

        sessions: list[coci.Session] = []

        def load_coci() -> None:
            session = coci.Session(
                path, {"model": stack.model, "optimizer": stack.optimizer}, policy=coci.EveryN(10**9), preemption_signals=()
            )
            sessions.append(session)
            if session.restore() is None:
                raise RuntimeError(f"coci found no checkpoint in {path}")

        return load_coci, lambda: sessions[0].close()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    def load_dcp() -> None:
        state = dcp_state(stack)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(stack.model, stack.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    return load_dcp, lambda: None


# -- the parent: interleaved runs, the table --------------------------------------------------------------


def run_child(role: str, arm: str, mb: float, args: argparse.Namespace, **extra: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", role, "--arm", arm, "--mb", str(mb), "--out", str(out)]
    command += ["--device", args.device, "--batch", str(args.batch), "--every", str(args.every), "--threads", str(args.threads)]
    command += ["--checkpoints", str(args.checkpoints), "--clean-steps", str(args.clean_steps)]
    for key, value in extra.items():
        command += [f"--{key}", value]
    if args.cold_restore:
        command.append("--cold-restore")
    env = steady_heap_env({**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"{role} child of {arm} ({mb} MB) failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return dict(json.loads(out.read_text()))
    finally:
        out.unlink(missing_ok=True)


def measure_size(mb: float, args: argparse.Namespace) -> dict[str, Any]:
    arms: dict[str, dict[str, list[Any]]] = {name: {"train": [], "restore": []} for name in args.arms}
    for repeat in range(args.repeats):
        order = args.arms[repeat % len(args.arms) :] + args.arms[: repeat % len(args.arms)]
        for name in order:
            started = time.perf_counter()
            directory = scratch_dir(f"peers-{name}")
            try:
                trained = run_child("train", name, mb, args, dir=str(directory))
                restored = run_child("restore", name, mb, args, path=trained["path"])
            finally:
                remove(directory)
            restored["bitwise"] = restored["digest"] == trained["digest"]
            arms[name]["train"].append(trained)
            arms[name]["restore"].append(restored)
            elapsed = time.perf_counter() - started
            print(f"  [{mb:g} MB, repeat {repeat + 1}/{args.repeats}] {name}: {elapsed:.0f} s", file=sys.stderr, flush=True)
    return {"mb": mb, "arms": {name: summarize(runs, args.every) for name, runs in arms.items()}}


def checkpoint_costs(train: dict[str, Any], every: int) -> tuple[list[float], list[float]]:
    """Per checkpoint: (its step + the next) and (its ``every`` steps), each less the clean steps."""
    clean = statistics.median(train["clean_seconds"])
    seconds = train["step_seconds"]
    stalls, intervals = [], []
    for step in train["checkpoint_steps"][:-1]:  # the last one is the restore's, with no step after
        index = step - 1
        stalls.append(seconds[index] + seconds[index + 1] - 2 * clean)
        intervals.append(sum(seconds[index : index + every]) - every * clean)
    return stalls, intervals


def summarize(runs: dict[str, list[dict[str, Any]]], every: int) -> dict[str, Any]:
    first_stalls, stalls, intervals, durables, resolved = [], [], [], [], []
    for train in runs["train"]:
        run_stalls, run_intervals = checkpoint_costs(train, every)
        first_stalls.append(run_stalls[0])
        stalls += run_stalls[1:]
        intervals += run_intervals[1:]
        durables += train["durable_seconds"][1:-1]
        resolved += train["resolved_seconds"][1:-1]
    trains = runs["train"]
    return {
        "state_bytes": trains[0]["state_bytes"],
        "clean_step_s": statistics.median(s for t in trains for s in t["clean_seconds"]),
        "first_stall_s": first_stalls,
        "stall_s": stalls,
        "interval_s": intervals,
        "durable_s": durables,
        "resolved_s": resolved,
        "restore_s": [r["restore_seconds"] for r in runs["restore"]],
        "extra_rss_bytes": [t["extra_rss_bytes"] for t in trains],
        "arena_bytes": trains[0]["arena_bytes"],
        "bitwise": [r["bitwise"] for r in runs["restore"]],
        "cold_restore": [r["cold"] for r in runs["restore"]],
    }


def med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio_cell(ours: float, theirs: float, label: str) -> str:
    if not theirs > 0:
        return f"n/a ({label} {1e3 * theirs:.1f} ms: within the noise)"
    if ours <= 0:
        return f"<= 0 (coci {1e3 * ours:.1f} ms: within the noise) vs {label}"
    return f"**{ours / theirs:.2f}** vs {label}"


def durable_cell(arm: dict[str, Any]) -> str:
    """The median time to durable; where the future resolves later (coci's retention), that too."""
    durable, resolved = med(arm["durable_s"]), med(arm["resolved_s"])
    return f"{durable:.3f}" if abs(resolved - durable) < 5e-4 else f"{durable:.3f} (future {resolved:.3f})"


def table(size: dict[str, Any], args: argparse.Namespace) -> str:
    arms = size["arms"]
    any_arm = next(iter(arms.values()))
    state_mb = any_arm["state_bytes"] / MB
    cold = all(c for arm in arms.values() for c in arm.get("cold_restore", [False]))
    lines = [
        f"### state {state_mb:.1f} MB (Adam: parameters + exp_avg + exp_avg_sq), a checkpoint every {args.every} steps, "
        f"clean step {1e3 * any_arm['clean_step_s']:.0f} ms, {args.repeats} repeat(s) x {args.checkpoints - 1} checkpoints (+1 first), "
        f"restore with the page cache {'dropped' if cold else 'warm'}",
        "",
        "| checkpointer | stall ms (ckpt step + next) | interval ms (every steps) | first stall ms | durable s | restore s "
        "| extra RSS MB | extra RSS / state | restore bitwise |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, arm in arms.items():
        extra = med(arm["extra_rss_bytes"])
        lines.append(
            f"| {LABELS[name]} | {1e3 * med(arm['stall_s']):.1f} | {1e3 * med(arm['interval_s']):.1f} | {1e3 * med(arm['first_stall_s']):.1f} "
            f"| {durable_cell(arm)} | {med(arm['restore_s']):.3f} | {extra / MB:.0f} | {extra / arm['state_bytes']:.2f} "
            f"| {'yes' if all(arm['bitwise']) else 'NO'} |"
        )
    if "coci" in arms and len(arms) > 1:
        lines.append(ratios_row(arms))
    return "\n".join(lines)


def ratios_row(arms: dict[str, Any]) -> str:
    """coci / the best peer in each column (restore: against DCP load too; memory: against the arena)."""
    ours = arms["coci"]
    peers = {name: arm for name, arm in arms.items() if name != "coci"}

    def best(metric: str) -> tuple[float, str]:
        name = min(peers, key=lambda n: med(peers[n][metric]))
        return med(peers[name][metric]), name

    cells = []
    for metric in ("stall_s", "interval_s", "first_stall_s", "durable_s", "restore_s"):
        value, name = best(metric)
        cell = ratio_cell(med(ours[metric]), value, name)
        if metric == "restore_s" and "dcp_save" in peers:
            cell += "; " + ratio_cell(med(ours[metric]), med(peers["dcp_save"]["restore_s"]), "DCP load")
        cells.append(cell)
    arena = ours["arena_bytes"] or ours["state_bytes"]
    extra = med(ours["extra_rss_bytes"])
    cells.append(f"{extra / arena:.2f} x arena ({arena / MB:.0f} MB)")
    cells.append(f"{extra / ours['state_bytes']:.2f}")
    return f"| coci / best peer | {' | '.join(cells)} | |"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10.0, 100.0, 300.0], help="state sizes in MB")
    parser.add_argument("--max-mb", type=float, default=2048.0, help="skip sizes above this (the machine is shared)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--checkpoints", type=int, default=8, help="checkpoints per process (the first reported apart)")
    parser.add_argument("--clean-steps", type=int, default=20, help="steps before any checkpoint (the clean step time)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the training loop (see the docstring)")
    parser.add_argument("--quick", action="store_true", help="one small size, one repeat, few steps (under a minute)")
    parser.add_argument("--cold-restore", action="store_true", help="drop the page cache before each restore (root only)")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--from-json", type=Path, help="print the tables of an earlier --json file (nothing is run)")
    parser.add_argument("--child", choices=("train", "restore"), help=argparse.SUPPRESS)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--mb", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.every, args.checkpoints, args.clean_steps, args.repeats = 3, 2, 3, 1
        if args.sizes == parser.get_default("sizes"):
            args.sizes = [4.0]
    if args.checkpoints < 2:
        parser.error("--checkpoints must be at least 2 (the first is reported apart)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available on this machine: --device cuda skipped (run it where a GPU is lent)")
        return 0
    if args.child is not None:
        torch.set_num_threads(args.threads)
        result = train_child(args) if args.child == "train" else restore_child(args)
        Path(args.out).write_text(json.dumps(result))
        return 0
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        args.every, args.repeats, args.checkpoints = saved["every"], saved["repeats"], saved["checkpoints"]
        for size in saved["sizes"]:
            print("\n" + table(size, args))
        return 0
    sizes = [mb for mb in args.sizes if mb <= args.max_mb]
    for mb in args.sizes:
        if mb > args.max_mb:
            print(f"size {mb:g} MB skipped: above --max-mb {args.max_mb:g}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, device {args.device}, arms {' '.join(args.arms)}")
    results = []
    for mb in sizes:
        size = measure_size(mb, args)
        results.append(size)
        print("\n" + table(size, args), flush=True)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"device": args.device, "every": args.every, "repeats": args.repeats, "checkpoints": args.checkpoints, "sizes": results},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
