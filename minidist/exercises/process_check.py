"""Running a student's function on real processes, for the exercises that are
not collectives (a strategy's step, a tensor-parallel layer): one launch per
world size with every case inside it, a short timeout, and the runtime's
verdict (a rank that raised, hung, or left while another waited for it)
turned into a :class:`~.exercise.Failure`; on request, the messages and
bytes the run sent, from its trace (the transports record every message). No process or segment outlives a
launch (:func:`minidist.launch` cleans up however it ends). And the verdict on
the weights a strategy step leaves on every rank (:func:`check_weights`).
"""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np

from minidist.exercises.exercise import CHECK_DEADLINE, ExerciseTimeout, Failure, deadline
from minidist.trace import read_jsonl

#: Seconds a blocking call may wait before the run is declared hung.
PROCESS_TIMEOUT = 3.0


def launch_checked(worker, n: int, args, what: str, traffic: bool = False,
                   transport: str = "pipe", events: bool = False):
    """``launch(worker, n, args)`` on ``transport`` (the pipes by default);
    (results, None) or (None, Failure). With ``traffic``, results is
    (results, (messages, bytes)): every message of the run, summed over
    ranks, read from its trace. With ``events``, results is (results, the
    trace's events, as dicts), for a checker that reads the run itself."""
    from minidist.distributed.launch import launch
    from minidist.runtime.errors import DistributedError, OversubscriptionWarning, WorkerError

    try:
        with deadline(CHECK_DEADLINE, f"{what} on {n} processes"), warnings.catch_warnings(), \
                tempfile.TemporaryDirectory() as folder:
            # more ranks than cores is expected here, and no timing is checked
            warnings.simplefilter("ignore", OversubscriptionWarning)
            path = os.path.join(folder, "run.trace.jsonl") if traffic or events else None
            results = launch(worker, world_size=n, transport=transport, args=args,
                             timeout=PROCESS_TIMEOUT, trace=path)
            if events:
                return (results, read_jsonl(path).events), None
            if traffic:
                sends = [event for event in read_jsonl(path).events
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
