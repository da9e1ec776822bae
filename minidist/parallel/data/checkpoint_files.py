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

**Sharded models** (ZeRO, :mod:`minidist.parallel.data.zero`): a
:class:`ZeroRedundancyOptimizer`'s state and a :class:`FullyShardedDataParallel`
model's weights and optimizer state are spread over the ranks (FSDP's
``NO_SHARD`` keeps each unit's whole flat buffer on every rank: saved as it
is, loaded in whole). Saving gathers
them (all_gather, every rank calls it) into exactly the file an unsharded model
writes: the module's names, one optimizer state entry per parameter in the
shape of the parameter, the optimizer saved as its own class (``Adam``, not the
wrapper). So one file loads into a plain model, into DDP, or into a sharded
model on *any* world size; loading takes each rank's slice from the full
arrays. Chosen over per-rank shard files with a manifest because those tie a
checkpoint to the world size and the padding it was written with, and a plain
model could not read them; the cost is one full copy on each rank while
saving, the model's states gathered once (at this course's sizes, small).

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
from collections import OrderedDict

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.atomic_file import atomic_write
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.data.fsdp import FullyShardedDataParallel
from minidist.parallel.data.zero import ZeroRedundancyOptimizer

FORMAT = "minidist.checkpoint"
VERSION = 1
_OK, _FAILED, _MISSING = 0, 1, -1


def _unwrap(model):
    # A DDP (or FSDP) wrapper's names all start with "module."; saving the wrapped
    # model makes one checkpoint load with or without the wrapper.
    if isinstance(model, (DistributedDataParallel, FullyShardedDataParallel)):
        return model.module
    return model


def _one_group(snapshot, who):
    if len(snapshot["param_groups"]) != 1:
        raise ValueError(f"save_checkpoint: {who} with {len(snapshot['param_groups'])} param "
                         "groups; a sharded optimizer is saved with one")
    return snapshot["param_groups"][0]


def _gather_flat(shard_array, layout, group):
    if layout.shard == layout.padded:
        # Every rank holds the whole buffer (FSDP's NO_SHARD, a world of one):
        # nothing to gather, and all_gather would ask for n times the buffer.
        return layout.views(np.ascontiguousarray(shard_array))
    full = np.empty(layout.padded, layout.dtype)
    dist.all_gather_into_tensor(full, np.ascontiguousarray(shard_array), group=group)
    return layout.views(full)


def _gather_state(shard_state, layout, index_of, group) -> dict:
    """One sharded optimizer state entry (a flat slice's ``{name: value}``) as
    the unsharded optimizer's entries, ``{parameter index: {name: value}}``."""
    state = {}
    for name in sorted(shard_state):
        value = shard_state[name]
        if hasattr(value, "shape") and getattr(value, "ndim", 0) == 1 \
                and value.shape[0] == layout.shard:
            for param, view in zip(layout.parameters, _gather_flat(value, layout, group)):
                state.setdefault(index_of[id(param)], {})[name] = view.copy()
        else:
            for param in layout.parameters:
                state.setdefault(index_of[id(param)], {})[name] = value
    return state


def _full_state(model, optimizer, group):
    """The model's state dict and the optimizer's snapshot (and class name) as
    an unsharded model's; sharded ones are gathered (a collective)."""
    module = _unwrap(model)
    parameters = list(module.parameters())
    index_of = {id(param): index for index, param in enumerate(parameters)}
    if isinstance(model, FullyShardedDataParallel):
        # Not module.state_dict(): FULL_SHARD's layers hold no full weights now.
        gathered = model._gathered_weights()
        model_state = OrderedDict(
            (name, gathered[id(tensor)] if id(tensor) in gathered else tensor.data.copy())
            for name, tensor in module._state_tensors().items())
    else:
        model_state = module.state_dict()
    if optimizer is None:
        return model_state, None, None
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        inner = optimizer.optimizer.state_dict()
        saved_group = dict(_one_group(inner, "a ZeroRedundancyOptimizer"),
                           params=list(range(len(parameters))))
        state = _gather_state(inner["state"].get(0, {}), optimizer.layout, index_of, group)
        return model_state, {"state": state, "param_groups": [saved_group]}, \
            type(optimizer.optimizer).__name__
    snapshot = optimizer.state_dict()
    if isinstance(model, FullyShardedDataParallel):
        saved_group = dict(_one_group(snapshot, "an FSDP model's optimizer"),
                           params=list(range(len(parameters))))
        state = {}
        for index, unit in enumerate(model._units):
            state.update(_gather_state(snapshot["state"].get(index, {}), unit.layout,
                                       index_of, group))
        snapshot = {"state": state, "param_groups": [saved_group]}
    return model_state, snapshot, type(optimizer).__name__


def _slice_state(entries_per_param, layout) -> dict:
    """The unsharded entries of a flat buffer's parameters, as this rank's
    slice's entry (arrays packed and sliced; other values from the first)."""
    if not all(entries_per_param):
        return {}
    out = {}
    for name, value in entries_per_param[0].items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            out[name] = layout.pack_slice([np.asarray(e[name]) for e in entries_per_param],
                                          np.empty(layout.shard, layout.dtype))
        else:
            out[name] = value
    return out


