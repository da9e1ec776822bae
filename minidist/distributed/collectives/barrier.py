"""barrier: no rank leaves until every rank of the group has entered.

    dist.barrier()                                # every rank, the world
    dist.barrier(algorithm="tree")

Only empty messages move, so the cost is latency alone (n ranks):

=====================  ===========================================
dissemination          ceil(log2 n) alpha
tree                   2 ceil(log2 n) alpha
=====================  ===========================================

A rank may leave once it has heard, directly or through others, from every
rank: then every rank has entered.
"""

from __future__ import annotations

import datetime
import pickle
import time

import numpy as np

from minidist.alpha_beta import ceil_log2
from minidist.distributed.collectives import call, trees
from minidist.distributed.collectives.registry import cost, register
from minidist.distributed.transport.base import _DEFAULT
from minidist.runtime.errors import CommTimeoutError, PeerGoneError


def _empty() -> np.ndarray:
    return np.empty(0, np.uint8)


@cost("ceil(log2 n) alpha",
      traffic=lambda n, count=0, itemsize=0, root=0: (n * ceil_log2(n), 0))
def dissemination(comm):
    """Dissemination barrier: in round k each rank sends an empty message to
    rank + 2^k and receives one from rank - 2^k (mod n). After round k a rank
    has heard from the 2^(k+1) ranks before it, so after ceil(log2 n) rounds
    from all of them; no rank is in charge and any n works.
    Cost: ceil(log2 n) alpha."""
    n, rank = comm.size, comm.rank
    distance = 1
    while distance < n:
        round_ = distance.bit_length() - 1
        target, source = (rank + distance) % n, (rank - distance) % n
        yield [comm.isend(_empty(), target, f"round {round_} to {target}"),
               comm.irecv(_empty(), source, f"round {round_} from {source}")]
        distance <<= 1


@cost("2 ceil(log2 n) alpha", traffic=lambda n, count=0, itemsize=0, root=0: (2 * (n - 1), 0))
def tree(comm):
    """Tree barrier: a binomial gather of empty messages to rank 0 (each rank
    reports once its whole subtree has), then a binomial broadcast of empty
    messages from rank 0 (everyone has entered: go). Any n works: subtrees
    past the end are smaller or missing. Cost: 2 ceil(log2 n) alpha."""
    n, rank = comm.size, comm.rank
    children = trees.children(rank, n)
    last = max(n - 1, 0).bit_length() - 1
    if children:
        receives = []
        for child in children:
            comm.at(trees.round_of(child), "entered")  # leaves report first
            receives.append(comm.irecv(_empty(), child, f"entered: from {child}"))
        yield receives
    if rank:
        parent = trees.parent(rank)
        comm.at(trees.round_of(rank), "entered")
        yield [comm.isend(_empty(), parent, f"entered: to {parent}")]
        comm.at(last + 1 + last - trees.round_of(rank), "go")
        yield [comm.irecv(_empty(), parent, f"go: from {parent}")]
    if children:
        sends = []
        for child in children:
            comm.at(last + 1 + last - trees.round_of(child), "go")  # the largest subtree first
            sends.append(comm.isend(_empty(), child, f"go: to {child}"))
        yield sends


ALGORITHMS = register("barrier", {
    "dissemination": dissemination,
    "tree": tree,
})


def barrier(group=None, async_op: bool = False, algorithm: str = "auto", *, timeout=_DEFAULT):
    """Return once every rank of ``group`` (None: the world) has entered.

    ``algorithm``: one of :data:`ALGORITHMS` or "auto". ``timeout``: seconds
    each wait may take (default: the run's timeout; None: no limit); with
    ``async_op=True`` pass it to the Work's ``wait`` instead. With
    ``async_op=True`` returns a Work: ``test()`` says whether everyone has
    entered yet, without blocking.
    """
    group = call.group_of(group)
    if group.size == 1:
        return call.nothing_to_do(async_op)
    comm = call.start("barrier", group, algorithm, nbytes=0, dtype=np.uint8)
    return call.execute(comm, call.steps_of(comm)(comm), async_op, timeout=timeout)


# --------------------------------------------------------------------------- monitored_barrier

_MONITORED_CALLS: dict = {}  # the collective context of a group -> calls made so far


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not come (torch.distributed's).

    Group rank 0 waits for an empty message from every other rank, all within
    one ``timeout`` (seconds or a timedelta; None: the run's timeout), then
    sends each rank the verdict: go, or the list of ranks that did not arrive.
    If some did not, every rank raises :class:`CommTimeoutError` naming them:
    the first missing one, or all of them with ``wait_all_ranks=True``. A
    rank that comes late finds the verdict waiting and raises at once; the
    other ranks wait up to twice the timeout for rank 0's verdict (if rank 0
    itself never comes, they raise naming it).

    A debugging tool, not a fast barrier: rank 0 hears from each rank in
    turn. Cost: 2 (n - 1) messages through rank 0, (n - 1) alpha on its side.
    """
    group = call.group_of(group)
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if timeout is None:
        timeout = group.transport.default_timeout
    if timeout is None:
        raise ValueError(f"rank {group._global_rank}: monitored_barrier: this run has no "
                         "timeout, and a barrier that watches the clock needs one; pass "
                         "timeout= (seconds).")
    if not timeout >= 0:
        raise ValueError(f"rank {group._global_rank}: monitored_barrier needs a timeout of "
                         f"0 seconds or more, got {timeout!r}")
    channel = group.with_context("monitored_barrier")
    calls = _MONITORED_CALLS.get(channel.context, 0)
    _MONITORED_CALLS[channel.context] = calls + 1
    tag = calls % (1 << 30)  # calls apart: a late rank's arrival never counts for the next call
    n, rank = group.size, group.rank
    world = [group.global_rank(r) for r in range(n)]
    if rank != 0:
        channel.send(_empty(), 0, tag, label="arrived")
        try:
            missing = channel.recv_object(0, tag, timeout=2 * timeout)
        except (CommTimeoutError, PeerGoneError):
            missing = [0]
    else:
        start = time.monotonic()
        arrivals = {other: channel.irecv(_empty(), other, tag, label=f"arrived: {other}")
                    for other in range(1, n)}
        missing = []
        for other, request in arrivals.items():
            # One deadline for all; past it, each wait only checks (and
            # withdraws the receive, so a late message is not half-expected).
            try:
                request.wait(max(0.0, timeout - (time.monotonic() - start)))
            except (CommTimeoutError, PeerGoneError):
                missing.append(other)
        for other in range(1, n):
            channel.isend(_object(missing), other, tag, label="verdict")
    if missing:
        named = missing if wait_all_ranks else missing[:1]
        ranks = ", ".join(str(world[r]) for r in named)
        raise CommTimeoutError(
            f"rank {group._global_rank}: monitored_barrier: rank{'s' if len(named) > 1 else ''} "
            f"{ranks} did not arrive within {timeout:g} s"
            + ("" if wait_all_ranks or len(missing) == 1 else
               f" (and {len(missing) - 1} more; wait_all_ranks=True names them all)")
            + ". Look at what those ranks were doing: a slower path, a missing call, a hang.",
            operation="monitored_barrier", peer=world[missing[0]])


def _object(value) -> np.ndarray:
    return np.frombuffer(pickle.dumps(value), np.uint8)
