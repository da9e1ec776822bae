"""Known wrong: forgets to turn virtual ranks back into ranks (no + root)."""


def tree_broadcast(comm, buffer, root):
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            yield [comm.irecv(buffer, virtual - mask)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if virtual + mask < n:
            sends.append(comm.isend(buffer, virtual + mask))
        mask >>= 1
    if sends:
        yield sends
