"""Checkpoints of data-parallel training: rank 0 writes, rank 0 reads and broadcasts.

In data parallelism every rank holds the same weights and the same optimizer
state, so one copy is the whole checkpoint:

**save** (:func:`save_checkpoint`): rank 0 writes the model's state, the
optimizer's state and any extra values (epoch, step, ...) to one ``.npz``
file, under a temporary name renamed at the end, so a crash never leaves
half a checkpoint. The other ranks wait until rank 0 says it is done (one
small broadcast, which also tells them whether the write failed), so no rank
goes on, or exits, before the checkpoint exists.

**load** (:func:`load_checkpoint`): rank 0 reads the file's bytes and
broadcasts them; every rank parses the same bytes into its model and
optimizer, so all ranks end bit-identical, and a file that only rank 0 can
see (a local disk) is enough. Cost: one broadcast of the file, about the
model's size (SGD with momentum: 2x, Adam: 3x).

Resuming is exact: train k steps, save, train k more gives the same bits as
a fresh run that loads the checkpoint and trains the same k steps (provided
the data order is resumed too, e.g. ``sampler.set_epoch(extra["epoch"])``).

The file is a plain NumPy archive, readable without minidist:
``model/NAME`` (parameters and buffers), ``optimizer/state/INDEX/NAME``
(state arrays), ``extra/KEY`` (array extras) and ``__meta__``, a JSON text
holding the format, the optimizer's class, hyper-parameters and non-array
state (step counts), and the other extras.
"""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.atomic_file import atomic_write
from minidist.parallel.data_parallel import DistributedDataParallel

FORMAT = "minidist.checkpoint"
VERSION = 1
_OK, _FAILED, _MISSING = 0, 1, -1


def _unwrap(model):
    # A DDP wrapper's names all start with "module."; saving the wrapped model
    # makes one checkpoint load with or without DDP.
    return model.module if isinstance(model, DistributedDataParallel) else model


def _rank_and_size(group):
    if not dist.is_initialized():
        return 0, 1
    if group is None:
        return dist.get_rank(), dist.get_world_size()
    return group.rank, group.size


def _json_value(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} cannot be stored in a checkpoint's JSON")


def _archive(model, optimizer, extra) -> dict[str, np.ndarray]:
    arrays = {f"model/{name}": backend.to_numpy(value)
              for name, value in _unwrap(model).state_dict().items()}
    meta = {"format": FORMAT, "version": VERSION, "optimizer": None, "extra": {}}
    if optimizer is not None:
        snapshot = optimizer.state_dict()
        scalars = {}
        for index, entries in snapshot["state"].items():
            for name, value in entries.items():
                if hasattr(value, "shape") and hasattr(value, "dtype"):
                    arrays[f"optimizer/state/{index}/{name}"] = backend.to_numpy(value)
                else:
                    scalars.setdefault(str(index), {})[name] = value
        meta["optimizer"] = {"class": type(optimizer).__name__,
                             "param_groups": snapshot["param_groups"], "scalars": scalars}
    for key, value in extra.items():
        if isinstance(value, np.ndarray):
            arrays[f"extra/{key}"] = value
        else:
            meta["extra"][key] = value
    try:
        arrays["__meta__"] = np.array(json.dumps(meta, default=_json_value))
    except TypeError as error:
        raise TypeError(f"save_checkpoint: {error}; extras and hyper-parameters must be "
                        "numbers, strings, bools, None, lists/dicts of those, or NumPy "
                        "arrays") from None
    return arrays


def save_checkpoint(path, model, optimizer=None, group=None, **extra) -> None:
    """Write ``model``'s state (a DDP wrapper is saved as the model it wraps),
    ``optimizer``'s state and ``extra`` (e.g. ``epoch=3, step=1200``) to the
    ``.npz`` file ``path``. Call it on every rank: rank 0 writes, the others
    wait until the file is complete. Outside a launch it just writes.

    An extra is a NumPy array or a JSON value (numbers, text, lists, dicts),
    so a learning-rate scheduler's ``state_dict()`` fits:
    ``save_checkpoint(path, ddp, optimizer, epoch=e, scheduler=scheduler.state_dict())``."""
    rank, world_size = _rank_and_size(group)
    path = os.fspath(path)
    status = np.array([_OK], np.int64)
    failure = None
    if rank == 0:
        try:
            arrays = _archive(model, optimizer, extra)
            with atomic_write(path, "wb") as file:
                np.savez(file, **arrays)
        except (OSError, TypeError) as error:
            status[0] = _FAILED
            failure = error
    if world_size > 1:
        dist.broadcast(status, src=0, group=group)
    if failure is not None:
        raise type(failure)(f"rank 0 could not write the checkpoint {path}: {failure}") \
            from failure
    if status[0] != _OK:
        raise RuntimeError(f"rank {rank}: rank 0 could not write the checkpoint {path}; "
                           "its error says why")