def _load_sharded(model, optimizer, model_state, optimizer_state) -> bool:
    """Load into a sharded model or optimizer; False when neither is sharded."""
    zero = isinstance(optimizer, ZeroRedundancyOptimizer)
    fsdp = isinstance(model, FullyShardedDataParallel)
    if not (zero or fsdp):
        return False
    module = _unwrap(model)
    parameters = list(module.parameters())
    index_of = {id(param): index for index, param in enumerate(parameters)}
    if fsdp:
        names = {id(param): name for name, param in module.named_parameters()}
        for unit in model._units:
            arrays = []
            for param, shape in zip(unit.layout.parameters, unit.layout.shapes):
                value = model_state.get(names[id(param)])
                if value is None or tuple(value.shape) != tuple(shape):
                    found = None if value is None else tuple(value.shape)
                    raise ValueError(f"parameter {names[id(param)]!r} of shape {shape} is "
                                     f"{'missing' if value is None else f'of shape {found}'}")
                arrays.append(np.asarray(value))
            full = unit.layout.pack(arrays, np.empty(unit.layout.padded, unit.layout.dtype))
            unit.shard.data[...] = full[unit.layout.lo:unit.layout.hi]
            if unit.full is not None:
                unit.full[...] = full
        # By identity, not name: a tied parameter has a second name (a GPT's
        # lm_head.weight), loaded above under its first.
        in_units = {id(p) for unit in model._units for p in unit.layout.parameters}
        tensors = module._state_tensors()
        rest = {name: value for name, value in model_state.items()
                if id(tensors.get(name)) not in in_units}
        if rest:
            module.load_state_dict(rest, strict=False)
    else:
        module.load_state_dict(model_state)     # in place: the flat buffer's views stay
    if optimizer_state is None:
        return True
    state, saved_group = optimizer_state["state"], optimizer_state["param_groups"]
    if len(saved_group) != 1:
        raise ValueError(f"{len(saved_group)} param groups; a sharded optimizer takes one")
    if zero:
        layouts, target = [optimizer.layout], optimizer.optimizer
    else:
        layouts, target = [unit.layout for unit in model._units], optimizer
    shard_state = {}
    for index, layout in enumerate(layouts):
        entries = _slice_state([state.get(index_of[id(p)], {}) for p in layout.parameters],
                               layout)
        if entries:
            shard_state[index] = entries
    target.load_state_dict({"state": shard_state,
                            "param_groups": [dict(saved_group[0],
                                                  params=list(range(len(layouts))))]})
    return True


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


def _archive(model_state, snapshot, class_name, extra) -> dict[str, np.ndarray]:
    arrays = {f"model/{name}": backend.to_numpy(value) for name, value in model_state.items()}
    meta = {"format": FORMAT, "version": VERSION, "optimizer": None, "extra": {}}
    if snapshot is not None:
        scalars = {}
        for index, entries in snapshot["state"].items():
            for name, value in entries.items():
                if hasattr(value, "shape") and hasattr(value, "dtype"):
                    arrays[f"optimizer/state/{index}/{name}"] = backend.to_numpy(value)
                else:
                    scalars.setdefault(str(index), {})[name] = value
        meta["optimizer"] = {"class": class_name,
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
    group = as_group(group, "checkpoint")
    rank, world_size = _rank_and_size(group)
    path = os.fspath(path)
    status = np.array([_OK], np.int64)
    failure = None
    model_state, snapshot, class_name = _full_state(model, optimizer, group)  # every rank
    if rank == 0:
        try:
            arrays = _archive(model_state, snapshot, class_name, extra)
            with atomic_write(path, "wb") as file:
                np.savez(file, **arrays)
        except (OSError, TypeError) as error:
            status[0] = _FAILED
            failure = error
    if world_size > 1:
        dist.broadcast(status, group=group, group_src=0)
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
        dist.broadcast(size, group=group, group_src=0)
    if size[0] == _MISSING:
        detail = f" ({data.decode()})" if data is not None else ""
        raise FileNotFoundError(f"rank {rank}: rank 0 could not read the checkpoint "
                                f"{path}{detail}; check the path, which is read on rank 0 only")
    buffer = np.frombuffer(data, np.uint8).copy() if rank == 0 else np.empty(size[0], np.uint8)
    if world_size > 1:
        dist.broadcast(buffer, group=group, group_src=0)
    return buffer.tobytes()


def load_checkpoint(path, model, optimizer=None, group=None) -> dict:
    """Load a file written by :func:`save_checkpoint` into ``model`` (and
    ``optimizer``) on every rank, from rank 0's copy; return the extras
    (``{"epoch": 3, ...}``). Call it on every rank, after building the model
    and optimizer exactly as when saving."""
    group = as_group(group, "checkpoint")
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
        mine = type(optimizer.optimizer if isinstance(optimizer, ZeroRedundancyOptimizer)
                    else optimizer).__name__
        if saved["class"] != mine:
            raise ValueError(f"rank {rank}: {path} holds the state of a {saved['class']}, "
                             f"not of this {mine}; build the optimizer that was saved")
        state = {int(index): dict(entries) for index, entries in saved["scalars"].items()}
        for name in names:
            if name.startswith("optimizer/state/"):
                index, _, entry = name[len("optimizer/state/"):].partition("/")
                state.setdefault(int(index), {})[entry] = archive[name]
        optimizer_state = {"state": state, "param_groups": saved["param_groups"]}
    try:
        if not _load_sharded(model, optimizer, model_state, optimizer_state):
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
