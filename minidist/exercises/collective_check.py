"""The checker of the collective exercises: a student's algorithm against the
reference, on the simulator and on real processes.

A student writes a collective the way every algorithm of
``minidist/distributed/collectives`` is written: a generator on a ``comm``
(``comm.rank``, ``comm.size``, ``comm.isend``, ``comm.irecv``,
``comm.irecv_reduce``, ``comm.combine``) that yields each step's requests.
So the same function runs on the simulator (thousands of ranks as
generators in one process, see :mod:`minidist.distributed.simulator`) and on
real processes, traced the same way, and its call carries the reference
algorithm's tag.

What is checked, in order, stopping at the first failure:

1. every world size 1..8, with element counts 0, 1, fewer than the ranks,
   not divisible by them, divisible, and some roots, on the simulator:
   the result on every rank against NumPy (the first wrong rank and element
   are named, and the first step where the student's messages differ from
   the reference's, or first the empty step, a yield of no requests, if a
   rank made one); a hang (some rank waits for a message nobody sends) is
   told as the wait-for chain, "rank 0 waits for rank 1 (...), rank 1 waits
   for rank 0 (...)", at once, not after a timeout;
2. the messages and bytes, summed over ranks, against the algorithm's
   registered traffic (:mod:`minidist.distributed.collectives.registry`):
   a correct algorithm that sends k times the ring's bytes is told so;
3. a bigger simulated world (32 ranks);
4. real processes (the pipe transport), one launch per world size 1..8
   with all sizes inside it, with a short timeout.

Cost of a check: about 250 simulated calls of at most 32 ranks and 8
launches, a few seconds on a laptop.
"""

from __future__ import annotations

import re
import types
import zlib
from dataclasses import dataclass

import numpy as np

from minidist import trace as _trace
from minidist.distributed.collectives import call, registry
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.simulator import (
    SimulationError,
    SimulationStallError,
    drive,
    simulated_world,
)
from minidist.exercises.exercise import (
    CHECK_DEADLINE,
    CheckResult,
    ExerciseTimeout,
    Failure,
    NotWrittenYet,
    deadline,
    describe_error,
)
from minidist.exercises.message_diff import Action, Chunking, Difference, first_difference
from minidist.exercises.process_check import PROCESS_TIMEOUT, launch_checked
from minidist.runtime.errors import MessageMismatchError
from minidist.trace import FIELDS as _FIELDS

WORLD_SIZES = tuple(range(1, 9))
BIG_WORLD = 40  # not a power of two: the folds of recursive doubling run too


class NotAGenerator(TypeError):
    pass


@dataclass(frozen=True)
class CollectiveSpec:
    """Which collective an exercise writes and which registered algorithm it
    must match: the registry gives the tag and the traffic formula."""

    exercise: str
    collective: str            # "all_reduce" | "broadcast"
    algorithm: str             # the registry's name: "ring", "binomial", ...
    reference: object          # the reference generator
    title: str                 # "the ring": "sends 3.0 x the bytes of the ring"
    #: the exercise cuts the buffer into comm.size chunks (split(buffer, n)):
    #: the checker then names a message's part of the buffer by its chunk number
    chunked: bool = False

    @property
    def rooted(self) -> bool:
        return self.collective == "broadcast"


# --------------------------------------------------------------------------- the recording comm


