"""Exercise: DiLoCo's outer step (Douillard et al., 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models"; :mod:`minidist.parallel.data.diloco`).

Every rank has taken H inner steps on its own batches, from the weights of
the last sync theta (the same on every rank) to its own theta_r. The outer
step, on every rank:

1. the pseudo-gradient Delta_r = theta - theta_r (the way the weights moved,
   reversed, so that it points like a gradient);
2. its mean over the ranks, Delta = (1/n) sum_r Delta_r: one all_reduce of
   the P values, the step's only message, 2 (n - 1) / n P values per rank on
   the ring, once every H steps;
3. SGD with Nesterov momentum, torch's formula: buf = mu buf + Delta,
   update = Delta + mu buf, and theta -= lr update, **from theta**, not from
   theta_r: the inner steps only served to measure Delta;
4. every rank holds the new theta, as its weights and as the next last-sync
   weights; the momentum buffer (the same on every rank) carries over.

Checked on real processes (2 and 3 ranks, float64, an odd P that no ring
splits evenly), three outer steps in a row, each after different inner
displacements on every rank: the weights, theta and the momentum of every
rank against NumPy's. A wrong answer is told by the mistake that explains
it: the pseudo-gradient's sign flipped, the step taken from the inner
weights, plain momentum for Nesterov's, the pseudo-gradients not averaged
(or summed), the weights averaged with no outer optimizer (local SGD), the
momentum or theta not kept for the next step.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.exercises.exercise import CheckResult, Exercise, Failure
from minidist.exercises.process_check import check_weights, launch_checked

WORLD_SIZES = (2, 3)
SIZE = 7          # parameters: odd, so that no ring chunks them evenly
ROUNDS = 3        # outer steps in a row: the momentum matters from the second
LR, MU = 0.7, 0.9  # the paper's outer rate and momentum


def diloco_outer_step(weights, last_sync, momentum, lr, mu):
    """One outer step; ``weights`` (this rank's after the inner steps),
    ``last_sync`` and ``momentum`` (the same on every rank) updated in place.
    One all_reduce of P values: 2 (n - 1) / n P values sent per rank (ring)."""
    delta = last_sync - weights                     # points like a gradient
    dist.all_reduce(delta)
    delta /= dist.get_world_size()
    momentum *= mu
    momentum += delta                               # buf = mu buf + g
    last_sync -= lr * (delta + mu * momentum)       # Nesterov: g + mu buf, from theta
    weights[...] = last_sync


def _start():
    return np.random.default_rng(11).standard_normal(SIZE)


def _displacement(n, rank, step):
    """What rank ``rank``'s inner steps of outer step ``step`` moved its weights by."""
    return 0.1 * np.random.default_rng([n, rank, step]).standard_normal(SIZE)


def _worker(function):
    rank, n = dist.get_rank(), dist.get_world_size()
    last_sync, momentum = _start(), np.zeros(SIZE)
    found = []
    for step in range(ROUNDS):
        weights = last_sync + _displacement(n, rank, step)   # after H inner steps
        function(weights, last_sync, momentum, LR, MU)
        found.append((weights.copy(), last_sync.copy(), momentum.copy()))
    return found


def _reference(n):
    """Per step: (the inner weights of every rank, theta and buf before, after)."""
    theta, buf, steps = _start(), np.zeros(SIZE), []
    for step in range(ROUNDS):
        inner = [theta + _displacement(n, rank, step) for rank in range(n)]
        delta = np.mean([theta - w for w in inner], axis=0)
        new_buf = MU * buf + delta
        new_theta = theta - LR * (delta + MU * new_buf)
        steps.append((inner, theta, buf, new_theta, new_buf))
        theta, buf = new_theta, new_buf
    return steps


def _mistakes(n, rank, inner, theta, buf):
    """What each known mistake leaves on rank ``rank``, from the step's inputs,
    with the words that explain it."""
    mine = theta - inner[rank]
    mean = np.mean([theta - w for w in inner], axis=0)

    def nesterov(delta, start=theta):
        return start - LR * (delta + MU * (MU * buf + delta))

    return [
        (nesterov(-mean), "the pseudo-gradient's sign is flipped: it is (last-sync weights) - "
         "(weights after the inner steps), theta - theta_r, which points like a gradient, so "
         "that the outer step `-= lr * update` moves the way the inner steps went"),
        (nesterov(mean, start=inner[rank]), "the outer step was applied to this rank's inner "
         "weights; apply it from the last-sync weights: theta_new = theta - lr * update (the "
         "inner steps only measure the pseudo-gradient; every rank must start from the same "
         "theta to end equal)"),
        (theta - LR * (MU * buf + mean), "that is plain (heavy-ball) momentum, update = buf; "
         "Nesterov's, torch's nesterov=True, looks ahead: update = g + mu * buf, after buf = "
         "mu * buf + g"),
        (nesterov(mine), "the pseudo-gradient was not averaged over the ranks: each rank "
         "stepped with its own theta - theta_r; all_reduce it and divide by the world size"),
        (nesterov(n * mean), "the pseudo-gradients were summed, not averaged: divide the "
         "all_reduce's sum by the world size"),
        (np.mean(inner, axis=0), "that is the average of the ranks' weights, local SGD: "
         "DiLoCo treats the averaged pseudo-gradient as a gradient for an outer optimizer "
         "(SGD with Nesterov momentum, lr and mu given) instead of taking the average"),
        (theta - LR * (1 + MU) * mean, "the momentum buffer did not carry over from the last "
         "outer step (buf started from zero again): update `momentum` in place, "
         "buf = mu * buf + g"),
    ]


def _compare(n, results):
    for step, (inner, theta, buf, new_theta, new_buf) in enumerate(_reference(n)):
        where = f"{n} ranks, outer step {step + 1} of {ROUNDS}"

        def hint(rank, got, inner=inner, theta=theta, buf=buf):
            for wrong, words in _mistakes(n, rank, inner, theta, buf):
                if np.allclose(got, wrong, rtol=1e-9, atol=1e-12):
                    return ": " + words
            if np.allclose(got, theta) or np.allclose(got, inner[rank]):
                return ": unchanged; write the new theta into `weights` on every rank"
            return ""

        weights = [[answer[0] for answer in rank_results] for rank_results in results]
        failure = check_weights(n, weights, step, new_theta, where, hint)
        if failure is not None:
            return failure
        for rank, rank_results in enumerate(results):
            _, kept, momentum = rank_results[step]
            if not np.allclose(momentum, new_buf, rtol=1e-9, atol=1e-12):
                return Failure("wrong result", (
                    f"{where}: the weights are right but rank {rank}'s `momentum` is not "
                    "buf = mu * buf + g: update the buffer in place (momentum *= mu; "
                    "momentum += g), the next outer step needs it"), rank=rank, step=step)
            if not np.allclose(kept, new_theta, rtol=1e-9, atol=1e-12):
                return Failure("wrong result", (
                    f"{where}: the weights are right but rank {rank}'s `last_sync` was not "
                    "set to them: the new theta is also the next outer step's last-sync "
                    "weights (update last_sync in place)"), rank=rank, step=step)
    return None


def check(function, **options) -> CheckResult:
    report = CheckResult("diloco_outer_step")
    for n in WORLD_SIZES:
        results, failure = launch_checked(_worker, n, (function,), "diloco_outer_step")
        if failure is None:
            failure = _compare(n, results)
        if failure is not None:
            report.failure = failure
            return report
    report.passed.append(f"real processes, {' and '.join(map(str, WORLD_SIZES))} ranks, "
                         f"{ROUNDS} outer steps in a row: every rank holds theta - lr (g + mu "
                         "buf), g the mean pseudo-gradient, buf = mu buf + g (torch's Nesterov)")
    report.passed.append("the momentum buffer and the last-sync weights carried to the next "
                         "outer step on every rank")
    return report


EXERCISE = Exercise(
    name="diloco_outer_step", function="diloco_outer_step",
    summary="DiLoCo's outer step: the averaged pseudo-gradient, then SGD with Nesterov momentum",
    lesson="lessons/22_failures_and_slow_links.py", reference=diloco_outer_step, check=check)
