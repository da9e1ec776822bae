"""Known wasteful: right, but every rank sends its whole array to every other
rank and adds them all up (n (n - 1) N bytes, the ring's n / 2 times)."""
import numpy as np


def ring_allreduce(comm, buffer):
    n, rank = comm.size, comm.rank
    others = [np.empty_like(buffer) for _ in range(n)]
    peers = [peer for peer in range(n) if peer != rank]
    yield ([comm.isend(buffer, peer) for peer in peers]
           + [comm.irecv(others[peer], peer) for peer in peers])
    for peer in peers:
        buffer += others[peer]
