"""Known wrong: skips the farthest child (starts one mask too low)."""


def tree_broadcast(comm, buffer, root):
    n = comm.size
    virtual = (comm.rank - root) % n
    mask = 1
    while mask < n:
        if virtual & mask:
            yield [comm.irecv(buffer, (virtual - mask + root) % n)]
            break
        mask <<= 1
    mask >>= 2
    sends = []
    while mask > 0:
        if virtual + mask < n:
            sends.append(comm.isend(buffer, (virtual + mask + root) % n))
        mask >>= 1
    if sends:
        yield sends
