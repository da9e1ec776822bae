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
   the reference's); a hang (some rank waits for a message nobody sends) is
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

import types
import zlib
from dataclasses import dataclass

import numpy as np

from minidist.distributed.collectives import call, registry
from minidist.distributed.collectives.comm import _Receive
from minidist.distributed.process_group import ProcessGroup
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.simulator import SimulationError, drive
from minidist.distributed.transport.sim import SimNetwork, SimulationStallError
from minidist.exercises.exercise import (
    CHECK_DEADLINE,
    CheckResult,
    ExerciseTimeout,
    Failure,
    NotWrittenYet,
    deadline,
    describe_error,
)
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

    @property
    def rooted(self) -> bool:
        return self.collective == "broadcast"


# --------------------------------------------------------------------------- the recording comm


class RecordingComm:
    """The ``comm`` a student's generator sees: the call's real
    :class:`~minidist.distributed.collectives.comm.Comm`, plus a record of
    what each rank sent (step, peer, bytes, a checksum of the values) and
    which receives the current step waits for (the wait-for chain)."""

    def __init__(self, comm):
        self._comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.sends: list[tuple[int, int, int, int]] = []
        self.current: list = []
        self.labels: dict = {}  # id(receive) -> (source, the student's label)
        self.steps = 0
        self.finished = False

    def _peer(self, peer, what: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) \
                or not 0 <= peer < self.size:
            raise ValueError(f"rank {self.rank}: {what} names rank {peer!r}, but the ranks are "
                             f"0..{self.size - 1}: take the peer modulo comm.size")
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
        self.sends.append((self.steps, to, array.nbytes,
                           zlib.crc32(np.ascontiguousarray(array).tobytes())))
        return self._comm.isend(array, to, label)

    def irecv(self, array, source, label: str = "", *, combined_into=None):
        array = self._array(array, "comm.irecv")
        source = self._peer(source, "comm.irecv")
        return self._remember(self._comm.irecv(array, source, label,
                                               combined_into=combined_into), source, label)

    def irecv_reduce(self, array, source, label: str = ""):
        array = self._array(array, "comm.irecv_reduce")
        source = self._peer(source, "comm.irecv_reduce")
        return self._remember(self._comm.irecv_reduce(array, source, label), source, label)

    def _remember(self, request, source, label):
        self.labels[id(request)] = (source, label or f"step {self.steps}")
        return request

    def at(self, step: int, phase: str) -> None:
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
        return [self.labels.get(id(request), (request.source, ""))
                for request in self.current
                if type(request) is _Receive and not request.done]


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
    network = SimNetwork(n, 1e-6, 1e-9, 0.0, record=record)
    buffers = [inputs(spec, rank, count, root) for rank in range(n)]
    comms, works = [], []
    error = None
    try:
        for rank in range(n):
            group = ProcessGroup(network.transports[rank], range(n), 0)
            comm = _start(spec, group, buffers[rank], root)
            recorder = RecordingComm(comm)
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
    """('rank 0 waits for rank 1 (recv "x"), rank 1 waits for rank 0 (recv "y"),
    back to rank 0: a cycle', True), or the chain ending at a rank that has
    finished without sending (False: a missing send, not a cycle)."""
    waits = {c.rank: c.waits() for c in comms if not c.finished}
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
        links.append(f"rank {rank} waits for rank {source} (recv {label!r})")
        if source not in waits:
            links.append(f"but rank {source} has finished without sending it")
            break
        rank = source
    return ", ".join(links), cycle


def _describe_send(send) -> str:
    if send is None:
        return "nothing"
    _, peer, nbytes, _ = send
    return f"{nbytes // 8} elements ({nbytes} bytes) to rank {peer}"


def _in_step_order(sends):
    """The sends in order of steps, sorted by (peer, bytes, values) inside a step:
    the order of the sends of one step is free."""
    return sorted(sends, key=lambda send: (send[0], send[1], send[2], send[3]))


def first_difference(student: list[RecordingComm], reference: list[RecordingComm]):
    """(rank, step, text) of the earliest message where the student's sends
    differ from the reference's (peer, size or values), or None."""
    found = None
    for mine, theirs in zip(student, reference):
        a, b = _in_step_order(mine.sends), _in_step_order(theirs.sends)
        for index in range(max(len(a), len(b))):
            got = a[index] if index < len(a) else None
            want = b[index] if index < len(b) else None
            if got is not None and want is not None and got[1:] == want[1:]:
                continue
            step = got[0] if got is not None else (a[-1][0] + 1 if a else 0)
            if got is not None and want is not None and got[1:3] == want[1:3]:
                what = (f"you send {_describe_send(got)} with other values than the "
                        "reference (a wrong chunk, or one not yet combined?)")
            else:
                what = f"you send {_describe_send(got)}; the reference sends {_describe_send(want)}"
            key = (step, mine.rank)
            if found is None or key < found[:2]:
                found = (step, mine.rank, what)
            break
    if found is None:
        return None
    step, rank, what = found
    return rank, step, f"rank {rank}, step {step}: {what}"


