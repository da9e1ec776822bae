"""Known wrong: spins forever waiting for something that never happens."""


def ring_allreduce(comm, buffer):
    while comm.size > 1:
        pass
    yield []