class RecordingComm:
    """The ``comm`` a student's generator sees: the call's real
    :class:`~minidist.distributed.collectives.comm.Comm`, plus a record of
    every send and receive each rank posted (:class:`~.message_diff.Action`:
    step, peer, the part of the buffer, a checksum of the values sent), the
    phase each step is in (from ``comm.at``) and which receives the current
    step waits for (the wait-for chain). Steps are counted from 1."""

    def __init__(self, comm, buffer):
        self._comm = comm
        self._buffer = buffer
        self.rank = comm.rank
        self.size = comm.size
        self.actions: list[Action] = []
        self.phases: dict[int, str] = {}
        self.current: list = []
        self.labels: dict = {}  # id(receive) -> (source, the student's label)
        self.steps = 0          # steps finished; the current one is steps + 1
        self.finished = False
        self.empty_steps: list[int] = []  # the steps that yielded no request

    @property
    def sends(self) -> list[Action]:
        return [action for action in self.actions if action.sends]

    def _span(self, array) -> tuple[int, int] | None:
        """[first, stop) elements of the call's buffer that ``array`` views, or None."""
        buffer = self._buffer
        if array.dtype != buffer.dtype:
            return None
        if not array.size:
            # An empty view's address says nothing (NumPy may point it at the
            # buffer's start): all empty chunks are one "empty chunk" (0, 0).
            return (0, 0) if array.base is not None and (
                array.base is buffer or array.base is buffer.base) else None
        if not buffer.size:
            return None
        offset = array.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]
        first, rest = divmod(offset, buffer.itemsize)
        if rest or first < 0 or first + array.size > buffer.size or (
                array.size > 1 and array.strides != buffer.strides):
            return None
        return first, first + array.size

    def _peer(self, peer, what: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) \
                or not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what} names rank {peer!r}, but the ranks are "
                             f"0..{self.size - 1}: take the peer modulo comm.size")
        if peer == self.rank:
            verb = "send to" if what == "comm.isend" else "receive from"
            raise ValueError(f"rank {self.rank}: {what} names rank {peer}, this rank: a rank "
                             f"cannot {verb} itself (a message to yourself is just a copy)")
        return int(peer)

    @staticmethod
    def _array(array, what: str) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{what} takes a NumPy array (a chunk of the buffer), got "
                            f"{type(array).__name__}")
        return array

    def isend(self, array, to, label: str = ""):
        array = self._array(array, "comm.isend")
        to = self._peer(to, "comm.isend")
        self.actions.append(Action(self.steps + 1, "send", to, self._span(array), array.nbytes,
                                   zlib.crc32(np.ascontiguousarray(array).tobytes())))
        return self._comm.isend(array, to, label)

    def irecv(self, array, source, label: str = "", *, combined_into=None):
        array = self._array(array, "comm.irecv")
        source = self._peer(source, "comm.irecv")
        if combined_into is None:
            self.actions.append(Action(self.steps + 1, "copy", source, self._span(array),
                                       array.nbytes))
        else:
            self.actions.append(Action(self.steps + 1, "add", source, self._span(combined_into),
                                       array.nbytes))
        return self._remember(self._comm.irecv(array, source, label,
                                               combined_into=combined_into), source, label)

    def irecv_reduce(self, array, source, label: str = ""):
        array = self._array(array, "comm.irecv_reduce")
        source = self._peer(source, "comm.irecv_reduce")
        self.actions.append(Action(self.steps + 1, "add", source, self._span(array),
                                   array.nbytes))
        return self._remember(self._comm.irecv_reduce(array, source, label), source, label)

    def _remember(self, request, source, label):
        self.labels[id(request)] = (source, label or f"step {self.steps + 1}")
        return request

    def at(self, step: int, phase: str) -> None:
        self.phases[self.steps + 1] = phase
        self._comm.at(step, phase)

    def combine(self, array, incoming, out=None) -> None:
        self._comm.combine(array, incoming, out)

    def scratch(self, like):
        return self._comm.scratch(like)

    def steps_of(self, generator):
        """Run the student's generator, checking what each step yields."""
        if not isinstance(generator, types.GeneratorType):
            raise NotAGenerator(
                f"the function returned {type(generator).__name__}, not a generator: an "
                "algorithm yields each step's requests, `yield [comm.isend(...), "
                "comm.irecv(...)]`, and changes the buffer in place")
        for requests in generator:
            if isinstance(requests, (list, tuple)) and all(
                    hasattr(request, "test") and hasattr(request, "wait")
                    for request in requests):
                if not requests:
                    self.empty_steps.append(self.steps + 1)
                self.current = list(requests)
                yield list(requests)
                self.steps += 1
            else:
                raise TypeError(f"rank {self.rank} yielded {requests!r}: yield a list of the "
                                "step's requests, [comm.isend(...), comm.irecv(...)]")
        self.current = []
        self.finished = True

    def waits(self) -> list[tuple[int, str]]:
        """(source, label) of every receive of the current step not yet done."""
        return [self.labels[id(request)] for request in self.current
                if id(request) in self.labels and not request.done]


