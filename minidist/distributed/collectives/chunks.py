"""Cutting a flat buffer into the pieces an algorithm moves.

``count`` elements into ``parts`` pieces as NumPy's ``array_split`` does: the
first ``count % parts`` pieces get one element more. Pieces may be empty
(fewer elements than ranks); every algorithm still sends them, so that both
sides of every exchange agree without looking at the data.

Also how many pieces a pipelined algorithm cuts an array into by its size
(:func:`double_binary_tree_chunks`): the cost model and the simulator read it
here, with the algorithm's registered cost, not from the algorithm's module.
"""

from __future__ import annotations

import functools
import math

import numpy as np


@functools.lru_cache(maxsize=64)
def chunk_bounds(count: int, parts: int) -> tuple[int, ...]:
    """``parts + 1`` offsets: piece i is ``[bounds[i], bounds[i + 1])``.

    A tuple, made once per (count, parts) and shared: every rank of a call
    asks for the same bounds, and in the simulator n ranks each holding
    their own n + 1 numbers would be n^2 of them."""
    base, extra = divmod(count, parts)
    bounds = [0]
    for index in range(parts):
        bounds.append(bounds[-1] + base + (1 if index < extra else 0))
    return tuple(bounds)


def split(flat: np.ndarray, parts: int) -> list[np.ndarray]:
    """Views of ``flat`` cut into ``parts`` pieces (writing to one writes to flat)."""
    bounds = chunk_bounds(flat.size, parts)
    return [flat[bounds[index]:bounds[index + 1]] for index in range(parts)]


def largest_power_of_two(n: int) -> int:
    """The largest power of two not above ``n`` (n >= 1)."""
    return 1 << (n.bit_length() - 1)


#: The double binary tree all_reduce pipelines each half of the array in
#: chunks of about this many bytes.
DOUBLE_BINARY_TREE_CHUNK_BYTES = 1 << 16


def double_binary_tree_chunks(nbytes: float) -> int:
    """k: the chunks each half of an ``nbytes`` array is pipelined in (by the
    double binary tree all_reduce)."""
    return max(1, math.ceil(nbytes / 2 / DOUBLE_BINARY_TREE_CHUNK_BYTES))
