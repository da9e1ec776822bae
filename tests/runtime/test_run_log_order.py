"""`minidist run`: log lines from the ranks come out in the order they were made.

Each rank's records reach the parent through a pipe of its own, so the
parent may find several pipes ready at once; it must merge them by the time
each record was made, not by the order it happens to read the pipes. The
parent's handler here is slow on the first record, so that the later records
of both ranks pile up in their pipes: read pipe by pipe, rank 0's would come
out ahead of rank 1's earlier ones.
"""

from __future__ import annotations

import logging
import textwrap
import time
from pathlib import Path

import pytest

from minidist.cli import main

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import logging, os, time
    import minidist.distributed as dist

    dist.init_process_group()
    rank = dist.get_rank()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == \\
        (str(rank), "2", str(rank))
    assert dist.get_node_local_rank() == rank and dist.get_backend() == "shm"
    log = logging.getLogger("order")
    dist.barrier()
    start = time.time()
    for k in range(4):  # rank 0 logs at 0, 0.12, 0.24, 0.36 s; rank 1 in between
        time.sleep(max(0.0, start + 0.06 * (2 * k + rank) - time.time()))
        log.info("step %d from rank %d", 2 * k + rank, rank)
    dist.barrier()
""")


class SlowFirst(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        if not self.records:
            time.sleep(0.4)  # meanwhile both ranks' later records wait in their pipes
        self.records.append((record.created, record.getMessage()))


@pytest.mark.timeout(60)
def test_log_lines_from_ranks_come_out_in_time_order(tmp_path, monkeypatch):
    script = tmp_path / "order.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    handler = SlowFirst()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        assert main(["run", "-n", "2", str(script)]) == 0
    finally:
        root.removeHandler(handler)
    mine = [(created, message) for created, message in handler.records if "step" in message]
    assert len(mine) == 8, mine
    times = [created for created, _ in mine]
    assert times == sorted(times), "\n".join(f"{t:.3f} {m}" for t, m in mine)
    # Both ranks' lines are there, interleaved, not one rank's block after the other's.
    ranks = [message[-1] for _, message in mine]
    assert ranks.count("0") == ranks.count("1") == 4
    assert ranks != sorted(ranks)
