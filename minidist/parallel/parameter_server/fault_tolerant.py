"""Fault-tolerant parameter server: every key range on two servers.

Seed 001 lists the parameter server's strength as fault tolerance, "set up
several servers". This is the parameter server of
:mod:`minidist.parallel.parameter_server.server` (read it first) made to survive a
server dying mid run, and workers dying, with no update lost.

Layout. S >= 2 servers (ranks ``0 .. S-1``) and W workers, as in
:class:`~minidist.parallel.parameter_server.server.Layout`. Server ``s`` is the
*primary* of key range ``s`` and the *backup* of range ``(s - 1) % S``: the
backup of range ``r`` is server ``(r + 1) % S``. No extra ranks (a small world
keeps its workers), at the price of every server holding two ranges and
doing each update twice, once for itself and once for its neighbour.

Chain replication after aggregation, for each range:

1. workers send their requests (push a gradient, pull the next weights) to
   the range's primary;
2. the primary aggregates (BSP: the step's pushes of every live worker,
   averaged by examples; async: one push) and applies the update
   (:meth:`ServerShard.apply_update`);
3. it forwards the update to the backup: the gradient it applied and the
   identities ``(worker, step)`` of the pushes in it. The backup applies the
   same gradient with the same optimizer, so its weights, momentum and
   version stay the primary's, bit for bit;
4. the backup acknowledges the new version;
5. only then does the primary answer the pulls that would see that version.

Why answer only after the acknowledgement: a worker that has received
weights of version v goes on and forgets the pushes that made v. Were the
primary to die with v not on the backup, nobody could make v again: an
update acknowledged to a worker would be lost. With the backup's
acknowledgement first, every update any worker has seen is on both copies;
an update the backup lacks has been seen by nobody, and its pushes are still
held by their workers, which send them again (below).

Failover. A worker keeps its last request until the reply comes. When the
primary is gone (PeerGoneError on the send or on the reply: a small send to
a dead rank may even complete, so the reply is where death shows), the
worker logs it and sends the same request to the range's backup, which, once
``dist.failed_ranks()`` names the primary, first applies whatever the dead
primary had forwarded, then becomes the range's primary (logged, traced).
The request sent again may hold a push the backup already has (forwarded
before the crash): each range keeps a *vector clock*, per worker the last
step received (:attr:`ServerShard.clock`), and a push not newer than it is a
duplicate, ignored and counted. So every push is applied exactly once, and a
BSP run with a server killed ends with the same weights as the run without.

Workers gone. A worker that dies (under ``launch(..., tolerate_failures=...)``)
shows in ``dist.failed_ranks()``. The primaries drop it from the synchronous
barrier from its first missing step on, log it ("worker 2 (rank 4) is gone;
step 7 goes on with 3 workers"), and each later step averages the pushes of
the remaining workers, weighted by their examples. A worker dying between
its pushes to two ranges leaves them one step apart in who they averaged.

What it survives: any one server, and any workers. After a failover the
range has a single copy (nothing copies it to a third server), and a server
whose backup died goes on without one (logged); losing both servers of a
range ends the run with an error that says so.

Modes: ``"bsp"`` and ``"async"`` (with ``n_push`` and ``warmup_steps``).
Every request pulls, so that its reply acknowledges its push; that is why
``n_fetch`` is not offered. SSP is not offered either: an SSP worker runs
ahead while its pushes wait unapplied on the primary, not on the backup, so
it would have to keep and resend several, not one.

The end. A worker's last request pulls the final weights (its reply
acknowledges the last push), then it says goodbye to every server; a server
ends when every worker has said goodbye or is gone. There is no final
broadcast (a collective cannot run with a member dead): each worker returns
the weights of its last pull, each server the ranges it holds, and
:func:`final_weights` puts the primaries' ranges together (a backup's copy
standing in for a primary that died after its last reply, when no server
had a reason to take over).

Testing failures. ``crash_server_at=(server, step[, moment])`` makes that
server SIGKILL itself (a machine vanishing; its own trace dies with it) at the update of ``step`` of its
own range: ``moment="before_forward"`` (the update is on the dying server
only) or ``"after_one_reply"`` (the backup has acknowledged it and one worker
has pulled it; the others' requests come again and are duplicates). Launch
with that server's rank in ``tolerate_failures``. ``push_twice_at=(worker,
step)`` makes a worker send that push a second time with no failure at all,
as a worker that gave up waiting and retried would.

Messages travel in their own context ("fault-tolerant parameter server"),
labelled ``kind=push|pull|replicate|ack|goodbye``; zero-length events of
kind ``"fault"`` mark ``kind=failover|backup_lost|worker_gone|duplicate``.

Cost, over the plain parameter server (P the weights' bytes): each update
sends P / S more, primary to backup, and a small acknowledgement back, so a
server's traffic grows by one range per update (one update per step in BSP,
W in async), not by W; each step's latency grows by that round trip (2 alpha
+ P / S beta) before any pull is answered. Memory and update work per
server double. A failover costs the workers one request sent again.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.parallel.parameter_server.messages import NO_STEP, PendingPush, Push, _push_label
from minidist.parallel.parameter_server.server import ParameterServer, WorkerResult, _check_whole
from minidist.parallel.parameter_server.shard import PushRecord, ServerShard

logger = logging.getLogger("minidist")

FAULT_TOLERANT_MODES = ("bsp", "async")
CRASH_MOMENTS = ("before_forward", "after_one_reply")

(REQUEST_TAG, GRADIENT_TAG, REPLY_TAG, WEIGHTS_TAG, REPLICATE_TAG, REPLICATED_GRADIENT_TAG,
 ACK_TAG, GOODBYE_TAG) = range(1, 9)

#: Replies carry their key range in the tag (``tag + RANGE_TAG_STRIDE * range``):
#: after a failover one server answers for two ranges, in whichever order
#: they become ready.
RANGE_TAG_STRIDE = 16

#: How long a server waits for a message before it looks at who has failed.
POLL_SECONDS = 0.05

#: A request: key range, push step, version pushed on, examples, pull step.
REQUEST_SIZE = 5
#: Per push in a forwarded update: worker, step, base version, examples.
IDENTITY_SIZE = 4


# --------------------------------------------------------------------------- failure injection


@dataclass(frozen=True)
class ServerCrash:
    """Server ``server`` SIGKILLs itself at the update of ``step`` of its own
    key range, at ``moment`` (see the module docstring)."""

    server: int
    step: int
    moment: str = "before_forward"

    @classmethod
    def parse(cls, value, servers: int, rank: int) -> ServerCrash | None:
        if value is None:
            return None
        if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
            raise ValueError(f"rank {rank}: crash_server_at must be (server, step) or (server, "
                             f"step, moment), got {value!r}")
        server = _check_whole("crash_server_at's server", value[0], 0, rank)
        step = _check_whole("crash_server_at's step", value[1], 0, rank)
        moment = value[2] if len(value) == 3 else "before_forward"
        if server >= servers:
            raise ValueError(f"rank {rank}: crash_server_at names server {server}, but there "
                             f"are only servers 0..{servers - 1}")
        if moment not in CRASH_MOMENTS:
            raise ValueError(f"rank {rank}: unknown crash moment {moment!r}; choose "
                             f"{' or '.join(map(repr, CRASH_MOMENTS))}")
        return cls(server, step, moment)


def _range_tag(tag: int, index: int) -> int:
    return tag + RANGE_TAG_STRIDE * index


def _die_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _say(events: list[str], text: str) -> None:
    """Log a fault where the run's user sees it, and keep it for the result."""
    logger.warning(text)
    events.append(text)


