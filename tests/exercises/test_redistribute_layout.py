"""The redistribute_layout exercise (Shard(i) -> Shard(j) by one all_to_all):
the reference passes on 2 and 4 real processes; each known mistake is caught
with the message that names it: the pieces joined in the wrong order,
np.split and np.array_split for torch.chunk's sizes, the padding not
trimmed (along either dim), the whole chunk sent to every rank, an
all_gather for the all_to_all; a wrong piece is named by its rank, its
global box and the element of the tensor it holds instead."""

from __future__ import annotations

import numpy as np
import pytest

import minidist.distributed as dist
from minidist.exercises import get
from minidist.exercises.redistribute_layout import _along, _sizes

EXERCISE = get("redistribute_layout")


def _blocks(local, global_shape, dim_from, dim_to, sizes=_sizes):
    """The reference's padded send buffer, with chunk sizes from ``sizes``."""
    n = dist.get_world_size()
    rows, columns = sizes(global_shape[dim_from], n), sizes(global_shape[dim_to], n)
    starts = np.cumsum([0] + list(columns))
    block = list(local.shape)
    block[dim_from], block[dim_to] = max(rows), max(columns)
    send = np.zeros([n] + block, local.dtype)
    for k in range(n):
        part = _along(local, dim_to, starts[k], starts[k + 1])
        send[k][tuple(slice(0, s) for s in part.shape)] = part
    received = np.empty_like(send)
    dist.all_to_all_single(received, send)
    return received, rows, columns


def _reversed_order(local, global_shape, dim_from, dim_to):
    received, rows, columns = _blocks(local, global_shape, dim_from, dim_to)
    me, n = dist.get_rank(), dist.get_world_size()
    pieces = [_along(_along(received[k], dim_from, 0, rows[k]), dim_to, 0, columns[me])
              for k in range(n)]
    # the sizes kept in chunk order, the pieces joined last rank first
    joined = np.concatenate(pieces[::-1], axis=dim_from)
    return joined


def _array_split_sizes(local, global_shape, dim_from, dim_to):
    def sizes(length, n):
        return [len(part) for part in np.array_split(np.arange(length), n)]
    received, rows, columns = _blocks(local, global_shape, dim_from, dim_to, sizes)
    me, n = dist.get_rank(), dist.get_world_size()
    return np.concatenate([_along(_along(received[k], dim_from, 0, rows[k]), dim_to, 0,
                                  columns[me]) for k in range(n)], axis=dim_from)


def _np_split(local, global_shape, dim_from, dim_to):
    n = dist.get_world_size()
    send = np.stack(np.split(local, n, axis=dim_to))     # equal parts only
    received = np.empty_like(send)
    dist.all_to_all_single(received, send)
    return np.concatenate(list(received), axis=dim_from)


def _untrimmed_to(local, global_shape, dim_from, dim_to):
    received, rows, columns = _blocks(local, global_shape, dim_from, dim_to)
    n = dist.get_world_size()
    return np.concatenate([_along(received[k], dim_from, 0, rows[k]) for k in range(n)],
                          axis=dim_from)


def _untrimmed_from(local, global_shape, dim_from, dim_to):
    received, rows, columns = _blocks(local, global_shape, dim_from, dim_to)
    me, n = dist.get_rank(), dist.get_world_size()
    return np.concatenate([_along(received[k], dim_to, 0, columns[me]) for k in range(n)],
                          axis=dim_from)


def _whole_chunk_to_everyone(local, global_shape, dim_from, dim_to):
    n, me = dist.get_world_size(), dist.get_rank()
    rows, columns = _sizes(global_shape[dim_from], n), _sizes(global_shape[dim_to], n)
    block = list(local.shape)
    block[dim_from] = max(rows)
    send = np.zeros([n] + block, local.dtype)
    for k in range(n):
        send[k][tuple(slice(0, s) for s in local.shape)] = local
    received = np.empty_like(send)
    dist.all_to_all_single(received, send, algorithm="pairwise")
    start = sum(columns[:me])
    return np.concatenate([_along(_along(received[k], dim_from, 0, rows[k]), dim_to, start,
                                  start + columns[me]) for k in range(n)], axis=dim_from)


def _all_gather(local, global_shape, dim_from, dim_to):
    n, me = dist.get_world_size(), dist.get_rank()
    rows, columns = _sizes(global_shape[dim_from], n), _sizes(global_shape[dim_to], n)
    padded = np.zeros([max(rows)] + [s for d, s in enumerate(local.shape) if d != dim_from])
    moved = np.moveaxis(local, dim_from, 0)
    padded[:moved.shape[0]] = moved
    pieces = np.empty((n,) + padded.shape)
    dist.all_gather_into_tensor(pieces, padded)
    whole = np.moveaxis(np.concatenate([pieces[k][:rows[k]] for k in range(n)]), 0, dim_from)
    start = sum(columns[:me])
    return np.ascontiguousarray(_along(whole, dim_to, start, start + columns[me]))


@pytest.mark.timeout(120)
def test_the_reference_passes_on_2_and_4_processes():
    result = EXERCISE.check(EXERCISE.reference)
    assert result.ok, result.failure
    assert "2 and 4 ranks" in result.passed[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("function,kind,words", [
    (_reversed_order, "wrong result", [
        "Shard(0) -> Shard(1) of a (8, 12) tensor on 2 ranks",
        "rank 0 should return its chunk of dim 1, the tensor's all rows, columns 0-5",
        "At its local index (0, 0), global (0, 0), it holds element (4, 0) instead of "
        "element (0, 0)", "the pieces are out of order: the piece from rank 0 belongs at rows 0-3"]),
    (_array_split_sizes, "wrong result", [
        "(5, 7) tensor on 4 ranks", "rank 0 should return its chunk of dim 1, the tensor's "
        "all rows, columns 0-1, shape (5, 2)", "a zero is padding, left in the piece", "cuts dim 0 into 2, 2, 1, 0",
        "numpy's array_split would cut 2, 1, 1, 1"]),
    (_np_split, "raised", ["equal division", "ceil(L / n) each"]),
    (_untrimmed_to, "wrong shape", ["(5, 7) tensor on 2 ranks", "rank 1 should return",
                                    "padded to the largest chunk, 4", "your chunk has 3"]),
    (_untrimmed_from, "wrong shape", ["(5, 7) tensor on 2 ranks", "2 padded blocks of 3",
                                      "trim each piece"]),
    (_whole_chunk_to_everyone, "wasteful", ["every piece is right, but rank 0 sent 384 B",
                                            "plan sends 192 B per rank", "(2.0 x)"]),
    (_all_gather, "wrong collective", ["rank 0 used all_gather", "one all_to_all"]),
])
def test_each_mistake_is_named(function, kind, words):
    result = EXERCISE.check(function)
    assert result.failure is not None and result.failure.kind == kind, result.failure
    for word in words:
        assert word in result.failure.message, result.failure.message


def test_the_skeleton_is_the_function_the_checker_names():
    text = EXERCISE.skeleton.read_text()
    assert "def shard_to_shard(local, global_shape, dim_from, dim_to):" in text
    assert "torch.chunk" in text and "all_to_all_single" in text
