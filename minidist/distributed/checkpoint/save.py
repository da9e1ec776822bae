"""``save``: every rank writes its own shards, rank 0 the table, all or nothing
(torch's ``torch.distributed.checkpoint.save``).

1. **Snapshot** (each rank, no message): the state dict flattened
   (:mod:`.flatten`); each tensor leaf becomes the box of the global tensor
   this rank holds (a DTensor's local shard; a plain array the whole), each
   object leaf its pickled bytes. A ``Partial`` DTensor is refused: its
   local values are not pieces of the tensor but terms of a sum.
2. **Plan** (one ``all_gather_object`` of the boxes, no data): every rank
   sees every rank's boxes, so every rank works out the same global plan.
   A box held by several ranks (a ``Replicate``, a plain array on every
   rank) is written once, by the lowest rank holding it (torch's dedup);
   the keys must agree on shape and dtype everywhere. Byte offsets follow
   from the sizes, so the table is known before a byte is written.
3. **Write** (each rank): its boxes end to end in ``__{rank}_0.distcp``,
   in a hidden temporary folder beside ``checkpoint_id`` that rank 0 made
   (its name is in rank 0's plan), flushed to disk.
4. **Agree** (one ``all_gather_object`` of ok / the error): if any rank
   failed, every rank raises naming it, and rank 0 removes the folder.
5. **Publish** (rank 0): ``.metadata`` written last, then the folder renamed
   to ``checkpoint_id`` (an old checkpoint there is renamed away first and
   removed after), and a ``broadcast_object_list`` tells everyone it is done.
   A crash before the rename leaves the old checkpoint; between the two
   renames, the old one is kept beside it under a ``.old`` name.

Cost: every rank writes its unique boxes once (the whole state, once, over
all ranks); messages: two all_gathers of the plan and the verdicts (small:
boxes and names, no data) and one broadcast; one file per rank plus the
metadata.

``async_save`` (:mod:`.async_save`) runs steps 3-5 in a background thread
on a copy taken in step 1.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import zlib

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.checkpoint.flatten import flatten_state_dict, is_tensor
from minidist.distributed.checkpoint.metadata import (
    METADATA,
    Metadata,
    little_endian,
    local_box,
    shard_file,
    volume,
)
from minidist.tensor import Tensor


def group_of(process_group):
    """``(group or None when not launched, this rank, size, global ranks)``."""
    if not dist.is_initialized():
        return None, 0, 1, (0,)
    group = process_group
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ranks = tuple(getattr(group, "ranks", range(size))) if group is not None else tuple(range(size))
    return group, rank, size, ranks


def all_gather(obj, group, size):
    if size == 1 and not dist.is_initialized():
        return [obj]
    out = [None] * size
    dist.all_gather_object(out, obj, group=group)
    return out


def snapshot(state_dict, copy: bool):
    """Step 1: ``[(key, entry, payload)]``: a tensor's entry is its box, its
    payload the little-endian array; an object's entry its size, its payload
    the pickled bytes. ``copy``: arrays copied (async_save: the caller may
    change its state as soon as the call returns)."""
    items = []
    for key, value in flatten_state_dict(state_dict).items():
        if is_tensor(value):
            spec = getattr(value, "_spec", None)
            if spec is not None and any(p.is_partial() for p in spec.placements):
                raise ValueError(
                    f"save: {key!r} is a "
                    f"Partial DTensor (layout {local_box(value)[4]}): its pieces are terms of a "
                    f"sum, not parts of the tensor; reduce it first "
                    f"(.redistribute(mesh, [Replicate()]) or full_tensor())")
            shape, dtype, offsets, sizes, _ = local_box(value)
            data = value.data if isinstance(value, Tensor) else value   # a DTensor's: local
            array = np.ascontiguousarray(backend.to_numpy(data), dtype=little_endian(dtype))
            if copy:
                array = array.copy()
            entry = {"kind": "tensor", "shape": shape, "dtype": np.dtype(dtype).str,
                     "offsets": offsets, "sizes": sizes,
                     "nbytes": volume(sizes) * np.dtype(dtype).itemsize,
                     "crc": zlib.crc32(memoryview(array.reshape(-1)).cast("B")) if array.size else 0}
            items.append((key, entry, array))
        else:
            try:
                payload = pickle.dumps(value)
            except Exception as error:
                raise TypeError(f"save: {key!r} ({type(value).__name__}) cannot be pickled: "
                                f"{error}") from error
            items.append((key, {"kind": "object", "nbytes": len(payload)}, payload))
    return items


def global_plan(plans, ranks):
    """Step 2, the same on every rank: for each rank the entries it writes (with
    their byte offsets in its file), and the checkpoint's table."""
    tensors, objects, writes = {}, {}, [[] for _ in plans]
    held = {}
    for rank, plan in enumerate(plans):
        for key, entry in plan:
            if entry["kind"] == "object":
                if key in tensors:
                    raise ValueError(f"save: {key!r} is a tensor on one rank and an object "
                                     f"(not a tensor) on rank {ranks[rank]}")
                if key not in objects:
                    objects[key] = {"rank": rank}
                    writes[rank].append((key, entry))
                continue
            if key in objects:
                raise ValueError(f"save: {key!r} is an object on one rank and a tensor on "
                                 f"rank {ranks[rank]}")
            table = tensors.setdefault(key, {"shape": tuple(entry["shape"]),
                                             "dtype": entry["dtype"], "chunks": []})
            if tuple(entry["shape"]) != table["shape"] or entry["dtype"] != table["dtype"]:
                raise ValueError(
                    f"save: {key!r} has global shape {table['shape']} {table['dtype']} on an "
                    f"earlier rank but {tuple(entry['shape'])} {entry['dtype']} on rank "
                    f"{ranks[rank]}: every rank must save the same tensor under one key")
            box = (tuple(entry["offsets"]), tuple(entry["sizes"]))
            if volume(box[1]) == 0:
                continue            # an empty piece
            if (key, box) in held:  # a copy a lower rank writes: it must be a copy
                first, crc = held[key, box]
                if crc != entry.get("crc", crc):
                    raise ValueError(
                        f"save: ranks {ranks[first]} and {ranks[rank]} hold different values "
                        f"for the same box of {key!r} (offsets {box[0]}, sizes {box[1]}), so it "
                        f"is not a copy and saving one of them would lose the other. A plain "
                        f"array is taken as the whole tensor on every rank: if each rank holds "
                        f"a piece, make it a DTensor of its layout; if the replicas should be "
                        f"equal, they have drifted apart (gradients not averaged?)")
                continue
            held[key, box] = (rank, entry.get("crc"))
            writes[rank].append((key, entry))
    for rank, entries in enumerate(writes):
        position = 0
        for key, entry in entries:
            where = {"file": shard_file(rank), "byte_offset": position,
                     "nbytes": entry["nbytes"], "rank": ranks[rank]}
            position += entry["nbytes"]
            if entry["kind"] == "object":
                objects[key] = where
            else:
                tensors[key]["chunks"].append({"offsets": tuple(entry["offsets"]),
                                               "sizes": tuple(entry["sizes"]), **where})
    for key, table in tensors.items():
        saved = sum(volume(c["sizes"]) for c in table["chunks"])
        if saved != volume(table["shape"]) and volume(table["shape"]):
            raise ValueError(f"save: the ranks' pieces of {key!r} hold {saved} of its "
                             f"{volume(table['shape'])} elements once each: they do not tile "
                             f"the tensor (or overlap without being equal)")
    return writes, Metadata(tensors, objects, len(plans))