def _fault_event(text: str, **info) -> None:
    moment = trace.now()
    trace.record("fault", moment, moment, label=trace.with_info(text, **info))


# --------------------------------------------------------------------------- one range's copy


class ReplicatedShard(ServerShard):
    """A :class:`ServerShard` that ignores duplicate pushes, leaves gone
    workers out of the barrier, and keeps each update it applies until the
    server has forwarded it to the backup.

    On a primary the clock moves as pushes arrive; on a backup it moves with
    the updates forwarded to it, so it holds, per worker, the last step
    applied: what a push sent again after a takeover is compared with."""

    def __init__(self, *args, index: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.index = index
        self.gone: set[int] = set()
        self.duplicates: list[tuple[int, int]] = []
        self.unforwarded: list[tuple[np.ndarray, list[Push]]] = []

    def receive_push(self, push: Push) -> bool:
        """Apply (or hold for its step) a new push; ignore and count a
        duplicate. True if the push was new."""
        if push.step <= self.clock[push.worker]:
            self.duplicates.append(push.identity)
            _fault_event("duplicate push ignored", kind="duplicate", range=self.index,
                         worker=push.worker, step=push.step, clock=self.clock[push.worker])
            return False
        super().receive_push(push)
        return True

    def step_is_complete(self, step: int) -> bool:
        pushes = self.pending.get(step, {})
        return bool(pushes) and all(worker in pushes for worker in range(self.workers)
                                    if worker not in self.gone)

    def drop_worker(self, worker: int) -> None:
        """Leave ``worker`` out of every step it has not pushed yet."""
        self.gone.add(worker)
        self.apply_complete_steps()

    def apply_update(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        super().apply_update(gradient, pushes)
        self.unforwarded.append((np.array(gradient, copy=True), pushes))

    def apply_forwarded(self, gradient: np.ndarray, pushes: list[Push]) -> None:
        """The backup's side: the primary's update, applied the same way."""
        ServerShard.apply_update(self, gradient, pushes)
        for push in pushes:
            self.clock[push.worker] = max(self.clock[push.worker], push.step)
        if self.synchronous(pushes[0].step):
            self.completed_steps += 1


@dataclass
class RangeCopy:
    """What one server holds of one key range, and its role for it."""

    shard: ReplicatedShard
    primary: int                  # the server that answers the workers for this range
    backup: int | None            # the server with the second copy; None: there is none
    acknowledged: int = 0         # the last version the backup acknowledged
    waiting_pulls: dict[int, int] = field(default_factory=dict)   # worker -> step
    deferred: list[tuple[int, np.ndarray, np.ndarray | None]] = field(default_factory=list)

    @property
    def index(self) -> int:
        return self.shard.index


# --------------------------------------------------------------------------- results


@dataclass
class RangeReport:
    """A server's copy of one range at the end."""

    index: int
    key_range: tuple[int, int]
    role: str                     # "primary" or "backup"
    weights: np.ndarray
    version: int
    pushes: list[PushRecord]
    duplicates: list[tuple[int, int]]
    applied_gradients: list[np.ndarray]


@dataclass
class FaultTolerantServerResult:
    role: str
    server: int
    ranges: dict[int, RangeReport]
    taken_over: list[int]          # ranges this server became primary of
    gone_workers: list[int]
    events: list[str]              # what this server logged
    servers: int = 0               # how many servers (= key ranges) the run had; 0: unknown

    @property
    def duplicates(self) -> int:
        return sum(len(report.duplicates) for report in self.ranges.values())


@dataclass(frozen=True)
class Failover:
    """A worker moved ``key range`` from server ``from_server`` to ``to_server``
    while in ``step``."""

    step: int
    range: int
    from_server: int
    to_server: int


@dataclass
class FaultTolerantWorkerResult(WorkerResult):
    failovers: list[Failover] = field(default_factory=list)
    events: list[str] = field(default_factory=list)    # what this worker logged


def final_weights(results) -> np.ndarray:
    """The whole weight vector from a launch's results: each range from the
    server that was its primary at the end (failed ranks' slots skipped).

    A primary killed after its last reply leaves its range with no primary
    at the end: no worker asked again, so its backup never took over. The
    backup's copy stands in, and is the same: a pull is answered only once
    the backup has acknowledged its version, so the backup holds every
    version a worker saw."""
    primaries, backups, ranges = {}, {}, 0
    for result in results:
        if isinstance(result, FaultTolerantServerResult):
            ranges = max(ranges, result.servers)
            for report in result.ranges.values():
                held = primaries if report.role == "primary" else backups
                held[report.index] = report
    pieces = {**backups, **primaries}
    if not pieces:
        raise ValueError("no server result among these results; pass the list launch returned")
    # Counted from the results, not from the ranges found: a lost last range
    # would otherwise go unnoticed and the weights come back short.
    ranges = max(ranges, max(pieces) + 1)
    missing = sorted(set(range(ranges)) - set(pieces))
    if missing:
        raise ValueError(f"no surviving server holds key range(s) {missing}: both of their "
                         "copies were lost")
    return np.concatenate([pieces[index].weights for index in range(ranges)])


# --------------------------------------------------------------------------- the strategy


class FaultTolerantParameterServer(ParameterServer):
    """A parameter server whose key ranges live on two servers each, the same
    call on every rank of ``group``::

        def program():
            ps = FaultTolerantParameterServer(w0, servers=2, lr=0.1,
                                              crash_server_at=(1, 5))
            return ps.run(steps=20, gradient_fn=my_gradient)

        results = minidist.launch(program, world_size=5, tolerate_failures=[1])
        weights = final_weights(results)

    Options as :class:`ParameterServer` (``lr``, ``momentum``, ``n_push``,
    ``warmup_steps``, ``keep_gradients``), ``mode`` "bsp" or "async", at
    least two servers; ``crash_server_at`` and ``push_twice_at`` inject
    failures (module docstring).
    """

    def __init__(self, initial_weights, *, servers: int = 2, mode: str = "bsp", lr: float,
                 momentum: float = 0.0, n_push: int = 1, warmup_steps: int = 0,
                 keep_gradients: bool = False, crash_server_at=None, push_twice_at=None,
                 group=None):
        rank = dist.get_rank()
        if mode not in FAULT_TOLERANT_MODES:
            raise ValueError(f"rank {rank}: the fault-tolerant parameter server runs mode 'bsp' "
                             f"or 'async', not {mode!r} (an SSP worker runs ahead of pushes "
                             "the backup does not have yet)")
        super().__init__(initial_weights, servers=servers, mode=mode, lr=lr, momentum=momentum,
                         n_push=n_push, warmup_steps=warmup_steps,
                         keep_gradients=keep_gradients, group=group)
        if self.layout.servers < 2:
            raise ValueError(f"rank {rank}: replication needs servers >= 2 (range r's backup "
                             f"is server (r + 1) % S), got servers={servers}")
        self.crash = ServerCrash.parse(crash_server_at, self.layout.servers, rank)
        self.push_twice_at = self._check_push_twice_at(push_twice_at, rank)
        self.messages = self.group.with_context("fault-tolerant parameter server")

    def _check_push_twice_at(self, value, rank: int):
        if value is None:
            return None
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"rank {rank}: push_twice_at must be (worker, step), got {value!r}")
        worker = _check_whole("push_twice_at's worker", value[0], 0, rank)
        if worker >= self.layout.workers:
            raise ValueError(f"rank {rank}: push_twice_at names worker {worker}, but there are "
                             f"only workers 0..{self.layout.workers - 1}")
        return worker, _check_whole("push_twice_at's step", value[1], 0, rank)

    def backup_of(self, index: int) -> int:
        """The server holding the second copy of key range ``index``."""
        return (index + 1) % self.layout.servers

    def run(self, steps: int, gradient_fn=None):
        """Serve (server ranks) or train for ``steps`` steps (worker ranks).
        Returns this rank's :class:`FaultTolerantServerResult` or
        :class:`FaultTolerantWorkerResult`."""
        steps = _check_whole("steps", steps, 0, dist.get_rank())
        if self.crash is not None and self.crash.step >= steps:
            raise ValueError(f"rank {dist.get_rank()}: crash_server_at step {self.crash.step} "
                             f"is past the run's last step, {steps - 1}; the server would never "
                             "crash")
        if self.layout.is_server(self.rank):
            return _Server(self, self.rank).serve()
        if not callable(gradient_fn):
            raise TypeError(f"rank {dist.get_rank()}: a worker needs gradient_fn(weights, "
                            "worker, step) -> (gradient, examples[, loss])")
        return self._work(self.layout.worker_of(self.rank), steps, gradient_fn)

    # -- the worker ------------------------------------------------------

    def _work(self, worker: int, steps: int, gradient_fn) -> FaultTolerantWorkerResult:
        weights = np.array(self.initial_weights, copy=True)
        result = FaultTolerantWorkerResult("worker", worker, weights, steps, 0, 0)
        primaries = list(range(self.layout.servers))
        versions = [0] * self.layout.servers
        pending = PendingPush()
        for step in range(steps):
            self._compute_gradient(gradient_fn, weights, worker, step, versions, result, pending)
            push = self._pushes_after(step, steps)
            requests = []
            for index, (start, stop) in enumerate(self.key_ranges):
                header = np.array([index, step if push else NO_STEP,
                                   pending.base_versions[index] if push else versions[index],
                                   pending.examples if push else 0, step + 1], np.int64)
                requests.append((header, pending.summed[start:stop] if push else None))
            for index, request in enumerate(requests):
                self._send_request(worker, index, request, primaries, step, result)
            if push and self.push_twice_at == (worker, step):
                for index, (header, piece) in enumerate(requests):
                    retry = header.copy()
                    retry[4] = NO_STEP
                    self._send_request(worker, index, (retry, piece), primaries, step, result)
            for index, request in enumerate(requests):
                versions[index] = self._receive_reply(worker, index, request, weights,
                                                      primaries, step, result)
            result.pulls += 1
            if push:
                result.pushes += 1
                pending.clear()
        self._say_goodbye(worker)
        return result

    def _send_request(self, worker, index, request, primaries, step, result) -> None:
        header, piece = request
        while True:
            try:
                self._send_to(primaries[index], worker, header, piece)
                return
            except dist.PeerGoneError:
                self._fail_over(worker, index, primaries, step, result)

    def _send_to(self, server: int, worker: int, header, piece) -> None:
        if piece is not None:
            label = _push_label(worker, int(header[1]), int(header[2]))
        else:
            label = trace.with_info("pull request", kind="pull", worker=worker,
                                    step=int(header[4]))
        self.messages.send(header, self.layout.server_rank(server), tag=REQUEST_TAG,
                           label=label)
        if piece is not None:
            self.messages.send(np.ascontiguousarray(piece), self.layout.server_rank(server),
                               tag=GRADIENT_TAG, label=label)

    def _receive_reply(self, worker, index, request, weights, primaries, step, result) -> int:
        """The reply to ``request`` from the range's primary; if it is gone,
        the same request again to the backup. Returns the version pulled."""
        start, stop = self.key_ranges[index]
        reply = np.empty(2, np.int64)
        pull_step = int(request[0][4])
        label = trace.with_info("pull", kind="pull", worker=worker, step=pull_step, range=index)
        while True:
            source = self.layout.server_rank(primaries[index])
            try:
                self.messages.recv(reply, src=source, tag=_range_tag(REPLY_TAG, index),
                                   label=label)
                self.messages.recv(weights[start:stop], src=source,
                                   tag=_range_tag(WEIGHTS_TAG, index), label=label)
                return int(reply[0])
            except dist.PeerGoneError:
                self._fail_over(worker, index, primaries, step, result)
                self._send_request(worker, index, request, primaries, step, result)

    def _fail_over(self, worker, index, primaries, step, result) -> None:
        gone, backup = primaries[index], self.backup_of(index)
        if gone == backup:
            raise dist.PeerGoneError(
                f"rank {dist.get_rank()} (worker {worker}): key range {index} is lost: its "
                f"primary, server {index}, and its backup, server {backup}, have both failed; "
                "one copy per range survives one server failure, not two")
        primaries[index] = backup
        result.failovers.append(Failover(step, index, gone, backup))
        _fault_event("failover", kind="failover", worker=worker, step=step, range=index,
                     server=backup, gone=gone)
        _say(result.events,
             f"worker {worker} (rank {dist.get_rank()}): server {gone} (rank "
             f"{self._server_world_rank(gone)}) is gone; key range {index} fails over to "
             f"server {backup} (rank {self._server_world_rank(backup)}) in step {step}")

    def _server_world_rank(self, server: int) -> int:
        return self.group.global_rank(self.layout.server_rank(server))

    def _say_goodbye(self, worker: int) -> None:
        """Tell every server this worker needs nothing more (so it may end).
        A server already gone may take the message or refuse it: either way."""
        failed = dist.failed_ranks()
        label = trace.with_info("goodbye", kind="goodbye", worker=worker)
        for server in range(self.layout.servers):
            rank = self.layout.server_rank(server)
            if self.group.global_rank(rank) in failed:
                continue
            try:
                self.messages.send(np.zeros(1, np.int64), rank, tag=GOODBYE_TAG, label=label)
            except dist.PeerGoneError:
                pass


# --------------------------------------------------------------------------- the server


class _Server:
    """One server rank's event loop over the ranges it holds."""

    def __init__(self, ps: FaultTolerantParameterServer, server: int):
        self.ps = ps
        self.server = server
        self.layout = ps.layout
        self.messages = ps.messages
        servers = self.layout.servers
        self.copies: dict[int, RangeCopy] = {}
        for index in (server, (server - 1) % servers):
            shard = ReplicatedShard(ps.initial_weights, ps.key_ranges[index],
                                    workers=self.layout.workers, mode=ps.mode, tau=0,
                                    warmup_steps=ps.warmup_steps, lr=ps.lr,
                                    momentum=ps.momentum, keep_gradients=ps.keep_gradients,
                                    index=index)
            self.copies[index] = RangeCopy(shard, primary=index, backup=ps.backup_of(index))
        self.finished_workers: set[int] = set()
        self.gone_workers: set[int] = set()
        self.gone_servers: set[int] = set()
        self.taken_over: list[int] = []
        self.events: list[str] = []

    def serve(self) -> FaultTolerantServerResult:
        workers = self.layout.workers
        while len(self.finished_workers | self.gone_workers) < workers:
            self._notice_failures()
            self._answer_ready_pulls()
            try:
                info = self.messages.probe(src=None, tag=None, timeout=POLL_SECONDS)
            except dist.CommTimeoutError:
                continue
            self._handle(info.source, info.tag)
        return self._result()

    def _handle(self, source: int, tag: int) -> None:
        if tag == REQUEST_TAG:
            self._on_request(source)
        elif tag == REPLICATE_TAG:
            self._on_replicate(source)
        elif tag == ACK_TAG:
            self._on_ack(source)
        elif tag == GOODBYE_TAG:
            self.messages.recv(np.zeros(1, np.int64), src=source, tag=GOODBYE_TAG,
                               label=trace.with_info("goodbye", kind="goodbye"))
            self.finished_workers.add(self.layout.worker_of(source))
        else:
            raise RuntimeError(f"rank {dist.get_rank()} (server {self.server}): a message with "
                               f"tag {tag} from rank {source} in the parameter server's context; "
                               "this is a bug in the fault-tolerant parameter server")

    # -- requests from workers -------------------------------------------

    def _on_request(self, source: int) -> None:
        worker = self.layout.worker_of(source)
        header = np.empty(REQUEST_SIZE, np.int64)
        self.messages.recv(header, src=source, tag=REQUEST_TAG, label="request")
        index = int(header[0])
        copy = self.copies.get(index)
        if copy is None:
            raise RuntimeError(f"rank {dist.get_rank()} (server {self.server}): worker {worker} "
                               f"asked for key range {index}, which this server does not hold; "
                               "this is a bug in the fault-tolerant parameter server")
        gradient = None
        if header[1] != NO_STEP:
            gradient = np.empty(copy.shard.weights.shape, copy.shard.weights.dtype)
            try:
                self.messages.recv(gradient, src=source, tag=GRADIENT_TAG,
                                   label=_push_label(worker, int(header[1]), int(header[2])))
            except dist.PeerGoneError:
                return   # the worker died between its header and its gradient
        if copy.primary != self.server:
            # The worker saw the primary fail before this server did: hold the
            # request until dist.failed_ranks() confirms it and this server takes over.
            copy.deferred.append((worker, header, gradient))
            return
        self._serve_request(copy, worker, header, gradient)

    def _serve_request(self, copy: RangeCopy, worker: int, header, gradient) -> None:
        push_step, base_version, examples, pull_step = (int(v) for v in header[1:])
        if worker in self.gone_workers:
            return
        if gradient is not None:
            copy.shard.receive_push(Push(worker, push_step, base_version, examples, gradient))
            self._forward_updates(copy)
        if pull_step != NO_STEP:
            copy.waiting_pulls[worker] = pull_step

    # -- replication, the primary's side ----------------------------------

    def _forward_updates(self, copy: RangeCopy) -> None:
        """Send the backup every update applied since the last call."""
        shard = copy.shard
        while shard.unforwarded:
            gradient, pushes = shard.unforwarded.pop(0)
            version = shard.version - len(shard.unforwarded)
            step = pushes[0].step
            crash = self.ps.crash
            if (crash is not None and crash.moment == "before_forward"
                    and crash.server == self.server == copy.index and step == crash.step):
                _die_now()
            if copy.backup is None:
                continue
            identities = np.array([[p.worker, p.step, p.base_version, p.examples]
                                   for p in pushes], np.int64).reshape(-1)
            meta = np.concatenate([np.array([copy.index, version], np.int64), identities])
            label = trace.with_info("replicate", kind="replicate", range=copy.index,
                                    version=version, step=step)
            backup_rank = self.layout.server_rank(copy.backup)
            try:
                self.messages.send(meta, backup_rank, tag=REPLICATE_TAG, label=label)
                self.messages.send(gradient, backup_rank, tag=REPLICATED_GRADIENT_TAG,
                                   label=label)
            except dist.PeerGoneError:
                self._backup_lost(copy)

    def _on_ack(self, source: int) -> None:
        ack = np.empty(2, np.int64)
        self.messages.recv(ack, src=source, tag=ACK_TAG,
                           label=trace.with_info("ack", kind="ack"))
        copy = self.copies[int(ack[0])]
        copy.acknowledged = max(copy.acknowledged, int(ack[1]))

    def _answer_ready_pulls(self) -> None:
        for copy in self.copies.values():
            if copy.primary != self.server:
                continue
            shard = copy.shard
            replicated = copy.backup is None or copy.acknowledged == shard.version
            if not replicated:
                continue
            for worker in sorted(copy.waiting_pulls):
                if shard.can_answer_pull(copy.waiting_pulls[worker]):
                    self._answer_pull(copy, worker, copy.waiting_pulls.pop(worker))

    def _answer_pull(self, copy: RangeCopy, worker: int, step: int) -> None:
        shard = copy.shard
        label = trace.with_info("pull", kind="pull", worker=worker, step=step, range=copy.index,
                                version=shard.version)
        destination = self.layout.worker_rank(worker)
        try:
            self.messages.send(np.array([shard.version, step], np.int64), destination,
                               tag=_range_tag(REPLY_TAG, copy.index), label=label)
            self.messages.send(shard.weights, destination, tag=_range_tag(WEIGHTS_TAG, copy.index),
                               label=label)
        except dist.PeerGoneError:
            return   # the worker died waiting; _notice_failures drops it
        crash = self.ps.crash
        if (crash is not None and crash.moment == "after_one_reply"
                and crash.server == self.server == copy.index and step == crash.step + 1):
            _die_now()

    # -- replication, the backup's side -----------------------------------

    def _on_replicate(self, source: int) -> None:
        try:
            meta = self.messages.recv_array(src=source, tag=REPLICATE_TAG,
                                            label=trace.with_info("replicate", kind="replicate"))
        except dist.PeerGoneError:
            return   # the primary died mid-forward: nobody has seen this update
        index, version = int(meta[0]), int(meta[1])
        copy = self.copies[index]
        shard = copy.shard
        label = trace.with_info("replicate", kind="replicate", range=index, version=version)
        gradient = np.empty(shard.weights.shape, shard.weights.dtype)
        try:
            self.messages.recv(gradient, src=source, tag=REPLICATED_GRADIENT_TAG, label=label)
        except dist.PeerGoneError:
            return   # the primary died mid-forward: nobody has seen this update
        if version != shard.version + 1:
            raise RuntimeError(f"rank {dist.get_rank()} (server {self.server}): range {index} "
                               f"got version {version} from its primary while holding version "
                               f"{shard.version}; this is a bug in the replication")
        pushes = [Push(int(w), int(s), int(b), int(e), gradient)
                  for w, s, b, e in meta[2:].reshape(-1, IDENTITY_SIZE)]
        shard.apply_forwarded(gradient, pushes)
        try:
            self.messages.send(np.array([index, shard.version], np.int64), source, tag=ACK_TAG,
                               label=trace.with_info("ack", kind="ack", range=index,
                                                     version=shard.version))
        except dist.PeerGoneError:
            pass   # the primary is gone; this server takes over once it knows

    # -- failures ---------------------------------------------------------

    def _notice_failures(self) -> None:
        failed = {self.ps.group.group_rank(rank) for rank in dist.failed_ranks()} - {-1}
        for rank in sorted(failed):
            if self.layout.is_server(rank):
                if rank not in self.gone_servers:
                    self.gone_servers.add(rank)
                    self._server_gone(rank)
            else:
                worker = self.layout.worker_of(rank)
                if worker not in self.gone_workers:
                    self.gone_workers.add(worker)
                    self._worker_gone(worker)

    def _server_gone(self, gone: int) -> None:
        for copy in self.copies.values():
            if copy.primary == gone:
                self._take_over(copy, gone)
            elif copy.primary == self.server and copy.backup == gone:
                self._backup_lost(copy)

    def _take_over(self, copy: RangeCopy, gone: int) -> None:
        """Become the primary of the dead server's range: first apply what it
        forwarded before dying, then serve the requests held for this moment."""
        gone_rank = self.layout.server_rank(gone)
        while self.messages.iprobe(src=gone_rank, tag=REPLICATE_TAG) is not None:
            self._on_replicate(gone_rank)
        copy.primary, copy.backup = self.server, None
        self.taken_over.append(copy.index)
        _fault_event("take over", kind="failover", range=copy.index, server=self.server,
                     gone=gone, version=copy.shard.version)
        _say(self.events,
             f"server {self.server} (rank {dist.get_rank()}): server {gone} (rank "
             f"{self.ps._server_world_rank(gone)}) is gone; this server takes over key range "
             f"{copy.index} at version {copy.shard.version}")
        held, copy.deferred = copy.deferred, []
        for worker, header, gradient in held:
            self._serve_request(copy, worker, header, gradient)

    def _backup_lost(self, copy: RangeCopy) -> None:
        if copy.backup is None:
            return
        gone = copy.backup
        copy.backup = None
        _fault_event("backup lost", kind="backup_lost", range=copy.index, server=gone)
        _say(self.events,
             f"server {self.server} (rank {dist.get_rank()}): backup server {gone} (rank "
             f"{self.ps._server_world_rank(gone)}) is gone; key range {copy.index} goes on "
             "with one copy")

    def _worker_gone(self, worker: int) -> None:
        primaries = [copy for copy in self.copies.values() if copy.primary == self.server]
        step = min(copy.shard.clock[worker] for copy in primaries) + 1 if primaries else 0
        for copy in self.copies.values():
            copy.waiting_pulls.pop(worker, None)
            copy.deferred = [held for held in copy.deferred if held[0] != worker]
            copy.shard.drop_worker(worker)
            if copy.primary == self.server:
                self._forward_updates(copy)
        remaining = self.layout.workers - len(self.gone_workers)
        _fault_event("worker gone", kind="worker_gone", worker=worker, step=step,
                     workers=remaining)
        world_rank = self.ps.group.global_rank(self.layout.worker_rank(worker))
        _say(self.events,
             f"server {self.server}: worker {worker} (rank {world_rank}) is gone; step {step} "
             f"goes on with {remaining} workers")

    # -- the end ------------------------------------------------------------

    def _result(self) -> FaultTolerantServerResult:
        reports = {}
        for index, copy in self.copies.items():
            shard = copy.shard
            reports[index] = RangeReport(
                index, shard.key_range, "primary" if copy.primary == self.server else "backup",
                np.array(shard.weights, copy=True), shard.version, shard.pushes,
                shard.duplicates, shard.applied_gradients)
        return FaultTolerantServerResult("server", self.server, reports, self.taken_over,
                                         sorted(self.gone_workers), self.events,
                                         self.layout.servers)
