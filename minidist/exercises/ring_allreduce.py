"""Exercise: the ring all_reduce (lesson 4).

The reference solution, written as lesson 4 teaches it: reduce-scatter for
n - 1 steps, then allgather for n - 1 steps. The student's version is
checked against it and against the registry's ``ring``: its traffic
formula, 2 n (n - 1) messages and 2 (n - 1) N bytes summed over ranks.
"""

from __future__ import annotations

from minidist.distributed.collectives.chunks import split
from minidist.exercises.collective_check import CollectiveSpec, check_collective
from minidist.exercises.exercise import Exercise


def ring_allreduce(comm, buffer):
    """Ring all_reduce of ``buffer`` (in place). Cost: 2 (n - 1) alpha +
    2 (n-1)/n N beta + (n-1)/n N gamma; each rank sends 2 (n - 1) messages
    of N / n bytes."""
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    # comm.at names each step's phase for the checker's messages and the
    # replay; its steps count from 0, the replays' from 1 (step 0: before any message).
    for step in range(n - 1):  # reduce-scatter: a partial sum grows by one rank per hop
        out, into = (rank - step) % n, (rank - step - 1) % n
        comm.at(step, "reduce-scatter")
        yield [comm.isend(chunks[out], right, f"reduce-scatter chunk {out}"),
               comm.irecv_reduce(chunks[into], left, f"reduce-scatter chunk {into}")]
    for step in range(n - 1):  # allgather: rank r starts with the finished chunk r + 1
        out, into = (rank + 1 - step) % n, (rank - step) % n
        comm.at(n - 1 + step, "allgather")
        yield [comm.isend(chunks[out], right, f"allgather chunk {out}"),
               comm.irecv(chunks[into], left, f"allgather chunk {into}")]


SPEC = CollectiveSpec("ring_allreduce", "all_reduce", "ring", ring_allreduce, "the ring",
                      chunked=True)

EXERCISE = Exercise(
    name="ring_allreduce", function="ring_allreduce",
    summary="all_reduce as a ring: reduce-scatter, then allgather",
    lesson="lessons/04_ring_allreduce.py", reference=ring_allreduce,
    check=lambda function, **options: check_collective(SPEC, function, **options))