# --------------------------------------------------------------------------- one simulated call


def inputs(spec: CollectiveSpec, rank: int, count: int, root: int) -> np.ndarray:
    """Rank-dependent whole numbers in float64, every sum exact; a broadcast's
    non-roots start with -1 so that a missing copy shows."""
    if spec.rooted and rank != root:
        return np.full(count, -1.0)
    return 1.0 + 100.0 * rank + np.arange(count) % 97


def expected(spec: CollectiveSpec, n: int, count: int, root: int) -> np.ndarray:
    if spec.rooted:
        return inputs(spec, root, count, root)
    return sum(inputs(spec, rank, count, root) for rank in range(n))


def _start(spec, group, buffer, root):
    return call.start(spec.collective, group, spec.algorithm, nbytes=buffer.nbytes,
                      op=None if spec.rooted else ReduceOp.SUM,
                      ufunc=None if spec.rooted else np.add, dtype=buffer.dtype,
                      count=buffer.size, root=root, buffer=buffer)


def _call(function, comm, buffer, root, rooted):
    return function(comm, buffer, root) if rooted else function(comm, buffer)


@dataclass
class SimulatedCall:
    buffers: list
    comms: list
    events: list | None
    error: BaseException | None


def simulate_call(spec: CollectiveSpec, function, n: int, count: int, root: int = 0,
                  record: bool = False) -> SimulatedCall:
    """One call of ``function`` on ``n`` simulated ranks; never raises for the
    student's errors (they are in ``.error``)."""
    network, groups = simulated_world(n, record=record)
    buffers = [inputs(spec, rank, count, root) for rank in range(n)]
    comms, works = [], []
    error = None
    try:
        for rank, group in enumerate(groups):
            comm = _start(spec, group, buffers[rank], root)
            recorder = RecordingComm(comm, buffers[rank])
            comms.append(recorder)
            steps = recorder.steps_of(_call(function, recorder, buffers[rank], root, spec.rooted))
            works.append(call.execute(comm, steps, async_op=True))
        drive(network, works, f"{spec.exercise} on {n} ranks")
    except Exception as raised:  # noqa: BLE001 - the student's errors, judged by the caller
        error = raised
    events = [dict(zip(_FIELDS, event)) for event in network.events] if record else None
    return SimulatedCall(buffers, comms, events, error)


# --------------------------------------------------------------------------- judging one call


def _root_error(error: BaseException) -> BaseException:
    while isinstance(error, SimulationError) and error.__cause__ is not None:
        error = error.__cause__
    return error


def wait_for_chain(comms: list[RecordingComm]) -> tuple[str, bool]:
    """('rank 0 (step 1) waits for rank 1 (recv "x"), rank 1 (step 1) waits for
    rank 0 (recv "y"), back to rank 0: a cycle', True), or the chain ending at
    a rank that has finished without sending (False: a missing send, not a cycle)."""
    waits = {c.rank: c.waits() for c in comms if not c.finished}
    steps = {c.rank: c.steps + 1 for c in comms}
    if not waits:
        return "no rank is waiting", False
    start = min((rank for rank, found in waits.items() if found), default=min(waits))
    links, seen, rank, cycle = [], [], start, False
    while True:
        if rank in seen:
            links.append(f"back to rank {rank}: a cycle, so none of them can go on")
            cycle = True
            break
        seen.append(rank)
        if not waits[rank]:
            links.append(f"rank {rank} is stuck without a pending receive")
            break
        source, label = waits[rank][0]
        links.append(f"rank {rank} (step {steps[rank]}) waits for rank {source} "
                     f"(recv {label!r})")
        if source not in waits:
            links.append(f"but rank {source} has finished without sending it")
            break
        rank = source
    return ", ".join(links), cycle


