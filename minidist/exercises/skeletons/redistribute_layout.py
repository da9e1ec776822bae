"""Exercise redistribute_layout: change a tensor's layout from Shard(i) to Shard(j).

Check it with `minidist exercise check redistribute_layout`: the checker
runs your function on 2 and 4 real processes, on several shapes (uneven
ones and a 3-D one among them), compares every rank's piece with what
DTensor.redistribute(mesh, [Shard(dim_to)]) gives, and reads the run's
messages from its trace.

A tensor of ``global_shape`` lies on n ranks cut along dim ``dim_from``:
rank r holds chunk r, as torch.chunk cuts a dim of L elements: ceil(L / n)
each, the last ones shorter, trailing ones empty (5 on 4 ranks: 2, 2, 1, 0;
3 on 4: 1, 1, 1, 0; 33 on 2: 17, 16). Chunk r starts after the sizes of
chunks 0 .. r - 1. You return this rank's chunk of dim ``dim_to`` instead:
the whole of ``dim_from``, only your chunk of ``dim_to``.

Think of the tensor as blocks: rank r's chunk of dim_from cut again along
dim_to. Rank k needs block (r, k) from every rank r, and nothing else. One
collective moves them all: ``dist.all_to_all_single(output, input)``, which
cuts ``input`` into n equal parts along dim 0, sends part k to rank k, and
puts the part from rank r into part r of ``output``. Equal parts: blocks of
uneven chunks are not all of one size, so pad each to the largest
(ceil(L_from / n) x ceil(L_to / n)) and trim what arrives (torch does the
same). Rank r's block goes r-th along dim_from.

Available inside: ``import minidist.distributed as dist``,
``dist.get_rank()``, ``dist.get_world_size()``, and

    dist.all_to_all_single(output, input)

(``input`` and ``output`` of one shape and dtype, dim 0 a multiple of n,
say (n, ...) with part k in ``input[k]``).
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def shard_to_shard(local, global_shape, dim_from, dim_to):
    """Return this rank's chunk of dim ``dim_to`` (a NumPy array).

    local: this rank's chunk of dim ``dim_from`` of a tensor of
    ``global_shape`` (a tuple), as torch.chunk cuts it on the n ranks;
    dim_from != dim_to. The result has the tensor's length along
    ``dim_from`` and this rank's chunk of ``dim_to`` (torch.chunk's size,
    possibly 0), and holds exactly those elements of the tensor.

    Cost to reach, per rank: one all_to_all, sending each other rank one
    block padded to ceil(L_from / n) x ceil(L_to / n) (x the other dims):
    (n - 1)/n of your padded piece, what redistribute's plan says. Nothing else.
    """
    raise NotWrittenYet("write shard_to_shard: cut your chunk along dim_to into the "
                        "blocks for each rank, pad them, one dist.all_to_all_single, "
                        "trim and join along dim_from")
