"""Parameter server: workers push gradients, servers update, workers pull weights.

The LSML lecture's picture ("Распараллеливание нейросетей", Large Scale
Machine Learning, lecture 7), on linear regression:

1. every worker reads its own part of the data and computes a gradient ``g``
   on the weights it holds;
2. it **pushes** ``g`` to the parameter server;
3. the server updates its weights ``w`` from the pushes it receives;
4. the worker **pulls** the updated ``w`` and goes on with the next step.

Read in this order: :mod:`.layout` (which ranks serve, which keys each
server owns), :mod:`.messages` (a worker's request and a server's reply),
:mod:`.shard` (one server's range and the consistency modes, ``"bsp"``,
``"ssp"``, ``"async"``, ``"drop"``: when a push is applied), then this
file: :class:`ParameterServer`, the server's loop (answer requests until
every worker is done) and the worker's (compute, push, pull).

A worker pulls before every step and pushes after it, except in the
asynchronous modes: there it pulls every ``n_fetch`` steps and pushes the
sum of its gradients every ``n_push`` steps.

Order. ``order="arrival"`` serves whichever worker's request comes first
(the real thing, not repeatable in async). ``order="round_robin"`` serves
the workers in turn, one request each, skipping those waiting for a pull
reply: every run makes the same updates in the same order, so tests can
predict them. Every push, applied or dropped, is logged with its identity
``(worker, step)`` in :attr:`ServerResult.pushes` and in the trace.

Cost per step, P the parameters' bytes, W workers, S servers: every worker
sends P and receives P (plus 2S small headers); the servers together receive
W P and send W P, each server W P / S. With one server, its link carries W
times a worker's: the bottleneck as W grows, which sharding divides by S.
An all-reduce (ring) moves about 2P per rank whatever W is, and no rank is
special. Alpha terms: 2S to 4S messages per worker per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import nn, trace
from minidist.parallel.parameter_server.layout import Layout, flat_parameters, shard_ranges
from minidist.parallel.parameter_server.messages import (
    GRADIENT_TAG,
    HEADER_SIZE,
    NO_STEP,
    REPLY_TAG,
    REQUEST_TAG,
    WEIGHTS_TAG,
    PendingPush,
    Push,
    Request,
    _push_label,
)
from minidist.parallel.parameter_server.shard import MODES, PushRecord, ServerShard, _synchronous

ORDERS = ("arrival", "round_robin")


@dataclass
class ServerResult:
    role: str
    server: int
    key_range: tuple[int, int]
    weights: np.ndarray                   # the whole final weights, every shard's
    version: int
    pushes: list[PushRecord]
    applied_gradients: list[np.ndarray]   # with keep_gradients: each update's gradient, in order

    @property
    def accepted(self) -> int:
        return sum(record.accepted for record in self.pushes)

    @property
    def dropped(self) -> int:
        return len(self.pushes) - self.accepted


@dataclass
class WorkerResult:
    role: str
    worker: int
    weights: np.ndarray                   # the whole final weights, every shard's
    steps: int
    pushes: int
    pulls: int
    losses: list[tuple[int, int, float]] = field(default_factory=list)  # (step, time ns, loss)


def _check_whole(name: str, value, minimum: int, rank: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"rank {rank}: {name} must be a whole number >= {minimum}, "
                         f"got {value!r}")
    return int(value)


class ParameterServer:
    """A parameter-server run, the same call on every rank of ``group``::

        def program():
            ps = ParameterServer(initial_weights, servers=2, mode="ssp", tau=2, lr=0.1)
            return ps.run(steps=100, gradient_fn=my_gradient)

        results = minidist.launch(program, world_size=5)   # 2 servers, 3 workers

    ``initial_weights`` is a flat float array (or an ``nn.Module``, whose
    parameters are flattened); the servers' copies are the ones that count.
    ``gradient_fn(weights, worker, step)`` runs on the workers: it returns
    ``(gradient, examples)`` or ``(gradient, examples, loss)``, the gradient
    of the mean loss over the worker's ``examples`` examples of that step,
    flat like ``weights``.

    Options: ``lr``, ``momentum`` (SGD on each server's range); ``tau`` for
    ``ssp`` (how far ahead a worker may run) and ``drop`` (the largest
    staleness accepted); ``n_fetch``, ``n_push``, ``warmup_steps`` for
    ``async`` and ``drop``; ``order`` ("arrival" or "round_robin");
    ``keep_gradients`` to return every applied gradient (for replays).
    """

    def __init__(self, initial_weights, *, servers: int = 1, mode: str = "bsp", lr: float,
                 momentum: float = 0.0, tau: int | None = None, n_fetch: int = 1,
                 n_push: int = 1, warmup_steps: int = 0, order: str = "arrival",
                 keep_gradients: bool = False, group=None):
        self.group = group if group is not None else dist.world_group()
        rank = dist.get_rank()
        if not self.group.is_member:
            raise ValueError(f"rank {rank} is not in {self.group!r}; only its members take part "
                             "in this parameter server")
        self.rank = self.group.rank
        self.layout = Layout.for_world(self.group.size, servers, rank)
        if mode not in MODES:
            raise ValueError(f"rank {rank}: unknown parameter-server mode {mode!r}; choose one "
                             f"of {', '.join(MODES)}")
        if order not in ORDERS:
            raise ValueError(f"rank {rank}: unknown order {order!r}; choose 'arrival' (whoever "
                             "comes first) or 'round_robin' (workers in turn, repeatable)")
        self.mode, self.order = mode, order
        self.tau = self._check_tau(tau, rank)
        self.n_fetch = _check_whole("n_fetch", n_fetch, 1, rank)
        self.n_push = _check_whole("n_push", n_push, 1, rank)
        self.warmup_steps = _check_whole("warmup_steps", warmup_steps, 0, rank)
        if mode in ("bsp", "ssp") and (self.n_fetch, self.n_push, self.warmup_steps) != (1, 1, 0):
            raise ValueError(f"rank {rank}: n_fetch, n_push and warmup_steps belong to the "
                             f"asynchronous modes ('async', 'drop'); mode {mode!r} pulls and "
                             "pushes every step")
        if not lr >= 0 or not momentum >= 0:
            raise ValueError(f"rank {rank}: lr and momentum must be >= 0, got lr={lr!r}, "
                             f"momentum={momentum!r}")
        self.lr, self.momentum = float(lr), float(momentum)
        self.keep_gradients = bool(keep_gradients)
        self.initial_weights = self._check_weights(initial_weights, rank)
        self.size = self.initial_weights.size
        if self.size < self.layout.servers:
            raise ValueError(f"rank {rank}: {self.size} parameter(s) cannot be split over "
                             f"{self.layout.servers} servers; use at most {self.size} servers")
        self.key_ranges = shard_ranges(self.size, self.layout.servers)
        self.messages = self.group.with_context("parameter server")

    def _check_tau(self, tau, rank: int) -> int:
        if self.mode in ("ssp", "drop"):
            if tau is None:
                raise ValueError(f"rank {rank}: mode {self.mode!r} needs tau, the largest "
                                 "staleness allowed (tau=0: none)")
            return _check_whole("tau", tau, 0, rank)
        if self.mode == "bsp" and tau not in (None, 0):
            raise ValueError(f"rank {rank}: bsp means tau = 0; for tau={tau!r} use mode='ssp'")
        if self.mode == "async" and tau is not None:
            raise ValueError(f"rank {rank}: async applies every push whatever its staleness, so "
                             "it takes no tau; use mode='drop' to drop stale pushes or "
                             "mode='ssp' to bound them")
        return 0

    @staticmethod
    def _check_weights(initial_weights, rank: int) -> np.ndarray:
        if isinstance(initial_weights, nn.Module):
            initial_weights = flat_parameters(initial_weights)
        weights = np.asarray(initial_weights)
        if weights.ndim != 1 or weights.dtype.kind != "f" or weights.size == 0:
            raise ValueError(f"rank {rank}: the parameter server takes a non-empty flat float "
                             f"array (or an nn.Module), got shape {weights.shape} dtype "
                             f"{weights.dtype}; flatten with flat_parameters(model)")
        return weights

    # -- running ---------------------------------------------------------

    def run(self, steps: int, gradient_fn=None):
        """Serve (server ranks) or train for ``steps`` steps (worker ranks);
        then every rank receives the final weights. Returns this rank's
        :class:`ServerResult` or :class:`WorkerResult`."""
        steps = _check_whole("steps", steps, 0, dist.get_rank())
        if self.layout.is_server(self.rank):
            shard = ServerShard(self.initial_weights, self.key_ranges[self.rank],
                                workers=self.layout.workers, mode=self.mode, tau=self.tau,
                                warmup_steps=self.warmup_steps, lr=self.lr,
                                momentum=self.momentum, keep_gradients=self.keep_gradients)
            if steps > 0:
                self._serve(shard)
            weights = self._share_final_weights(shard.weights)
            return ServerResult("server", self.rank, shard.key_range, weights, shard.version,
                                shard.pushes, shard.applied_gradients)
        if not callable(gradient_fn):
            raise TypeError(f"rank {dist.get_rank()}: a worker needs gradient_fn(weights, "
                            "worker, step) -> (gradient, examples[, loss])")
        result = self._work(self.layout.worker_of(self.rank), steps, gradient_fn)
        result.weights = self._share_final_weights(None)
        return result

    def _share_final_weights(self, own_range) -> np.ndarray:
        """Each server broadcasts its range, so every rank ends with the whole vector."""
        weights = np.zeros(self.size, self.initial_weights.dtype)
        for server, (start, stop) in enumerate(self.key_ranges):
            if server == self.rank:
                weights[start:stop] = own_range
            dist.broadcast(weights[start:stop], group=self.group,
                           group_src=self.layout.server_rank(server))
        return weights

    # -- the server ------------------------------------------------------

    def _serve(self, shard: ServerShard) -> None:
        """Answer requests until every worker is done: apply the push, if any,
        then answer every pull whose weights are ready (others wait)."""
        workers = self.layout.workers
        waiting_pulls: dict[int, int] = {}     # worker -> step it wants weights for
        done: set[int] = set()
        header = np.empty(HEADER_SIZE, np.int64)
        turn = 0
        while len(done) < workers:
            if self.order == "round_robin":
                worker, turn = self._next_in_turn(turn, waiting_pulls, done)
                self.messages.recv(header, src=self.layout.worker_rank(worker), tag=REQUEST_TAG,
                                   label="request")
            else:
                source = self.messages.recv(header, src=None, tag=REQUEST_TAG, label="request")
                worker = self.layout.worker_of(source)
            request = Request.decode(header)
            if request.push_step != NO_STEP:
                gradient = np.empty(shard.weights.shape, shard.weights.dtype)
                self.messages.recv(gradient, src=self.layout.worker_rank(worker),
                                   tag=GRADIENT_TAG,
                                   label=_push_label(worker, request.push_step,
                                                     request.base_version))
                shard.receive_push(Push(worker, request.push_step, request.base_version,
                                        request.examples, gradient))
            if request.pull_step != NO_STEP:
                waiting_pulls[worker] = request.pull_step
            if request.done:
                done.add(worker)
            for waiting in sorted(waiting_pulls):
                if shard.can_answer_pull(waiting_pulls[waiting]):
                    self._answer_pull(shard, waiting, waiting_pulls.pop(waiting))

    def _next_in_turn(self, turn: int, waiting_pulls, done) -> tuple[int, int]:
        """The next worker, cyclically from ``turn``, that can send a request
        (not done, not waiting for weights)."""
        workers = self.layout.workers
        for offset in range(workers):
            worker = (turn + offset) % workers
            if worker not in done and worker not in waiting_pulls:
                return worker, (worker + 1) % workers
        raise RuntimeError(f"rank {dist.get_rank()}: every worker waits for weights that no "
                           f"push can make ready (waiting: {waiting_pulls}); this is a bug in "
                           "the parameter server")

    def _answer_pull(self, shard: ServerShard, worker: int, step: int) -> None:
        label = trace.with_info("pull", kind="pull", worker=worker, step=step,
                                version=shard.version)
        destination = self.layout.worker_rank(worker)
        self.messages.send(np.array([shard.version, step], np.int64), destination,
                           tag=REPLY_TAG, label=label)
        self.messages.send(shard.weights, destination, tag=WEIGHTS_TAG, label=label)

    # -- the worker ------------------------------------------------------

    def _synchronous(self, step: int) -> bool:
        return _synchronous(self.mode, self.warmup_steps, step)

    def _pulls_before(self, step: int) -> bool:
        """Does the worker fetch fresh weights before computing ``step``?"""
        return self._synchronous(step) or (step - self.warmup_steps) % self.n_fetch == 0

    def _pushes_after(self, step: int, steps: int) -> bool:
        return (self._synchronous(step) or step == steps - 1
                or (step - self.warmup_steps + 1) % self.n_push == 0)

    def _work(self, worker: int, steps: int, gradient_fn) -> WorkerResult:
        result = WorkerResult("worker", worker, np.empty(0), steps, 0, 0)
        if steps == 0:
            return result
        weights = np.array(self.initial_weights, copy=True)
        versions = [NO_STEP] * self.layout.servers
        self._request(worker, Request(pull_step=0), None, versions)
        self._receive_weights(worker, 0, weights, versions)
        result.pulls += 1
        pending = PendingPush()
        for step in range(steps):
            self._compute_gradient(gradient_fn, weights, worker, step, versions, result, pending)
            push = self._pushes_after(step, steps)
            pull = step + 1 < steps and self._pulls_before(step + 1)
            if not (push or pull):
                continue
            request = Request(push_step=step if push else NO_STEP,
                              examples=pending.examples if push else 0,
                              pull_step=step + 1 if pull else NO_STEP, done=step == steps - 1)
            self._request(worker, request, pending.summed if push else None,
                          pending.base_versions if push else versions)
            if push:
                result.pushes += 1
                pending.clear()
            if pull:
                self._receive_weights(worker, step + 1, weights, versions)
                result.pulls += 1
        return result

    def _compute_gradient(self, gradient_fn, weights, worker: int, step: int, versions,
                          result: WorkerResult, pending: PendingPush) -> None:
        """One step of a worker's own work: its gradient on the weights it holds,
        traced, its loss logged, added to the push it is gathering."""
        with trace.region(trace.with_info("gradient", worker=worker, step=step,
                                          version=min(versions))):
            gradient, examples, loss = self._call_gradient_fn(gradient_fn, weights, worker, step)
        if loss is not None:
            result.losses.append((step, trace.now(), float(loss)))
        pending.add(gradient, examples, versions)

    def _call_gradient_fn(self, gradient_fn, weights, worker: int, step: int):
        returned = gradient_fn(weights, worker, step)
        rank = dist.get_rank()
        if not isinstance(returned, tuple) or len(returned) not in (2, 3):
            raise TypeError(f"rank {rank} (worker {worker}): gradient_fn must return (gradient, "
                            f"examples) or (gradient, examples, loss), got {type(returned).__name__}")
        gradient = np.asarray(returned[0])
        if gradient.shape != weights.shape:
            raise ValueError(f"rank {rank} (worker {worker}): gradient_fn returned a gradient of "
                             f"shape {gradient.shape}; it must be flat like the weights, "
                             f"{weights.shape}")
        examples = _check_whole("the number of examples gradient_fn returned", returned[1], 0,
                                rank)
        loss = returned[2] if len(returned) == 3 else None
        return gradient.astype(weights.dtype, copy=False), examples, loss

    def _request(self, worker: int, request: Request, gradient, versions) -> None:
        """Send one request to every server: the header, then this server's
        slice of the gradient when it pushes."""
        for server, (start, stop) in enumerate(self.key_ranges):
            addressed = Request(request.push_step, versions[server], request.examples,
                                request.pull_step, request.done)
            if gradient is not None:
                label = _push_label(worker, request.push_step, versions[server])
            else:
                label = trace.with_info("pull request", kind="pull", worker=worker,
                                        step=request.pull_step)
            destination = self.layout.server_rank(server)
            self.messages.send(addressed.encode(), destination, tag=REQUEST_TAG, label=label)
            if gradient is not None:
                self.messages.send(gradient[start:stop], destination, tag=GRADIENT_TAG,
                                   label=label)

    def _receive_weights(self, worker: int, step: int, weights, versions) -> None:
        reply = np.empty(2, np.int64)
        label = trace.with_info("pull", kind="pull", worker=worker, step=step)
        for server, (start, stop) in enumerate(self.key_ranges):
            source = self.layout.server_rank(server)
            self.messages.recv(reply, src=source, tag=REPLY_TAG, label=label)
            self.messages.recv(weights[start:stop], src=source, tag=WEIGHTS_TAG, label=label)
            versions[server] = int(reply[0])