def difference_from_reference(spec: CollectiveSpec, student: SimulatedCall, n: int,
                              count: int, root: int,
                              reference: SimulatedCall | None = None) -> Difference | None:
    """The first step where the student's posted messages differ from the
    reference's on the same case (see :mod:`.message_diff`)."""
    reference = reference or simulate_call(spec, spec.reference, n, count, root)
    if reference.error is not None:
        return None
    chunking = Chunking(count, n if spec.chunked else None)

    def phase_of(rank: int, step: int) -> str:
        return reference.comms[rank].phases.get(step, "") if rank < len(reference.comms) else ""

    return first_difference(student.comms, reference.comms, chunking, phase_of)


def _mistake_first(difference: Difference | None, kind: str, symptom: str, told: str,
                   **where) -> Failure:
    """The failure told mistake first when the messages show one: "rank 0,
    step 1 (reduce-scatter): you receive into chunk 0; the reference receives
    into chunk 3 (from rank 3). On 4 ranks, 16 elements (simulated): <symptom>";
    else the symptom alone."""
    if difference is None:
        return Failure(kind, symptom, **where)
    where.update(rank=difference.rank, step=difference.step)
    return Failure(difference.kind, f"{difference.text}. On {told} (simulated): {symptom}",
                   **where)


def _sizes(error: MessageMismatchError) -> str:
    """' (rank 1 got 3 elements for a receive of 2)' from the transport's
    words, or '' if they say it otherwise."""
    found = re.search(r"rank (\d+): .*message of shape \((\d+),?\).*buffer is \S+ of "
                      r"shape \((\d+),?\)", str(error))
    if found is None:
        return ""
    rank, got, room = found.groups()
    return f" (rank {rank} got {got} elements for a receive of {room})"


def judge_call(spec: CollectiveSpec, function, n: int, count: int, root: int):
    """(None, the call) if ``function`` gives the right result on this case; else a
    Failure, told as an empty step's when a rank yielded one (see :func:`_empty_step`)."""
    result = simulate_call(spec, function, n, count, root)
    judged = _judge_result(spec, result, n, count, root)
    if isinstance(judged, Failure):
        return _empty_step(result, judged) or judged
    return judged


def _empty_step(result: SimulatedCall, failure: Failure) -> Failure | None:
    """The failure of a call in which a rank yielded an empty step, told that
    mistake first: nothing moves in that step, so every step after it is one
    behind the algorithm's (the messages then look wrong from there on, and
    the replay of a run of empty steps has nothing to draw). None when no
    rank yielded one."""
    empty = [(comm.empty_steps[0], comm.rank) for comm in result.comms if comm.empty_steps]
    if failure.kind in ("not written", "not a generator") or not empty:
        return None
    step, rank = min(empty)
    ranks = sorted(rank for _, rank in empty)
    others = (f" (so did rank{'s' if len(ranks) > 2 else ''} "
              f"{', '.join(str(r) for r in ranks if r != rank)})" if len(ranks) > 1 else "")
    return Failure("empty step", (
        f"rank {rank}, step {step}: your generator yielded an empty step, a list of no "
        f"requests{others}: nothing is sent or received in it, and the algorithm's steps "
        "after it come one step late. Each yield is one step, its sends and receives "
        "together, [comm.isend(...), comm.irecv(...)]: yield only when there is something "
        f"to post. What followed: {failure.message}"),
        rank=rank, element=failure.element, step=step, case=failure.case)


