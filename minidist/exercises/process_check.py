"""Running a student's function on real processes, for the exercises that are
not collectives (a strategy's step, a tensor-parallel layer): one launch per
world size with every case inside it, a short timeout, and the runtime's
verdict (a rank that raised, hung, or left while another waited for it)
turned into a :class:`~.exercise.Failure`; on request, the messages and
bytes the run sent, from its trace (the transports record every message). No process or segment outlives a
launch (:func:`minidist.launch` cleans up however it ends). And the verdict on
the weights a strategy step leaves on every rank (:func:`check_weights`).

The transformer exercises (an attention split by heads, ring attention's
merge, expert parallelism's dispatch) share one loop more
(:func:`check_beside_reference`): the reference runs after the student in
the same launch, so that the trace holds both runs' messages, and a wrong
case comes with the side-by-side replay of the student's call beside the
reference's (:func:`traced_calls`, :func:`replay_of_calls`, :func:`replay`).

Costs: one launch per world size, every case inside it; with a trace, the
trace file written by the launch and read back once.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np

from minidist import trace
from minidist.exercises.exercise import (
    CHECK_DEADLINE,
    CheckResult,
    ExerciseTimeout,
    Failure,
    deadline,
)
from minidist.tensor import Tensor

#: Seconds a blocking call may wait before the run is declared hung.
PROCESS_TIMEOUT = 3.0


def launch_checked(worker, n: int, args, what: str, traffic: bool = False,
                   transport: str = "pipe", events: bool = False, **launch_options):
    """``launch(worker, n, args)`` on ``transport`` (the pipes by default);
    (results, None) or (None, Failure). With ``traffic``, results is
    (results, (messages, bytes)): every message of the run, summed over
    ranks, read from its trace. With ``events``, results is (results, the
    trace's events, as dicts), for a checker that reads the run itself.
    ``launch_options`` go to the launch as they are (``tolerate_failures``
    for a checker that kills a rank on purpose, ``log_level``)."""
    from minidist.distributed.launch import launch
    from minidist.runtime.errors import DistributedError, OversubscriptionWarning, WorkerError

    try:
        with deadline(CHECK_DEADLINE, f"{what} on {n} processes"), warnings.catch_warnings(), \
                tempfile.TemporaryDirectory() as folder:
            # more ranks than cores is expected here, and no timing is checked
            warnings.simplefilter("ignore", OversubscriptionWarning)
            path = os.path.join(folder, "run.trace.jsonl") if traffic or events else None
            results = launch(worker, world_size=n, transport=transport, args=args,
                             timeout=PROCESS_TIMEOUT, trace=path, **launch_options)
            if events:
                return (results, trace.read_jsonl(path).events), None
            if traffic:
                sends = [event for event in trace.read_jsonl(path).events
                         if event["kind"] == "send"]
                results = results, (len(sends), sum(event["bytes"] for event in sends))
            return results, None
    except ExerciseTimeout as error:
        return None, Failure("hang", f"{error}: an endless loop, or a call only some ranks "
                             "make?")
    except WorkerError as error:
        if error.remote_type == "NotWrittenYet":
            return None, Failure("not written", f"{what} is not written yet: "
                                 f"{error.remote_message}")
        # "returned": a rank left while another waited for it (an unmatched call)
        kind = {"timeout": "hang", "returned": "unmatched"}.get(error.kind, "raised")
        text = str(error).strip()
        if kind == "hang" and "a deadlock" in text:
            kind = "deadlock"  # the runtime's report names who waits for whom
        if kind != "raised":  # the report says it all; the traceback only where it waited
            text = text.split("\nTraceback from")[0]
        lines = text.splitlines()
        return None, Failure(kind, f"on {n} processes: " + "\n".join(lines[:16]),
                             rank=error.rank)
    except DistributedError as error:
        return None, Failure("raised", f"on {n} processes: {error}")


def check_on_worlds(worker, function, world_sizes, what: str, compare, traffic):
    """The process check of a strategy exercise: ``worker(function)`` on each
    world size in turn (real processes, messages and bytes from the trace).
    Returns the first Failure, of the run or of ``compare(n, results)``; if
    every run is right, the traffic verdict ``traffic(n, messages, bytes)`` of
    the biggest world that has one (a waste shows most there); else None."""
    wasteful = None
    for n in world_sizes:
        run, failure = launch_checked(worker, n, (function,), what, traffic=True)
        if failure is None:
            results, (messages, nbytes) = run
            failure = compare(n, results)
            wasteful = traffic(n, messages, nbytes) or wasteful
        if failure is not None:
            return failure
    return wasteful


def check_weights(n: int, results, case: int, want, where: str, hint) -> Failure | None:
    """Every rank's weights of ``case`` (``results[rank][case]``, what a
    strategy step left there) against ``want``, to round-off. None if all
    are right; else the first rank's Failure: weights of another shape, or
    its first wrong element, said with ``where`` (the world and the case)
    and ``hint(rank, got)``: the mistake that explains ``got``, or ""."""
    for rank, answers in enumerate(results):
        got = answers[case]
        if not isinstance(got, np.ndarray) or got.shape != want.shape:
            return Failure("wrong shape", f"{n} ranks: rank {rank}'s weights became "
                           f"{getattr(got, 'shape', type(got).__name__)}, expected "
                           f"{want.shape}: update the weights in place", rank=rank)
        wrong = np.flatnonzero(~np.isclose(got, want, rtol=1e-9, atol=1e-12))
        if wrong.size:
            element = int(wrong[0])
            return Failure("wrong result", (
                f"{where}: rank {rank}, element {element} is {got[element]:.6g}, expected "
                f"{want[element]:.6g}{hint(rank, got)}"), rank=rank, element=element)
    return None


# --------------------------------------------------------------------------- beside the reference


def check_beside_reference(name: str, run, function, reference, what: str, judge, passed, *,
                           cases: int = 1, explain=None, world_sizes=(2, 4),
                           transport: str = "shm") -> CheckResult:
    """The process check of a transformer exercise. On each world size, one
    launch (real processes, float64): on every rank ``run(function, case)``
    for each case (in the trace region "case 0", ...), all in the region
    "yours", then the same with ``reference`` in "reference", for the
    reference's messages in the same trace (the replay draws them beside
    the student's). ``judge(n, case, the student's result of the case on
    every rank, the trace's events)`` says None or (Failure, replay or
    None). The report holds the first failure: of a run (told by
    ``explain(failure)`` when given) or of a case; else it passes with
    ``passed``, its first line after the words that say where it ran."""
    def each_case(solution):
        found = []
        for case in range(cases):
            with trace.region(f"case {case}"):
                found.append(run(solution, case))
        return found

    def worker(student):
        with trace.region("yours"):
            mine = each_case(student)
        with trace.region("reference"):
            each_case(reference)
        return mine

    report = CheckResult(name)
    for n in world_sizes:
        launched, failure = launch_checked(worker, n, (function,), what, transport=transport,
                                           events=True)
        if failure is not None:
            report.failure = failure if explain is None else explain(failure)
            return report
        results, events = launched
        for case in range(cases):
            verdict = judge(n, case, [result[case] for result in results], events)
            if verdict is not None:
                report.failure, report.replay = verdict
                return report
    worlds = " and ".join(map(str, world_sizes))
    report.passed += [f"real processes ({transport}, float64), {worlds} ranks{passed[0]}",
                      *passed[1:]]
    return report


def forward_backward(forward, inputs, grad_out, parameters=None):
    """One forward of ``forward(*inputs)`` (arrays, made tensors that want
    their gradient) and its backward from ``grad_out``, in the trace regions
    "forward" and "backward": (the output, the inputs' gradients,
    {name: gradient} of ``parameters``)."""
    tensors = [Tensor(array, requires_grad=True) for array in inputs]
    with trace.region("forward"):
        out = forward(*tensors)
    with trace.region("backward"):
        out.backward(grad_out)
    return (np.array(out.data), tuple(np.array(tensor.grad) for tensor in tensors),
            {name: np.array(parameter.grad) for name, parameter in (parameters or {}).items()})


@dataclass(frozen=True)
class TracedCall:
    """One collective call of rank 0, read from the trace: the innermost of
    the checker's named regions (``point``) it was made in, or None."""

    point: str | None
    collective: str
    count: int
    itemsize: int
    call: int           # the call's number in the trace (its messages carry it)


