"""Replay a collective call from its trace: the state before any message,
then one frame per algorithm step.

This is the model every picture of minidist is drawn from (the Rich
step-through in :mod:`viz.terminal`, the matplotlib animation, the lesson's
figures). It is pure Python and draws nothing::

    from viz.replay import replay
    ring = replay("ring.jsonl")          # the first collective call in the trace
    ring.steps                           # 2 (n - 1) for a ring all_reduce
    len(ring.frames)                     # steps + 1: frame 0 is the state before any message
    ring.frames[0].messages              # (): nothing has moved yet
    ring.frames[1].messages[0]           # Message(source=0, target=1, nbytes=256, ...)
    ring.frames[-1].holdings[3][0]       # frozenset({0, 1, 2, 3}): rank 3's cell 0 is done

Steps are counted one way in every picture (terminal, GIF, HTML player,
exercise replays): "step k of K" is ``frames[k]``, the state after the
algorithm's k-th step (counted from 1), and step 0 is the state before any
message. The trace and the algorithms' labels count their steps from 0
(``Frame.step``, "reduce-scatter step 0 chunk 3"): trace step s is drawn as
step s + 1.

What the trace says (schema version 2, written by the collectives): every
rank records one ``collective`` event per call, whose label carries the call's
number, collective, algorithm, world size, element count, item size, root and
number of steps; every message of the call carries the algorithm's step, its
phase, the element range of the call's buffer it reads (send) or writes
(recv), and whether the receiver copies or combines it. See
:func:`minidist.trace.label_info`.

Holdings: which ranks' data each part of each buffer already contains. Each
rank's buffer is drawn as ``cells`` equal cells (cell i covers elements
``chunk_bounds(count, cells)[i]`` up to ``[i + 1]``), as many as make every
message cover whole cells (:func:`cells_for`): n for the ring, p for
Rabenseifner, so that a cell is exactly a chunk the algorithm moves.
The frames are computed by applying the messages step by step, as the
algorithm did:

* every message of a step carries what its sender held *before* the step
  (all messages of one step are in flight together);
* at the target, ``copy`` replaces the cells the message writes and
  ``combine`` adds the incoming ranks to them (a partial sum grows);
* a message covering only part of a cell counts for the whole cell, so a
  cell is the union of what its pieces hold (with fewer cells than chunks the
  picture runs slightly ahead of the truth, never behind it);
* an empty message (an empty chunk, when the buffer has fewer elements than
  the algorithm has chunks) changes nothing.

Initial holdings: all_reduce, reduce and reduce_scatter start with rank r's
whole buffer holding {r}; broadcast with the root's buffer holding {root}
and the others nothing; all_gather with rank r's piece r holding {r}. Other
collectives (gather, scatter, all_to_all, barrier) are replayed as messages
only (``holdings`` is None). A cell with no elements (fewer elements than
cells) holds nothing throughout (``frozenset()``), which is also its final
state, so it counts as complete.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass

from minidist import costmodel
from minidist import trace as _trace
from minidist.alpha_beta import in_symbols
from minidist.distributed.collectives.chunks import chunk_bounds
from minidist.model_gap import RunFacts, explain

#: Above this many ranks the renderers draw the summary view.
SUMMARY_ABOVE = 16
#: The most cells a buffer is cut into (one per rank up to here).
MAX_CELLS = 64
#: Above this many ranks frames keep no per-cell holdings (only ``complete``):
#: 1,024 ranks x 64 cells x 2,046 steps would not fit in memory.
HOLDINGS_UP_TO = 64

#: Initial holdings by collective; the others are replayed as messages only.
_STARTS_WITH_OWN = ("all_reduce", "reduce", "reduce_scatter")

#: Algorithms drawn as a ring of ranks (each rank talks to its neighbours);
#: trees as a tree; everything else as a row.
RING_ALGORITHMS = ("ring", "chain")
TREE_ALGORITHMS = ("binomial", "tree", "double_binary_tree", "reduce_broadcast",
                   "coordinator", "linear")


@dataclass(frozen=True)
class Message:
    """One message of a step, as both of its ends recorded it."""

    source: int          # group rank that sent it
    target: int          # group rank that received it
    nbytes: int
    text: str            # the algorithm's words: "reduce-scatter step 2 chunk 3"
    op: str              # "copy" | "combine" | "" (unknown)
    cells: tuple[int, int] | None  # [first, stop) cells written at the target
    start_ns: int        # send start, relative to the call's start
    end_ns: int          # recv end, relative to the call's start


@dataclass(frozen=True)
class Frame:
    """The state after one algorithm step (frame 0: before the first)."""

    index: int           # the step shown, "step index of K": 0 before any message
    step: int            # the trace's step number, from 0 (index - 1; -1 for frame 0)
    phase: str           # "reduce-scatter", "allgather", "broadcast", ... ("" if none)
    holdings: tuple[tuple[frozenset, ...], ...] | None  # [rank][cell] -> ranks in it
    messages: tuple[Message, ...]
    elapsed_ns: int      # call start -> end of this step's last message (or earlier ones)
    #: Fraction of all (rank, cell) pairs that already hold what they hold at
    #: the end of the call (None without holdings); the summary view's progress.
    complete: float | None = None
    nbytes: int = 0      # bytes moved in this step


@dataclass(frozen=True)
class Replay:
    """One collective call, ready to be drawn frame by frame."""

    collective: str
    algorithm: str
    world_size: int
    count: int           # elements of the call's buffer
    itemsize: int
    root: int | None
    call: int
    cells: int           # cells each buffer is drawn as
    layout: str          # "ring" | "tree" | "row"
    initial: tuple[tuple[frozenset, ...], ...] | None  # holdings before any message
    frames: tuple[Frame, ...]  # frames[0]: before any message; frames[k]: after step k
    formula: str         # the algorithm's cost formula in words
    predicted_s: float | None  # the cost model's time for this call
    measured_s: float    # first rank in to last rank out of the call
    summary: bool        # True above SUMMARY_ABOVE ranks: draw the summary view
    group: int = 0       # the process group's id
    transport: str = ""  # "shm", "pipe", "sim", ... from the trace header

    #: Bytes of the call's buffer on one rank: count x itemsize, except for
    #: the simulator, whose small array stands for the size its header names.
    nbytes: int = 0
    #: Seconds between the first and the last rank entering the call (part
    #: of measured_s: the early ranks wait for the late one).
    skew_s: float = 0.0
    #: Cores the run had, from the trace header (None: not recorded).
    cores: int | None = None
    #: Where predicted_s's alpha / beta come from: "given" (the header's, the
    #: simulator's) or "default" (the transport's defaults in the cost model).
    params: str = "default"
    #: The longest a message took once both its ends were in the call
    #: (recv end - the later of send start and recv start), seconds.
    slowest_message_s: float = 0.0
    #: The machine's load average at the end of the run (header; None: not recorded).
    load: float | None = None

    @property
    def steps(self) -> int:
        """The algorithm's steps: the frames after the first (before any message)."""
        return len(self.frames) - 1


