"""D2P, distributed delayed proximal gradient (Li, Andersen and Smola, 2013).

The paper's setting: L1-regularised logistic regression (any smooth loss
plus an L1 penalty), data split over W workers, weights held by a parameter
server. Minimise ``F(w) = (1/n) sum_i loss(x_i . w, y_i) + l1 ||w||_1``.

The algorithm, in the order the LSML lecture ("Распараллеливание нейросетей",
Large Scale Machine Learning, lecture 7) quotes it from the paper:

1. divide the coordinates into B blocks; fix the order ``b(0), ..., b(T-1)``
   in which blocks are updated (cyclic here: ``b(t) = t mod B``) and the
   maximal delay ``tau``;
2. at step t each worker computes the gradient of its loss with respect to
   block b(t) only, with the weights it holds, which may be up to tau steps
   old; it pushes that block gradient to the server, without waiting
   (optionally filtered: only coordinates that changed "significantly",
   by more than ``threshold`` since the worker last pushed them);
3. the server waits for the W pushes of step t, sums them and takes a
   proximal step on block b(t) only:
   ``w_b <- soft_threshold(w_b - step_size * g_b, step_size * l1)``;
4. the server sends the new block to every worker (the pull); a worker
   goes on to step t + 1 at once, as soon as its own push is out, unless it
   would break the delay bound.

The delay bound, exactly. Number steps from 0 and say a worker *holds*
step s when it has received (and written into its weights) the server's
block of step s; pulls are applied in step order, so a worker that holds
steps 0..k-1 has exactly the server's weights after k steps. **A worker may
start step t only when it holds step t - tau - 1** (that is, k >= t - tau);
it then computes with the weights after k steps, and its delay ``t - k``
(the number of updates it has not seen) is at most tau. tau = 0 is the
sequential proximal block gradient method: every step waits for the
previous one. Before blocking, a worker also takes any pulls that have
already arrived, so its delay is as small as the timing allows.

Cost per step, with ``|b| = d / B`` coordinates in the block and ``n_r``
examples on worker r (8-byte floats):

* worker: margins ``n_r d`` and block gradient ``n_r |b|`` multiply-adds;
  one push of ``8 |b|`` bytes and one pull of ``8 |b|`` bytes:
  ``2 (alpha + 8 |b| beta)``; with the filter the push becomes ``k``
  positions and ``k`` values (``2 (alpha + 8 k beta)``, two messages);
* server: receives W pushes and sends W pulls, ``2 W (alpha + 8 |b| beta)``
  through one link, the bottleneck as W grows (B blocks make each message
  B times smaller than pushing the whole model), plus ``W |b|`` additions;
* waiting: with tau = 0 every step is a synchronisation of all workers; with
  tau >= 1 a worker computes step t while the messages of steps t - tau ..
  t - 1 are still on their way, and waits only when it gets more than tau
  steps ahead. Fewer synchronisations per step, paid for by gradients
  computed on older weights (larger tau wants a smaller step size).

Two implementations share every numerical function, so they agree bit for
bit when they compute on the same weights: :func:`delayed_proximal_reference`,
one process with an explicit delay schedule (for tests and the lesson), and
:func:`delayed_proximal_gradient`, real processes (server rank 0, workers
1..W) over the public point-to-point API, every message labelled
``kind=push|pull block= step=`` (pushes also ``delay=``), all with ``tau=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import trace

SERVER = 0

# --------------------------------------------------------------------------- the numerics


def soft_threshold(values: np.ndarray, threshold: float) -> np.ndarray:
    """The proximal operator of ``threshold * ||.||_1``: shrink every value toward 0
    by ``threshold``, and set those within ``threshold`` of 0 to exactly 0:
    ``sign(v) * max(|v| - threshold, 0)``."""
    return np.sign(values) * np.maximum(np.abs(values) - threshold, 0.0)


def block_bounds(n_features: int, blocks: int) -> list[tuple[int, int]]:
    """``blocks`` contiguous ranges of coordinates, as even as possible."""
    if isinstance(blocks, bool) or int(blocks) != blocks or not 1 <= blocks <= n_features:
        raise ValueError(f"blocks must be a whole number from 1 to the number of features "
                         f"({n_features}), got {blocks!r}")
    edges = np.linspace(0, n_features, int(blocks) + 1).round().astype(int)
    return [(int(edges[i]), int(edges[i + 1])) for i in range(int(blocks))]


def block_order(steps: int, blocks: int) -> np.ndarray:
    """b(t) for t = 0..steps-1: the blocks in turn, ``t mod blocks``."""
    return np.arange(steps) % blocks


def shard_rows(n_examples: int, workers: int, worker: int) -> slice:
    """The contiguous examples of worker ``worker`` (0-based) of ``workers``."""
    edges = np.linspace(0, n_examples, workers + 1).round().astype(int)
    return slice(int(edges[worker]), int(edges[worker + 1]))


def objective(weights, features, labels, l1: float) -> float:
    """F(w) = mean logistic loss (labels in {0, 1}) + l1 * ||w||_1."""
    margins = features @ weights
    loss = np.mean(np.logaddexp(0.0, margins) - labels * margins)
    return float(loss + l1 * np.abs(weights).sum())


def shard_block_gradient(features, labels, weights, start: int, stop: int) -> np.ndarray:
    """The *sum* over this shard's examples of the logistic loss's gradient,
    coordinates ``start:stop`` only: ``X[:, b].T @ (sigmoid(X w) - y)``."""
    errors = 1.0 / (1.0 + np.exp(-(features @ weights))) - labels
    return features[:, start:stop].T @ errors


def significant_positions(gradient, last_pushed, threshold) -> np.ndarray:
    """Positions whose value moved by more than ``threshold`` since last pushed
    (all positions when ``threshold`` is None: no filter)."""
    if threshold is None:
        return np.arange(len(gradient))
    return np.flatnonzero(np.abs(gradient - last_pushed) > threshold)


def sum_in_worker_order(known_block_gradients: np.ndarray) -> np.ndarray:
    """Sum the workers' block gradients in worker order (a fixed order, so the
    result is the same bits in every implementation)."""
    total = known_block_gradients[0].copy()
    for gradient in known_block_gradients[1:]:
        total += gradient
    return total


def proximal_block_step(weights, start, stop, gradient_sum, n_examples, step_size, l1) -> None:
    """w_b <- soft_threshold(w_b - step_size * gradient_sum / n, step_size * l1), in place."""
    moved = weights[start:stop] - step_size * (gradient_sum / n_examples)
    weights[start:stop] = soft_threshold(moved, step_size * l1)


def default_step_size(features) -> float:
    """1 / L for the mean logistic loss, L = ||X||_2^2 / (4 n) bounding its curvature."""
    features = np.asarray(features, np.float64)
    return 4.0 * features.shape[0] / np.linalg.norm(features, 2) ** 2


def _check(features, labels, workers, blocks, steps, step_size, l1, threshold):
    features = np.asarray(features)
    if features.ndim != 2 or features.shape[0] < workers:
        raise ValueError(f"features must be a 2-D array with at least one example per worker "
                         f"({workers}), got shape {features.shape}")
    if np.shape(labels) != (features.shape[0],):
        raise ValueError(f"labels must have one entry per example ({features.shape[0]}), got "
                         f"shape {np.shape(labels)}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a whole number >= 0, got {steps!r}")
    if not step_size > 0:
        raise ValueError(f"step_size must be > 0, got {step_size!r}")
    if not l1 >= 0:
        raise ValueError(f"l1 must be >= 0, got {l1!r}")
    if threshold is not None and not threshold >= 0:
        raise ValueError(f"threshold must be None (push everything) or >= 0, got {threshold!r}")
    return block_bounds(features.shape[1], blocks)


# --------------------------------------------------------------------------- one process


@dataclass
class D2PResult:
    weights: np.ndarray
    objectives: list = field(default_factory=list)  # F after each step (reference only)
    pushed: int = 0  # coordinates pushed, over all workers and steps
    filtered: int = 0  # coordinates the significance filter held back


def max_delay_schedule(steps: int, workers: int, tau: int) -> np.ndarray:
    """The worst case the bound allows: every worker always tau steps behind
    (fewer at the start, where fewer steps exist): delays[t, r] = min(tau, t)."""
    return np.minimum(np.arange(steps), tau)[:, None].repeat(workers, axis=1)


def delayed_proximal_reference(features, labels, workers: int, blocks: int, steps: int,
                               step_size: float, l1: float, delays=None,
                               threshold=None) -> D2PResult:
    """D2P in one process. ``delays[t, r]`` is how many of the latest updates
    worker r has not seen at step t (0 <= delays[t, r] <= t; None: all 0): it
    computes on the weights after ``t - delays[t, r]`` steps."""
    bounds = _check(features, labels, workers, blocks, steps, step_size, l1, threshold)
    features, labels = np.asarray(features, np.float64), np.asarray(labels, np.float64)
    delays = (np.zeros((steps, workers), int) if delays is None
              else np.asarray(delays).reshape(steps, workers))
    if np.any(delays < 0) or np.any(delays > np.arange(steps)[:, None]):
        raise ValueError("delays[t, r] must be between 0 and t: a worker cannot miss updates "
                         "that have not happened yet")
    shards = [shard_rows(len(labels), workers, r) for r in range(workers)]
    history = [np.zeros(features.shape[1])]  # weights after 0, 1, ... steps
    known = np.zeros((workers, features.shape[1]))  # the server's view of each push
    last_pushed = np.zeros((workers, features.shape[1]))
    result = D2PResult(history[0])
    for t, block in enumerate(block_order(steps, blocks)):
        start, stop = bounds[block]
        for r, rows in enumerate(shards):
            seen = history[t - delays[t, r]]
            gradient = shard_block_gradient(features[rows], labels[rows], seen, start, stop)
            positions = significant_positions(gradient, last_pushed[r, start:stop], threshold)
            last_pushed[r, start:stop][positions] = gradient[positions]
            known[r, start:stop][positions] = gradient[positions]
            result.pushed += len(positions)
            result.filtered += (stop - start) - len(positions)
        weights = history[t].copy()
        proximal_block_step(weights, start, stop, sum_in_worker_order(known[:, start:stop]),
                            len(labels), step_size, l1)
        history.append(weights)
        result.objectives.append(objective(weights, features, labels, l1))
    result.weights = history[-1]
    return result


# --------------------------------------------------------------------------- processes


def delayed_proximal_gradient(features, labels, blocks: int, steps: int, step_size: float,
                              l1: float, tau: int, threshold=None, group=None) -> dict:
    """D2P on real processes: call it on every rank of ``group`` (the world by
    default). Group rank 0 is the server; ranks 1..W are the workers, worker r
    training on shard r - 1 of the examples (every rank passes all of them).

    The server returns ``{"weights", "pushed", "filtered"}``; a worker returns
    ``{"weights"}`` (equal to the server's once every pull is in), ``"delays"``
    (its delay at each step) and its ``"pushed"`` / ``"filtered"`` counts.
    """
    group = dist.world_group() if group is None else group
    workers = group.size - 1
    if workers < 1:
        raise ValueError(f"rank {dist.get_rank()}: D2P needs a server and at least one worker, "
                         f"but the group has {group.size} rank(s); launch 2 or more")
    if isinstance(tau, bool) or int(tau) != tau or tau < 0:
        raise ValueError(f"rank {dist.get_rank()}: tau (the maximal delay) must be a whole "
                         f"number >= 0, got {tau!r}")
    bounds = _check(features, labels, workers, blocks, steps, step_size, l1, threshold)
    channels = {name: group.with_context(f"d2p {name}") for name in ("push", "positions", "pull")}
    if group.rank == SERVER:
        return _serve(np.asarray(features).shape[1], len(labels), workers, bounds, blocks, steps,
                      step_size, l1, tau, threshold, channels)
    rows = shard_rows(len(labels), workers, group.rank - 1)
    return _work(np.asarray(features, np.float64)[rows], np.asarray(labels, np.float64)[rows],
                 np.asarray(features).shape[1], bounds, blocks, steps, tau, threshold, channels)


def _serve(n_features, n_examples, workers, bounds, blocks, steps, step_size, l1, tau,
           threshold, channels) -> dict:
    weights = np.zeros(n_features)
    known = np.zeros((workers, n_features))
    sends = []
    pushed = 0
    for t, block in enumerate(block_order(steps, blocks)):
        start, stop = bounds[block]
        label = trace.with_info("push", kind="push", block=int(block), step=t, tau=tau)
        for worker in range(1, workers + 1):
            target = known[worker - 1, start:stop]
            if threshold is None:
                channels["push"].recv(target, worker, t, label=label)
                pushed += stop - start
            else:
                positions = channels["positions"].recv_array(worker, t, label=label)
                target[positions] = channels["push"].recv_array(worker, t, label=label)
                pushed += len(positions)
        with trace.region(trace.with_info("proximal step", block=int(block), step=t)):
            proximal_block_step(weights, start, stop, sum_in_worker_order(known[:, start:stop]),
                                n_examples, step_size, l1)
        new_block = weights[start:stop].copy()  # isend reads it later; weights move on
        label = trace.with_info("pull", kind="pull", block=int(block), step=t, tau=tau)
        sends += [channels["pull"].isend(new_block, worker, t, label=label)
                  for worker in range(1, workers + 1)]
        sends = [request for request in sends if not request.is_completed()]
    dist.wait_all(sends)
    offered = workers * sum(stop - start for start, stop in
                            (bounds[block] for block in block_order(steps, blocks)))
    return {"weights": weights, "pushed": pushed, "filtered": offered - pushed}


def _work(features, labels, n_features, bounds, blocks, steps, tau, threshold, channels) -> dict:
    order = block_order(steps, blocks)
    weights = np.zeros(n_features)
    last_pushed = np.zeros(n_features)
    held = 0  # steps whose pulled block is in `weights`: they are the server's after `held` steps
    delays, sends, pushed, filtered = [], [], 0, 0

    def take_pull():
        nonlocal held
        start, stop = bounds[order[held]]
        label = trace.with_info("pull", kind="pull", block=int(order[held]), step=held, tau=tau)
        channels["pull"].recv(weights[start:stop], SERVER, held, label=label)
        held += 1

    for t, block in enumerate(order):
        while held < t - tau:  # the bound: hold step t - tau - 1 before starting step t
            take_pull()
        while held < t and channels["pull"].iprobe(SERVER, held) is not None:
            take_pull()  # already here: a fresher start costs nothing
        delays.append(t - held)
        start, stop = bounds[block]
        with trace.region(trace.with_info("block gradient", block=int(block), step=t)):
            gradient = shard_block_gradient(features, labels, weights, start, stop)
        label = trace.with_info("push", kind="push", block=int(block), step=t, delay=t - held,
                                tau=tau)
        if threshold is None:
            sends.append(channels["push"].isend(gradient, SERVER, t, label=label))
            pushed += stop - start
        else:
            positions = significant_positions(gradient, last_pushed[start:stop], threshold)
            last_pushed[start:stop][positions] = gradient[positions]
            sends.append(channels["positions"].isend(positions, SERVER, t, label=label))
            sends.append(channels["push"].isend(gradient[positions], SERVER, t, label=label))
            pushed += len(positions)
            filtered += (stop - start) - len(positions)
        sends = [request for request in sends if not request.is_completed()]
    while held < steps:
        take_pull()
    dist.wait_all(sends)
    return {"weights": weights, "delays": delays, "pushed": pushed, "filtered": filtered}