def _inside(event, region) -> bool:
    return region["start"] <= event["start"] and event["end"] <= region["end"]


def traced_calls(events, *regions: str, points=()) -> list[TracedCall]:
    """Rank 0's collective calls inside the nested trace regions ``regions``
    ("yours", then "case 1", ...: each the first of its label inside the
    one before), in the order made, each with the region of ``points``
    that holds it."""
    own = sorted((e for e in events if e["rank"] == 0), key=lambda e: e["start"])
    outer = None
    for label in regions:
        outer = next(e for e in own if e["kind"] == "compute" and e["label"] == label
                     and (outer is None or _inside(e, outer)))
    marked = [e for e in own if e["kind"] == "compute" and e["label"] in points
              and _inside(e, outer)]
    calls = []
    for event in own:
        if event["kind"] == "collective" and _inside(event, outer):
            info = trace.label_info(event["label"])
            point = next((p["label"] for p in marked if _inside(event, p)), None)
            calls.append(TracedCall(point, str(info.get("collective", "?")),
                                    int(info.get("count", 0)), int(info.get("itemsize", 8)),
                                    int(info.get("call", -1))))
    return calls


def replay(n: int, count: int, student, reference, first_difference, difference: str) -> dict:
    """What :mod:`viz.exercise_replay` draws: the student's trace events
    beside the reference's, on ``n`` ranks, ``count`` elements, the step
    ``first_difference`` marked (None: none) and ``difference`` said."""
    return {"world_size": n, "count": count, "student": student, "reference": reference,
            "first_difference": first_difference, "difference": difference}


def _call_events(events, call: int) -> list[dict]:
    """The trace events of one collective call of the world group."""
    return [e for e in events if e.get("group", 0) == 0 and e["kind"] != "compute"
            and trace.label_info(e.get("label") or "").get("call") == call]


def replay_of_calls(n: int, events, yours: TracedCall, theirs: TracedCall,
                    first_difference, difference: str) -> dict | None:
    """The replay of the student's call ``yours`` beside the reference's
    ``theirs``; None when the student's is not the world group's (a group
    of the student's own numbers its calls apart)."""
    student = _call_events(events, yours.call)
    if not any(event["kind"] == "collective" for event in student):
        return None
    return replay(n, yours.count, student, _call_events(events, theirs.call),
                  first_difference, difference)


def same(got, want, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    """``got`` is ``want``, its shape and its values to round-off."""
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))


def first_wrong(got, want, rtol: float = 1e-9, atol: float = 1e-12) -> tuple[int, ...]:
    """The index of ``got``'s first element that is not ``want``'s."""
    wrong = np.flatnonzero(~np.isclose(got, want, rtol=rtol, atol=atol))
    return tuple(int(i) for i in np.unravel_index(int(wrong[0]), want.shape))
