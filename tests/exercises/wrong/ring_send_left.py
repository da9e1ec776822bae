"""Known wrong: the reduce-scatter sends to the left neighbour and receives
from the right (the ring turned the other way, with the chunks of the right way)."""
from minidist.distributed.collectives.chunks import split


def ring_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step - 1) % n
        yield [comm.isend(chunks[out], left), comm.irecv_reduce(chunks[into], right)]
    for step in range(n - 1):
        out, into = (rank + 1 - step) % n, (rank - step) % n
        yield [comm.isend(chunks[out], right), comm.irecv(chunks[into], left)]
