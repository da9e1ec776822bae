"""Hello from every rank: add up the ranks by passing a running total around a ring.

    minidist run -n 4 examples/hello.py
    minidist run -n 4 --transport pipe --trace hello.trace.jsonl examples/hello.py

Rank 0 starts the ring with a total of 0 and sends it to rank 1; every other
rank receives the total from its left neighbour, adds its own rank and sends
it on to its right; rank 0 gets the total back from the last rank, which must
be 0 + 1 + ... + (n - 1).
"""

import logging

import numpy as np

import minidist.distributed as dist


def main() -> None:
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    log = logging.getLogger("hello")
    log.info("hello from rank %d of %d", rank, size)

    right, left = (rank + 1) % size, (rank - 1) % size
    total = np.zeros(1, np.int64)
    if size == 1:
        log.info("alone: the total is my rank, %d", rank)
    elif rank == 0:
        dist.send(total, right)
        log.info("started the ring: sent a total of 0 to rank %d", right)
        dist.recv(total, left)
        log.info("got the total %d back from rank %d", total[0], left)
    else:
        dist.recv(total, left)
        total += rank
        dist.send(total, right)
        log.info("received %d from rank %d, added my rank, sent %d on to rank %d",
                 total[0] - rank, left, total[0], right)

    dist.barrier()
    expected = size * (size - 1) // 2
    dist.print0(f"the ring of {size} ranks added up to {total[0]} (expected {expected})")
    assert rank != 0 or total[0] == expected
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
