"""Hello from every rank: pass a message around a ring.

    minidist run -n 4 examples/hello.py
    minidist run -n 4 --transport pipe --trace hello.trace.jsonl examples/hello.py

Each rank adds its number to a running total and passes it to the next rank;
rank 0 starts the ring and receives the total back, which must be
0 + 1 + ... + (n - 1).
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
        total[0] = rank
    elif rank == 0:
        dist.send(total + rank, right)  # start the ring
        dist.recv(total, left)  # ... and get the sum back
    else:
        dist.recv(total, left)
        total += rank
        dist.send(total, right)
    log.info("passed the running total %d on to rank %d", total[0], right)

    dist.barrier()
    expected = size * (size - 1) // 2
    dist.print0(f"the ring of {size} ranks added up to {total[0]} (expected {expected})")
    assert rank != 0 or total[0] == expected
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
