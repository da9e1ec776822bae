"""Known wrong: the children are v + mask + 1 (off by one)."""


def tree_broadcast(comm, buffer, root):
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            yield [comm.irecv(buffer, (virtual - mask + root) % n)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if virtual + mask + 1 < n:
            sends.append(comm.isend(buffer, (virtual + mask + 1 + root) % n))
        mask >>= 1
    if sends:
        yield sends
