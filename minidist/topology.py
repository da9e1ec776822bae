"""The machine's shape: ranks grouped into nodes, a fast link inside a node
and a slower one between nodes (the two-level alpha-beta model).

    from minidist import topology
    from minidist.alpha_beta import Params
    topology.use(topology.Topology(nodes=2, ranks_per_node=4,
                                   intra=Params(alpha=2e-6, beta=1e-11),
                                   inter=Params(alpha=1e-5, beta=1e-10)))

Rank r sits on node r // ranks_per_node. :func:`use` sets this process's
topology (None: a flat network, every link alike); :func:`current` reads it.
The hierarchical collectives and "auto" read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.alpha_beta import Params


@dataclass(frozen=True)
class Topology:
    """``nodes`` nodes of ``ranks_per_node`` ranks; ``intra``: the alpha-beta of
    a message inside a node, ``inter``: between nodes; ``nics_per_node``
    network cards share a node's off-node traffic; ``spine_oversubscription``:
    how much less the spine carries than all the nodes can send at once."""

    nodes: int
    ranks_per_node: int
    intra: Params
    inter: Params
    nics_per_node: int = 1
    spine_oversubscription: float = 1.0
    name: str = ""
    source: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def link(self, a: int, b: int) -> Params:
        """The alpha-beta of a message from rank ``a`` to rank ``b``."""
        return self.intra if self.same_node(a, b) else self.inter


_CURRENT: list = [None]


def use(topology: Topology | None) -> None:
    """Set this process's topology (None: a flat network)."""
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"topology.use needs a Topology or None, got {type(topology).__name__}")
    _CURRENT[0] = topology


def current() -> Topology | None:
    """This process's topology, or None (a flat network)."""
    return _CURRENT[0]