def _read_on_rank_0(path, rank, world_size, group) -> bytes:
    """The file's bytes on every rank: rank 0 reads them and broadcasts."""
    size = np.array([_MISSING], np.int64)
    data = None
    if rank == 0:
        try:
            with open(path, "rb") as file:
                data = file.read()
            size[0] = len(data)
        except OSError as error:
            reason = error.strerror or str(error)
            data = reason.encode()
    if world_size > 1:
        dist.broadcast(size, src=0, group=group)
    if size[0] == _MISSING:
        detail = f" ({data.decode()})" if data is not None else ""
        raise FileNotFoundError(f"rank {rank}: rank 0 could not read the checkpoint "
                                f"{path}{detail}; check the path, which is read on rank 0 only")
    buffer = np.frombuffer(data, np.uint8).copy() if rank == 0 else np.empty(size[0], np.uint8)
    if world_size > 1:
        dist.broadcast(buffer, src=0, group=group)
    return buffer.tobytes()


def load_checkpoint(path, model, optimizer=None, group=None) -> dict:
    """Load a file written by :func:`save_checkpoint` into ``model`` (and
    ``optimizer``) on every rank, from rank 0's copy; return the extras
    (``{"epoch": 3, ...}``). Call it on every rank, after building the model
    and optimizer exactly as when saving."""
    rank, world_size = _rank_and_size(group)
    path = os.fspath(path)
    data = _read_on_rank_0(path, rank, world_size, group)
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"rank {rank}: {path} is not a checkpoint (not a NumPy .npz archive: "
                         f"{error or 'empty file'}); save_checkpoint writes them") from None
    if not hasattr(archive, "files"):
        raise ValueError(f"rank {rank}: {path} is a single .npy array, not a checkpoint "
                         "(a .npz archive written by save_checkpoint)")
    names = set(archive.files)
    if "__meta__" not in names:
        raise ValueError(f"rank {rank}: {path} is a .npz archive but not a minidist "
                         "checkpoint (no __meta__ entry); save_checkpoint writes them")
    meta = json.loads(str(archive["__meta__"]))
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ValueError(f"rank {rank}: {path} has format {meta.get('format')!r} version "
                         f"{meta.get('version')!r}; this minidist reads {FORMAT!r} version "
                         f"{VERSION}")
    model_state = {name[len("model/"):]: archive[name] for name in names
                   if name.startswith("model/")}
    optimizer_state = None
    if optimizer is not None:
        saved = meta["optimizer"]
        if saved is None:
            raise ValueError(f"rank {rank}: {path} holds no optimizer state (it was saved "
                             "without optimizer=); load it without optimizer=, or save one")
        if saved["class"] != type(optimizer).__name__:
            raise ValueError(f"rank {rank}: {path} holds the state of a {saved['class']}, "
                             f"not of this {type(optimizer).__name__}; build the optimizer "
                             "that was saved")
        state = {int(index): dict(entries) for index, entries in saved["scalars"].items()}
        for name in names:
            if name.startswith("optimizer/state/"):
                index, _, entry = name[len("optimizer/state/"):].partition("/")
                state.setdefault(int(index), {})[entry] = archive[name]
        optimizer_state = {"state": state, "param_groups": saved["param_groups"]}
    try:
        _unwrap(model).load_state_dict(model_state)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
    except (ValueError, KeyError, RuntimeError) as error:
        raise ValueError(f"rank {rank}: the checkpoint {path} does not fit this model or "
                         f"optimizer: {error}") from None
    extra = dict(meta["extra"])
    extra.update({name[len("extra/"):]: archive[name] for name in names
                  if name.startswith("extra/")})
    return extra
