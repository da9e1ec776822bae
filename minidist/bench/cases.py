"""What one call of each collective moves, the same for minidist, MPICH and gloo.

The size of a case is nccl-tests' "size": the bytes of each rank's buffer for
broadcast, reduce and all_reduce; the bytes of the whole (gathered,
scattered, exchanged) array for the others, where each rank holds or
contributes one n-th of it (``piece``). That is also the N of
:mod:`minidist.costmodel`, so the model's prediction is for the same call.

algbw = size / time. busbw corrects algbw by how much of the array must
cross some rank's link at the very least, so that busbw can be compared with
the link's bandwidth whatever the collective and world size (nccl-tests'
PERFORMANCE.md): all_reduce 2 (n - 1) / n; all_gather, reduce_scatter,
all_to_all, gather, scatter (n - 1) / n; broadcast and reduce 1.
"""

from __future__ import annotations

#: Every collective the benchmark knows how to call, in the order it reports them.
ORDER = ("broadcast", "reduce", "all_reduce", "gather", "scatter", "all_gather",
         "reduce_scatter", "all_to_all", "barrier")

#: Collectives whose size is each rank's whole buffer (the others: the whole array).
WHOLE_BUFFER = ("broadcast", "reduce", "all_reduce")

ITEMSIZE = 4  # float32

#: The same collective in MPI (mpi4py's buffer methods) and in torch.distributed.
MPICH_NAMES = {"broadcast": "Bcast", "reduce": "Reduce", "all_reduce": "Allreduce",
               "gather": "Gather", "scatter": "Scatter", "all_gather": "Allgather",
               "reduce_scatter": "Reduce_scatter_block", "all_to_all": "Alltoall",
               "barrier": "Barrier"}
GLOO_NAMES = {"broadcast": "broadcast", "reduce": "reduce", "all_reduce": "all_reduce",
              "gather": "gather", "scatter": "scatter",
              "all_gather": "all_gather_into_tensor",
              "reduce_scatter": "reduce_scatter_tensor",
              "all_to_all": "all_to_all_single", "barrier": "barrier"}


def bus_factor(collective: str, world_size: int) -> float | None:
    """nccl-tests' busbw / algbw; None for barrier (it moves no data)."""
    n = world_size
    if collective == "barrier":
        return None
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def layout(collective: str, world_size: int, nbytes: int) -> tuple[int, int]:
    """(elements of one rank's piece, elements of the whole array) for a case of
    ``nbytes``. A whole array that the world does not divide is rounded down to
    a multiple of it, so every rank's piece is the same."""
    if collective == "barrier":
        return 0, 0
    total = max(nbytes // ITEMSIZE, 1)
    if collective in WHOLE_BUFFER:
        return total, total
    piece = max(total // world_size, 1)
    return piece, piece * world_size


def case_bytes(collective: str, world_size: int, nbytes: int) -> int:
    """The size a case really has (``nbytes`` rounded as :func:`layout` does)."""
    return layout(collective, world_size, nbytes)[1] * ITEMSIZE
