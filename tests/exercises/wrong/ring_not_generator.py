"""Known wrong: returns a new array instead of yielding steps."""


def ring_allreduce(comm, buffer):
    return buffer * comm.size
