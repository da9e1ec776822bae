"""A fault-tolerant server rank: chain replication of its ranges, and taking over.

Read after :mod:`.replicated_shard`. Every server is the *primary* of one
key range and the *backup* of its neighbour's (:mod:`.fault_tolerant`
says why); one loop (:class:`_Server`) serves both. Chain replication after
aggregation, for each range:

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
held by their workers, which send them again.

Taking over. A worker that finds the primary gone sends its request to the
backup. The backup holds such a request until ``dist.failed_ranks()`` names
the primary; then it first applies whatever the dead primary had forwarded,
becomes the range's primary (logged, traced) and serves the held requests.
A server whose backup died goes on without one (logged). A worker that
dies is dropped from the synchronous barrier ("worker 2 (rank 4) is gone;
step 7 goes on with 3 workers"); a worker dying between its pushes to two
ranges leaves them one step apart in who they averaged. A server ends when
every worker has said goodbye or is gone.

Messages travel in their own context ("fault-tolerant parameter server"),
labelled ``kind=push|pull|replicate|ack|goodbye``.

Cost, over the plain parameter server (P the weights' bytes, S servers):
each update sends P / S more, primary to backup, and a small
acknowledgement back, so a server's traffic grows by one range per update
(one update per step in BSP, W in async), not by W; each step's latency
grows by that round trip (2 alpha + P / S beta) before any pull is answered.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import minidist.distributed as dist
from minidist import trace
from minidist.parallel.parameter_server.failures import _die_now, _fault_event, _say
from minidist.parallel.parameter_server.messages import NO_STEP, Push, _push_label
from minidist.parallel.parameter_server.replicated_shard import (
    RangeCopy,
    RangeReport,
    ReplicatedShard,
)

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


def _range_tag(tag: int, index: int) -> int:
    return tag + RANGE_TAG_STRIDE * index


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


class _Server:
    """One server rank's event loop over the ranges it holds, run with the
    settings of ``ps``, its
    :class:`~minidist.parallel.parameter_server.fault_tolerant.FaultTolerantParameterServer`."""

    def __init__(self, ps, server: int):
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

