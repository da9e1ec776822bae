"""Known wrong: each round receives the partner's array but never adds it
in (no comm.combine): the buffer sent in the next round is still the rank's own."""
import numpy as np

from minidist.distributed.collectives.chunks import largest_power_of_two


def recursive_doubling_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    p = largest_power_of_two(n)
    extra = n - p
    if rank < 2 * extra and rank % 2 == 0:
        yield [comm.isend(buffer, rank + 1)]
        yield [comm.irecv(buffer, rank + 1)]
        return
    if rank < 2 * extra:
        yield [comm.irecv_reduce(buffer, rank - 1)]
    virtual = rank // 2 if rank < 2 * extra else rank - extra
    incoming = np.empty_like(buffer)
    mask = 1
    while mask < p:
        other = virtual ^ mask
        partner = 2 * other + 1 if other < extra else other + extra
        yield [comm.isend(buffer, partner), comm.irecv(incoming, partner)]
        mask <<= 1
    if rank < 2 * extra:
        yield [comm.isend(buffer, rank - 1)]
