"""Replay ring attention from its trace, as :mod:`viz.replay` replays the ring
all_reduce: the state before any message, then one frame per step of the
ring, drawn by the same terminal step-through, GIF and browser player::

    from viz.ring_attention_replay import ring_attention_replay
    from viz.terminal import step_through
    from viz.animate import save_gif, save_html
    ring = ring_attention_replay("cp.jsonl")     # the first ring_attention call's forward
    step_through(ring); save_gif(ring, "ring_attention.gif"); save_html(ring, "ring_attention.html")

What a frame shows (:mod:`minidist.parallel.context.ring_attention`):

* each rank's buffer is its *output*, one cell per chunk of its positions
  (two with the zig-zag split: chunks r and 2n - 1 - r). A cell holds the
  ranks whose K, V blocks its partial attention has merged so far, the
  online softmax's running (O, LSE), and shows what every replay's cell
  shows (:func:`viz.replay.cell_symbol`): "2" rank 2's own block alone,
  "Σ3" three blocks, "A" all of them; the legend says so in these words
  (:func:`viz.replay.cell_words`). Under the causal mask a chunk never
  merges the blocks of later positions: rank 0's early chunk ends holding
  {0} only ("0"), its late chunk every block ("A");
* step 0 (before any message): each rank has attended to its own K, V
  block; step k: rank r has received the block of rank r - k from its left
  neighbour (the message's text names whose block it carries, the frame's
  arrows show the ring) and merged it into the chunks that may see it;
* the ring's n - 1 messages per step carry the K, V blocks, 2 B H (T/n) D s bytes (a rank holds T/n positions)
  each.

The replay is built from the trace's messages, their labels (step, owner of
the block, sequence length, split, causal) and
:mod:`minidist.parallel.context.split` (which chunks see which block): what
the ranks did, as they recorded it. The backward pass (``phase="backward"``)
replays the same way: the K, V blocks ringing round again.
"""

from __future__ import annotations

import os
from collections import defaultdict

from minidist import trace as _trace
from minidist.parallel.context.split import SKIP, pair_kind, rank_chunks
from viz.replay import Frame, Message, Replay

FORMULA = "(n - 1) (α + 2 B H (T/n) D s β)  per rank, overlapped with the blocks' arithmetic"


def _load(source):
    if isinstance(source, (str, os.PathLike)):
        source = _trace.read_jsonl(source)
    if isinstance(source, _trace.Trace):
        return source.header, source.events
    return {}, list(source)


def ring_attention_calls(source) -> list[int]:
    """The ring attention calls a trace holds (their numbers, in order)."""
    _, events = _load(source)
    return sorted({_trace.label_info(event.get("label", "")).get("ring_attention")
                   for event in events if event.get("kind") == "send"} - {None})


def _merges(seq_len, world, rank, owner, causal, layout) -> list[int]:
    """The chunks (cells) of ``rank`` that may see ``owner``'s K, V block."""
    keys = rank_chunks(seq_len, world, owner, layout)
    return [cell for cell, query in enumerate(rank_chunks(seq_len, world, rank, layout))
            if any(pair_kind(query, key, causal) != SKIP for key in keys)]


def ring_attention_replay(source, call: int | None = None, phase: str = "forward",
                          member: int | None = None) -> Replay:
    """The K, V ring of one ring attention call (``call``: its number, the
    first by default) in ``source`` (a trace file, a :class:`minidist.trace.Trace`
    or a list of events), ``phase`` "forward" or "backward". With several
    context-parallel groups (CP x DP) the group of global rank ``member``
    (default: the lowest) is drawn."""
    header, events = _load(source)
    calls = ring_attention_calls(events)
    if not calls:
        raise ValueError("this trace holds no ring attention: record one with "
                         "minidist.launch(..., trace=path) around ring_attention(...)")
    call = calls[0] if call is None else call
    pairs = [(send, recv) for send, recv in _trace.iter_messages(events)
             if _trace.label_info(send.get("label", "")).get("ring_attention") == call
             and _trace.label_info(send.get("label", "")).get("phase") == phase]
    if not pairs:
        raise ValueError(f"ring attention call {call} has no {phase!r} messages in this trace "
                         f"(calls: {calls}; phases: 'forward', 'backward')")
    # The group: the ranks connected to ``member`` by the call's messages.
    links = defaultdict(set)
    for send, _ in pairs:
        links[send["rank"]].add(send["peer"])
        links[send["peer"]].add(send["rank"])
    start = min(links) if member is None else member
    group, frontier = {start}, [start]
    while frontier:
        for peer in links[frontier.pop()] - group:
            group.add(peer)
            frontier.append(peer)
    members = sorted(group)
    position = {rank: index for index, rank in enumerate(members)}
    pairs = [(send, recv) for send, recv in pairs if send["rank"] in group]
    info = _trace.label_info(pairs[0][0]["label"])
    world, seq_len, layout = int(info["world"]), int(info["seq"]), str(info["layout"])
    causal = bool(info["causal"])
    cells = len(rank_chunks(seq_len, world, 0, layout))
    holdings = [[set() for _ in range(cells)] for _ in range(world)]
    for rank in range(world):
        for cell in _merges(seq_len, world, rank, rank, causal, layout):
            holdings[rank][cell].add(rank)
    origin = min(send["start"] for send, _ in pairs)

    def frozen():
        return tuple(tuple(frozenset(cell) for cell in row) for row in holdings)

    initial = frozen()
    frames = [Frame(index=0, step=-1, phase=phase, holdings=initial, messages=(), elapsed_ns=0)]
    by_step = defaultdict(list)
    for send, recv in pairs:
        by_step[int(_trace.label_info(send["label"])["step"])].append((send, recv))
    elapsed = 0
    for step in range(world - 1):
        messages = []
        for send, recv in sorted(by_step.get(step, []), key=lambda pair: pair[0]["rank"]):
            owner = int(_trace.label_info(send["label"])["owner"])
            source, target = position[send["rank"]], position[send["peer"]]
            merged = _merges(seq_len, world, target, owner, causal, layout)
            for cell in merged:
                holdings[target][cell].add(owner)
            end = (recv or send)["end"] - origin
            elapsed = max(elapsed, end)
            text = _trace.label_text(send["label"])
            messages.append(Message(
                source=source, target=target, nbytes=int(send.get("bytes") or 0),
                text=text.split(": ", 1)[1] if ": " in text else text, op="merge",
                cells=(min(merged), max(merged) + 1) if merged else None,
                start_ns=send["start"] - origin, end_ns=end))
        frames.append(Frame(index=step + 1, step=step, phase=phase, holdings=frozen(),
                            messages=tuple(messages), elapsed_ns=elapsed,
                            nbytes=sum(message.nbytes for message in messages)))
    block = frames[1].messages[0].nbytes if world > 1 and frames[1].messages else 0
    itemsize = int(info.get("itemsize", 8))
    return Replay(
        collective="ring_attention", algorithm="ring", world_size=world,
        count=block // itemsize, itemsize=itemsize, root=None, call=call, cells=cells,
        layout="ring", initial=initial, frames=tuple(frames), formula=FORMULA, predicted_s=None,
        measured_s=max((recv or send)["end"] for send, recv in pairs) / 1e9 - origin / 1e9,
        summary=False, transport=str(header.get("transport", "")), nbytes=block)


__all__ = ["ring_attention_replay", "ring_attention_calls", "FORMULA"]