# --------------------------------------------------------------------------- reading


def _label_info(label: str) -> dict:
    """The key=value pairs after " #" in a label (ints converted, ranges as tuples)."""
    return _trace.label_info(label or "")


def _label_text(label: str) -> str:
    return _trace.label_text(label or "")


def _load(trace) -> tuple[dict, list[dict]]:
    if isinstance(trace, (str, os.PathLike)):
        trace = _trace.read_jsonl(trace)
    if isinstance(trace, _trace.Trace):
        return trace.header, trace.events
    return {}, list(trace)


def replays(trace) -> list[Replay]:
    """Every collective call in ``trace`` (a :class:`minidist.trace.Trace`, a
    path to a trace file, or a list of event dicts), in the order they started."""
    header, events = _load(trace)
    calls: dict[tuple[int, int], list[dict]] = defaultdict(list)
    messages: dict[tuple[int, int], list[tuple[dict, dict | None]]] = defaultdict(list)
    for event in events:
        if event.get("kind") == "collective":
            info = _label_info(event.get("label"))
            if "call" in info:
                calls[(info.get("group", event.get("group", 0)), info["call"])].append(event)
    for send, recv in _trace.iter_messages(events):
        info = _label_info(send.get("label"))
        if "call" in info:
            messages[(send.get("group", 0), info["call"])].append((send, recv))
    ordered = sorted(calls, key=lambda key: min(event["start"] for event in calls[key]))
    return [_replay_call(header, calls[key], messages.get(key, [])) for key in ordered]


