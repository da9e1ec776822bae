"""all_to_all_single's split sizes, agreed before the exchange: the odd rank named.

With split sizes, rank i's ``input_split_sizes[j]`` (rows it sends to j) must
equal rank j's ``output_split_sizes[i]`` (rows j expects from i). A receiver
alone sees only that one message has the wrong size: it cannot tell whether
the sender or itself is wrong, and which rank notices first is chance. So
every rank's sizes travel once to every rank (one all_gather of 2 n
integers), and every rank judges the same matrix the same way:

* a pair (i, j) disagrees when i sends j another number of rows than j expects;
* the odd rank is the one in the most disagreeing pairs (it sends, or
  expects, other sizes than every rank it exchanges with); two ranks that
  disagree only with each other tie, and then the lower rank's sizes are the
  reference and the higher rank is named.

Cost: one small all_gather per call with split sizes (the even exchange,
without them, has no sizes to agree on and pays nothing).
"""

from __future__ import annotations

import numpy as np

from minidist.distributed.collectives.all_gather import all_gather_into_tensor
from minidist.runtime.errors import CollectiveMismatchError, name_ranks


def check_split_sizes(group, sent_rows, received_rows) -> None:
    """Raise :class:`CollectiveMismatchError` naming the odd rank if the
    group's split sizes do not fit together; every rank of ``group`` calls it."""
    n = group.size
    mine = np.array(list(sent_rows) + list(received_rows), dtype=np.int64)
    every = np.empty(2 * n * n, dtype=np.int64)
    all_gather_into_tensor(every, mine, group=group)
    every = every.reshape(n, 2, n)
    sent, expected = every[:, 0, :], every[:, 1, :]  # sent[i, j]: i to j; expected[j, i]
    wrong = sent != expected.T
    if not wrong.any():
        return
    raise CollectiveMismatchError(_verdict(group, sent, expected, wrong),
                                  odd=[group.ranks[_odd(wrong)]])


def _odd(wrong: np.ndarray) -> int:
    """The group rank in the most disagreeing pairs; of tied ranks, the highest
    (the lower rank's sizes are the reference)."""
    pairs = wrong.sum(axis=1) + wrong.sum(axis=0)
    return int(np.flatnonzero(pairs == pairs.max())[-1])


def _verdict(group, sent, expected, wrong) -> str:
    odd = _odd(wrong)
    ranks = group.ranks
    others = [j for j in range(group.size) if j != odd]
    if wrong[odd].sum() >= wrong[:, odd].sum():
        # Its input sizes are off: what the others expect from it.
        name, theirs, verb = "input_split_sizes", expected[:, odd].copy(), "expect"
        mine = sent[odd]
    else:
        name, theirs, verb = "output_split_sizes", sent[:, odd].copy(), "send"
        mine = expected[odd]
    theirs[odd] = mine[odd]  # its own piece it keeps (checked equal on each rank)
    said = verb + "s" if len(others) == 1 else verb
    return (f"rank {ranks[odd]} called all_to_all_single with {name} {_rows(mine)} where "
            f"{name_ranks([ranks[j] for j in others], most=8)} {said} {_rows(theirs)} "
            f"(entry j: what rank j {'expects from' if verb == 'expect' else 'sends to'} it). "
            "Rank i's input_split_sizes[j] must equal rank j's output_split_sizes[i].")


def _rows(counts) -> str:
    return "[" + ", ".join(str(int(count)) for count in counts) + "]"
