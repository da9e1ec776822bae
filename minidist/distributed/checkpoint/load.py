"""``load``: each rank reads only the saved chunks that overlap its box, into
whatever layout its state dict has (torch's ``torch.distributed.checkpoint.load``).

1. **Read the table** (each rank reads ``.metadata``, no message).
2. **Check** every leaf of the target state dict before anything is
   copied: its key is in the checkpoint, a tensor where a tensor was saved,
   the same global shape and the same dtype. minidist refuses a dtype
   mismatch (torch's ``copy_`` casts silently; a float32 model loading
   float64 weights would round them without a word); load into a state dict
   of the saved dtype and cast it yourself if you mean it. Keys the
   checkpoint has and the target lacks are fine (a pipeline stage loads its
   layers only); they are listed in the report.
3. **Plan the reads**: the box this rank needs (a DTensor's local shard, a
   plain array's whole) against every saved chunk's box (:func:`overlap`):
   only the chunks that meet it are read. The files must exist and be long
   enough: a missing or truncated shard file is named before any read.
4. **Read** into fresh arrays: of each chunk the run of rows the overlap
   spans (bytes at a known offset), the overlap copied out of it.
5. **Agree** (one ``all_gather_object`` of ok / the error, when launched):
   a failure on any rank leaves every rank's state untouched.
6. **Copy** the fresh arrays into the targets in place (views of them stay
   valid), and put the saved objects (step counts, betas) where the target's
   were.

Cost: of each saved chunk that overlaps its box, this rank reads the rows
(dim 0) the overlap spans, one contiguous run of bytes (torch reads the
whole chunk): a box cut along dim 0 reads only its own rows, a Shard(0) box
out of a save in Shard(1) columns reads its rows of every column chunk (the
columns it does not need come along: a row is the unit). An aligned layout
reads exactly its own bytes, a replicated tensor the whole. One small
message (the verdicts); memory: this rank's new state twice while it is
staged.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.checkpoint.flatten import is_tensor, leaves
from minidist.distributed.checkpoint.metadata import (
    Metadata,
    little_endian,
    local_box,
    overlap,
    rows_to_read,
    slices,
    volume,
)
from minidist.distributed.checkpoint.save import all_gather, failure, group_of, listed
from minidist.tensor import Tensor
from minidist.units import format_bytes


class LoadReport:
    """What one rank read: ``reads[key]`` lists the chunks of ``key`` it read
    (``(writer rank, file, offsets, sizes, nbytes)``); ``box[key]`` the box it
    needed; ``bytes_read`` / ``chunks_read`` against ``bytes_saved`` /
    ``chunks_saved`` of the keys it loaded; ``unexpected``: saved keys the
    target did not ask for."""

    def __init__(self, rank):
        self.rank, self.reads, self.box = rank, {}, {}
        self.bytes_read = self.chunks_read = self.bytes_saved = self.chunks_saved = 0
        self.unexpected = []

    def text(self, key=None) -> str:
        """``rank 1 read 2 of 4 chunks, 1.5 KiB of 6 KiB`` (of ``key`` alone if given)."""
        if key is None:
            read, of, nbytes, whole = (self.chunks_read, self.chunks_saved, self.bytes_read,
                                       self.bytes_saved)
        else:
            chunks, saved = self.reads.get(key, []), self._saved[key]
            read, of = len(chunks), saved[0]
            nbytes, whole = sum(c[4] for c in chunks), saved[1]
        return (f"rank {self.rank} read {read} of {of} chunks, {format_bytes(nbytes)} of "
                f"{format_bytes(whole)}" + (f" of {key}" if key else ""))

    def __repr__(self) -> str:
        return f"LoadReport({self.text()})"


def _problems(state_dict, metadata: Metadata, folder, allow_partial_load):
    """Step 2 and 3: ``(problems, plan)``; the plan is ``[(key, container, name,
    value, kind, reads)]``."""
    problems, plan, seen = [], [], set()
    sizes = {}
    for key, container, name, value in leaves(state_dict):
        seen.add(key)
        if key in metadata.objects:
            if is_tensor(value):
                problems.append(f"{key!r}: saved as a value (not a tensor), the target holds a "
                                f"tensor")
            else:
                plan.append((key, container, name, value, "object", [metadata.objects[key]]))
            continue
        if key not in metadata.tensors:
            if not allow_partial_load:
                problems.append(f"missing key {key!r}: the target has it, the checkpoint does "
                                f"not")
            continue
        saved = metadata.tensors[key]
        if not is_tensor(value):
            problems.append(f"{key!r}: saved as a tensor {saved['shape']}, the target holds a "
                            f"{type(value).__name__}; put a tensor of that shape there")
            continue
        shape, dtype, offsets, box, _ = local_box(value)
        if tuple(shape) != tuple(saved["shape"]):
            problems.append(f"size mismatch for {key!r}: saved with shape {saved['shape']}, "
                            f"the target has shape {tuple(shape)}")
            continue
        if np.dtype(dtype) != np.dtype(saved["dtype"]):
            problems.append(f"dtype mismatch for {key!r}: saved as {np.dtype(saved['dtype'])}, "
                            f"the target is {np.dtype(dtype)} (minidist does not cast; load "
                            f"into a {np.dtype(saved['dtype'])} state dict and cast after)")
            continue
        reads = []
        for chunk in saved["chunks"]:
            met = overlap(offsets, box, chunk["offsets"], chunk["sizes"])
            if met is not None and volume(met[1]) and volume(box):
                reads.append((chunk, met))
        plan.append((key, container, name, value, "tensor", reads))
    for key, _, _, _, kind, reads in plan:
        for read in reads:
            where = read if kind == "object" else read[0]
            path = os.path.join(folder, where["file"])
            if path not in sizes:
                sizes[path] = os.path.getsize(path) if os.path.exists(path) else None
            end = where["byte_offset"] + where["nbytes"]
            if sizes[path] is None:
                problems.append(f"{key!r}: its shard file {path} is missing (written by rank "
                                f"{where['rank']}); the checkpoint is incomplete")
            elif sizes[path] < end:
                problems.append(f"{key!r}: the shard file {path} is truncated: it has "
                                f"{sizes[path]} bytes, the chunk needs bytes "
                                f"{where['byte_offset']}..{end}")
    unexpected = [k for k in metadata.keys() if k not in seen]
    return problems, plan, unexpected


def _read(path, where, files):
    file = files.get(path)
    if file is None:
        file = files[path] = open(path, "rb")
    file.seek(where["byte_offset"])
    data = file.read(where["nbytes"])
    if len(data) != where["nbytes"]:
        raise OSError(f"{path}: read {len(data)} of {where['nbytes']} bytes at "
                      f"{where['byte_offset']} (truncated)")
    return data


def load(state_dict, *, checkpoint_id=None, storage_reader=None, planner=None,
         process_group=None, no_dist: bool = False, allow_partial_load: bool = False) -> LoadReport:
    """Load the checkpoint in the folder ``checkpoint_id`` into ``state_dict``
    in place, resharded to its layouts (the module docstring). Every rank of
    ``process_group`` calls it (outside a launch: one process, plain arrays).
    torch returns None; minidist returns this rank's :class:`LoadReport`.
    ``allow_partial_load=True`` (torch's ``DefaultLoadPlanner`` option):
    keys missing from the checkpoint are left as they are."""
    if checkpoint_id is None:
        raise ValueError("load: pass checkpoint_id=, the folder save wrote")
    if storage_reader is not None or planner is not None:
        raise NotImplementedError("load(storage_reader=, planner=): minidist reads the file "
                                  "system layout of torch's FileSystemReader; pass "
                                  "checkpoint_id (and allow_partial_load=)")
    folder = os.path.abspath(os.fspath(checkpoint_id))
    group, rank, size, ranks = group_of(None if no_dist else process_group)
    if no_dist:
        group, rank, size, ranks = None, 0, 1, (0,)
    report, staged, problem, original = LoadReport(ranks[rank]), [], None, None
    report._saved = {}
    try:
        metadata = Metadata.read(folder)                     # 1. the table
        problems, plan, report.unexpected = _problems(state_dict, metadata, folder,
                                                      allow_partial_load)   # 2-3.
        if problems:
            raise ValueError(
                f"load from {folder}: {len(problems)} problem(s), nothing was loaded:\n  "
                + listed(problems)
                + (f"\n  (the checkpoint also has {len(report.unexpected)} key(s) the target "
                   f"lacks, e.g. {report.unexpected[:3]})" if report.unexpected else ""))
        files = {}
        try:
            for key, container, name, value, kind, reads in plan:   # 4. read
                if kind == "object":
                    where = reads[0]
                    data = _read(os.path.join(folder, where["file"]), where, files)
                    staged.append((container, name, value, kind, pickle.loads(data)))
                    report.bytes_read += where["nbytes"]
                    report.bytes_saved += where["nbytes"]
                    continue
                saved = metadata.tensors[key]
                _, dtype, offsets, box, _ = local_box(value)
                out = np.empty(box, dtype=np.dtype(dtype))
                for chunk, (met_offsets, met_sizes) in reads:
                    (start, nbytes, run), first = rows_to_read(
                        chunk, met_offsets, met_sizes, np.dtype(dtype).itemsize)
                    where = {"byte_offset": start, "nbytes": nbytes}
                    data = _read(os.path.join(folder, chunk["file"]), where, files)
                    piece = np.frombuffer(data, dtype=little_endian(dtype)).reshape(run)
                    out[slices(met_offsets, met_sizes, offsets)] = \
                        piece[slices(met_offsets, met_sizes, first)]
                    report.reads.setdefault(key, []).append(
                        (chunk["rank"], chunk["file"], chunk["offsets"], chunk["sizes"],
                         where["nbytes"]))
                    report.chunks_read += 1
                    report.bytes_read += where["nbytes"]
                report.box[key] = (offsets, box)
                whole = sum(c["nbytes"] for c in saved["chunks"])
                report._saved[key] = (len(saved["chunks"]), whole)
                report.chunks_saved += len(saved["chunks"])
                report.bytes_saved += whole
                staged.append((container, name, value, kind, out))
        finally:
            for file in files.values():
                file.close()
    except Exception as error:
        problem, original = f"{type(error).__name__}: {error}", error
    if not no_dist and dist.is_initialized():                # 5. agree
        verdict = failure(all_gather(problem, group, size), ranks, f"load from {folder}")
        if verdict is not None:
            raise verdict
    elif problem is not None:
        raise original                                   # one process: the error itself
    for container, name, value, kind, out in staged:          # 6. copy
        if kind == "object":
            container[name] = out
            continue
        target = value.data if isinstance(value, Tensor) else value
        xp = backend.of(target)
        target[...] = out if xp is np else xp.asarray(out)
    return report


__all__ = ["LoadReport", "load"]
