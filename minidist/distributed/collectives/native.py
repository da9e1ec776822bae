"""``algorithm="native"``: the MPI library's own collective, for comparison.

Under ``mpiexec`` a student can time the course's ring against the collective
MPICH (or Open MPI) ships, in the same script, on the same arrays::

    dist.all_reduce(grad, algorithm="ring")     # minidist's, message by message
    dist.all_reduce(grad, algorithm="native")   # MPI_Allreduce

Everything around the call stays minidist's: the checks, ReduceOp.AVG (a SUM
then one division), the copy back of a strided array, ``async_op`` (a Work,
which makes the whole library call on its first ``test()`` or ``wait()``:
MPI's blocking call has no steps to advance), and the trace's ``collective``
event (algorithm "native"; the library's own messages are invisible to
minidist, so the trace has no send or receive events for it).

Each function below is an algorithm like the others (a generator on a
:class:`~.comm.Comm`, the same arguments as the collective's algorithms), but
with one step that hands the whole call to the transport's
``library_collective``, which only the mpi transport has. Its cost is the
library's business: it has no formula, is never chosen by "auto", and the
cost model does not predict it.

The ranks order: a group's sub-communicator lists the group's ranks in order,
so the root passed here (a group rank) is the library's root. Gather and
scatter keep their pieces in *virtual* order (the root's own first, see
:mod:`.trees`); the library uses real order, so they are turned around here.
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives import trees

#: The name and the fingerprint's algorithm number of a native call (4 bits:
#: the last one, never used by a course algorithm; see comm.fingerprint).
NAME = "native"
INDEX = 15
#: What stands for MPI_IN_PLACE in a buffer list (the transport turns it into MPI's).
IN_PLACE = "in_place"

_OPS = {np.add: "sum", np.multiply: "product", np.minimum: "min", np.maximum: "max",
        np.bitwise_and: "band", np.bitwise_or: "bor", np.bitwise_xor: "bxor"}


def check_available(group, collective: str) -> None:
    """Raise a clear error unless the transport can call the library's collective."""
    transport = group.transport
    if not hasattr(transport, "library_collective"):
        raise ValueError(
            f"rank {group._global_rank}: {collective}(algorithm='native') calls the MPI "
            f"library's own {collective}, which only the 'mpi' transport has; this run uses "
            f"the {getattr(transport, 'name', '?')!r} transport. Start the script with "
            "`mpiexec -n N python script.py` (or `minidist run --transport mpi`), or choose "
            "one of the course's algorithms (or 'auto').")


def _call(comm, function: str, *buffers, op: bool = False, root=None) -> None:
    name = None
    if op:
        name = _OPS.get(comm.ufunc)
        if name is None:
            raise ValueError(f"rank {comm.group._global_rank}: {comm.collective}"
                             f"(algorithm='native') takes the ReduceOps (SUM, AVG, PRODUCT, "
                             f"MIN, MAX, BAND, BOR, BXOR), not the ufunc {comm.ufunc!r}; "
                             "use one of the course's algorithms for a custom reduction.")
    comm.group.transport.library_collective(function, comm.group.ranks, *buffers, op=name,
                                            root=root)


def all_reduce(comm, buffer):
    """MPI_Allreduce, in place."""
    _call(comm, "Allreduce", IN_PLACE, buffer, op=True)
    yield from ()


def broadcast(comm, buffer, root):
    """MPI_Bcast."""
    _call(comm, "Bcast", buffer, root=root)
    yield from ()


def reduce(comm, buffer, root):
    """MPI_Reduce, in place on the root (the others' buffer is a scratch copy)."""
    if comm.rank == root:
        _call(comm, "Reduce", IN_PLACE, buffer, op=True, root=root)
    else:
        _call(comm, "Reduce", buffer, None, op=True, root=root)
    yield from ()


def all_gather(comm, result):
    """MPI_Allgather, in place: this rank's piece is already in ``result``."""
    _call(comm, "Allgather", IN_PLACE, result)
    yield from ()


def reduce_scatter(comm, pieces, output):
    """MPI_Reduce_scatter_block: n equal pieces in, this rank's sum out."""
    _call(comm, "Reduce_scatter_block", pieces, output, op=True)
    yield from ()


def all_to_all(comm, source, result):
    """MPI_Alltoall of n equal pieces."""
    _call(comm, "Alltoall", source, result)
    yield from ()


def gather(comm, pieces, piece, root):
    """MPI_Gather into real rank order, then turned to the root-first order."""
    n = comm.size
    if comm.rank == root:
        real = np.empty_like(pieces)
        _call(comm, "Gather", piece, real, root=root)
        count = piece.size
        for source, place in trees.pieces_by_rank(pieces, count, root, n):
            place[...] = real[source * count:(source + 1) * count]
    else:
        _call(comm, "Gather", piece, None, root=root)
    yield from ()


def scatter(comm, pieces, output, root):
    """MPI_Scatter from the root's pieces, put in real rank order first."""
    n = comm.size
    if comm.rank == root:
        count = output.size
        real = np.empty_like(pieces)
        for target, mine in trees.pieces_by_rank(pieces, count, root, n):
            real[target * count:(target + 1) * count] = mine
        _call(comm, "Scatter", real, output, root=root)
    else:
        _call(comm, "Scatter", None, output, root=root)
    yield from ()


def barrier(comm):
    """MPI_Barrier."""
    _call(comm, "Barrier")
    yield from ()


ALGORITHMS = {"all_reduce": all_reduce, "broadcast": broadcast, "reduce": reduce,
              "all_gather": all_gather, "reduce_scatter": reduce_scatter,
              "all_to_all": all_to_all, "gather": gather, "scatter": scatter,
              "barrier": barrier}
