"""``async_save``: the checkpoint written in a background thread while
training goes on (torch's ``torch.distributed.checkpoint.async_save``).

The call does :mod:`.save`'s steps 1 and 2 at once, with a **copy** of every
array this rank saves (so the state may change as soon as the call
returns), and returns a future. A background thread then writes this rank's
file; rank 0's thread waits for every rank's file, writes ``.metadata`` and
renames the folder into place.

The background threads send no message: a collective from a second thread
would interleave with the training's own collectives on the same
connections (torch gives async_save a process group of its own for that).
They meet through the temporary folder instead: a rank's file appears
under its final name only once complete (written as ``.part``, renamed),
a rank that fails leaves ``__{rank}_0.error`` naming its error; rank 0
then writes ``FAILED`` with every rank's error, each other rank raises it
and says so (``ack.{rank}``), and rank 0 removes the folder. Every other
rank's future is done when the folder has been renamed to ``checkpoint_id``. This asks for one
file system seen by every rank, as torch's ``FileSystemWriter`` does.

Cost: as ``save``, plus one copy of this rank's arrays in memory until the
thread has written them; the wait is polling the folder every 10 ms.
"""

from __future__ import annotations

import os
import shutil
import threading
import time

from minidist.distributed.checkpoint.metadata import shard_file
from minidist.distributed.checkpoint.save import (
    all_gather,
    failure,
    global_plan,
    group_of,
    prepare_folder,
    publish,
    snapshot,
    write_file,
)

POLL_SECONDS = 0.01


class AsyncSaveFuture:
    """torch's ``Future`` of an async save: ``result(timeout=None)`` waits and
    returns the :class:`Metadata` (or raises the save's error), ``done()``."""

    def __init__(self):
        self._event, self._value, self._error = threading.Event(), None, None

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout=None):
        if not self._event.wait(timeout):
            raise TimeoutError(f"async_save: not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value

    def wait(self, timeout=None):
        return self.result(timeout)


def async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
               process_group=None, timeout: float = 600.0) -> AsyncSaveFuture:
    """Save ``state_dict`` to ``checkpoint_id`` in the background (the module
    docstring). Every rank calls it; each returns its own future."""
    if checkpoint_id is None:
        raise ValueError("async_save: pass checkpoint_id=, the folder to write")
    if storage_writer is not None or planner is not None:
        raise NotImplementedError("async_save(storage_writer=, planner=): pass checkpoint_id")
    group, rank, size, ranks = group_of(process_group)
    items, folder = None, None
    try:
        items = snapshot(state_dict, copy=True)
        if rank == 0:
            folder = prepare_folder(checkpoint_id)
        mine = (None, folder, [(k, e) for k, e, _ in items])
    except Exception as error:
        mine = (f"{type(error).__name__}: {error}", None, [])
    plans = all_gather(mine, group, size)
    folder = plans[0][1]
    problem = failure([p[0] for p in plans], ranks, "async_save (snapshot)")
    writes = metadata = None
    if problem is None:
        try:
            writes, metadata = global_plan([p[2] for p in plans], ranks)
        except ValueError as error:
            problem = error
    if problem is not None:
        if rank == 0 and folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise problem
    future = AsyncSaveFuture()

    def run():
        try:
            _write_and_finish(folder, checkpoint_id, items, writes, metadata, rank, ranks,
                              timeout)
            future._value = metadata
        except BaseException as error:  # noqa: BLE001 - handed to the caller's result()
            future._error = error
        finally:
            future._event.set()

    threading.Thread(target=run, name=f"async_save rank {ranks[rank]}", daemon=True).start()
    return future


def _write_and_finish(folder, checkpoint_id, items, writes, metadata, rank, ranks, timeout):
    """The background thread: this rank's file, then rank 0 finishes and the others wait."""
    name = os.path.join(folder, shard_file(rank))
    try:
        if writes[rank]:                   # a rank holding only copies writes no file
            write_file(name + ".part", items, writes[rank])
            os.rename(name + ".part", name)
    except Exception as error:
        with open(os.path.join(folder, f"__{rank}_0.error"), "w", encoding="utf-8") as file:
            file.write(f"{type(error).__name__}: {error} (writing {shard_file(rank)})")
        if rank != 0:                      # its error file tells rank 0, which cleans up
            raise RuntimeError(f"async_save to {checkpoint_id} failed on rank {ranks[rank]}: "
                               f"{error}") from error
    deadline = time.monotonic() + timeout
    if rank == 0:
        _finish(folder, checkpoint_id, writes, metadata, ranks, deadline, timeout)
        return
    while os.path.exists(folder):
        failed = os.path.join(folder, "FAILED")
        if os.path.exists(failed):
            with open(failed, encoding="utf-8") as file:
                text = file.read()
            with open(os.path.join(folder, f"ack.{rank}"), "w", encoding="utf-8"):
                pass                       # rank 0 removes the folder once all have read it
            raise RuntimeError(text)
        if time.monotonic() > deadline:
            raise TimeoutError(f"async_save to {checkpoint_id}: rank {ranks[0]} did not "
                               f"finish in {timeout} s")
        time.sleep(POLL_SECONDS)


def _finish(folder, checkpoint_id, writes, metadata, ranks, deadline, timeout):
    """Rank 0: wait for every rank's file, then publish; or, if a rank failed,
    tell the others and remove the folder once each has read it."""
    while True:
        errors = [None] * len(ranks)
        for r in range(len(ranks)):
            path = os.path.join(folder, f"__{r}_0.error")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as file:
                    errors[r] = file.read()
        problem = failure(errors, ranks, f"async_save to {checkpoint_id}")
        if problem is None and time.monotonic() > deadline:
            problem = TimeoutError(f"async_save to {checkpoint_id}: the other ranks' files "
                                   f"did not appear in {timeout} s")
        if problem is not None:
            _fail(folder, problem, ranks, deadline)
            raise RuntimeError(f"{problem}\n(nothing was written to {checkpoint_id}: a "
                               f"checkpoint there before is as it was)")
        if all(os.path.exists(os.path.join(folder, shard_file(r)))
               for r in range(len(ranks)) if writes[r]):
            break
        time.sleep(POLL_SECONDS)
    try:
        publish(folder, checkpoint_id, metadata)
    except Exception as error:
        _fail(folder, f"rank {ranks[0]}: publishing failed: {error}", ranks, deadline)
        raise


def _fail(folder, problem, ranks, deadline):
    with open(os.path.join(folder, "FAILED"), "w", encoding="utf-8") as file:
        file.write(f"{problem}")
    others, limit = range(1, len(ranks)), max(deadline, time.monotonic() + 60)
    while time.monotonic() < limit:
        if all(os.path.exists(os.path.join(folder, f"ack.{r}")) or
               os.path.exists(os.path.join(folder, f"__{r}_0.error")) for r in others):
            shutil.rmtree(folder, ignore_errors=True)
            return
        time.sleep(POLL_SECONDS)


__all__ = ["AsyncSaveFuture", "async_save"]
