"""Known wasteful: right, but every rank sends its array to every other rank."""
import numpy as np


def recursive_doubling_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    peers = [peer for peer in range(n) if peer != rank]
    others = {peer: np.empty_like(buffer) for peer in peers}
    yield ([comm.isend(buffer, peer) for peer in peers]
           + [comm.irecv(others[peer], peer) for peer in peers])
    total = buffer.copy()
    for peer in range(n):
        if peer != rank:
            total += others[peer]
    buffer[...] = total
