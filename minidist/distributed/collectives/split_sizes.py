"""An uneven all_to_all's split sizes: shown as the call begins, and the odd rank named from them.

Split sizes differ from rank to rank by right (each rank routes its own
number of tokens to each expert), so the call's fingerprint cannot carry
them, and no rank can check its own alone: what must hold is that rank i's
``input_split_sizes[j]`` is rank j's ``output_split_sizes[i]``. A pair that
disagrees shows only at the receiver, as a piece that does not fit its
receive (a MessageMismatchError), and which receiver sees it first is
chance: a rank that sends 3 elements to rank 0, which expects 2, and 1 to
rank 3, which expects 2, is seen by rank 0 or by rank 3.

So every rank shows, as it enters the call, the elements it sends to and
expects from each rank (:func:`show`, in its shown-call record of the
control block: :mod:`minidist.distributed.shown_calls`; no message more). The
rank whose receive did not fit reads every member's (:func:`verdict`) and
judges the pairs:

* a pair of ranks **disagrees** when what one sends the other does not
  expect, in either direction;
* an odd rank is in every pair it spoils, an honest rank only in those with
  an odd one. So the rank in the most disagreeing pairs is named odd (a
  tie: the higher rank, the lower one's sizes taken as right, as the
  majority rule takes the lowest rank's call), its pairs are set aside, and
  so on while pairs remain (:func:`odd_ranks`).

Every noticing rank reads the same records, so the first line is the same
whichever rank noticed: "rank 1 is the odd rank in call 0 of the world: its
all_to_all_single sends 3 elements to rank 0, which expects 2; ...".

Cost: 2n + 1 integers written to shared memory per uneven call (groups of
up to 64 ranks: the record's room); reading them and O(n^2) comparisons,
only when a piece did not fit.
"""

from __future__ import annotations

from collections import Counter

from minidist.distributed.shown_calls import read_shown

#: What the first shown value says the call was.
COLLECTIVES = ("all_to_all_single", "all_to_all")
#: At most this many of an odd rank's disagreements are said.
SAID = 4


def show(comm, collective: str, send_counts, receive_counts) -> None:
    """Show this rank's call ``comm``: ``collective``, the elements it sends
    to and expects from each group rank."""
    comm.transport.show_call(comm.context, comm.call, [COLLECTIVES.index(collective),
                                                       *send_counts, *receive_counts])


def odd_ranks(sends: dict, receives: dict) -> list[tuple[int, list, bool]]:
    """[(odd rank, its disagreements, whether it was a tie)] of the ranks that
    showed their sizes: ``sends[i][j]`` the elements rank i sends to rank j,
    ``receives[j][i]`` those rank j expects from rank i (group ranks).

    A disagreement is (i, j): rank i sends ``sends[i][j]``, rank j expects
    ``receives[j][i]``, and they differ. The rank in the most disagreeing
    pairs is odd (a tie: the higher rank); its pairs are set aside, and the
    next is looked for among the rest."""
    pairs: dict = {}
    for i in sends:
        for j in sends:
            if i != j and j in receives and sends[i][j] != receives[j][i]:
                pairs.setdefault(frozenset((i, j)), []).append((i, j))
    found = []
    while pairs:
        count = Counter(rank for pair in pairs for rank in pair)
        most = max(count.values())
        tied = sorted(rank for rank, times in count.items() if times == most)
        rank = tied[-1]
        mine = sorted((pair for pair in pairs if rank in pair),
                      key=lambda pair: min(pair - {rank}))
        found.append((rank, [each for pair in mine for each in sorted(
            pairs[pair], key=lambda item: item[0] != rank)], len(tied) > 1))
        for pair in mine:
            del pairs[pair]
    return found


def _elements(count: int) -> str:
    return f"{count} element{'s' if count != 1 else ''}"


def describe(rank: int, disagreements, sends, receives, ranks) -> list[str]:
    """What odd ``rank`` (a group rank) disagrees on, in words, global ranks named."""
    parts = []
    for i, j in disagreements:
        if i == rank:
            parts.append(f"sends {_elements(sends[i][j])} to rank {ranks[j]}, which expects "
                         f"{receives[j][i]}")
        else:
            parts.append(f"expects {_elements(receives[j][i])} from rank {ranks[i]}, which "
                         f"sends {sends[i][j]}")
    if len(parts) > SAID:
        parts = parts[:SAID] + [f"and {len(parts) - SAID} more"]
    return parts


def verdict(control, ranks, context: int, number: int, odd_in) -> tuple[list, str] | None:
    """(the odd members (global ranks), the line that names them) of call
    ``number`` of ``context`` (the group's collectives), from the sizes its
    members ``ranks`` showed; None when they do not tell (not every member
    showed them, or they agree). ``odd_in(odd)`` says where: "rank 1 is the
    odd rank in call 0 of the world".

    A member that shows a later call of the group completed this one: every
    piece it sent and received fitted, so it is in no disagreeing pair, and
    the pairs are judged among the members whose sizes are here."""
    shown, settled = read_shown(control, ranks, context, number)
    n = len(ranks)
    if not settled:
        return None
    rows = {ranks.index(rank): values for rank, values in shown.items()
            if len(values) == 2 * n + 1}
    sends = {rank: values[1:n + 1] for rank, values in rows.items()}
    receives = {rank: values[n + 1:] for rank, values in rows.items()}
    found = odd_ranks(sends, receives)
    if not found:
        return None
    odd = [ranks[rank] for rank, _, _ in found]
    said = []
    for rank, disagreements, tie in found:
        whose = "its" if len(found) == 1 else f"rank {ranks[rank]}'s"
        words = describe(rank, disagreements, sends, receives, ranks)
        said.append(f"{whose} {COLLECTIVES[rows[rank][0]]} " + "; ".join(words)
                    + (" (a tie: the lower rank's sizes are taken as right)" if tie else ""))
    return odd, f"{odd_in(odd)}: " + "; ".join(said) + ". " + HINTS[rows[found[0][0]][0]]


#: What must hold, said after the verdict, by the collective the odd rank called.
HINTS = ("Rank i's input_split_sizes[j] must be rank j's output_split_sizes[i]",
         "Rank i's input_tensor_list[j] must have the size of rank j's output_tensor_list[i]")