def _judge_result(spec: CollectiveSpec, result: SimulatedCall, n: int, count: int, root: int):
    case = f"{n} ranks, {count} elements" + (f", root {root}" if spec.rooted else "")
    key = (n, count, root)
    if result.error is not None:
        error = _root_error(result.error)
        if isinstance(error, NotWrittenYet):
            return Failure("not written", f"{spec.exercise} is not written yet: {error}")
        if isinstance(error, NotAGenerator):
            return Failure("not a generator", f"{case}: {error}")
        if isinstance(error, ExerciseTimeout):
            raise error
        if isinstance(error, SimulationStallError):
            chain, cycle = wait_for_chain(result.comms)
            difference = difference_from_reference(spec, result, n, count, root)
            if cycle:
                first = (f" The first difference from the reference: {difference.text}."
                         if difference else "")
                return Failure("deadlock",
                               f"deadlock on {case} (simulated): {chain}.{first} Post each "
                               "step's sends and receives together, yield [comm.isend(...), "
                               "comm.irecv(...)], and check that every receive has a "
                               "matching send in the same step.", case=key,
                               rank=difference.rank if difference else None,
                               step=difference.step if difference else None)
            return _mistake_first(difference, "never sent",
                                  f"a receive nobody sends: {chain}: a missing send, or a "
                                  "receive too many.", case, case=key)
        if isinstance(error, MessageMismatchError):
            difference = difference_from_reference(spec, result, n, count, root)
            if difference is not None:
                symptom = f"a message did not fit its receive{_sizes(error)}" + (
                    ": the chunks of split(buffer, n) differ by one element when n does not "
                    "divide the count, so a receive into another chunk than the one sent "
                    "shows up as a size." if spec.chunked else ".")
            else:
                symptom = f"{case}: a message does not fit its receive: {error}"
            return _mistake_first(difference, "wrong message", symptom, case, case=key)
        return Failure("raised", f"{case}: your function raised {describe_error(error)}")
    want = expected(spec, n, count, root)
    for rank, got in enumerate(result.buffers):
        if got.shape != want.shape:
            return Failure("wrong shape", f"{case}: rank {rank}'s buffer has shape {got.shape}, "
                           f"expected {want.shape}: change the buffer in place", rank=rank)
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            element = int(wrong[0])
            difference = difference_from_reference(spec, result, n, count, root)
            outcome = (f"rank {rank}, element {element} ends as {got[element]:g}, expected "
                       f"{want[element]:g} ({wrong.size} wrong elements on this rank).")
            if difference is None:
                return Failure("wrong result", f"wrong result on {case}: {outcome}",
                               rank=rank, element=element, case=key)
            return _mistake_first(difference, "wrong result", f"a wrong result: {outcome}",
                                  case, element=element, case=key)
    return None, result


def traffic_of(result: SimulatedCall) -> tuple[int, int]:
    return (sum(len(c.sends) for c in result.comms),
            sum(send.nbytes for c in result.comms for send in c.sends))


def _formula(spec: CollectiveSpec) -> str:
    """The reference's cost formula as the lessons and the replay write it
    (α, β, βₓ, γ), not in the registry's names (alpha, xbeta, ...)."""
    from minidist.alpha_beta import in_symbols

    return in_symbols(registry.text(spec.collective, spec.algorithm))


def judge_traffic(spec: CollectiveSpec, result: SimulatedCall, n: int, count: int, root: int):
    """A Failure when the messages or bytes exceed the registered formula's."""
    if n < 2:
        return None
    messages, nbytes = traffic_of(result)
    want_messages, want_bytes = registry.traffic(spec.collective, spec.algorithm)(
        n, count, 8, root)
    case = f"{n} ranks, {count} elements"
    if nbytes > want_bytes:
        times = nbytes / want_bytes if want_bytes else float("inf")
        return Failure("wasteful", (
            f"correct, but it sends {times:.1f} x the bytes of {spec.title} on {case} "
            f"({nbytes:,} bytes in all, where {spec.title} sends {want_bytes:,}: "
            f"{_formula(spec)}). Send each piece "
            "only where it is needed."))
    if messages > want_messages:
        return Failure("wasteful", (
            f"correct, but it sends {messages / want_messages:.1f} x the messages of "
            f"{spec.title} on {case} ({messages} where {spec.title} sends {want_messages}): "
            "each message costs a latency α."))
    return None


