"""What a checkpoint folder holds, and which box of a tensor each rank has.

A checkpoint is a folder (torch's layout)::

    ckpt/
      .metadata          JSON: every key, its global shape and dtype, and
                         where every saved chunk of it lies
      __0_0.distcp       rank 0's chunks, raw little-endian bytes end to end
      __1_0.distcp       rank 1's ...

A *chunk* is a box of the global tensor: its first element's index
(``offsets``) and its extent (``sizes``), C-ordered bytes at ``byte_offset``
in ``file``. A DTensor's chunk on a rank is the box its placements give that
rank (:func:`~minidist.distributed.tensor.local_shape_and_offset`); a plain
array's is the whole tensor. A non-tensor value (a step count, betas) is an
*object*: pickled bytes, also at an offset in one rank's file.

Because each chunk says where it lies in the global tensor, a load on any
layout asks which saved boxes overlap the box it needs (:func:`overlap`) and
reads those bytes only: resharding is box arithmetic, no collective.

The metadata is JSON so that ``python -m json.tool ckpt/.metadata`` shows it
(torch pickles its ``Metadata``); the shard files are plain bytes so that
``numpy.fromfile(..., offset=)`` reads one chunk without minidist.
"""

from __future__ import annotations

import json
import os

import numpy as np

from minidist.tensor import Tensor

FORMAT = "minidist.distributed.checkpoint"
VERSION = 1
METADATA = ".metadata"


def shard_file(rank: int) -> str:
    """torch's name for rank ``rank``'s shard file."""
    return f"__{rank}_0.distcp"


def little_endian(dtype) -> np.dtype:
    """The dtype as it is written: little-endian, whatever the machine."""
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("<") if dtype.byteorder not in ("=", "|", "<") else dtype


def local_box(value):
    """``(global shape, dtype, offsets, sizes, placements text)`` of the box of
    a tensor leaf this rank holds (duck typing: a DTensor has ``_spec``)."""
    spec = getattr(value, "_spec", None)
    if spec is not None:
        sizes, offsets = spec.local_shape_and_offset()
        layout = "(" + ", ".join(str(p) for p in spec.placements) + ")"
        return spec.shape, spec.dtype, tuple(offsets), tuple(sizes), layout
    data = value.data if isinstance(value, Tensor) else value   # a NumPy or CuPy array
    shape = tuple(int(s) for s in data.shape)
    return shape, np.dtype(data.dtype), (0,) * len(shape), shape, "whole"


def volume(sizes) -> int:
    return int(np.prod(sizes, dtype=np.int64)) if len(sizes) else 1


def overlap(offsets_a, sizes_a, offsets_b, sizes_b):
    """The box both boxes hold, as ``(offsets, sizes)``, or None."""
    start = [max(a, b) for a, b in zip(offsets_a, offsets_b)]
    stop = [min(a + s, b + t) for a, s, b, t in zip(offsets_a, sizes_a, offsets_b, sizes_b)]
    if any(e <= s for s, e in zip(start, stop)) and len(start):
        return None
    return tuple(start), tuple(e - s for s, e in zip(start, stop))


def rows_to_read(chunk, met_offsets, met_sizes, itemsize):
    """The bytes of ``chunk`` a load reads for the overlap ``(met_offsets,
    met_sizes)``: the rows (dim 0) the overlap spans, one contiguous run of a
    C-ordered chunk. Returns ``(byte_offset, nbytes, sizes)`` of the run and
    the global index of its first element."""
    sizes = tuple(chunk["sizes"])
    if not sizes:
        return (chunk["byte_offset"], chunk["nbytes"], ()), ()
    row = volume(sizes[1:]) * itemsize
    skip = met_offsets[0] - chunk["offsets"][0]
    run = (chunk["byte_offset"] + skip * row, met_sizes[0] * row, (met_sizes[0],) + sizes[1:])
    return run, (met_offsets[0],) + tuple(chunk["offsets"][1:])


def slices(offsets, sizes, origin):
    """Index of the box ``(offsets, sizes)`` in an array whose [0, ...] is ``origin``."""
    return tuple(slice(o - g, o - g + s) for o, s, g in zip(offsets, sizes, origin))


class Metadata:
    """The table of a checkpoint (torch's ``Metadata``): ``tensors[key]`` is
    ``{"shape", "dtype", "chunks": [{"offsets", "sizes", "file", "byte_offset",
    "nbytes", "rank"}]}``, ``objects[key]`` is ``{"file", "byte_offset",
    "nbytes", "rank"}``."""

    def __init__(self, tensors: dict, objects: dict, world_size: int):
        self.tensors, self.objects, self.world_size = tensors, objects, world_size

    @property
    def state_dict_metadata(self) -> dict:
        """torch's name: every key's entry, tensors and objects."""
        return {**self.tensors, **self.objects}

    def keys(self):
        return list(self.tensors) + list(self.objects)

    def total_bytes(self) -> int:
        return sum(c["nbytes"] for t in self.tensors.values() for c in t["chunks"]) + sum(
            o["nbytes"] for o in self.objects.values())

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, "world_size": self.world_size,
                           "tensors": self.tensors, "objects": self.objects}, indent=1)

    @staticmethod
    def read(folder) -> Metadata:
        """The metadata of the checkpoint in ``folder``, or a clear error."""
        path = os.path.join(os.fspath(folder), METADATA)
        if not os.path.isdir(os.fspath(folder)):
            raise FileNotFoundError(f"no checkpoint at {os.fspath(folder)}: the folder does "
                                    f"not exist; pass the checkpoint_id given to save")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: {os.fspath(folder)} is not a complete "
                                    f"checkpoint (save writes .metadata last)")
        try:
            with open(path, encoding="utf-8") as file:
                table = json.load(file)
        except ValueError as error:
            raise ValueError(f"{path} is not a checkpoint's metadata ({error}); it may be "
                             f"damaged: save the checkpoint again") from None
        if table.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} metadata file (format "
                             f"{table.get('format')!r})")
        for entry in table["tensors"].values():
            entry["shape"] = tuple(entry["shape"])
            for chunk in entry["chunks"]:
                chunk["offsets"], chunk["sizes"] = tuple(chunk["offsets"]), tuple(chunk["sizes"])
        return Metadata(table["tensors"], table["objects"], table["world_size"])

    def __repr__(self) -> str:
        chunks = sum(len(t["chunks"]) for t in self.tensors.values())
        return (f"Metadata({len(self.tensors)} tensors in {chunks} chunks, {len(self.objects)} "
                f"objects, written by {self.world_size} rank(s))")


__all__ = ["FORMAT", "METADATA", "Metadata", "little_endian", "local_box", "overlap",
           "rows_to_read", "shard_file", "slices", "volume"]
