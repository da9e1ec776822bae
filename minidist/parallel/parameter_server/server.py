"""Parameter server: workers push gradients, servers update, workers pull weights.

The slide's picture, on linear regression (seed 000):

1. every worker reads its own part of the data and computes a gradient ``g``
   on the weights it holds;
2. it **pushes** ``g`` to the parameter server;
3. the server updates its weights ``w`` from the pushes it receives;
4. the worker **pulls** the updated ``w`` and goes on with the next step.

Roles. The ranks of the group are split by :class:`Layout`: ranks
``0 .. S-1`` are the servers, ranks ``S .. S+W-1`` the workers (worker ``k``
is rank ``S + k``). Every rank runs the same program; :meth:`ParameterServer.run`
sends each one down its role.

Sharding. The parameters are one flat vector of P numbers (a model's
parameters one after the other). Server ``s`` owns the contiguous key range
``shard_ranges(P, S)[s]``: the ranges are as even as possible, the first
``P % S`` of them one key longer. A worker pulls every range from its server
and pushes each server only its slice of the gradient; a server keeps its
slice of the weights, its slice of the optimizer state, and its own version
number, and never sees the rest.

Consistency, chosen by name (``mode=``):

* ``"bsp"``, bulk synchronous: a server waits for the pushes of all W workers
  for step t, averages them weighted by their number of examples (exact with
  uneven data), and applies one update. A worker's pull for step t + 1 is
  answered only then, so workers idle while the slowest one computes; the
  idle time is the long ``recv`` of the pull reply in the trace. Equals
  single-process SGD on the whole batch.
* ``"ssp"``, stale synchronous (bounded delay) with ``tau``: updates are
  still the averaged steps of BSP, but a worker may start step t once step
  ``t - tau - 1`` is applied, that is run at most ``tau`` steps ahead of the
  slowest worker, on weights at most ``tau`` versions old. ``tau=0`` is BSP,
  bit for bit.
* ``"async"``, Downpour (DistBelief): every push is applied the moment it
  arrives, ``w -= lr * g``, whatever weights it was computed on. A worker
  pulls every ``n_fetch`` steps and pushes the sum of its gradients every
  ``n_push`` steps. ``warmup_steps`` synchronous (BSP) steps may come first:
  DistBelief only went asynchronous after a first synchronous epoch, because
  stale gradients on the rough start diverge.
* ``"drop"``: as async, but a push computed on weights more than ``tau``
  versions old is dropped (counted, never applied): "throw away the
  gradients that lag behind" (seed 001).

Versions and staleness. Each server's version counts the updates it applied
to its range (one per step in BSP and SSP, one per accepted push in async).
A pull returns the weights with their version; a push carries the version it
was computed on (with ``n_push > 1``, that of its oldest gradient). At apply
time, ``staleness = version now - version computed on``: 0 in BSP, at most
``tau`` in SSP, W - 1 for async workers served in turn. Every push, applied
or dropped, is logged with its identity ``(worker, step)`` (``step``: the
worker's last step in it) in :attr:`ServerResult.pushes` and in the trace.

Order. ``order="arrival"`` serves whichever worker's request comes first
(the real thing, not repeatable in async). ``order="round_robin"`` serves
the workers in turn, one request each, skipping those waiting for a pull
reply: every run makes the same updates in the same order, so tests can
predict them.

Messages. A worker's request to a server is a small header (push step,
version, examples, pull step, done) followed, when it pushes, by the
gradient slice; a pull is answered by a header (version, step) and the
weight slice. Everything travels in its own context ("parameter server"),
labelled for the trace with ``kind=push|pull|update``, ``worker``, ``step``,
``version`` and, on the server's update region, ``staleness`` and
``accepted`` (read them back with :func:`minidist.trace.label_info`).

Cost per step, P the parameters' bytes, W workers, S servers: every worker
sends P and receives P (plus 2S small headers); the servers together receive
W P and send W P, each server W P / S. With one server, its link carries W
times a worker's: the bottleneck as W grows, which sharding divides by S.
An all-reduce (ring) moves about 2P per rank whatever W is, and no rank is
special. Alpha terms: 2S to 4S messages per worker per step.

What a fault-tolerance layer hooks into (:mod:`.fault_tolerant_server` does):
:meth:`ServerShard.apply_update` is the one place weights change; every push
has the identity ``(worker, step)`` and :attr:`ServerShard.clock` holds, per
worker, the last step pushed; :meth:`ServerShard.step_is_complete` says when a
synchronous step has all the pushes it waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import Tensor, nn, optim, trace
from minidist.tensor import no_grad

MODES = ("bsp", "ssp", "async", "drop")
ORDERS = ("arrival", "round_robin")

REQUEST_TAG, GRADIENT_TAG, REPLY_TAG, WEIGHTS_TAG = 1, 2, 3, 4
NO_STEP = -1


# --------------------------------------------------------------------------- layout


def shard_ranges(size: int, shards: int) -> list[tuple[int, int]]:
    """Split keys ``0 .. size-1`` into ``shards`` contiguous ranges ``(start, stop)``,
    as even as possible: the first ``size % shards`` ranges are one key longer."""
    if shards < 1:
        raise ValueError(f"need at least one shard, got {shards}")
    lengths = [size // shards + (1 if index < size % shards else 0) for index in range(shards)]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    return [(int(start), int(stop)) for start, stop in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class Layout:
    """Who does what: ranks ``0 .. servers-1`` are servers, the rest workers.

    Ranks are group ranks (world ranks when there is no group)."""

    servers: int
    workers: int

    @classmethod
    def for_world(cls, world_size: int, servers: int, rank: int = 0) -> Layout:
        if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
            raise ValueError(f"rank {rank}: servers must be a whole number >= 1, got {servers!r}")
        if servers >= world_size:
            raise ValueError(
                f"rank {rank}: {servers} server(s) in a world of {world_size} rank(s) leaves no "
                f"worker; launch at least {servers + 1} ranks, or use servers <= "
                f"{max(world_size - 1, 1)}")
        return cls(int(servers), int(world_size - servers))

    @property
    def size(self) -> int:
        return self.servers + self.workers

    def is_server(self, rank: int) -> bool:
        return rank < self.servers

    def role(self, rank: int) -> str:
        return "server" if self.is_server(rank) else "worker"

    def server_rank(self, server: int) -> int:
        return server

    def worker_rank(self, worker: int) -> int:
        return self.servers + worker

    def worker_of(self, rank: int) -> int:
        return rank - self.servers


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Request:
    """What a worker asks of one server in one message: push a gradient
    (``push_step >= 0``), send weights for a step (``pull_step >= 0``),
    or both; ``done`` says it is the worker's last request."""

    push_step: int = NO_STEP
    base_version: int = NO_STEP
    examples: int = 0
    pull_step: int = NO_STEP
    done: bool = False

    def encode(self) -> np.ndarray:
        return np.array([self.push_step, self.base_version, self.examples, self.pull_step,
                         int(self.done)], np.int64)

    @classmethod
    def decode(cls, header: np.ndarray) -> Request:
        push_step, base_version, examples, pull_step, done = (int(v) for v in header)
        return cls(push_step, base_version, examples, pull_step, bool(done))


