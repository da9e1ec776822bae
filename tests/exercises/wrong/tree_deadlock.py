"""Known wrong: every rank but the root waits for its *child* first."""


def tree_broadcast(comm, buffer, root):
    n = comm.size
    virtual = (comm.rank - root) % n
    if virtual != 0 and virtual + 1 < n:
        yield [comm.irecv(buffer, (virtual + 1 + root) % n, "from my child?")]
    if virtual + 1 < n:
        yield [comm.isend(buffer, (virtual + 1 + root) % n)]
    if virtual == n - 1 and n > 1:
        yield [comm.irecv(buffer, (virtual - 1 + root) % n)]
