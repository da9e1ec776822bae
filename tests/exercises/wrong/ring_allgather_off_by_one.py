"""Known wrong: the allgather sends the chunk it is about to receive
(r - s instead of r + 1 - s), an off-by-one in the send index."""
from minidist.distributed.collectives.chunks import split


def ring_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step - 1) % n
        yield [comm.isend(chunks[out], right), comm.irecv_reduce(chunks[into], left)]
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step) % n   # should be r + 1 - s and r - s
        yield [comm.isend(chunks[out], right), comm.irecv(chunks[into], left)]
