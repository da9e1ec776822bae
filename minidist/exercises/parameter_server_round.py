"""Exercise: one push/pull round of a parameter server (lesson 7).

Rank 0 is the server and holds the weights; ranks 1..n-1 are workers, each
with a gradient. Push: every worker sends its gradient to the server. The
server averages the workers' gradients and takes an SGD step. Pull: every
worker receives the new weights. Written with point-to-point messages
(``dist.send`` / ``dist.recv``), as :mod:`minidist.parallel.parameter_server.server`
is.

Checked on real processes, world sizes 2..5: every rank's weights against
NumPy's ``w - lr * mean of the workers' gradients``; the messages and bytes
of the run (from its trace) against push + pull; a worker that waits
for a pull the server never sends is reported by the runtime, naming it.
"""

from __future__ import annotations

from functools import partial

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import check_on_worlds, check_weights

WORLD_SIZES = (2, 3, 4, 5)
LR = 0.25
SIZES = (1, 6, 9)


def parameter_server_round(weights, gradient, lr):
    """One synchronous round; weights updated in place on every rank. The server
    receives (n - 1) P and sends (n - 1) P values: 2 (n - 1) messages through
    its one link."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = np.zeros_like(weights)
        incoming = np.empty_like(weights)
        for worker in range(1, n):
            dist.recv(incoming, src=worker, tag=1)  # push
            total += incoming
        weights -= lr * total / (n - 1)
        for worker in range(1, n):
            dist.send(weights, dst=worker, tag=2)  # pull
    else:
        dist.send(gradient, dst=0, tag=1)
        dist.recv(weights, src=0, tag=2)


def _data(n, size):
    generator = np.random.default_rng(7 * n + size)
    return generator.standard_normal(size), generator.standard_normal((n, size))


def _worker(function):
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for size in SIZES:
        weights, gradients = _data(n, size)
        function(weights, gradients[rank].copy(), LR)
        results.append(weights)
    return results


def check(function, **options) -> CheckResult:
    report = CheckResult("parameter_server_round")
    report.failure = check_on_worlds(_worker, function, WORLD_SIZES, "parameter_server_round",
                                     _compare, _traffic)
    if report.failure is not None:
        return report
    report.passed.append(f"real processes, world sizes {WORLD_SIZES[0]}-{WORLD_SIZES[-1]}: "
                         "every rank holds w - lr * the workers' average gradient")
    report.passed.append("2 (n - 1) messages of P values per round, from the trace")
    return report


def _traffic(n, messages, nbytes):
    """The round's messages against push + pull: 2 (n - 1) of P values each."""
    want_messages = len(SIZES) * 2 * (n - 1)
    want_bytes = sum(2 * (n - 1) * 8 * size for size in SIZES)
    if nbytes > want_bytes or messages > want_messages:
        return Failure("wasteful", (
            f"correct, but on {n} ranks the rounds sent {messages} messages and {nbytes:,} "
            f"bytes, {nbytes / want_bytes:.1f} x the bytes and "
            f"{messages / want_messages:.1f} x the messages of push + pull "
            f"({want_messages} messages of P values, {want_bytes:,} bytes): each worker "
            "pushes its gradient once and pulls the weights once"))
    return None


def _compare(n, results):
    for case, size in enumerate(SIZES):
        weights, gradients = _data(n, size)
        want = weights - LR * gradients[1:].mean(axis=0)
        with_server = weights - LR * gradients.mean(axis=0)
        failure = check_weights(n, results, case, want, f"{n} ranks, {size} parameters",
                                partial(_hint, weights, with_server))
        if failure is not None:
            return failure
    return None


def _hint(weights, with_server, rank, got):
    """The likely mistake behind rank ``rank``'s wrong weights ``got``, or ""."""
    if np.allclose(got, with_server):
        return (": the server's own gradient was averaged in; the server has none, average "
                "over the n - 1 workers")
    if np.allclose(got, weights):
        return ": unchanged; did this rank pull the new weights?"
    return ""


EXERCISE = Exercise(
    name="parameter_server_round", function="parameter_server_round",
    summary="one push/pull round of a parameter server, with send and recv",
    lesson="lessons/07_parameter_server.py", reference=parameter_server_round, check=check)