def replay(trace, index: int = 0) -> Replay:
    """The ``index``-th collective call of ``trace`` (see :func:`replays`)."""
    found = replays(trace)
    if not found:
        raise ValueError("this trace holds no collective call: record one with "
                         "minidist.launch(..., trace=path) around a collective, or "
                         "minidist.distributed.simulate(..., trace=path). (Traces written "
                         "before schema version 2 carry no collective information.)")
    if not -len(found) <= index < len(found):
        raise IndexError(f"the trace holds {len(found)} collective calls (0..{len(found) - 1}); "
                         f"there is no call {index}")
    return found[index]


# --------------------------------------------------------------------------- one call


def _replay_call(header: dict, collective_events: list[dict],
                 pairs: list[tuple[dict, dict | None]]) -> Replay:
    info = _label_info(collective_events[0]["label"])
    collective, algorithm = info["collective"], info["algorithm"]
    world = int(info["world"])
    count, itemsize = int(info.get("count", 0)), int(info.get("itemsize", 1))
    root = info.get("root", -1)
    root = None if root is None or root < 0 else int(root)
    # A rank idle at the end of the call has seen fewer steps: take the most.
    steps = max(_label_info(event["label"]).get("steps", 0) for event in collective_events)
    rank_of = _group_ranks(collective_events, world)

    # The call is timed from the first rank entering it to the last one
    # leaving: a rank that enters late makes the others wait, and that wait is
    # part of what the call cost (the frames' times count from the same
    # origin, so "so far" never passes the total). Right after the processes
    # start, that includes their start-up skew: `minidist demo` shows a
    # second, warmed-up call for that reason.
    origin = min(event["start"] for event in collective_events)
    measured_ns = max(event["end"] for event in collective_events) - origin
    cells = cells_for(world, count, _range_ends(pairs))
    bounds = chunk_bounds(count, cells)

    by_step: dict[int, list[tuple[Message, tuple | None, tuple | None, str]]] = defaultdict(list)
    phase_votes: dict[int, Counter] = defaultdict(Counter)
    for send, recv in pairs:
        sent = _label_info(send.get("label"))
        received = _label_info(recv.get("label")) if recv is not None else {}
        step = int(sent.get("step", received.get("step", 0)))
        steps = max(steps, step + 1)
        # A message that is not a slice of the call's buffer (a scratch array)
        # is taken to read and write the same range as its other end.
        source_range = sent.get("range") or received.get("range")
        target_range = received.get("range") or sent.get("range")
        op = received.get("op") or sent.get("op") or ""
        phase = sent.get("phase") or received.get("phase") or ""
        if phase:
            phase_votes[step][phase] += 1
        end = recv["end"] if recv is not None else send["end"]
        message = Message(
            source=rank_of(send["rank"]), target=rank_of(send["peer"]),
            nbytes=int(send.get("bytes") or 0), text=_message_text(send.get("label")),
            op=op, cells=_cells_of(target_range, bounds) if target_range else None,
            start_ns=send["start"] - origin, end_ns=end - origin)
        by_step[step].append((message, source_range, target_range, op))

    start = _initial(collective, world, count, root, bounds)
    frames = _frames(steps, by_step, phase_votes, start, bounds, world)
    return Replay(
        collective=collective, algorithm=algorithm, world_size=world, count=count,
        itemsize=itemsize, root=root, call=int(info["call"]), cells=cells,
        layout=layout_of(algorithm), initial=_as_holdings(start, world),
        frames=frames, formula=formula_of(collective, algorithm),
        predicted_s=_predict(header, collective, algorithm, world,
                             _modelled_bytes(header, collective, count * itemsize)),
        nbytes=_modelled_bytes(header, collective, count * itemsize),
        measured_s=measured_ns / 1e9, summary=world > SUMMARY_ABOVE,
        group=int(info.get("group", collective_events[0].get("group", 0))),
        transport=str(header.get("transport", "")),
        skew_s=(max(event["start"] for event in collective_events) - origin) / 1e9,
        cores=header.get("cores") if isinstance(header.get("cores"), int) else None,
        params="given" if all(key in header for key in ("alpha", "beta")) else "default",
        slowest_message_s=max((recv["end"] - max(send["start"], recv["start"])
                               for send, recv in pairs if recv is not None), default=0) / 1e9,
        load=header.get("load") if isinstance(header.get("load"), (int, float)) else None)


