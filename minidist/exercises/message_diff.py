"""Where a student's collective first does something else than the reference:
which rank, which step, and what it sent or received instead, in the
exercise's words ("chunk 3", "the whole buffer", "rank 1").

Both runs are recorded the same way (:class:`~.collective_check.RecordingComm`):
every send and every receive a rank posts, as an :class:`Action` holding
its step, its peer, the part of the call's buffer it reads or writes (an
element range, mapped to the chunk numbers of
:func:`~minidist.distributed.collectives.chunks.chunk_bounds` for the
exercises that cut the buffer) and, for a send, a checksum of the values.

Steps are counted as the replays count them: step k is a rank's k-th
``yield`` (its k-th exchange), from 1; step 0 is the state before any
message. A rank's step k is compared with the reference's step k on the
same rank; the difference told is the earliest step, then the lowest rank.
A run that stopped (an error, a deadlock) is compared only up to the step
each rank reached: what it would have done after is unknown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from minidist.distributed.collectives.chunks import chunk_bounds


@dataclass(frozen=True)
class Action:
    """One send or receive a rank posted."""

    step: int                    # the rank's step, from 1 (its k-th yield)
    kind: str                    # "send" | "copy" (irecv) | "add" (irecv_reduce, combined_into)
    peer: int
    span: tuple[int, int] | None  # [first, stop) elements of the call's buffer; None: another array
    nbytes: int
    checksum: int | None = None  # of the values sent (sends only)

    @property
    def sends(self) -> bool:
        return self.kind == "send"


@dataclass(frozen=True)
class Difference:
    """The first place a student's run differs from the reference's.

    ``kind`` names the mistake ("wrong chunk", "wrong peer", "add instead of
    copy", "copy instead of add", "wrong values", "missing step", "extra
    message", "missing message"); ``text`` is the sentence a student reads,
    "rank 0, step 1 (reduce-scatter): you receive into chunk 0; the reference
    receives into chunk 3 (from rank 3)"."""

    rank: int
    step: int
    kind: str
    text: str


@dataclass(frozen=True)
class Chunking:
    """How the exercise names the parts of a buffer: ``parts`` chunks cut as
    ``split(buffer, parts)`` cuts them (the ring), or the whole buffer
    (``parts`` None: the tree, recursive doubling)."""

    count: int
    parts: int | None

    def name(self, span: tuple[int, int] | None) -> str:
        if span is None:
            return "an array that is not part of the buffer"
        first, stop = span
        if stop == first and self.count:
            return "an empty chunk"  # the recorder cannot tell empty views apart
        if self.parts is None or self.parts == 1:
            if span == (0, self.count):
                return "the whole buffer"
            return f"elements {first}..{stop - 1} of the buffer" if stop > first \
                else "an empty slice of the buffer"
        bounds = chunk_bounds(self.count, self.parts)
        matches = [index for index in range(self.parts)
                   if (bounds[index], bounds[index + 1]) == span]
        if len(matches) == 1:
            index = matches[0]
            return f"chunk {index}" + (" (empty)" if stop == first else "")
        if matches:  # several empty chunks start here: they cannot be told apart
            return "an empty chunk"
        if stop > first:
            return f"elements {first}..{stop - 1} (not one chunk of split(buffer, {self.parts}))"
        return "an empty slice (not one chunk)"


def _at(actions, step):
    return [action for action in actions if action.step == step]


def _key(action: Action):
    return (action.kind, action.peer, action.span, action.nbytes, action.checksum)


def first_difference(student, reference, chunking: Chunking, phase_of=None) -> Difference | None:
    """The earliest (step, rank) whose posted sends and receives differ from
    the reference's, described; None when every step compared is the same.

    ``student`` and ``reference``: per rank, an object with ``actions``
    (a list of :class:`Action`), ``finished`` (the rank ran to its end) and
    ``steps`` (the steps it finished). ``phase_of(rank, step)``: the
    reference's phase of that step ("reduce-scatter"), or ""."""
    found = None
    for mine, theirs in zip(student, reference):
        last = max([action.step for action in mine.actions + theirs.actions], default=0)
        # A rank that did not finish is compared up to the step it was in.
        reached = last if mine.finished else mine.steps + 1
        for step in range(1, min(last, reached) + 1):
            got, want = _at(mine.actions, step), _at(theirs.actions, step)
            if Counter(map(_key, got)) == Counter(map(_key, want)):
                continue
            if found is None or (step, mine.rank) < (found[0], found[1]):
                found = (step, mine.rank, got, want, mine)
            break
    if found is None:
        return None
    step, rank, got, want, mine = found
    phase = phase_of(rank, step) if phase_of else ""
    where = f"rank {rank}, step {step}" + (f" ({phase})" if phase else "")
    if not got and mine.finished and step > mine.steps:
        kind = "missing step"
        steps = f"{mine.steps} step" + ("" if mine.steps == 1 else "s")
        text = f"your code has finished after {steps}; the reference still {_doing(want, chunking)}"
    else:
        kind, text = _describe(got, want, chunking)
    return Difference(rank, step, kind, f"{where}: {text}")


def _doing(actions, chunking) -> str:
    """'sends chunk 0 to rank 1 and receives into chunk 3 (from rank 3)'."""
    words = [_one(action, chunking) for action in actions]
    return " and ".join(words) if words else "posts nothing"


def _one(action: Action, chunking: Chunking) -> str:
    """'sends chunk 0 to rank 1', 'receives into chunk 3 (from rank 3)'."""
    what = chunking.name(action.span)
    if action.sends:
        return f"sends {what} to rank {action.peer}"
    if action.kind == "add":
        return f"adds the message from rank {action.peer} into {what}"
    return f"receives into {what} (from rank {action.peer})"


def _pair(got: list[Action], want: list[Action]):
    """Match the student's unexplained actions with the reference's: same
    span first (then the peer or the operation differs), then same peer (then
    the chunk differs), then in order. Returns (pairs, extra, missing)."""
    got, want = list(got), list(want)
    pairs = []
    for same in (lambda a, b: a.span == b.span and a.peer == b.peer,
                 lambda a, b: a.span == b.span,
                 lambda a, b: a.peer == b.peer,
                 lambda a, b: True):
        for a in list(got):
            partner = next((b for b in want if same(a, b)), None)
            if partner is not None:
                pairs.append((a, partner))
                got.remove(a)
                want.remove(partner)
    return pairs, got, want


#: the order in which kinds of mistake are named, when one step holds several
_PRIORITY = ("wrong chunk", "wrong peer", "add instead of copy", "copy instead of add",
             "wrong size", "missing message", "extra message", "wrong values")


def _describe(got: list[Action], want: list[Action], chunking: Chunking) -> tuple[str, str]:
    """(kind, 'you ...; the reference ...') for one rank's step."""
    exact = Counter(map(_key, got)) & Counter(map(_key, want))
    left_got, left_want = [], []
    for actions, left in ((got, left_got), (want, left_want)):
        budget = Counter(exact)
        for action in actions:
            if budget[_key(action)]:
                budget[_key(action)] -= 1
            else:
                left.append(action)
    found = []  # (kind, text)
    for sending in (True, False):
        pairs, extra, missing = _pair([a for a in left_got if a.sends == sending],
                                      [a for a in left_want if a.sends == sending])
        for mine, theirs in pairs:
            found.append(_compare(mine, theirs, chunking))
        for mine in extra:
            found.append(("extra message", f"you {_verb(_one(mine, chunking))}; the reference "
                          f"does not at this step"))
        for theirs in missing:
            found.append(("missing message",
                          f"you do not {_verb(_one(theirs, chunking))}; the reference does"))
    found.sort(key=lambda item: _PRIORITY.index(item[0]))
    return found[0][0], "; and ".join(text for _, text in found[:2])


def _verb(words: str) -> str:
    """'sends chunk 0 ...' -> 'send chunk 0 ...' (the student's 'you ...')."""
    first, _, rest = words.partition(" ")
    plain = {"sends": "send", "receives": "receive", "adds": "add"}.get(first, first)
    return f"{plain} {rest}"


def _compare(mine: Action, theirs: Action, chunking: Chunking) -> tuple[str, str]:
    name = chunking.name
    if mine.sends:
        if mine.span != theirs.span:
            to = "" if mine.peer == theirs.peer else f" to rank {mine.peer}"
            their_to = f" (to rank {theirs.peer})"
            return "wrong chunk", (f"you send {name(mine.span)}{to}; the reference sends "
                                   f"{name(theirs.span)}{their_to}")
        if mine.peer != theirs.peer:
            return "wrong peer", (f"you send {name(mine.span)} to rank {mine.peer}; the "
                                  f"reference sends it to rank {theirs.peer}")
        if mine.nbytes != theirs.nbytes:
            return "wrong size", (f"you send {mine.nbytes} bytes of {name(mine.span)}; the "
                                  f"reference sends {theirs.nbytes}")
        return "wrong values", (
            f"you send {name(mine.span)} to rank {mine.peer} with other values than the "
            "reference's: it holds something else at this step (what did your earlier "
            "steps write into it?)")
    verb = {"copy": "receive into", "add": "receive into"}  # copy or add: told below
    if mine.span != theirs.span:
        peer = "" if mine.peer == theirs.peer else f" (from rank {mine.peer})"
        return "wrong chunk", (f"you {verb[mine.kind]} {name(mine.span)}{peer}; the reference "
                               f"{_verb_s(verb[theirs.kind])} {name(theirs.span)} (from rank "
                               f"{theirs.peer})")
    if mine.peer != theirs.peer:
        return "wrong peer", (f"you {verb[mine.kind]} {name(mine.span)} from rank {mine.peer}; "
                              f"the reference's comes from rank {theirs.peer}")
    if mine.kind != theirs.kind:
        if mine.kind == "add":
            return "add instead of copy", (
                f"you add the message into {name(mine.span)} (irecv_reduce); the reference "
                f"copies it (irecv): what arrives is already the finished sum")
        return "copy instead of add", (
            f"you copy the message into {name(mine.span)} (irecv); the reference adds it "
            "(irecv_reduce), so that the partial sum grows by one rank")
    return "wrong size", (f"you receive {mine.nbytes} bytes into {name(mine.span)}; the "
                          f"reference receives {theirs.nbytes}")


def _verb_s(verb: str) -> str:
    """'receive into' -> 'receives into', 'add the message into' -> 'adds ...'."""
    first, _, rest = verb.partition(" ")
    return f"{first}s {rest}"
