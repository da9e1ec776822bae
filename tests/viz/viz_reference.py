"""Reference holdings and hand-made traces for the visualiser's tests.

The references are written from the algorithms' definitions (which ranks'
data a chunk holds after each step), not from the replay's code, so the
tests compare two independent derivations.
"""

from __future__ import annotations

from minidist.distributed.collectives.chunks import chunk_bounds


def ring_all_reduce_holdings(n: int, frame: int) -> list[list[frozenset]]:
    """[rank][chunk] after ring all_reduce step ``frame`` (the trace's count,
    from 0; -1: before any message).

    Reduce-scatter step s: rank r combines chunk (r - s - 1) mod n from its
    left, so chunk c reaches rank r (d = (r - c) mod n hops from its first
    owner c) at step d - 1, carrying ranks c, c + 1, ..., r. Rank r ends the
    phase with chunk r + 1 complete. Allgather step t: rank r copies the
    finished chunk (r - t) mod n from its left.
    """
    everyone = frozenset(range(n))
    holdings = []
    for rank in range(n):
        row = []
        for chunk in range(n):
            hops = (rank - chunk) % n
            reduce_steps = min(frame, n - 2)
            if frame >= n - 1 and (hops == n - 1 or hops <= frame - (n - 1)):
                row.append(everyone)
            elif hops <= reduce_steps + 1:
                row.append(frozenset((rank - k) % n for k in range(hops + 1)))
            else:
                row.append(frozenset({rank}))
        holdings.append(row)
    return holdings


def binomial_broadcast_holders(n: int, root: int, round_: int) -> set[int]:
    """The ranks holding the root's data after round ``round_`` of a binomial
    broadcast that serves the farthest subtree first (as minidist's does):
    with L = ceil(log2 n) rounds, in round k every holder v (virtual ranks,
    relative to the root) sends to v + 2^(L - 1 - k), so after round k the
    holders are the multiples of 2^(L - 1 - k) (round -1: the root alone)."""
    rounds = (n - 1).bit_length()
    stride = 2 ** (rounds - 1 - round_)
    return {(virtual + root) % n for virtual in range(0, n, stride)}


def recursive_doubling_holdings(n: int, round_: int) -> list[frozenset]:
    """Rank r's whole buffer after round k of recursive doubling (n a power
    of two): r has swapped with the ranks differing in bits 0..k, so it holds
    every rank that agrees with it above bit k."""
    return [frozenset(q for q in range(n) if q >> (round_ + 1) == rank >> (round_ + 1))
            for rank in range(n)]


def ring_all_gather_holdings(n: int, frame: int) -> list[list[frozenset]]:
    """[rank][piece] after ring all_gather step ``frame`` (from 0; -1: before
    any message): in step s rank r
    passes piece (r - s) mod n on to its right, so it holds pieces r, r - 1,
    ..., r - s - 1 (each piece holds its owner's data)."""
    return [[frozenset({piece}) if (rank - piece) % n <= frame + 1 else frozenset()
             for piece in range(n)] for rank in range(n)]


# --------------------------------------------------------------------------- hand-made traces


def _labelled(text: str, **pairs) -> str:
    def value(item):
        return f"{item[0]}:{item[1]}" if isinstance(item, tuple) else str(item)
    return f"{text} #" + " ".join(f"{key}={value(item)}" for key, item in pairs.items())


def ring_all_reduce_events(n: int, count: int, itemsize: int = 8, call: int = 0,
                           step_ns: int = 1000) -> list[dict]:
    """The events a schema-2 trace of one ring all_reduce holds, written by
    hand from the algorithm (send / recv pairs with labels, one collective
    event per rank), with a fake clock of ``step_ns`` per step."""
    bounds = chunk_bounds(count, n)
    steps = 2 * (n - 1)
    events = []
    seq = {}
    for rank in range(n):
        events.append({
            "rank": rank, "kind": "collective", "peer": None, "bytes": 0, "tag": None,
            "label": _labelled("all_reduce ring", call=call, collective="all_reduce",
                               algorithm="ring", world=n, count=count, itemsize=itemsize,
                               root=-1, steps=steps, group=0),
            "start": 0, "end": steps * step_ns + rank, "seq": None, "group": 0, "channel": 0})
    for step in range(steps):
        phase = "reduce-scatter" if step < n - 1 else "allgather"
        local = step if step < n - 1 else step - (n - 1)
        for rank in range(n):
            right = (rank + 1) % n
            chunk = (rank - local) % n if phase == "reduce-scatter" else (rank + 1 - local) % n
            element_range = (bounds[chunk], bounds[chunk + 1])
            text = f"all_reduce ring: {phase} step {local} chunk {chunk}"
            number = seq.get((rank, right), 0)
            seq[(rank, right)] = number + 1
            nbytes = (element_range[1] - element_range[0]) * itemsize
            start = step * step_ns
            events.append({
                "rank": rank, "kind": "send", "peer": right, "bytes": nbytes, "tag": 5,
                "label": _labelled(text, call=call, step=step, phase=phase,
                                   range=element_range),
                "start": start, "end": start + step_ns // 2, "seq": number, "group": 0,
                "channel": 0})
            events.append({
                "rank": right, "kind": "recv", "peer": rank, "bytes": nbytes, "tag": 5,
                "label": _labelled(text, call=call, step=step, phase=phase,
                                   range=element_range,
                                   op="combine" if phase == "reduce-scatter" else "copy"),
                "start": start, "end": start + step_ns - 1, "seq": number, "group": 0,
                "channel": 0})
    return events
