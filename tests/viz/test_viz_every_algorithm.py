"""Every collective and algorithm replays sensibly: the simulator's trace of
each gives one frame per algorithm step with at least one message in it (a
step number shared by all ranks, not each rank's own count of steps), and
the collectives that leave every rank with everything end complete."""

import numpy as np
import pytest

from minidist.distributed import simulate
from minidist.distributed.collectives.call import ALGORITHMS
from viz.replay import replays

ROOTED = ("broadcast", "reduce", "gather", "scatter")
CASES = [(collective, algorithm) for collective in ALGORITHMS for algorithm in ALGORITHMS[collective]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective, algorithm", CASES)
def test_every_step_has_messages_and_full_collectives_end_complete(collective, algorithm,
                                                                   tmp_path):
    for n in (4, 5, 8):
        path = tmp_path / f"{n}.jsonl"
        simulate(collective, algorithm, world_size=n, nbytes=n * 64, dtype=np.int64,
                 root=1 if collective in ROOTED else 0, trace=path)
        replay = replays(path)[0]
        # Step 0 is the state before any message; every step after it moves data.
        assert not replay.frames[0].messages
        empty = [frame.index for frame in replay.frames[1:] if not frame.messages]
        assert not empty, f"{collective} {algorithm} n={n}: steps {empty} move nothing"
        if collective in ("all_reduce", "broadcast", "all_gather"):
            assert replay.frames[-1].complete == 1.0, f"{collective} {algorithm} n={n}"
