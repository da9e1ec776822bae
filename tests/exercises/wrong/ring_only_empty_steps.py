"""Known wrong: every step is empty (yield [], no requests): nothing moves."""


def ring_allreduce(comm, buffer):
    for _ in range(2 * (comm.size - 1)):
        yield []
