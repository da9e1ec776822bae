"""Exercise moe_dispatch: send the tokens to their experts' ranks and back.

Check it with `minidist exercise check moe_dispatch`: the checker runs your
function on 2 and 4 real processes inside a mixture-of-experts layer and
compares what every rank's experts were given, what you return and the
layer's output with the one-process MoE on the same tokens.

Expert parallelism (built around you, as minidist.parallel.expert.dispatch
builds it). A MoE layer holds E experts; on n ranks rank j holds E / n of
them, the experts j E/n .. (j+1) E/n - 1. Every rank routes its own N
tokens: each token chose its k experts (``choices``, (N, k)), and a choice
whose expert was full was dropped (``kept``, (N, k), False for it). A kept
choice's row (its token's x) must go to the rank of its expert, through that
expert, and its output must come back to the choice it belongs to. One
collective moves everything: ``dist.all_to_all_single``, with uneven split
sizes (each rank sends a different number of rows to each rank).

Think about what each rank knows. It knows its own choices, so how many of
its rows go to each rank; it does not know how many rows each other rank
sends to it, nor to which of its experts. And all_to_all_single cuts its
input in order: the first input_split_sizes[0] rows go to rank 0, the next
input_split_sizes[1] to rank 1, and so on; on arrival, the rows from rank
0 come first, then those from rank 1, ...

Available inside: ``import minidist.distributed as dist``,
``dist.get_rank()``, ``dist.get_world_size()`` and

    dist.all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None)

which sends rows of ``input`` (dim 0) to each rank and puts the rows from
each rank into ``output``; the split sizes are lists of n ints, rows to
(input) or from (output) each rank, each summing to its array's rows. Without
split sizes both arrays are cut into n equal parts (E counts: E / n each).
"""

import numpy as np  # noqa: F401

import minidist.distributed as dist  # noqa: F401
from minidist.exercises import NotWrittenYet


def moe_dispatch(x, choices, kept, n_expert, experts):
    """Return each kept choice's expert output, (N, k, C), zeros for a dropped one.

    x: (N, C) float64, this rank's tokens; choices: (N, k) int, the experts
    each token chose (0 .. n_expert - 1); kept: (N, k) bool, whether the
    choice found a place; n_expert: E, a multiple of the world size.
    experts(rows, local_expert) runs this rank's experts: rows (M, C), the
    rows that arrived here, and local_expert (M,) ints, which of this rank's
    E / n experts each row is for (0 for expert rank E/n, 1 for the next...);
    it returns their outputs (M, C), row for row. Call it once.

    The steps: the rows for each rank (the split sizes); an all_to_all of
    the per-expert counts first, so that every rank learns what it will
    receive; the rows, grouped by destination, in one all_to_all_single;
    your experts on what arrived; the outputs back to where they came from
    (the combine); each output into the place of its choice.

    Cost to reach, per rank: three all_to_alls: E counts, then each kept
    row to its expert's rank, then each output back; nothing else.
    """
    raise NotWrittenYet("write moe_dispatch: how many rows go to each rank, and in what "
                        "order must they sit in the input?")
