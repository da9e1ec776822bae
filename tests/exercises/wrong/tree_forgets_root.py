"""Known wrong: the tree is built as if rank 0 were always the root (works
for root 0 only)."""


def tree_broadcast(comm, buffer, root):
    n, rank = comm.size, comm.rank
    mask = 1
    while mask < n:
        if rank & mask:
            yield [comm.irecv(buffer, rank - mask)]
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if rank + mask < n:
            sends.append(comm.isend(buffer, rank + mask))
        mask >>= 1
    if sends:
        yield sends
