"""Exercise tensor_parallel_linear: split a dense layer over ranks.

Check it with `minidist exercise check tensor_parallel_linear tensor_parallel_linear.py`:
the checker runs your function on 1 to 4 real processes, giving each rank
only its shard, and compares every rank's y with x W^T + b.

Available inside: ``import minidist.distributed as dist`` and
``dist.get_rank()``, ``dist.get_world_size()``,
``dist.all_gather_into_tensor(out, piece)`` (``out`` of shape
(n,) + piece.shape receives every rank's piece, in rank order) and
``dist.all_reduce(array)`` (sums in place over the ranks).
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def parallel_linear(x, weight_shard, bias_shard, split):
    """Return the whole y = x W^T + b (shape (batch, out)) on every rank.

    W has shape (out, in); n ranks; feature counts are multiples of n.

    split == "column": this rank holds out / n rows of W (``weight_shard``,
    shape (out / n, in)) and the same slice of b; ``x`` is the whole input
    (batch, in). Compute your slice of y's columns, then gather every rank's
    slice along the last axis, in rank order.

    split == "row": this rank holds in / n columns of W (shape (out, in / n))
    and ``x`` is the same slice of the input's features (batch, in / n);
    ``bias_shard`` is the whole b. Your x_r W_r^T is a partial sum of y: add
    the partials of all ranks, then add b, once.

    Cost to reach, per rank: column, one all_gather of y ((n-1)/n of its
    values sent); row, one all_reduce of y. Nothing else is sent.
    """
    raise NotWrittenYet("write parallel_linear: compute your part, then "
                        "dist.all_gather_into_tensor (column) or dist.all_reduce (row)")