def judge_call(spec: CollectiveSpec, function, n: int, count: int, root: int):
    """None if ``function`` gives the right result on this case; else a Failure."""
    case = f"{n} ranks, {count} elements" + (f", root {root}" if spec.rooted else "")
    result = simulate_call(spec, function, n, count, root)
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
            if cycle:
                return Failure("deadlock",
                               f"deadlock on {case} (simulated): {chain}. Post each step's "
                               "sends and receives together, yield [comm.isend(...), "
                               "comm.irecv(...)], and check that every receive has a "
                               "matching send in the same step.", case=(n, count, root))
            reference = simulate_call(spec, spec.reference, n, count, root)
            difference = first_difference(result.comms, reference.comms)
            where = (f" First difference from the reference's messages: {difference[2]}."
                     if difference else "")
            return Failure("never sent",
                           f"a receive nobody sends, on {case} (simulated): {chain}: a "
                           f"missing send, or a receive too many.{where}",
                           step=difference[1] if difference else None, case=(n, count, root))
        if isinstance(error, MessageMismatchError):
            reference = simulate_call(spec, spec.reference, n, count, root)
            difference = first_difference(result.comms, reference.comms)
            where = (f" First difference from the reference's messages: {difference[2]}."
                     if difference else "")
            return Failure("wrong message",
                           f"{case}: a message does not fit its receive: {error}{where}",
                           step=difference[1] if difference else None, case=(n, count, root))
        return Failure("raised", f"{case}: your function raised {describe_error(error)}")
    want = expected(spec, n, count, root)
    for rank, got in enumerate(result.buffers):
        if got.shape != want.shape:
            return Failure("wrong shape", f"{case}: rank {rank}'s buffer has shape {got.shape}, "
                           f"expected {want.shape}: change the buffer in place", rank=rank)
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            element = int(wrong[0])
            reference = simulate_call(spec, spec.reference, n, count, root)
            difference = first_difference(result.comms, reference.comms)
            where = (f" First difference from the reference's messages: {difference[2]}."
                     if difference else "")
            return Failure(
                "wrong result",
                f"wrong result on {case}: rank {rank}, element {element} is "
                f"{got[element]:g}, expected {want[element]:g} ({wrong.size} wrong elements "
                f"on this rank).{where}", rank=rank, element=element,
                step=difference[1] if difference else None, case=(n, count, root))
    return None, result


def traffic_of(result: SimulatedCall) -> tuple[int, int]:
    return (sum(len(c.sends) for c in result.comms),
            sum(send[2] for c in result.comms for send in c.sends))


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
            f"{registry.text(spec.collective, spec.algorithm)}). Send each piece "
            "only where it is needed."))
    if messages > want_messages:
        return Failure("wasteful", (
            f"correct, but it sends {messages / want_messages:.1f} x the messages of "
            f"{spec.title} on {case} ({messages} where {spec.title} sends {want_messages}): "
            "each message costs a latency alpha."))
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
        if failure.kind in ("wrong result", "wasteful"):
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
                return judged
            failure = judge_traffic(spec, judged[1], n, count, root)
            if failure is not None:
                return _representative(spec, function, failure, (n, count, root))
            calls += 1
    report.passed.append(f"simulated: right results on every rank, {calls} calls of "
                         f"1-{WORLD_SIZES[-1]} ranks (0, 1, < n, not divisible, divisible "
                         "elements" + (", several roots" if spec.rooted else "") + ")")
    report.passed.append(f"messages and bytes within {spec.title}'s: "
                         f"{registry.text(spec.collective, spec.algorithm)}")
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


def replay_data(spec, function, failure: Failure) -> dict | None:
    """The traces of the student's and the reference's call on the first
    failing case with at most 8 ranks, and the first differing step."""
    case = failure.case
    if case is None or case[0] > 8:
        return None
    # Four ranks and four elements each show a ring, a tree or the doubling
    # rounds plainly: replay there if the student's call goes wrong there too.
    judged = judge_call(spec, function, 4, 16, 0 if not spec.rooted else 1)
    if isinstance(judged, Failure) and judged.kind in ("wrong result",):
        case = (4, 16, 0 if not spec.rooted else 1)
    elif not isinstance(judged, Failure) and failure.kind == "wasteful" \
            and judge_traffic(spec, judged[1], 4, 16, 0) is not None:
        case = (4, 16, 0)
    n, count, root = case
    student = simulate_call(spec, function, n, count, root, record=True)
    reference = simulate_call(spec, spec.reference, n, count, root, record=True)
    if student.error is not None or reference.error is not None:
        return None
    difference = first_difference(student.comms, reference.comms)
    return {"world_size": n, "count": count, "root": root,
            "student": student.events, "reference": reference.events,
            "first_difference": None if difference is None else difference[1],
            "difference": None if difference is None else difference[2]}


# --------------------------------------------------------------------------- real processes


def _worker(spec, function, all_cases):
    import minidist.distributed as dist
    from minidist.distributed import world

    group = world.current().group
    n, results = dist.get_world_size(), []
    for count, root in all_cases:
        buffer = inputs(spec, group.rank, count, root)
        comm = _start(spec, group, buffer, root)
        recorder = RecordingComm(comm)
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
