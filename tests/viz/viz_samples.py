"""Replays built by hand, for testing the renderers without processes.

They follow the algorithms' step order exactly (ring all_reduce: n-1 steps of
reduce-scatter, then n-1 of allgather; binomial broadcast: in step k every
rank that has the data sends it 2^k ranks further), so a renderer's output can
be checked against what the algorithm really does. As the replay's frames,
they start with the state before any message (frame 0, :func:`_before`).
"""

from __future__ import annotations

from viz.replay import Frame, Message, Replay


def _frozen(holdings):
    return tuple(tuple(frozenset(cell) for cell in rank) for rank in holdings)


def _before(holdings) -> Frame:
    """Frame 0: the state before any message."""
    return Frame(index=0, step=-1, phase="", holdings=holdings, messages=(), elapsed_ns=0)


def ring_all_reduce(n: int = 4, count: int | None = None, itemsize: int = 8) -> Replay:
    count = n * 4 if count is None else count
    chunk_bytes = count // n * itemsize
    holdings = [[{rank} for _ in range(n)] for rank in range(n)]
    initial = _frozen(holdings)
    frames = [_before(initial)]
    step_ns = 1000
    for step in range(2 * (n - 1)):
        reducing = step < n - 1
        before = [[set(cell) for cell in rank] for rank in holdings]
        messages = []
        for rank in range(n):
            target = (rank + 1) % n
            chunk = (rank - step) % n if reducing else (rank + 1 - (step - n + 1)) % n
            if reducing:
                holdings[target][chunk] |= before[rank][chunk]
            else:
                holdings[target][chunk] = set(before[rank][chunk])
            messages.append(Message(
                source=rank, target=target, nbytes=chunk_bytes,
                text=f"chunk {chunk}", op="combine" if reducing else "copy",
                cells=(chunk, chunk + 1), start_ns=step * step_ns,
                end_ns=(step + 1) * step_ns))
        frames.append(Frame(index=step + 1, step=step,
                            phase="reduce-scatter" if reducing else "allgather",
                            holdings=_frozen(holdings), messages=tuple(messages),
                            elapsed_ns=(step + 1) * step_ns))
    return Replay(collective="all_reduce", algorithm="ring", world_size=n, count=count,
                  itemsize=itemsize, root=None, call=0, cells=n, layout="ring",
                  initial=initial, frames=tuple(frames),
                  formula="2(n-1) alpha + 2(n-1)/n N beta + (n-1)/n N gamma",
                  predicted_s=2 * (n - 1) * 0.9e-6, measured_s=2 * (n - 1) * 1e-6,
                  summary=n > 16)


def binomial_broadcast(n: int = 8, root: int = 0, count: int = 8, itemsize: int = 8) -> Replay:
    holdings = [[set() for _ in range(n)] for _ in range(n)]
    for cell in range(n):
        holdings[root][cell] = {root}
    initial = _frozen(holdings)
    frames = [_before(initial)]
    have = [root]
    distance, step = 1, 0
    while distance < n:
        messages = []
        for sender in list(have):
            relative = (sender - root) % n
            if relative + distance < n:
                target = (sender + distance) % n
                have.append(target)
                for cell in range(n):
                    holdings[target][cell] = {root}
                messages.append(Message(source=sender, target=target,
                                        nbytes=count * itemsize, text="whole array", op="copy",
                                        cells=(0, n), start_ns=step * 1000,
                                        end_ns=(step + 1) * 1000))
        frames.append(Frame(index=step + 1, step=step, phase="broadcast",
                            holdings=_frozen(holdings), messages=tuple(messages),
                            elapsed_ns=(step + 1) * 1000))
        distance *= 2
        step += 1
    return Replay(collective="broadcast", algorithm="binomial", world_size=n, count=count,
                  itemsize=itemsize, root=root, call=0, cells=n, layout="tree",
                  initial=initial, frames=tuple(frames),
                  formula="log2(n) (alpha + N beta)", predicted_s=None,
                  measured_s=step * 1e-6, summary=n > 16)


def messages_only(n: int = 4) -> Replay:
    """A gather to rank 0 drawn without holdings (what the replay gives for gather)."""
    messages = tuple(Message(source=rank, target=0, nbytes=64, text=f"piece {rank}",
                             op="", cells=None, start_ns=0, end_ns=1000)
                     for rank in range(1, n))
    frame = Frame(index=1, step=0, phase="gather", holdings=None, messages=messages,
                  elapsed_ns=1000)
    return Replay(collective="gather", algorithm="linear", world_size=n, count=16,
                  itemsize=4, root=0, call=0, cells=n, layout="row", initial=None,
                  frames=(_before(None), frame), formula="(n-1) alpha + (n-1)/n N beta",
                  predicted_s=1e-6, measured_s=1e-6, summary=False)
