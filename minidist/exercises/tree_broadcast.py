"""Exercise: the binomial-tree broadcast (lesson 3).

The reference solution: the number of ranks holding the data doubles every
round, so everyone has it after ceil(log2 n) rounds. Checked against the
registry's ``binomial`` broadcast: n - 1 messages of the whole array.
"""

from __future__ import annotations

from minidist.exercises.collective_check import CollectiveSpec, check_collective
from minidist.exercises.exercise import Exercise


def tree_broadcast(comm, buffer, root):
    """Binomial-tree broadcast of the root's ``buffer`` to every rank (in place).
    Cost: ceil(log2 n) (alpha + N beta); n - 1 messages of N bytes in all."""
    n = comm.size
    virtual = (comm.rank - root) % n  # renumber so that the root is 0
    mask = 1
    while mask < n:  # receive from the parent: clear my lowest set bit
        if virtual & mask:
            parent = (virtual - mask + root) % n
            yield [comm.irecv(buffer, parent, f"from {parent}")]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # then send to my children, the farthest subtree first
        if virtual + mask < n:
            child = (virtual + mask + root) % n
            sends.append(comm.isend(buffer, child, f"to {child}"))
        mask >>= 1
    if sends:
        yield sends


SPEC = CollectiveSpec("tree_broadcast", "broadcast", "binomial", tree_broadcast,
                      "the binomial tree")

EXERCISE = Exercise(
    name="tree_broadcast", function="tree_broadcast",
    summary="broadcast down a binomial tree: log2 n rounds",
    lesson="lessons/03_collectives.py", reference=tree_broadcast,
    check=lambda function, **options: check_collective(SPEC, function, **options))
