"""Run a collective on many simulated ranks in this process, and time it.

    from minidist.distributed import simulate
    result = simulate("all_reduce", "ring", world_size=1024, nbytes=100_000_000,
                      alpha=5e-6, beta=1e-10, gamma=1e-10, trace="ring.jsonl")
    result.time        # simulated seconds (the latest rank's clock)
    result.predicted   # the cost model's formula, for comparison

How. Every rank gets a :class:`~minidist.distributed.transport.sim.SimTransport`
of one :class:`~minidist.distributed.transport.sim.SimNetwork` and a
:class:`~minidist.distributed.process_group.ProcessGroup` on it, and calls the
*public* collective with ``group=`` its group and ``async_op=True``: exactly
the code that runs on real processes. Each call returns a Work whose
generator has not started. The driver then moves the ranks on: it calls
``work.test()`` on a rank, which runs its algorithm until it waits for a
message that has not been sent yet, and takes the next rank from a queue of
ranks that have something new (a receive completed). When the queue is
empty and some rank has not finished, that rank waits for a message nobody
will send: the error names who waits for what.

The virtual clock (see :mod:`~minidist.virtual_clock` and
:mod:`~minidist.distributed.transport.sim`) follows
the cost model's single-port alpha-beta-gamma model, so on arrays that
divide evenly the simulated time equals the formula of
:mod:`minidist.costmodel`; where they differ, the simulation shows what the
formula leaves out (chunks of unequal size, the ranks of a non-power-of-two
world waiting for each other).

Big arrays cost nothing: the ranks run on a small array (an element count
every chunking of the algorithms divides), and the network charges each
message ``byte_scale`` times its real size. Only arrays that fit in
:data:`MEMORY_BUDGET` for all ranks together are simulated at their real size.

Symmetric algorithms cost one rank. In the ring, two-shot, one-shot (and the
other algorithms of :data:`SYMMETRIC`) rank r does exactly what rank 0 does
with every rank number shifted by r: it sends the same sizes at the same
moments to rank r + d that rank 0 sends to rank d. All ranks then have the
same clock at every step, and the message rank 0 receives from rank -d is
the one it sends to rank d itself. So the simulator runs rank 0 alone, the
network handing each of its sends back to it as its neighbour's (see
``symmetric`` in :class:`~minidist.distributed.transport.sim.SimNetwork`),
and multiplies its messages and bytes by n: the same algorithm code, the
same clock arithmetic, 1/n of the work and memory (the ring at 65,536 ranks
is 131,070 messages instead of 8.6 billion). This holds when every rank's
array cuts into equal pieces, which the driver's element count guarantees;
given ``inputs``, a trace, or ``symmetry=False``, every rank runs. The
tests hold each algorithm of :data:`SYMMETRIC` to the full simulation's
exact times, message counts and bytes.

A cluster with a shape. ``simulate(..., topology=Topology)`` (see
:mod:`minidist.topology`) charges each message by the link it crosses and
makes a node's off-node messages share its NICs (see
:mod:`~minidist.distributed.transport.sim`). Then the ranks are no longer
all alike, and one rank cannot stand for all: the symmetric shortcut runs
node 0's ranks instead (R of them, R ranks a node), which is exact for the
algorithms of :data:`SYMMETRIC` because shifting every rank by a whole node
changes neither the algorithm nor the cluster, as long as no two messages of
a node wait for the same NIC: the order a NIC takes them in is then the
driver's, which differs from node to node. So node 0 stands for all in the
rings (:data:`RINGS`: one rank a node sends off it) and, for every
symmetric algorithm, when each rank has a NIC of its own; otherwise every
rank runs (see :func:`node_symmetric`). ``result.predicted`` is then
the two-level figure of :func:`~minidist.distributed.collectives.topology_costs.predict`
where one exists (None otherwise; ``topology_costs.kind`` says whether it is
exact or a bound), and "auto" picks the least of them, the algorithms for
nodes (:data:`~.collectives.registry.NODE_ALGORITHMS`) among them.

Every collective of :data:`~minidist.distributed.collectives.ALGORITHMS` has
an entry in :data:`CALLS` saying which arrays a rank passes and how its
public function is called; a new collective needs one there. An algorithm
that cuts the array by its size in bytes (chain segments, pipeline chunks)
asks ``comm.nbytes_of(buffer)`` and has an entry in :data:`GRAINS`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from minidist import alpha_beta
from minidist import topology as _topology
from minidist import trace as _trace
from minidist.atomic_file import atomic_write
from minidist.distributed.collectives import (
    ALGORITHMS,
    all_gather_into_tensor,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter_tensor,
    registry,
    scatter,
    topology_costs,
)
from minidist.distributed.collectives.broadcast import chain_segments
from minidist.distributed.collectives.chunks import double_binary_tree_chunks, largest_power_of_two
from minidist.distributed.process_group import ProcessGroup
from minidist.distributed.reduce_op import ReduceOp
from minidist.distributed.transport.sim import (  # noqa: F401 - the stall, raised by drive
    SimNetwork,
    SimulationStallError,
)
from minidist.runtime.errors import DistributedError
from minidist.topology import Topology
from minidist.virtual_clock import ReadyQueue

MEMORY_BUDGET = 16 << 20
"""Real bytes (all ranks together) up to which arrays are simulated at their true size."""


class SimulationError(DistributedError):
    """A simulated rank raised: the algorithm failed, not the simulator."""


# --------------------------------------------------------------------------- how to call each collective


@dataclass(frozen=True)
class CollectiveCall:
    """How the driver calls one public collective on a simulated rank.

    ``inputs(rank, world_size, count, dtype, root)``: the arrays the rank
    passes (a tuple; lists and None where the call takes them), where
    ``count`` is the element count of the N-byte array the cost model means.
    ``start(group, arrays, root, algorithm, op)``: the call, with
    ``async_op=True``, returning its Work. ``rooted``: takes a root.
    ``split``: N is cut into n equal pieces, one per rank (scatter, gather,
    all_gather, reduce_scatter, all_to_all), so ``count`` is a multiple of n.
    ``piece_first``: the first array is one rank's piece of N (N = n times
    its size), not the whole N; how N is read from given inputs.
    ``sized``: the call moves data (a barrier does not).
    """

    inputs: Callable
    start: Callable
    rooted: bool = False
    split: bool = False
    piece_first: bool = False
    sized: bool = True


def sample_values(rank: int, count: int, dtype) -> np.ndarray:
    """Rank-dependent small integers: exact in every dtype, so any order of
    summation gives the same bits and a result can be checked exactly."""
    dtype = np.dtype(dtype)
    values = (np.arange(count, dtype=np.int64) * 7 + rank * 3 + 1) % 5
    if dtype == np.bool_:
        return values % 2 == 1
    return values.astype(dtype)


def _one_array(rank, n, count, dtype, root):
    return (sample_values(rank, count, dtype),)


def _whole_in_and_out(rank, n, count, dtype, root):
    return sample_values(rank, count, dtype), np.zeros(count, dtype)


CALLS: dict[str, CollectiveCall] = {
    "broadcast": CollectiveCall(
        _one_array, rooted=True,
        start=lambda group, arrays, root, algorithm, op: broadcast(
            arrays[0], group=group, group_src=root, async_op=True, algorithm=algorithm)),
    "reduce": CollectiveCall(
        _one_array, rooted=True,
        start=lambda group, arrays, root, algorithm, op: reduce(
            arrays[0], group=group, group_dst=root, op=op, async_op=True, algorithm=algorithm)),
    "all_reduce": CollectiveCall(
        _one_array,
        start=lambda group, arrays, root, algorithm, op: all_reduce(
            arrays[0], op=op, group=group, async_op=True, algorithm=algorithm)),
    "scatter": CollectiveCall(
        inputs=lambda rank, n, count, dtype, root: (
            np.zeros(count // n, dtype),
            [sample_values(peer, count // n, dtype) for peer in range(n)]
            if rank == root else None),
        start=lambda group, arrays, root, algorithm, op: scatter(
            arrays[0], arrays[1], group=group, group_src=root, async_op=True, algorithm=algorithm),
        rooted=True, split=True, piece_first=True),
    "gather": CollectiveCall(
        inputs=lambda rank, n, count, dtype, root: (
            sample_values(rank, count // n, dtype),
            [np.zeros(count // n, dtype) for _ in range(n)] if rank == root else None),
        start=lambda group, arrays, root, algorithm, op: gather(
            arrays[0], arrays[1], group=group, group_dst=root, async_op=True, algorithm=algorithm),
        rooted=True, split=True, piece_first=True),
    "all_gather": CollectiveCall(
        inputs=lambda rank, n, count, dtype, root: (sample_values(rank, count // n, dtype),
                                                    np.zeros(count, dtype)),
        start=lambda group, arrays, root, algorithm, op: all_gather_into_tensor(
            arrays[1], arrays[0], group=group, async_op=True, algorithm=algorithm),
        split=True, piece_first=True),
    "reduce_scatter": CollectiveCall(
        inputs=lambda rank, n, count, dtype, root: (sample_values(rank, count, dtype),
                                                    np.zeros(count // n, dtype)),
        start=lambda group, arrays, root, algorithm, op: reduce_scatter_tensor(
            arrays[1], arrays[0], op=op, group=group, async_op=True, algorithm=algorithm),
        split=True),
    "all_to_all": CollectiveCall(
        _whole_in_and_out,
        start=lambda group, arrays, root, algorithm, op: all_to_all_single(
            arrays[1], arrays[0], group=group, async_op=True, algorithm=algorithm),
        split=True),
    "barrier": CollectiveCall(
        inputs=lambda rank, n, count, dtype, root: (),
        start=lambda group, arrays, root, algorithm, op: barrier(
            group=group, async_op=True, algorithm=algorithm),
        sized=False),
}

#: Algorithms that cut the array by its size in bytes (segments of a chain,
#: chunks of a pipeline) rather than into n or p pieces: (n, N) -> the number
#: of equal pieces, which the simulated element count must be a multiple of.
GRAINS: dict[tuple[str, str], Callable] = {
    ("broadcast", "chain"): lambda n, N: chain_segments(N),
    ("all_reduce", "double_binary_tree"): lambda n, N: 2 * double_binary_tree_chunks(N),
    ("all_reduce", "nccl_tree"): lambda n, N: 2 * double_binary_tree_chunks(N),
}


#: Algorithms that only ever send whole arrays (no chunks): when the default
#: grain does not fit :data:`MEMORY_BUDGET`, one element per rank stands
#: for the N bytes exactly, instead of n elements (n^2 for all the ranks).
WHOLE_ARRAYS: frozenset = frozenset({
    ("all_reduce", "coordinator"), ("all_reduce", "reduce_broadcast"),
    ("all_reduce", "recursive_doubling"),
})

#: Algorithms in which rank r does what rank 0 does with every rank number
#: shifted by r (sends to rank + d, receives from rank - d, pieces of equal
#: size), so that one rank stands for all (see the module's docstring).
#: An entry here is a claim the tests check: the symmetric simulation must
#: give the full one's time, messages and bytes exactly.
SYMMETRIC: frozenset = frozenset({
    ("all_reduce", "ring"), ("all_reduce", "two_shot"), ("all_reduce", "one_shot"),
    ("all_gather", "ring"), ("all_gather", "bruck"),
    ("reduce_scatter", "ring"), ("reduce_scatter", "pairwise"),
    ("all_to_all", "pairwise"), ("all_to_all", "bruck"),
    ("barrier", "dissemination"),
})


#: The rings of :data:`SYMMETRIC`: every step a rank sends to the next rank
#: only, so a ring leaves each node from one rank and no NIC is ever asked
#: for by two messages at once.
RINGS: frozenset = frozenset({
    ("all_reduce", "ring"), ("all_gather", "ring"), ("reduce_scatter", "ring"),
})


def node_symmetric(collective: str, algorithm: str, topology: Topology) -> bool:
    """Whether node 0's ranks may stand for every node's on ``topology``: the
    algorithm is symmetric (:data:`SYMMETRIC`), and no two of a node's
    messages ever wait for the same NIC, whose order would be the driver's
    (a ring, or a NIC a rank). Else every rank runs."""
    return (collective, algorithm) in SYMMETRIC and (
        (collective, algorithm) in RINGS or topology.ranks_per_nic == 1)


# --------------------------------------------------------------------------- result


@dataclass
class SimulationResult:
    """What one simulated call did and how long it took (seconds of virtual time)."""

    collective: str
    algorithm: str
    world_size: int
    nbytes: int
    params: alpha_beta.Params
    time: float
    clocks: list[float]
    messages: int
    bytes: float
    byte_scale: float
    predicted: float | None
    #: Each rank's arrays after the call; None when one rank stood for all
    #: (``symmetric``: its arrays hold no meaningful result).
    buffers: list | None = field(repr=False)
    #: With tracing: one tuple per send and per receive, in
    #: :data:`minidist.trace.FIELDS` order, times in virtual nanoseconds.
    events: list[tuple] | None = field(default=None, repr=False)
    #: True when rank 0 (or, with a topology, node 0) was simulated for all
    #: ranks (see :data:`SYMMETRIC`).
    symmetric: bool = False
    #: The cluster's shape the messages were charged on (None: the flat network).
    topology: Topology | None = None

    def trace_header(self) -> dict:
        # On a topology, alpha and beta are the intra link's; the shape says the rest.
        shape = {} if self.topology is None else {"topology": {
            "name": self.topology.name, "nodes": self.topology.nodes,
            "ranks_per_node": self.topology.ranks_per_node,
            "nics_per_node": self.topology.nics_per_node,
            "spine_oversubscription": self.topology.spine_oversubscription,
            "inter_alpha": self.topology.inter.alpha, "inter_beta": self.topology.inter.beta,
            "described": self.topology.describe()}}
        return _trace.make_header(
            self.world_size, transport="sim", clock="virtual", collective=self.collective,
            algorithm=self.algorithm, nbytes=self.nbytes, alpha=self.params.alpha,
            beta=self.params.beta, gamma=self.params.gamma, simulated_seconds=self.time,
            **shape)

    def event_dicts(self) -> list[dict]:
        """The events in the written form (one dict per message end)."""
        return [dict(zip(_trace.FIELDS, event)) for event in self.events or ()]

    def write_trace(self, path) -> int:
        """Write the events as a minidist trace (JSON lines, as
        :func:`minidist.trace.write_jsonl` does, one event at a time so that
        millions of them need no list of dicts); returns their number."""
        if self.events is None:
            raise ValueError("this simulation kept no events; run simulate(..., trace=True) "
                             "or simulate(..., trace='file.jsonl')")
        ordered = sorted(self.events, key=lambda event: (event[6], event[0]))  # start, rank
        header = self.trace_header()
        header["events"] = len(ordered)
        path = os.fspath(path)
        fields = _trace.FIELDS
        with atomic_write(path) as file:
            file.write(json.dumps(header) + "\n")
            for event in ordered:
                file.write(json.dumps(dict(zip(fields, event)), separators=(",", ":")) + "\n")
        return len(ordered)


# --------------------------------------------------------------------------- sizing


def plan_elements(world_size: int, nbytes: int, itemsize: int, split: bool = False,
                  grain: int | None = None, whole: bool = False) -> tuple[int, float]:
    """(elements of the N-byte array, byte_scale) to simulate it with.

    At its true size when that fits :data:`MEMORY_BUDGET` for all ranks (and,
    with ``split``, divides into n equal pieces). Otherwise a multiple of
    ``grain`` elements, charged as ``nbytes`` bytes: the number of equal
    pieces the algorithm cuts the array into, so that it cuts the small array
    in the same proportions as the big one. The default grain, lcm(n, p)
    (p: the largest power of two <= n), serves every algorithm that cuts into
    n or p pieces and halves of those. A grain too big for the budget falls
    back to n elements: then the pieces are only nearly proportional; or,
    with ``whole`` (the algorithm sends only whole arrays, see
    :data:`WHOLE_ARRAYS`), to one element, which is exact.
    """
    count, rest = divmod(nbytes, itemsize)
    if rest == 0 and nbytes * world_size <= MEMORY_BUDGET and not (split and count % world_size):
        return count, 1.0
    if grain is None:
        grain = math.lcm(world_size, largest_power_of_two(world_size))
    elif split:
        grain = math.lcm(grain, world_size)
    if grain * itemsize * world_size <= MEMORY_BUDGET:
        count = grain
    else:
        count = 1 if whole and not split else world_size
    return count, nbytes / (count * itemsize)


# --------------------------------------------------------------------------- what a simulation costs

#: What a simulation costs this process, fitted by hand on small cases (see
#: :func:`estimate`; ``benchmarks/bench_simulator.py`` measures large ones):
#: every simulated rank keeps tables of one entry per rank of the world ...
BYTES_PER_RANK_PAIR = 5
SECONDS_PER_RANK_PAIR = 45e-9
#: ... every rank of the world some bookkeeping, even when one stands for all ...
BYTES_PER_RANK = 200
#: ... and each simulated message costs this much time (and, traced, memory).
SECONDS_PER_MESSAGE = 30e-6
TRACE_BYTES_PER_MESSAGE = 400
BASE_BYTES = 48 << 20
#: Past this many (simulated rank, rank) pairs the messages are not counted.
MAX_RANK_PAIRS = 10**11


@dataclass(frozen=True)
class Estimate:
    """About how long and how much memory :func:`simulate` will take."""

    seconds: float
    bytes: float
    messages: float          # messages the driver simulates (one rank's, when symmetric)
    symmetric: bool


def estimate(collective: str, algorithm: str, world_size: int, nbytes: int, *,
             dtype=np.float32, root: int = 0, trace: bool = False,
             topology: Topology | None = None) -> Estimate:
    """About the seconds and bytes of ``simulate(...)`` with these arguments,
    from arithmetic alone (nothing is simulated; well under a second).

    Fitted on small cases: a world of n ranks, R of them simulated (1 when
    the algorithm is symmetric, see :data:`SYMMETRIC`; else n), M messages
    simulated (the traffic formula's count, divided by n when symmetric)::

        memory  ~ BYTES_PER_RANK_PAIR * R * n  +  BYTES_PER_RANK * n
                  (+ TRACE_BYTES_PER_MESSAGE * M traced)
        time    ~ SECONDS_PER_RANK_PAIR * R * n  +  SECONDS_PER_MESSAGE * M

    Within a factor of a few of what large cases take (benchmarks/README.md,
    "The simulator at scale"), which is what a refusal before minutes of work
    needs. With a ``topology``, a symmetric simulation runs a node's ranks."""
    n = int(world_size)
    spec = CALLS[collective]
    nbytes = int(nbytes) if spec.sized else 0
    itemsize = np.dtype(dtype).itemsize
    grain = GRAINS.get((collective, algorithm))
    count, _ = plan_elements(n, nbytes, itemsize, spec.split,
                             None if grain is None else grain(n, nbytes),
                             whole=(collective, algorithm) in WHOLE_ARRAYS)
    symmetric = (not trace and (collective, algorithm) in SYMMETRIC and count % n == 0
                 and (topology is None or node_symmetric(collective, algorithm, topology)))
    simulated = (1 if topology is None else topology.ranks_per_node) if symmetric else n
    memory = BASE_BYTES + BYTES_PER_RANK_PAIR * simulated * n + BYTES_PER_RANK * n
    seconds = SECONDS_PER_RANK_PAIR * simulated * n
    if simulated * n > MAX_RANK_PAIRS:
        # Far past any machine already; counting the messages would take time
        # proportional to n for some traffic formulas.
        return Estimate(seconds, memory, math.nan, symmetric)
    messages = _expected_messages(collective, algorithm, n, nbytes, itemsize, root, topology)
    messages = float(n * max(n - 1, 1)) if messages is None else float(messages)
    if symmetric:
        messages *= simulated / n
    seconds += SECONDS_PER_MESSAGE * messages
    if trace:
        memory += TRACE_BYTES_PER_MESSAGE * messages
    return Estimate(seconds, memory, messages, symmetric)


# --------------------------------------------------------------------------- the driver


def _check(collective, algorithm, world_size, nbytes, root) -> None:
    if collective not in ALGORITHMS or collective not in CALLS:
        known = sorted(name for name in ALGORITHMS if name in CALLS)
        raise ValueError(f"cannot simulate collective {collective!r}; choose one of {known}")
    algorithms = list(registry.every_algorithm(collective))
    if algorithm not in algorithms and algorithm != "auto":
        raise ValueError(f"{collective} has no algorithm {algorithm!r}; choose one of "
                         f"{algorithms} or 'auto'")
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
            or world_size < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {world_size!r}")
    if nbytes is not None and (not isinstance(nbytes, (int, np.integer)) or nbytes < 0):
        raise ValueError(f"nbytes must be a whole number of bytes >= 0, got {nbytes!r}")
    if CALLS[collective].rooted and not 0 <= root < world_size:
        raise ValueError(f"root {root} is out of range: the simulated world has ranks "
                         f"0..{world_size - 1}")


def simulate(collective: str, algorithm: str = "auto", world_size: int = 8,
             nbytes: int | None = None, *, alpha: float | None = None, beta: float | None = None,
             gamma: float | None = None, dtype=np.float32, op=ReduceOp.SUM, root: int = 0,
             inputs=None, trace=None, symmetry: bool = True,
             progress: Callable | None = None,
             topology: Topology | None = None) -> SimulationResult:
    """Simulate one call of ``collective`` with ``algorithm`` on ``world_size`` ranks.

    ``nbytes``: the size N the cost model means (each rank's array for
    all_reduce); simulated on a small array scaled up (see
    :func:`plan_elements`). ``alpha`` (seconds per message), ``beta`` (seconds
    per byte), ``gamma`` (seconds per byte combined) default to
    ``alpha_beta.PARAMS["sim"]``. ``inputs``: each rank's arrays (a list of one
    array per rank, or of tuples for collectives taking several), simulated
    at their true size; ``result.buffers`` holds them after the call.
    ``trace``: True to keep the events in ``result.events``, or a path to also
    write them there as a minidist trace (virtual nanoseconds).
    ``symmetry``: run one rank for all when the algorithm allows it (see
    :data:`SYMMETRIC`; the times are the same, the buffers are not kept).
    ``progress``: called as ``progress(messages, total)`` once before the
    first message (``messages`` 0), now and then while the ranks run, and
    once at the end; ``total``: the messages the cost model's traffic
    formula counts, which is what every algorithm sends (None for one
    without a formula).
    ``topology``: a :class:`~minidist.topology.Topology` (a cluster of nodes,
    its links and NICs) on which each message is charged by the link it
    crosses, instead of one ``alpha`` and ``beta`` for every pair (give
    neither with it; ``gamma`` defaults to the topology's). The world must
    fill whole nodes of it. The symmetric shortcut then runs node 0's ranks
    for all (see the module's docstring), ``predicted`` is the two-level
    figure of :func:`.collectives.topology_costs.predict`, None where it has
    none, and "auto" is :func:`.collectives.topology_costs.best`. While
    the ranks run, :func:`minidist.topology.current` is this topology (None
    on the flat network), whatever :func:`minidist.topology.use` set before.
    """
    _check(collective, algorithm, world_size, nbytes, root)
    world_size = int(world_size)
    defaults = alpha_beta.PARAMS["sim"]
    if topology is not None:
        if not isinstance(topology, Topology):
            raise TypeError(f"topology= takes a minidist.topology.Topology, got "
                            f"{type(topology).__name__}; read one with parse_topology('dgx:4')")
        if alpha is not None or beta is not None:
            raise ValueError("give either topology= or alpha= and beta=, not both: the "
                             "topology's links set each message's alpha and beta")
        topology.check_world(world_size, "the simulated world")
        defaults = alpha_beta.Params(topology.intra.alpha, topology.intra.beta,
                                     topology.gamma)
    params = alpha_beta.Params(alpha=defaults.alpha if alpha is None else float(alpha),
                              beta=defaults.beta if beta is None else float(beta),
                              gamma=defaults.gamma if gamma is None else float(gamma))
    spec = CALLS[collective]
    if not spec.sized:
        nbytes = 0
    if algorithm == "auto":
        if nbytes is None and inputs is not None:
            nbytes = _size_of(spec, _given_inputs(inputs, world_size), world_size)
        # On a topology: the least two-level figure of every algorithm, flat or
        # for nodes (topology_costs.best, as "auto" on processes); none: the flat choice.
        chosen = (None if topology is None else
                  topology_costs.best(collective, world_size, nbytes or 0, topology,
                                      gamma=params.gamma))
        algorithm = chosen or registry.best(collective, world_size, nbytes or 0, params=params,
                                            candidates=tuple(ALGORITHMS[collective]))
    if inputs is not None:
        arrays = _given_inputs(inputs, world_size)
        real = _size_of(spec, arrays, world_size)
        nbytes = real if nbytes is None else int(nbytes)
        byte_scale = nbytes / real if real else 1.0
    else:
        if nbytes is None:
            raise ValueError("say how big the array is: nbytes=... (or pass inputs=)")
        grain = GRAINS.get((collective, algorithm))
        count, byte_scale = plan_elements(
            world_size, int(nbytes), np.dtype(dtype).itemsize, spec.split,
            None if grain is None else grain(world_size, int(nbytes)),
            whole=(collective, algorithm) in WHOLE_ARRAYS)
        symmetric = (symmetry and not trace and (collective, algorithm) in SYMMETRIC
                     and count % world_size == 0
                     and (topology is None or node_symmetric(collective, algorithm, topology)))
        stand_ins = (1 if topology is None else topology.ranks_per_node) if symmetric \
            else world_size
        arrays = [spec.inputs(rank, world_size, count, dtype, root)
                  for rank in range(stand_ins)]
    if inputs is not None:
        symmetric = False

    network = SimNetwork(world_size, params.alpha, params.beta, params.gamma,
                         byte_scale=byte_scale, record=bool(trace), symmetric=symmetric,
                         topology=topology)
    reporter = None
    if progress is not None:
        total = _expected_messages(collective, algorithm, world_size, int(nbytes or 0),
                                   np.dtype(dtype).itemsize, root, topology)

        def reporter(messages):
            progress(messages, total)
        progress(0, total)  # the total before the first message, for a bar's "0/N"
        if symmetric:
            _report_sends(network, reporter)
    # While it runs, the process's topology is the simulated cluster's (None:
    # flat), so that an algorithm that asks topology.current() sees its nodes.
    before = _topology.current()
    _topology.use(topology)
    try:
        _run(network, spec, arrays, root, algorithm, op, collective, reporter)
    finally:
        _topology.use(before)

    try:
        if topology is None:
            predicted = registry.predict(collective, algorithm, world_size, nbytes, params)
        else:
            predicted = topology_costs.predict(collective, algorithm, world_size, nbytes,
                                               topology, gamma=params.gamma)
    except ValueError:
        predicted = None  # no formula for this algorithm (on this topology)
    result = SimulationResult(
        collective=collective, algorithm=algorithm, world_size=world_size, nbytes=int(nbytes),
        params=params, time=network.time, clocks=network.clocks,
        messages=network.messages, bytes=network.bytes, byte_scale=byte_scale,
        predicted=predicted,
        buffers=None if symmetric else [a[0] if len(a) == 1 else a for a in arrays],
        events=network.events, symmetric=symmetric, topology=topology)
    if trace and not isinstance(trace, bool):
        result.write_trace(trace)
    return result


#: A symmetric network's rank looks at the clock for progress every this many sends.
SENDS_PER_LOOK = 4096


def _report_sends(network: SimNetwork, reporter: Callable) -> None:
    """Progress from inside a symmetric run: its one rank finishes the whole
    call in a single test of its Work, so the driver, which reports between
    tests, would say nothing until the end (the 65,536-rank ring's 8.6
    billion messages in one jump). Counting this rank's sends instead costs
    a counter per message; the clock is read every :data:`SENDS_PER_LOOK`
    sends, and ``reporter(messages)`` called at most every
    :data:`PROGRESS_SECONDS`."""
    transport = network.transports[0]
    send = transport.isend
    last = [time.monotonic(), 0]

    def counted_isend(*args, **kwargs):
        last[1] += 1
        if last[1] % SENDS_PER_LOOK == 0 and time.monotonic() - last[0] >= PROGRESS_SECONDS:
            last[0] = time.monotonic()
            reporter(network.messages)
        return send(*args, **kwargs)

    transport.isend = counted_isend


def _given_inputs(inputs, world_size: int) -> list[tuple]:
    inputs = list(inputs)
    if len(inputs) != world_size:
        raise ValueError(f"inputs has {len(inputs)} entries but world_size is {world_size}: "
                         "give one array (or tuple of arrays) per simulated rank")
    arrays = [tuple(entry) if isinstance(entry, tuple) else (entry,) for entry in inputs]
    for rank, entry in enumerate(arrays):
        for item in entry:
            if item is None or isinstance(item, np.ndarray):
                continue
            if isinstance(item, list) and all(isinstance(a, np.ndarray) for a in item):
                continue
            raise TypeError(f"inputs[{rank}] must hold NumPy arrays (or lists of them, or "
                            f"None, as the collective takes them), got {type(item).__name__}")
    return arrays


def _size_of(spec: CollectiveCall, arrays, world_size: int) -> int:
    """N (the cost model's bytes) of given inputs."""
    if not spec.sized or not arrays[0]:
        return 0
    first = arrays[0][0]
    return first.nbytes * world_size if spec.piece_first else first.nbytes


def _expected_messages(collective, algorithm, world_size, nbytes, itemsize, root,
                       topology=None):
    """The messages the cost model's traffic formula counts (None without one;
    an algorithm for nodes counts on ``topology``'s)."""
    count = nbytes // itemsize
    if collective in ("scatter", "gather"):
        count //= world_size  # their formulas count one rank's piece
    on_nodes = {"topology": topology} if registry.needs_topology(collective, algorithm) else {}
    try:
        return int(registry.traffic(collective, algorithm)(world_size, count, itemsize, root,
                                                           **on_nodes)[0])
    except (ValueError, KeyError, AttributeError, TypeError):
        return None


def _run(network: SimNetwork, spec: CollectiveCall, arrays, root, algorithm, op,
         collective, progress=None) -> None:
    """Start the call on every rank (on rank 0 alone in a symmetric network),
    then move the ranks on until all have finished."""
    members = range(network.world_size)
    works = []
    for rank in range(len(network.transports)):
        group = ProcessGroup(network.transports[rank], members, 0)
        try:
            works.append(spec.start(group, arrays[rank], root, algorithm, op))
        except DistributedError:
            raise
        except Exception as error:
            raise type(error)(f"simulated rank {rank}: {error}") from error
    drive(network, works, f"{collective} ({algorithm})", progress)


def simulated_world(world_size: int, *, record: bool = False, alpha: float = 1e-6,
                    beta: float = 1e-9, gamma: float = 0.0) -> tuple:
    """(network, [each simulated rank's world group]): ``world_size`` ranks in
    this process on a virtual network, for a caller that starts calls of its
    own on them (``async_op=True``) and moves them on with :func:`drive`, as
    the exercises' checker does. ``record``: the network keeps every message
    as an event (``network.events``, in :data:`minidist.trace.FIELDS` order)."""
    network = SimNetwork(world_size, alpha, beta, gamma, record=record)
    members = range(world_size)
    return network, [ProcessGroup(transport, members, 0) for transport in network.transports]


#: The driver looks at the clock every this many ranks it moves on, and
#: reports progress at most every PROGRESS_SECONDS (counting the messages
#: sums over all ranks: too dear to do on every step).
PROGRESS_EVERY = 64
PROGRESS_SECONDS = 0.1


def drive(network: SimNetwork, works, what: str = "the simulation",
          progress: Callable | None = None) -> None:
    """Move every rank's Work (``works[rank]``, started with ``async_op=True``
    on a group of ``network``) on until all have finished.

    A rank is tested when it may have something new to do: at the start, and
    whenever one of its receives completes. Raises SimulationStallError,
    naming who waits for what, when ranks are left that nothing will wake.
    ``progress(messages)``: called with the messages sent so far at most
    every :data:`PROGRESS_SECONDS` and once at the end.
    """
    ranks = len(network.transports)  # 1 in a symmetric network
    if len(works) != ranks:
        raise ValueError(f"drive needs one Work per rank: {ranks} ranks, "
                         f"{len(works)} works")
    ready = ReadyQueue(ranks)
    network.on_ready = ready.wake
    finished = bytearray(ranks)
    remaining = ranks
    moves = 0
    reported = time.monotonic()
    try:
        while ready:
            if progress is not None:
                moves += 1
                if moves % PROGRESS_EVERY == 0 and \
                        time.monotonic() - reported >= PROGRESS_SECONDS:
                    progress(network.messages)
                    reported = time.monotonic()
            rank = ready.pop()
            if finished[rank]:
                continue
            try:
                complete = works[rank].test()
            except DistributedError:
                raise
            except Exception as error:
                raise SimulationError(f"simulated rank {rank} failed in {what}: "
                                      f"{type(error).__name__}: {error}") from error
            if complete:
                finished[rank] = 1
                remaining -= 1
    finally:
        network.on_ready = None
    if progress is not None and not remaining:
        progress(network.messages)
    if remaining:
        raise SimulationStallError(_stall_report(network, finished, what))


def _stall_report(network, finished, what) -> str:
    stuck = [rank for rank in range(len(network.transports)) if not finished[rank]]
    lines = []
    for rank in stuck[:8]:
        waits = network.transports[rank].waiting_for() or ["nothing it can name"]
        lines.append(f"  rank {rank} waits for {waits[0]}"
                     + (f" (and {len(waits) - 1} more)" if len(waits) > 1 else ""))
    if len(stuck) > 8:
        lines.append(f"  ... and {len(stuck) - 8} more ranks")
    if network.symmetric:
        return (f"{what} cannot finish: rank 0, simulated for all {network.world_size} ranks "
                "by symmetry, waits for a message that no rank sends; the algorithm is not "
                "symmetric as SYMMETRIC claims: remove it there (or pass symmetry=False).\n"
                + "\n".join(lines))
    return (f"{what} cannot finish: {len(stuck)} of {network.world_size} "
            "simulated ranks wait for messages that no rank will send (a deadlock: check "
            "that every receive has a matching send, posted in the same order on both "
            "sides).\n" + "\n".join(lines))
