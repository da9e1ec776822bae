"""Known wasteful: right, but every holder sends to every rank after it."""


def tree_broadcast(comm, buffer, root):
    n = comm.size
    virtual = (comm.rank - root) % n
    for sender in range(virtual):
        yield [comm.irecv(buffer, (sender + root) % n)]
    yield [comm.isend(buffer, (later + root) % n) for later in range(virtual + 1, n)]