def _range_ends(pairs) -> set[int]:
    ends = set()
    for send, recv in pairs:
        for event in (send, recv):
            if event is not None:
                element_range = _label_info(event.get("label")).get("range")
                if element_range:
                    ends.update(element_range)
    return ends


def cells_for(world: int, count: int, range_ends: set[int]) -> int:
    """How many equal cells to draw a buffer as: the first of n, p (the
    largest power of two <= n), then their multiples, whose cell boundaries
    include every end of every message's range, so that each message
    covers whole cells (Rabenseifner on 5 ranks cuts the array in 4, the
    ring in 5). None fits: n cells, and messages may cover parts of cells.
    At most :data:`MAX_CELLS`."""
    power = 1 << (world.bit_length() - 1)
    candidates = [world, power] + sorted({base * factor for base in (world, power)
                                          for factor in range(2, MAX_CELLS + 1)
                                          if base * factor <= MAX_CELLS})
    for cells in candidates:
        if cells <= MAX_CELLS and range_ends <= set(chunk_bounds(count, cells)):
            return cells
    return min(world, MAX_CELLS)


def _group_ranks(collective_events: list[dict], world: int):
    """Map the trace's (global) ranks to group ranks.

    The trace records global ranks; a group's ranks are its members in
    increasing global order, and every member records the call's collective
    event, so the sorted members are the group. In the world group (or if
    some rank recorded nothing) the ranks are taken as they are.
    """
    members = sorted({event["rank"] for event in collective_events})
    if len(members) != world or members == list(range(world)):
        return lambda rank: rank
    position = {rank: index for index, rank in enumerate(members)}
    return lambda rank: position.get(rank, rank)


def _message_text(label) -> str:
    """The algorithm's own words: "reduce-scatter step 2 chunk 3"."""
    text = _label_text(label)
    return text.split(": ", 1)[1] if ": " in text else text


def _cells_of(element_range: tuple[int, int], bounds: list[int]) -> tuple[int, int]:
    """[first, stop) of the cells that elements [a, b) touch (an empty range:
    the cell it sits in, so that an empty chunk still shows where it went)."""
    first, stop = element_range
    last_cell = len(bounds) - 2
    low = min(max(bisect.bisect_right(bounds, first) - 1, 0), last_cell)
    if stop <= first:
        return low, low + 1
    high = min(max(bisect.bisect_left(bounds, stop) - 1, low), last_cell)
    return low, high + 1


# --------------------------------------------------------------------------- holdings
#
# Internally a holding is a bit set (a Python int: bit r set = rank r's data
# is in it): unions are one "|", and 64 ranks x 64 cells x 126 steps stay cheap.


def _initial(collective: str, world: int, count: int, root, bounds) -> list[list[int]] | None:
    """Holdings before step 0. A cell with no elements (fewer elements than
    cells) holds nothing, from the start to the end: no message writes it."""
    start = _initial_holdings(collective, world, count, root, bounds)
    if start is not None:
        for cell in range(len(bounds) - 1):
            if bounds[cell + 1] <= bounds[cell]:
                for row in start:
                    row[cell] = 0
    return start


def _initial_holdings(collective: str, world: int, count: int, root,
                      bounds) -> list[list[int]] | None:
    cells = len(bounds) - 1
    if collective in _STARTS_WITH_OWN:
        return [[1 << rank] * cells for rank in range(world)]
    if collective == "broadcast":
        owner = root or 0
        return [[(1 << owner) if rank == owner else 0] * cells for rank in range(world)]
    if collective == "all_gather":
        pieces = chunk_bounds(count, world)
        start = [[0] * cells for _ in range(world)]
        for rank in range(world):
            first, stop = _cells_of((pieces[rank], pieces[rank + 1]), bounds)
            for cell in range(first, stop):
                start[rank][cell] |= 1 << rank
        return start
    return None


