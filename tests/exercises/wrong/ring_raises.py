"""Known wrong: indexes past the end of the chunk list."""
from minidist.distributed.collectives.chunks import split


def ring_allreduce(comm, buffer):
    chunks = split(buffer, comm.size)
    yield [comm.isend(chunks[comm.size], (comm.rank + 1) % comm.size)]
