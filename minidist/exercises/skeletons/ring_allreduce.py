"""Exercise ring_allreduce: write the ring all_reduce.

Check it with `minidist exercise check ring_allreduce ring_allreduce.py`.

``comm`` is your rank's view of the call:

* ``comm.rank``, ``comm.size``: this rank and the number of ranks n;
* ``comm.isend(array, to, "label")``: start sending ``array`` to rank ``to``;
* ``comm.irecv(array, source, "label")``: start receiving into ``array``
  (same size as the message), replacing its values;
* ``comm.irecv_reduce(array, source, "label")``: start receiving and
  *adding* the message into ``array``;
* ``split(buffer, n)``: n views of the buffer (chunks), as NumPy's
  array_split cuts it; writing a view writes the buffer.

An algorithm is a generator: each ``yield [request, request, ...]`` is one
step, and the driver waits until all of that step's requests are done
before your code goes on. The same function runs on real processes and on
the simulator.
"""

from minidist.distributed.collectives.chunks import split  # noqa: F401  (you will need it)
from minidist.exercises import NotWrittenYet


def ring_allreduce(comm, buffer):
    """Leave on every rank the element-wise sum of all ranks' ``buffer``s, in place.

    The ring: cut the buffer into n chunks. Reduce-scatter, n - 1 steps: in
    step s rank r sends chunk (r - s) mod n to its right neighbour and adds
    the chunk (r - s - 1) mod n arriving from its left into its own copy.
    After n - 1 steps rank r holds the finished chunk (r + 1) mod n.
    Allgather, n - 1 steps: pass the finished chunks on around the ring,
    copying instead of adding.

    Must work for any n >= 1 and any number of elements (0, fewer than n,
    not divisible by n: split() makes some chunks one element longer, or
    empty; send empty chunks too, so both sides agree).

    Cost to reach: 2 (n - 1) alpha + 2 (n-1)/n N beta + (n-1)/n N gamma:
    each rank sends 2 (n - 1) messages of about N / n bytes, 2 (n - 1) N
    bytes summed over all ranks. The checker counts them.
    """
    raise NotWrittenYet("write ring_allreduce: replace this line with the two loops "
                        "of the ring (yield [comm.isend(...), comm.irecv_reduce(...)])")