def _payload(holding: list[int], source_range, target_range, bounds) -> dict[int, int]:
    """What a message brings to each target cell: the sender's holdings of the
    elements it reads that land in that cell."""
    source_first = source_range[0]
    target_first, target_stop = target_range
    brought = {}
    if target_stop <= target_first:
        return brought  # an empty piece (fewer elements than chunks) carries no data
    first_cell, stop_cell = _cells_of(target_range, bounds)
    for cell in range(first_cell, stop_cell):
        low = max(bounds[cell], target_first)
        high = min(bounds[cell + 1], target_stop)
        shifted = (low - target_first + source_first, high - target_first + source_first)
        if high <= low:
            shifted = (shifted[0], shifted[0])
        sender_first, sender_stop = _cells_of(shifted, bounds)
        bits = 0
        for sender_cell in range(sender_first, sender_stop):
            bits |= holding[sender_cell]
        brought[cell] = bits
    return brought


def _apply(state: list[list[int]], entries, bounds) -> set[tuple[int, int]]:
    """Apply one step's messages to ``state``; returns the (rank, cell) pairs written.

    Every message of a step leaves with its sender's holdings from before the
    step (they are all in flight at once), so all payloads are read first."""
    updates = [(message.target, op, _payload(state[message.source], source_range,
                                             target_range, bounds))
               for message, source_range, target_range, op in entries
               if source_range is not None]
    written = set()
    for target, op, brought in updates:
        row = state[target]
        for cell, bits in brought.items():
            row[cell] = row[cell] | bits if op == "combine" else bits
            written.add((target, cell))
    return written


def _frames(steps, by_step, phase_votes, start, bounds, world) -> tuple[Frame, ...]:
    """The state before any message, then apply the messages step by step and
    keep what each step left."""
    cells = len(bounds) - 1
    ordered = [sorted(by_step.get(step, []), key=lambda entry: entry[0].end_ns)
               for step in range(steps)]
    final = None
    if start is not None:
        # A first pass finds where every cell ends, so that the second can
        # count the cells already there ("complete") as it goes.
        final = [list(row) for row in start]
        for entries in ordered:
            _apply(final, entries, bounds)
    state = [list(row) for row in start] if start is not None else None
    done = sum(state[rank][cell] == final[rank][cell]
               for rank in range(world) for cell in range(cells)) if state else 0
    keep_holdings = state is not None and world <= HOLDINGS_UP_TO
    cache: dict[int, frozenset] = {}
    rows = [tuple(_as_set(bits, cache) for bits in row) for row in state] if keep_holdings \
        else None
    frames = [Frame(index=0, step=-1, phase="", holdings=tuple(rows) if keep_holdings else None,
                    messages=(), elapsed_ns=0,
                    complete=(done / (world * cells) if cells else 1.0)
                    if state is not None else None)]
    elapsed, phase = 0, ""
    for step, entries in enumerate(ordered):
        holdings = complete = None
        if state is not None:
            before = {(rank, cell): state[rank][cell] == final[rank][cell]
                      for rank, cell in _targets(entries, bounds)}
            written = _apply(state, entries, bounds)
            for rank, cell in written:
                done += (state[rank][cell] == final[rank][cell]) - before[(rank, cell)]
            complete = done / (world * cells) if cells else 1.0
            if keep_holdings:
                # Rows no message wrote are shared with the previous frame.
                for rank in {rank for rank, _ in written}:
                    rows[rank] = tuple(_as_set(bits, cache) for bits in state[rank])
                holdings = tuple(rows)
        if entries:
            elapsed = max(elapsed, max(entry[0].end_ns for entry in entries))
        if phase_votes.get(step):
            phase = phase_votes[step].most_common(1)[0][0]
        messages = tuple(sorted((entry[0] for entry in entries),
                                key=lambda message: (message.source, message.target)))
        frames.append(Frame(index=step + 1, step=step, phase=phase, holdings=holdings,
                            messages=messages, elapsed_ns=elapsed, complete=complete,
                            nbytes=sum(message.nbytes for message in messages)))
    return tuple(frames)


