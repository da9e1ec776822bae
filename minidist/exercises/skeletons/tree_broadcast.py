"""Exercise tree_broadcast: write the binomial-tree broadcast.

Check it with `minidist exercise check tree_broadcast tree_broadcast.py`.

``comm`` is your rank's view of the call: ``comm.rank``, ``comm.size``,
``comm.isend(array, to, "label")`` and ``comm.irecv(array, source, "label")``
start a send or a receive and return a request. An algorithm is a
generator: each ``yield [request, ...]`` is one step, and your code goes on
when all of the step's requests are done. The same function runs on real
processes and on the simulator.
"""

from minidist.exercises import NotWrittenYet


def tree_broadcast(comm, buffer, root):
    """Copy the root's ``buffer`` into every rank's ``buffer``, in place.

    The binomial tree: number the ranks from the root, v = (rank - root) mod n.
    In round 0 the root sends to the rank half the world away; in every
    later round each rank that already has the data sends it on to the rank
    half as far away, so the number of holders doubles every round. In
    code: rank v receives from its parent v with its lowest set bit cleared
    (the root, v = 0, receives nothing), then sends to its children v + 2^j
    for the 2^j below that bit, the farthest first, skipping those >= n.
    Remember to turn virtual numbers back into ranks: (v + root) mod n.

    Must work for any n >= 1, any root, any number of elements (0 too).

    Cost to reach: ceil(log2 n) (alpha + N beta): n - 1 messages of N bytes
    in all, none sent twice. The checker counts them.
    """
    raise NotWrittenYet("write tree_broadcast: receive from your parent "
                        "(yield [comm.irecv(buffer, parent)]), then send to your children")
