"""Known wrong: the reduce-scatter receives into the chunk it just sent
(r - s instead of r - s - 1), an off-by-one in the receive index."""
from minidist.distributed.collectives.chunks import split


def ring_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step) % n   # should be r - s and r - s - 1
        yield [comm.isend(chunks[out], right), comm.irecv_reduce(chunks[into], left)]
    for step in range(n - 1):
        out, into = (rank + 1 - step) % n, (rank - step) % n
        yield [comm.isend(chunks[out], right), comm.irecv(chunks[into], left)]
