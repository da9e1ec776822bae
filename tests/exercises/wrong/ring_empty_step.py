"""Known wrong: the reduce-scatter, then an empty step (yield [], no requests)
where the allgather should be."""
from minidist.distributed.collectives.chunks import split


def ring_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    chunks = split(buffer, n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out, into = (rank - step) % n, (rank - step - 1) % n
        yield [comm.isend(chunks[out], right), comm.irecv_reduce(chunks[into], left)]
    yield []