HEADER_SIZE = 5


@dataclass
class Push:
    """One gradient pushed by ``worker`` after its step ``step``: its identity
    is ``(worker, step)``."""

    worker: int
    step: int
    base_version: int
    examples: int
    gradient: np.ndarray

    @property
    def identity(self) -> tuple[int, int]:
        return (self.worker, self.step)


@dataclass(frozen=True)
class PushRecord:
    """What a server did with one push."""

    worker: int
    step: int
    base_version: int
    version: int          # the server's version when the push was applied or dropped
    staleness: int        # version - base_version
    accepted: bool
    examples: int


# --------------------------------------------------------------------------- results


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


# --------------------------------------------------------------------------- the server's shard


class PendingPush:
    """The gradients a worker has summed since its last push (``n_push`` steps
    of them in async), their examples, and the versions the first was computed on."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.summed, self.examples, self.base_versions = None, 0, None

    def add(self, gradient: np.ndarray, examples: int, versions) -> None:
        if self.summed is None:
            self.summed, self.base_versions = np.array(gradient, copy=True), list(versions)
        else:
            self.summed += gradient
        self.examples += examples


class ServerShard:
    """One server's key range: its weights, optimizer, version and log.

    ``receive_push`` decides what a push does (wait for the rest of its step,
    be applied, or be dropped); ``apply_update`` is the only place the
    weights change."""

    def __init__(self, weights: np.ndarray, key_range: tuple[int, int], *, workers: int,
                 mode: str, tau: int, warmup_steps: int, lr: float, momentum: float,
                 keep_gradients: bool):
        self.key_range = key_range
        self.parameter = Tensor(np.array(weights[key_range[0]:key_range[1]], copy=True),
                                requires_grad=True)
        self.optimizer = optim.SGD([self.parameter], lr=lr, momentum=momentum)
        self.workers = workers
        self.mode = mode
        self.tau = tau
        self.warmup_steps = warmup_steps
        self.version = 0
        self.completed_steps = 0   # synchronous steps applied
        self.clock = {worker: NO_STEP for worker in range(workers)}
        self.pending: dict[int, dict[int, Push]] = {}   # step -> worker -> push
        self.pushes: list[PushRecord] = []
        self.keep_gradients = keep_gradients
        self.applied_gradients: list[np.ndarray] = []

    @property
    def weights(self) -> np.ndarray:
        return self.parameter.data

    def synchronous(self, step: int) -> bool:
        return self.mode in ("bsp", "ssp") or step < self.warmup_steps

    def can_answer_pull(self, step: int) -> bool:
        """A worker may compute ``step`` once the synchronous steps it depends
        on are applied: ``step - tau`` of them in SSP (tau = 0: BSP and the
        warm-up); after the warm-up, all of the warm-up."""
        if self.synchronous(step):
            bound = self.tau if self.mode == "ssp" else 0
            return self.completed_steps >= step - bound
        return self.completed_steps >= self.warmup_steps

    def receive_push(self, push: Push) -> None:
        self.clock[push.worker] = push.step
        if self.synchronous(push.step):
            self.pending.setdefault(push.step, {})[push.worker] = push
            self.apply_complete_steps()
            return
        staleness = self.version - push.base_version
        if self.mode == "drop" and staleness > self.tau:
            self._log(push, accepted=False)
            moment = trace.now()
            trace.record("compute", moment, moment, label=_update_label(
                push.worker, push.step, self.version, staleness, accepted=False))
            return
        self.apply_update(push.gradient, [push])

    def apply_complete_steps(self) -> None:
        """Apply the synchronous steps whose pushes are all in, in step order."""
        while self.step_is_complete(self.completed_steps):
            self._apply_synchronous_step(self.pending.pop(self.completed_steps))

    def step_is_complete(self, step: int) -> bool:
        return len(self.pending.get(step, ())) == self.workers

    def _apply_synchronous_step(self, pushes: dict[int, Push]) -> None:
        """Average the step's gradients weighted by examples: the gradient of
        the mean loss over all the step's examples, in worker order so the
        sum is the same whatever order the pushes arrived in."""
        ordered = [pushes[worker] for worker in sorted(pushes)]
        total = sum(push.examples for push in ordered)
        if total == 0:
            raise ValueError(f"parameter server: no worker had any example in step "
                             f"{ordered[0].step}; at least one needs examples to average over")
        dtype = self.weights.dtype.type
        average = np.zeros_like(self.weights)
        for push in ordered:
            average += push.gradient * dtype(push.examples)
        average /= dtype(total)
        self.apply_update(average, ordered)
        self.completed_steps += 1

    def apply_update(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        """One optimizer step on this range with ``gradient``, made of
        ``pushes``; the version moves on by one."""
        label = _update_label(pushes[0].worker if len(pushes) == 1 else "all", pushes[0].step,
                              self.version, max(self.version - p.base_version for p in pushes),
                              accepted=True)
        with trace.region(label):
            for push in pushes:
                self._log(push, accepted=True)
            self.parameter.grad = gradient
            with no_grad():
                self.optimizer.step()
            self.parameter.grad = None
            if self.keep_gradients:
                self.applied_gradients.append(np.array(gradient, copy=True))
            self.version += 1

    def _log(self, push: Push, accepted: bool) -> None:
        self.pushes.append(PushRecord(push.worker, push.step, push.base_version, self.version,
                                      self.version - push.base_version, accepted, push.examples))


def _update_label(worker, step, version, staleness, accepted) -> str:
    return trace.with_info("update", kind="update", worker=worker, step=step, version=version,
                           staleness=staleness, accepted=int(accepted))


# --------------------------------------------------------------------------- the strategy


def _check_whole(name: str, value, minimum: int, rank: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"rank {rank}: {name} must be a whole number >= {minimum}, "
                         f"got {value!r}")
    return int(value)


def flat_parameters(model: nn.Module) -> np.ndarray:
    """The model's trainable parameters, one after the other, as one new flat array."""
    return np.concatenate([p.data.reshape(-1) for p in model.parameters() if p.requires_grad])


def load_flat_parameters(model: nn.Module, weights: np.ndarray) -> None:
    """Copy consecutive pieces of ``weights`` into the model's parameters, in place."""
    offset = 0
    for param in (p for p in model.parameters() if p.requires_grad):
        param.data[...] = weights[offset:offset + param.data.size].reshape(param.data.shape)
        offset += param.data.size


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
        return self.mode in ("bsp", "ssp") or step < self.warmup_steps

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


def _push_label(worker: int, step: int, version: int) -> str:
    return trace.with_info("push", kind="push", worker=worker, step=step, version=version)
