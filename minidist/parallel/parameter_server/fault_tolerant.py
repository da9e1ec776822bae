"""Fault-tolerant parameter server: every key range on two servers.

A parameter server's strength, says the zhihu article on distributed training
("深度模型常见加速训练策略架构篇(一)"), is fault tolerance: "set up several
servers". This is the parameter server of
:mod:`minidist.parallel.parameter_server.server` (read it first) made to survive a
server dying mid run, and workers dying, with no update lost.

Layout. S >= 2 servers (ranks ``0 .. S-1``) and W workers, as in
:class:`~minidist.parallel.parameter_server.layout.Layout`. Server ``s`` is the
*primary* of key range ``s`` and the *backup* of range ``(s - 1) % S``: the
backup of range ``r`` is server ``(r + 1) % S``. No extra ranks (a small world
keeps its workers), at the price of every server holding two ranges and
doing each update twice, once for itself and once for its neighbour. The
primary forwards every update to the backup and answers a pull only once
the backup has acknowledged it (chain replication, :mod:`.replication`).

Read in this order: this overview and the workers' side (below), then
:mod:`.failures` (crashes made on purpose, and how a fault is reported),
:mod:`.replicated_shard` (a range's copy: each push applied exactly once),
:mod:`.replication` (a server rank's loop: forwarding, acknowledging,
taking over).

Failover, the worker's side. A worker keeps its last request until the
reply comes. When the primary is gone (PeerGoneError on the send or on the
reply: a small send to a dead rank may even complete, so the reply is where
death shows), the worker logs it and sends the same request to the range's
backup, which takes the range over. The request sent again may hold a push
the backup already has: the backup's vector clock ignores it.

What it survives: any one server, and any workers (under
``launch(..., tolerate_failures=...)``, a dead worker shows in
``dist.failed_ranks()``). After a failover the range has a single copy
(nothing copies it to a third server), and a server whose backup died goes
on without one (logged); losing both servers of a range ends the run with
an error that says so.

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

Cost, over the plain parameter server (P the weights' bytes): each update
sends P / S more, primary to backup, and a small acknowledgement back; each
step's latency grows by that round trip (2 alpha + P / S beta) before any
pull is answered. Memory and update work per server double. A failover
costs the workers one request sent again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.parallel.parameter_server.failures import ServerCrash, _fault_event, _say
from minidist.parallel.parameter_server.messages import NO_STEP, PendingPush, _push_label
from minidist.parallel.parameter_server.replication import (
    GOODBYE_TAG,
    GRADIENT_TAG,
    REPLY_TAG,
    REQUEST_TAG,
    WEIGHTS_TAG,
    FaultTolerantServerResult,
    _range_tag,
    _Server,
)
from minidist.parallel.parameter_server.server import ParameterServer, WorkerResult, _check_whole

FAULT_TOLERANT_MODES = ("bsp", "async")


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