def _targets(entries, bounds) -> set[tuple[int, int]]:
    """The (rank, cell) pairs a step's messages will write."""
    targets = set()
    for message, source_range, target_range, _ in entries:
        if source_range is not None:
            first, stop = _cells_of(target_range, bounds)
            targets.update((message.target, cell) for cell in range(first, stop))
    return targets


def _as_set(bits: int, cache: dict) -> frozenset:
    known = cache.get(bits)
    if known is None:
        known = cache[bits] = frozenset(rank for rank in range(bits.bit_length())
                                        if bits >> rank & 1)
    return known


def _as_holdings(start, world):
    if start is None or world > HOLDINGS_UP_TO:
        return None
    cache: dict[int, frozenset] = {}
    return tuple(tuple(_as_set(bits, cache) for bits in cells) for cells in start)


# --------------------------------------------------------------------------- words and costs


# The cells' symbols, one vocabulary for every picture of a replay (the
# terminal, the GIF, the browser's player): a rank is always "rank r", and a
# cell holding rank r's data alone shows "r", never "r0" in one picture and
# "1" in another.

#: The kinds of cell, in the order every legend lists them.
CELL_KINDS = ("one", "partial", "complete", "empty")


def cell_kind(holders: frozenset, world_size: int) -> str:
    """"empty", "one" (one rank's data), "complete" (every rank's) or "partial"."""
    if not holders:
        return "empty"
    if len(holders) == world_size:
        return "complete"
    return "one" if len(holders) == 1 else "partial"


def cell_symbol(holders: frozenset, world_size: int) -> str:
    """What a cell shows: "2" rank 2's data alone, "Σ3" three ranks' data
    combined so far, "A" all ranks', "·" nothing yet."""
    kind = cell_kind(holders, world_size)
    if kind == "one":
        return str(next(iter(holders)))
    return {"empty": "·", "complete": "A", "partial": f"Σ{len(holders)}"}[kind]


def cell_kinds(replay: Replay) -> list[str]:
    """The kinds of cell some frame of ``replay`` draws (:data:`CELL_KINDS`'
    order): a legend names these and no others."""
    if replay.initial is None:
        return []
    found = {cell_kind(holders, replay.world_size)
             for frame in replay.frames if frame.holdings is not None
             for row in frame.holdings for holders in row}
    return [kind for kind in CELL_KINDS if kind in found]


def alone_ranks(replay: Replay) -> list[int]:
    """The ranks whose data some cell holds alone in some frame (those the
    cells show by number): every rank in an all_reduce, the root alone in a
    broadcast; every rank when the cells are not tracked (their boxes)."""
    if replay.initial is None:
        return list(range(replay.world_size))
    return sorted({next(iter(holders)) for frame in replay.frames if frame.holdings is not None
                   for row in frame.holdings for holders in row
                   if len(holders) == 1})


def cell_words(replay: Replay) -> dict[str, tuple[str, str]]:
    """kind -> (symbol, what it means) for this replay's collective: "Σk" is a
    partial sum in a reduction, K, V blocks merged in ring attention. The
    symbol of "one" is "r" (the rank's number is drawn)."""
    if replay.collective == "ring_attention":
        return {"one": ("r", "rank r's own K, V block only"),
                "partial": ("Σk", "k ranks' K, V blocks merged so far"),
                "complete": ("A", "every rank's K, V block merged"),
                "empty": ("·", "nothing merged yet")}
    combined = ("summed so far" if replay.collective in _STARTS_WITH_OWN
                else "combined so far")
    return {"one": ("r", "rank r's data alone"),
            "partial": ("Σk", f"k ranks' data {combined}"),
            "complete": ("A", "all ranks' data (complete)"),
            "empty": ("·", "nothing yet")}


def rank_words(replay: Replay, rank: int) -> str:
    """The legend's words for the cells (or box) of rank ``rank``'s number."""
    if replay.initial is None:
        return f"rank {rank}'s buffer"
    return cell_words(replay)["one"][1].replace("rank r", f"rank {rank}")



def step_words(replay: Replay, frame: Frame) -> str:
    """"step k of K", as every picture counts: step 0 is the state before any
    message, step K the end of the call."""
    words = f"step {frame.index} of {replay.steps}"
    return words + " (before any message)" if frame.index == 0 else words


