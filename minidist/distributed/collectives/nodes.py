"""The nodes of a group, and a collective call seen by some of its ranks.

A hierarchical algorithm (:mod:`.hierarchical`, :mod:`.ring_2d`,
:mod:`.nccl_tree`) needs to know which ranks share a node. On real processes
there is no machine to ask, so it is told: the group's ranks are cut into
nodes of ``ranks_per_node`` consecutive group ranks, read from
``minidist.topology.current()``, which every rank sets the same way with
``minidist.topology.use(Topology(...))`` before the call, or that the
launching process set before ``minidist.launch`` (its workers are forked
and inherit it); a process-wide setting, as NCCL reads the machine's
topology once per process. Group rank
r = node * g + local, for g ranks per node: a rank's *node group* is the g
ranks of its node, its *rail* the m ranks of its local index on every node
(one per node, the ranks that talk across nodes in a hierarchical algorithm).

:class:`Subset` is a :class:`~.comm.Comm` seen by a subset of its ranks,
numbered 0 .. len - 1: a flat algorithm (the ring, the binomial tree) runs on
it unchanged, its messages going out with the call's tag to the real group
ranks. Every phase of a hierarchical algorithm is such a flat algorithm on
one node group or one rail.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from minidist import topology as _topology


def check(collective: str, algorithm: str, group_size: int, rank: int):
    """The current topology, checked to cut a group of ``group_size`` ranks into
    whole nodes; each refusal in one line, on which rank and what to do."""
    machine = _topology.current()
    if machine is None:
        raise ValueError(
            f"rank {rank}: {collective} algorithm={algorithm!r} needs a topology: call "
            "minidist.topology.use(Topology(nodes=..., ranks_per_node=..., intra=..., "
            "inter=...)) in every rank before the call, or choose a flat algorithm or 'auto'.")
    per_node = machine.ranks_per_node
    if per_node < 1 or group_size % per_node:
        raise ValueError(
            f"rank {rank}: {collective} algorithm={algorithm!r} cuts the group's {group_size} "
            f"ranks into nodes of ranks_per_node={per_node}, but {group_size} is not a "
            f"multiple of {per_node}: use a group of whole nodes or a flat algorithm.")
    return machine


@functools.lru_cache(maxsize=64)
def _stray_block(ranks: tuple, per_node: int) -> int | None:
    """The first block of ``per_node`` consecutive group ranks whose global
    ranks are not all on one node, or None (made once per group, not per rank)."""
    for block in range(len(ranks) // per_node):
        nodes = {rank // per_node for rank in ranks[block * per_node:(block + 1) * per_node]}
        if len(nodes) > 1:
            return block
    return None


@dataclass(frozen=True)
class Nodes:
    """Where one rank sits: g ranks per node, m nodes, its node and local index."""

    per_node: int
    nodes: int
    node: int
    local: int

    def node_group(self) -> list[int]:
        """The group ranks of this rank's node, in local order."""
        first = self.node * self.per_node
        return list(range(first, first + self.per_node))

    def rail(self, local: int | None = None) -> list[int]:
        """The group ranks of local index ``local`` (this rank's) on every node."""
        local = self.local if local is None else local
        return [node * self.per_node + local for node in range(self.nodes)]


def nodes_of(comm) -> Nodes:
    """This rank's place in the current topology's nodes (checked, see :func:`check`).

    The topology places global ranks (rank r on node r // ranks_per_node, as
    the simulator charges them); a subgroup is cut by its group ranks, so each
    block of ranks_per_node consecutive group ranks must sit on one node."""
    machine = check(comm.collective, comm.algorithm, comm.size, comm.rank)
    per_node = machine.ranks_per_node
    if comm.ranks is not None:
        stray = _stray_block(tuple(comm.ranks), per_node)
        if stray is not None:
            block = comm.ranks[stray * per_node:(stray + 1) * per_node]
            raise ValueError(
                f"rank {comm.rank}: {comm.collective} algorithm={comm.algorithm!r} cuts the "
                f"group into nodes of {per_node} consecutive group ranks, but global ranks "
                f"{list(block)} are on nodes {sorted({machine.node_of(r) for r in block})}: "
                "use a group whose ranks fill whole nodes in order, or a flat algorithm.")
    return Nodes(per_node, comm.size // per_node, comm.rank // per_node, comm.rank % per_node)


class Subset:
    """``comm`` seen by ``members`` (group ranks) alone, as ranks 0 .. len - 1.

    ``first_step`` is added to every step the algorithm names, and ``name``
    to every label and phase, so that the trace tells the phases apart."""

    def __init__(self, comm, members: list[int], first_step: int, name: str):
        self.comm = comm
        self.members = members
        self.rank = members.index(comm.rank)
        self.size = len(members)
        self.first_step = first_step
        self.name = name
        self.blocking = comm.blocking

    def at(self, step: int, phase: str) -> None:
        self.comm.at(self.first_step + step, f"{self.name} {phase}")

    def isend(self, array, to: int, label: str = ""):
        return self.comm.isend(array, self.members[to], f"{self.name} {label}")

    def irecv(self, array, source: int, label: str = "", *, combined_into=None):
        return self.comm.irecv(array, self.members[source], f"{self.name} {label}",
                               combined_into=combined_into)

    def irecv_reduce(self, array, source: int, label: str = ""):
        return self.comm.irecv_reduce(array, self.members[source], f"{self.name} {label}")

    def scratch(self, like):
        return self.comm.scratch(like)

    def combine(self, array, incoming, out=None) -> None:
        self.comm.combine(array, incoming, out)

    def nbytes_of(self, array) -> int:
        return self.comm.nbytes_of(array)