# --------------------------------------------------------------------------- the check


def cases(n: int, rooted: bool):
    """(count, root) of world size n: empty, one element, fewer than the ranks,
    not divisible by them, divisible."""
    counts = sorted({0, 1, max(n - 1, 0), 2 * n + 1, 4 * n, 37})
    roots = sorted({0, n - 1, n // 2}) if rooted else [0]
    return [(count, root) for count in counts for root in roots]


def check_collective(spec: CollectiveSpec, function, *, processes: bool = True) -> CheckResult:
    """Everything the module docstring lists, on ``function``."""
    report = CheckResult(spec.exercise)
    try:
        with deadline(CHECK_DEADLINE, f"checking {spec.exercise} on the simulator"):
            failure = _check_simulated(spec, function, report)
    except ExerciseTimeout as error:
        failure = Failure("hang", f"{error}: an endless loop? (on the simulator no rank "
                          "ever waits for time, so a loop that waits for a message never "
                          "ends)")
    if failure is not None:
        report.failure = failure
        report.replay = replay_data(spec, function, failure)
        return report
    if processes:
        report.failure = _check_processes(spec, function, report)
    return report


def _check_simulated(spec, function, report):
    calls = 0
    for n in WORLD_SIZES:
        for count, root in cases(n, spec.rooted):
            judged = judge_call(spec, function, n, count, root)
            if isinstance(judged, Failure):
                return _showcase(spec, function, judged)
            failure = judge_traffic(spec, judged[1], n, count, root)
            if failure is not None:
                return _representative(spec, function, failure, (n, count, root))
            calls += 1
    report.passed.append(f"simulated: right results on every rank, {calls} calls of "
                         f"1-{WORLD_SIZES[-1]} ranks (0, 1, < n, not divisible, divisible "
                         "elements" + (", several roots" if spec.rooted else "") + ")")
    report.passed.append(f"messages and bytes within {spec.title}'s: "
                         f"{_formula(spec)}")
    count = 3 * BIG_WORLD + 5
    judged = judge_call(spec, function, BIG_WORLD, count, BIG_WORLD // 3)
    if isinstance(judged, Failure):
        return judged
    failure = judge_traffic(spec, judged[1], BIG_WORLD, count, BIG_WORLD // 3)
    if failure is not None:
        return failure
    report.passed.append(f"simulated: {BIG_WORLD} ranks, {count} elements")
    return None


def _representative(spec, function, failure, case):
    """The traffic failure told on 8 ranks and 64 elements (a ratio that
    means something) if it shows there too, else on the case that found it."""
    n, count, root = WORLD_SIZES[-1], 8 * WORLD_SIZES[-1], 0
    judged = judge_call(spec, function, n, count, root)
    if not isinstance(judged, Failure):
        bigger = judge_traffic(spec, judged[1], n, count, root)
        if bigger is not None:
            failure, case = bigger, (n, count, root)
    failure.case = case
    return failure


#: (ranks, elements) where a mistake is told and replayed if it shows there:
#: four ranks of four elements each show a ring, a tree or the doubling
#: rounds plainly, with every chunk non-empty.
SHOWCASE = (4, 16)

#: failures that no other case tells better (nothing was exchanged to compare)
_AS_FOUND = ("not written", "not a generator", "raised", "hang", "wrong shape")


def _showcase(spec, function, failure: Failure) -> Failure:
    """The failure told on :data:`SHOWCASE` (root 1 for a broadcast) if the
    student's call goes wrong there too, else as found: the message and the
    replay then show the same case, small and with no empty chunks."""
    n, count = SHOWCASE
    case = (n, count, 1 if spec.rooted else 0)
    if failure.kind in _AS_FOUND or failure.case == case:
        return failure
    judged = judge_call(spec, function, *case)
    if isinstance(judged, Failure) and judged.kind not in _AS_FOUND:
        return judged
    return failure


def replay_data(spec, function, failure: Failure) -> dict | None:
    """The traces of the student's and the reference's call on the failing
    case (at most 8 ranks), and the first differing step (counted from 1, as
    the replay's frames are); None when there is no case to replay."""
    if failure.case is None or failure.case[0] > 8:
        return None
    n, count, root = failure.case
    student = simulate_call(spec, function, n, count, root, record=True)
    reference = simulate_call(spec, spec.reference, n, count, root, record=True)
    if reference.error is not None:
        return None
    events = student.events if student.error is None else completed_events(student, reference)
    difference = difference_from_reference(spec, student, n, count, root, reference)
    return {"world_size": n, "count": count, "root": root,
            "student": events, "reference": reference.events,
            "first_difference": difference.step if difference else failure.step,
            "difference": difference.text if difference else failure.message.split(". ")[0]}


def completed_events(student: SimulatedCall, reference: SimulatedCall) -> list[dict]:
    """The trace of a student's call that stopped (a deadlock, a message that
    did not fit), made replayable: each rank's call event taken from the
    reference's run (same call, world and size), and each send that was never
    received paired with the receive its target posted for it, if any (so
    the replay shows where the student's code put it)."""
    events = list(student.events)
    called = {event["rank"] for event in events if event["kind"] == "collective"}
    events += [dict(event) for event in reference.events
               if event["kind"] == "collective" and event["rank"] not in called]
    received = {(event["peer"], event["rank"], event["seq"]) for event in events
                if event["kind"] == "recv"}
    sent_so_far: dict[tuple[int, int], int] = {}
    for send in [event for event in events if event["kind"] == "send"]:
        pair = (send["rank"], send["peer"])
        ordinal = sent_so_far[pair] = sent_so_far.get(pair, -1) + 1
        if (send["rank"], send["peer"], send["seq"]) in received \
                or send["peer"] >= len(student.comms):
            continue
        posted = [action for action in student.comms[send["peer"]].actions
                  if not action.sends and action.peer == send["rank"]]
        if ordinal >= len(posted):
            continue
        action = posted[ordinal]
        info = _trace.label_info(send["label"])
        label = _trace.with_info(_trace.label_text(send["label"]), call=info.get("call"),
                                 step=action.step - 1, range=action.span,
                                 op="combine" if action.kind == "add" else "copy")
        events.append({**send, "rank": send["peer"], "peer": send["rank"], "kind": "recv",
                       "label": label, "start": send["end"]})
    return events


# --------------------------------------------------------------------------- real processes


def _worker(spec, function, all_cases):
    import minidist.distributed as dist
    from minidist.distributed import world

    group = world.current().group
    n, results = dist.get_world_size(), []
    for count, root in all_cases:
        buffer = inputs(spec, group.rank, count, root)
        comm = _start(spec, group, buffer, root)
        recorder = RecordingComm(comm, buffer)
        call.execute(comm, recorder.steps_of(_call(function, recorder, buffer, root,
                                                   spec.rooted)), False,
                     timeout=PROCESS_TIMEOUT)
        results.append(buffer)
    assert n == group.size
    return results


def _check_processes(spec, function, report) -> Failure | None:
    for n in WORLD_SIZES:
        all_cases = cases(n, spec.rooted)
        results, failure = launch_checked(_worker, n, (spec, function, all_cases),
                                          spec.exercise)
        if failure is not None:
            return failure
        for rank, buffers in enumerate(results):
            for (count, root), got in zip(all_cases, buffers):
                want = expected(spec, n, count, root)
                wrong = np.flatnonzero(got != want)
                if wrong.size:
                    element = int(wrong[0])
                    return Failure("wrong result", (
                        f"wrong result on {n} processes, {count} elements: rank {rank}, "
                        f"element {element} is {got[element]:g}, expected {want[element]:g} "
                        "(the simulator agreed with the reference: does your code depend on "
                        "timing, or write a buffer another request still reads?)"),
                        rank=rank, element=element)
    report.passed.append(f"real processes (pipe transport): world sizes 1-{WORLD_SIZES[-1]}, "
                         "the same sizes, right results on every rank")
    return None