def layout_of(algorithm: str) -> str:
    """How the ranks are laid out: "ring", "tree" or "row"."""
    if algorithm in RING_ALGORITHMS:
        return "ring"
    if algorithm in TREE_ALGORITHMS:
        return "tree"
    return "row"


def formula_of(collective: str, algorithm: str) -> str:
    """The algorithm's cost in the lessons' symbols (α, β, βₓ, γ), from its
    docstring's "Cost:" line (the module's cost table when that line is a
    paragraph)."""
    from minidist.distributed.collectives.call import ALGORITHMS

    function = ALGORITHMS.get(collective, {}).get(algorithm)
    if function is None:
        return ""
    doc = function.__doc__ or ""
    found = re.search(r"Cost:\s*(.*?)(?:\n\s*\n|$)", doc, re.S)
    text = " ".join(found.group(1).split()).rstrip(".") if found else ""
    if not text or len(text) > 80:
        table = _table_row(sys.modules[function.__module__].__doc__ or "", algorithm)
        text = table or text
    return in_symbols(text)


def _table_row(doc: str, algorithm: str) -> str:
    for line in doc.splitlines():
        found = re.match(rf"\s*{re.escape(algorithm)}\s{{2,}}(\S.*)$", line)
        if found:
            # Drop the remark column ("(the root sends n - 1 times)").
            return re.split(r"\s{2,}", found.group(1).strip())[0]
    return ""


def gap_facts(replay: Replay) -> RunFacts:
    """What the trace says about the run, for :mod:`minidist.model_gap`."""
    size = f"{replay.nbytes}B"
    return RunFacts(
        ranks=replay.world_size, cores=replay.cores, simulated=replay.transport == "sim",
        transport=replay.transport, params=replay.params,
        # Call 0 of a group is its first: it maps buffers and waits for late starters.
        first_call=replay.call == 0, skew_s=replay.skew_s, nbytes=replay.nbytes,
        load=replay.load, slowest_message_s=replay.slowest_message_s,
        hold=() if replay.transport == "sim" else (f"on `minidist simulate {replay.collective} --algorithm {replay.algorithm} "
              f"-n {replay.world_size} --size {size}`",))


def model_gap(replay: Replay) -> str | None:
    """Why the call's measured time and the cost model's differ in this run,
    and where the model holds (None: no formula for this algorithm)."""
    if replay.predicted_s is None:
        return None
    return explain(replay.measured_s, replay.predicted_s, gap_facts(replay))


def _modelled_bytes(header: dict, collective: str, nbytes: int) -> int:
    """The simulator runs a small array standing for a big one: its header
    names the size the run stands for."""
    if header.get("transport") == "sim" and header.get("collective") == collective \
            and header.get("nbytes") is not None:
        return int(header["nbytes"])
    return nbytes


def _predict(header: dict, collective: str, algorithm: str, world: int,
             nbytes: int) -> float | None:
    """The cost model's time for the call, with the parameters the trace was
    made under: the simulator's alpha / beta / gamma (and its cluster's shape,
    when it ran on one: the two-level formula, None where there is none), or
    the transport's fit."""
    shape = header.get("topology")
    if shape and all(key in header for key in ("alpha", "beta")):
        from minidist.topology import Topology

        try:
            cluster = Topology(
                nodes=shape["nodes"], ranks_per_node=shape["ranks_per_node"],
                intra=costmodel.Params(header["alpha"], header["beta"], header.get("gamma", 0.0)),
                inter=costmodel.Params(shape["inter_alpha"], shape["inter_beta"],
                                       header.get("gamma", 0.0)),
                nics_per_node=shape["nics_per_node"],
                spine_oversubscription=shape["spine_oversubscription"], name=shape.get("name", ""))
            return costmodel.predict(collective, algorithm, world, nbytes, topology=cluster)
        except (KeyError, TypeError, ValueError):
            return None
    if all(key in header for key in ("alpha", "beta")):
        params = costmodel.Params(alpha=header["alpha"], beta=header["beta"],
                                  gamma=header.get("gamma", 0.0))
    else:
        params = costmodel.PARAMS.get(header.get("transport") or "shm", costmodel.PARAMS["shm"])
    try:
        return costmodel.predict(collective, algorithm, world, nbytes, params)
    except ValueError:
        return None