def prepare_folder(checkpoint_id) -> str:
    """Rank 0: the hidden temporary folder beside ``checkpoint_id``."""
    target = os.path.abspath(os.fspath(checkpoint_id))
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise FileExistsError(f"save: {target} is a file; checkpoint_id names a folder")
        foreign = [n for n in os.listdir(target)
                   if n != METADATA and not n.endswith(".distcp")]
        if foreign:
            raise FileExistsError(
                f"save: {target} holds files that are not a checkpoint's ({foreign[:3]}); "
                f"a save replaces the whole folder, so name an empty or a checkpoint folder")
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    _remove_stale(parent, name)
    return tempfile.mkdtemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=parent)


def _remove_stale(parent, name):
    """Temporary folders of saves whose rank 0 died (``.name.<pid>.<random>.tmp``):
    never a checkpoint, since the rename is what makes one."""
    for entry in os.listdir(parent):
        parts = entry[len(name) + 2:].split(".")
        if entry.startswith(f".{name}.") and entry.endswith(".tmp") and parts[0].isdigit():
            try:
                os.kill(int(parts[0]), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
            except PermissionError:
                pass                   # another user's process: alive


def write_file(path, items, writes_of_rank):
    """Step 3: this rank's entries end to end, as the plan placed them."""
    mine = {key: payload for key, _, payload in items}
    with open(path, "wb") as file:
        for key, _ in writes_of_rank:
            write_bytes(file, mine[key], key)
        file.flush()
        os.fsync(file.fileno())


def write_bytes(file, payload, key):
    """One entry's bytes (a seam for the tests' failure injection)."""
    file.write(payload if isinstance(payload, bytes) else memoryview(payload).cast("B"))


def publish(folder, checkpoint_id, metadata: Metadata):
    """Step 5 (rank 0): the table last, then the folder in place of the old one."""
    path = os.path.join(folder, METADATA)
    with open(path, "w", encoding="utf-8") as file:
        file.write(metadata.to_json())
        file.flush()
        os.fsync(file.fileno())
    target = os.path.abspath(os.fspath(checkpoint_id))
    if os.path.exists(target):
        old = folder[:-len(".tmp")] + ".old"
        os.rename(target, old)
        os.rename(folder, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(folder, target)


def failure(verdicts, ranks, what):
    """The error every rank raises when some rank's verdict is an error (ranks
    with the same error listed together)."""
    bad = [(ranks[r], v) for r, v in enumerate(verdicts) if v is not None]
    if not bad:
        return None
    by_text = {}
    for rank, text in bad:
        by_text.setdefault(text, []).append(rank)
    lines = "\n  ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {text}"
                        for text, rs in by_text.items())
    return RuntimeError(f"{what} failed on rank(s) {[r for r, _ in bad]}:\n  {lines}")


def listed(problems, most: int = 8) -> str:
    """Problems one a line, the first ``most`` of them."""
    more = len(problems) - most
    return "\n  ".join(problems[:most] + ([f"... and {more} more"] if more > 0 else []))


def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None,
         process_group=None, no_dist: bool = False) -> Metadata:
    """Write ``state_dict`` (nested dicts of DTensors, Tensors, arrays and
    values) to the folder ``checkpoint_id``, every rank its own shards (the
    module docstring). Every rank of ``process_group`` (the world) calls it.
    Returns the checkpoint's :class:`Metadata`."""
    if checkpoint_id is None:
        raise ValueError("save: pass checkpoint_id=, the folder to write")
    if storage_writer is not None or planner is not None:
        raise NotImplementedError("save(storage_writer=, planner=): minidist writes the file "
                                  "system layout of torch's FileSystemWriter; pass checkpoint_id")
    items, folder, metadata, writes = None, None, None, None
    group, rank, size, ranks = group_of(None if no_dist else process_group)
    if no_dist:
        group, rank, size, ranks = None, 0, 1, (0,)
    gather = (lambda obj: [obj]) if no_dist else (lambda obj: all_gather(obj, group, size))
    try:                                                      # 1. snapshot
        items = snapshot(state_dict, copy=False)
        if rank == 0:
            folder = prepare_folder(checkpoint_id)
        mine = (None, folder, [(k, e) for k, e, _ in items])
    except Exception as error:
        if size == 1:
            raise                                          # one process: the error itself
        mine = (f"{type(error).__name__}: {error}", None, [])
    plans = gather(mine)                                      # 2. plan
    folder = plans[0][1]
    problem = failure([p[0] for p in plans], ranks, "save (snapshot)")
    if problem is None:
        try:
            writes, metadata = global_plan([p[2] for p in plans], ranks)
        except ValueError as error:
            problem = error
    if problem is not None:
        if rank == 0 and folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise problem
    try:                                                      # 3. write
        if writes[rank]:
            write_file(os.path.join(folder, shard_file(rank)), items, writes[rank])
        verdict = None
    except Exception as error:
        if size == 1:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        verdict = f"{type(error).__name__}: {error} (writing {shard_file(rank)})"
    problem = failure(gather(verdict), ranks, f"save to {checkpoint_id}")   # 4. agree
    if problem is not None:
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"{problem}\n(nothing was written to {checkpoint_id}: a checkpoint "
                           f"there before is as it was)")
    done = [None]
    if rank == 0:                                             # 5. publish
        try:
            publish(folder, checkpoint_id, metadata)
        except Exception as error:
            shutil.rmtree(folder, ignore_errors=True)
            done = [f"{type(error).__name__}: {error} (publishing {checkpoint_id})"]
    if size > 1 and not no_dist:
        dist.broadcast_object_list(done, src=ranks[0], group=group)
    if done[0] is not None:
        raise RuntimeError(f"save to {checkpoint_id} failed on rank {ranks[0]}: {done[0]}")
    return metadata


__all__ = ["save"]
