"""Checkpoint every ``every`` steps, resume from the latest on any world size.

The other half of an elastic restart (``minidist run --max-restarts``,
torchrun's): the launcher starts every rank again, and the script must find
where it was. :class:`ElasticCheckpointer` does the script's part::

    checkpointer = ElasticCheckpointer("ckpt", model, optimizer, every=10)
    start = checkpointer.resume()              # 0 on a first run
    if dist.get_rank() == 0:
        print(checkpointer.report.text())      # resumed at step 40 from ...; 7 steps lost
    for step in range(start, steps):
        ...                                    # sampler.local_batch(step, rank, world)
        checkpointer.step_done(step + 1)       # saves after steps 10, 20, ...

**What is saved**: the model's and the optimizer's state (momentum, Adam's
moments and step) through :mod:`minidist.distributed.checkpoint` (torch's
DCP: each rank writes its shards, any world size or layout loads them, so a
restart on fewer ranks reads the same checkpoint), and the step, which is
also the data order's position when the batches come from
:class:`~.global_batches.GlobalBatchSampler` (a step's batch is a function
of the step alone).

**Always whole**: each checkpoint is its own folder ``step_00000040``, which
``dcp.save`` writes in a hidden temporary folder and renames into place once
every rank has written (the rename is atomic). A rank killed in the middle of
a save leaves a hidden ``.step_....tmp``, never a ``step_`` folder, so the
latest ``step_`` folder is always a complete checkpoint; :meth:`resume`
removes the leftovers. The ``keep`` newest are kept.

**Lost work**: after each step rank 0 notes the step in ``progress.json``
(one small file written and renamed: tens of microseconds a step). On resume
the steps done after the checkpoint are the work lost, done again:
``report.lost_steps``, also appended to ``resumes.jsonl`` in the folder.

**Another model's checkpoint** is refused before anything is read, in one
line naming the keys and shapes that differ (and, under ``minidist run
--max-restarts``, with no restart: a restart would fail the same way).

Cost: a save writes the whole state once over all ranks (replicated arrays
by rank 0 only) and costs two small all_gathers and a broadcast; a resume
reads it once per rank (a DDP replica needs all of it).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import minidist.distributed as dist
import minidist.distributed.checkpoint as dcp
from minidist.atomic_file import atomic_write
from minidist.distributed.checkpoint.flatten import flatten_state_dict
from minidist.distributed.checkpoint.metadata import Metadata
from minidist.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from minidist.runtime import restarts

_STEP = re.compile(r"^step_(\d+)$")
PROGRESS = "progress.json"
RESUMES = "resumes.jsonl"


class CheckpointMismatchError(ValueError):
    """The checkpoint in the folder was saved from another model."""


class ResumeReport:
    """Where a run resumed: ``step`` (the next step to run), ``checkpoint_step``
    (None: no checkpoint), ``lost_steps`` (done before the failure, after the
    checkpoint: done again), ``attempt`` (TORCHELASTIC_RESTART_COUNT)."""

    def __init__(self, step: int, checkpoint_step, lost_steps: int, attempt: int):
        self.step, self.checkpoint_step = step, checkpoint_step
        self.lost_steps, self.attempt = lost_steps, attempt

    def text(self) -> str:
        lost = f"; {self.lost_steps} step{'' if self.lost_steps == 1 else 's'} lost"
        if self.checkpoint_step is None:
            return "no checkpoint yet: starting at step 0" + (lost if self.lost_steps else "")
        return (f"resumed at step {self.step} from checkpoint of step "
                f"{self.checkpoint_step}{lost}")

    def as_dict(self) -> dict:
        return {"step": self.step, "checkpoint_step": self.checkpoint_step,
                "lost_steps": self.lost_steps, "attempt": self.attempt}


class ElasticCheckpointer:
    """Saves ``model`` and ``optimizer`` into ``folder`` every ``every`` steps
    and resumes from the latest (the module docstring). Every rank passes
    the same ``folder`` (one machine, or a file system they share) and calls
    every method, in the same order."""

    def __init__(self, folder, model, optimizer, every: int, keep: int = 2, extra=None):
        if every < 1 or keep < 1:
            raise ValueError(f"every and keep must be at least 1, got every={every}, keep={keep}")
        self.folder = os.path.abspath(os.fspath(folder))
        self.model, self.optimizer = model, optimizer
        self.every, self.keep = every, keep
        self.extra = dict(extra or {})  # saved with the step (e.g. a sampler's state_dict())
        self.report = None
        self._rank = dist.get_rank() if dist.is_initialized() else 0

    # ------------------------------------------------------------------ the folder

    def checkpoints(self) -> list[tuple[int, str]]:
        """The complete checkpoints, oldest first: ``(step, path)``."""
        if not os.path.isdir(self.folder):
            return []
        found = [(int(match.group(1)), os.path.join(self.folder, name))
                 for name in os.listdir(self.folder) if (match := _STEP.match(name))]
        return sorted(found)

    def path_of(self, step: int) -> str:
        return os.path.join(self.folder, f"step_{step:08d}")

    def _progress(self) -> int:
        try:
            with open(os.path.join(self.folder, PROGRESS), encoding="utf-8") as file:
                return int(json.load(file)["step"])
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    def _remove_leftovers(self) -> None:
        """Hidden folders of saves that were cut short: never checkpoints."""
        for name in os.listdir(self.folder):
            if name.startswith(".step_") and (name.endswith(".tmp") or name.endswith(".old")):
                shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)

    # ------------------------------------------------------------------ resume

    def _state(self, step: int) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd,
                "progress": {"step": step, "extra": dict(self.extra)}}

    def _check_same_model(self, path: str, model_sd: dict) -> None:
        saved = {key[len("model."):]: tuple(entry["shape"])
                 for key, entry in Metadata.read(path).tensors.items()
                 if key.startswith("model.")}
        mine = {key[len("model."):]: tuple(value.shape)
                for key, value in flatten_state_dict({"model": model_sd}).items()}
        differ = [f"{key} saved {saved[key]}, this model {mine[key]}"
                  for key in sorted(saved.keys() & mine.keys()) if saved[key] != mine[key]]
        differ += [f"{key} missing from the checkpoint" for key in sorted(mine.keys() - saved.keys())]
        differ += [f"{key} not in this model" for key in sorted(saved.keys() - mine.keys())]
        if not differ:
            return
        shown = "; ".join(differ[:4]) + (f"; and {len(differ) - 4} more" if len(differ) > 4 else "")
        if os.environ.get(restarts.ELASTIC_DIR):
            restarts.mark_no_restart()  # a restart would meet the same checkpoint
        raise CheckpointMismatchError(
            f"elastic resume: the checkpoint {path} was saved from another model ({len(differ)} "
            f"key(s) differ: {shown}); resume with the model it was saved from, or give an "
            f"empty folder (or remove {self.folder}) to start from step 0")

    def resume(self) -> int:
        """Load the latest checkpoint (resharded to this world size) and return
        the step to run next (0 when there is none); ``self.report`` says
        where and how much work was lost."""
        latest = [None, 0]
        if self._rank == 0:
            os.makedirs(self.folder, exist_ok=True)
            self._remove_leftovers()
            found = self.checkpoints()
            latest = [found[-1][0] if found else None, self._progress()]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(latest, src=0)  # one decision, every rank
        step, done = latest
        if step is not None:
            path = self.path_of(step)
            state = self._state(step)
            self._check_same_model(path, state["model"])
            dcp.load(state, checkpoint_id=path)
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
            self.extra.update(state["progress"]["extra"])
        start = step or 0
        self.report = ResumeReport(start, step, max(done - start, 0), restarts.restart_count())
        if self._rank == 0:
            with open(os.path.join(self.folder, RESUMES), "a", encoding="utf-8") as file:
                file.write(json.dumps(self.report.as_dict()) + "\n")
        return start

    # ------------------------------------------------------------------ save

    def step_done(self, step: int) -> bool:
        """After step ``step`` (counted from 1): note the progress, and save
        when ``step`` is a multiple of ``every``. True if it saved."""
        if self._rank == 0:
            with atomic_write(os.path.join(self.folder, PROGRESS)) as file:
                file.write(json.dumps({"step": step}))
        if step % self.every:
            return False
        self.save(step)
        return True

    def save(self, step: int) -> str:
        """Save now, as the checkpoint of ``step``; the oldest beyond ``keep`` go."""
        path = self.path_of(step)
        dcp.save(self._state(step), checkpoint_id=path)
        if self._rank == 0:
            for _, old in self.checkpoints()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path
