"""The 2D ring all_reduce: rings inside the nodes, then rings across them.

The ranks stand in a grid of m nodes by g ranks per node (see :mod:`.nodes`).
As Ying, Kumar, Chen, Wang and Cheng do on a TPU pod's torus ("Image
Classification at Supercomputer Scale", 2018, the 2-D algorithm) and Mikami
et al. on a GPU cluster ("Massively Distributed SGD: ImageNet/ResNet-50
Training in a Flash", 2018, the 2D-torus all-reduce):

1. a ring reduce-scatter along the first dimension (inside each node), which
   leaves local rank l with chunk l of its node's sum;
2. a ring all_reduce of that chunk along the second dimension (across the
   nodes, among the ranks of local index l: the rail);
3. a ring all_gather along the first dimension (inside each node).

(Ying et al. also run half of the array in the other order at the same time,
to keep both dimensions' links of a torus busy; on a machine of nodes the
network is the slow dimension, so here the whole array goes inside first.)

It is the hierarchical all_reduce (:mod:`.hierarchical`) with a ring in the
middle instead of halving and doubling: every message goes to a neighbour
only, which suits rings and tori of links; the price is 2 (m - 1) latencies
across the network instead of 2 log2 m.

Cost on the two-level model (see :mod:`.registry`; in phase 2 all g ranks
of a node send off it at once, and each NIC takes its share messages one
after another, latency included; exact with a NIC a rank or on two nodes, a
lower bound with a shared NIC, as the hierarchical all_reduce's, see
:mod:`.hierarchical`):
2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma
+ 2 (m - 1) share alpha_inter + 2 (m-1)/m N/g share beta_inter + (m-1)/m N/g gamma.
"""

from __future__ import annotations

from minidist.distributed.collectives.all_gather import ring as all_gather_ring
from minidist.distributed.collectives.all_reduce import ring as all_reduce_ring
from minidist.distributed.collectives.chunks import chunk_bounds, split
from minidist.distributed.collectives.hierarchical import per_node
from minidist.distributed.collectives.nodes import Subset, nodes_of
from minidist.distributed.collectives.reduce_scatter import ring as reduce_scatter_ring
from minidist.distributed.collectives.registry import cost, register_for_nodes


def _traffic(n, count, itemsize, root=0, topology=None):
    if n == 1:
        return 0, 0
    g = per_node(topology)
    m = n // g
    bounds = chunk_bounds(count, g)
    # inside: two rings of g - 1 steps (every chunk but one sent by each rank);
    # across: a ring all_reduce of each rail's chunk, 2 m (m - 1) messages
    messages = 2 * n * (g - 1) + g * 2 * m * (m - 1)
    elements = 2 * m * (g - 1) * count + sum(2 * (m - 1) * (bounds[local + 1] - bounds[local])
                                             for local in range(g))
    return messages, elements * itemsize


@cost("2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma"
      " + 2 (m - 1) share alpha_inter + 2 (m-1)/m N/g share beta_inter + (m-1)/m N/g gamma",
      traffic=_traffic, two_level=True)
def ring_2d(comm, buffer):
    """2D ring all_reduce: a ring reduce-scatter inside the node, a ring
    all_reduce across the nodes of the chunk each rank finished, a ring
    all_gather inside the node (Ying et al., 2018; Mikami et al., 2018).
    Cost: 2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma
    + 2 (m - 1) share alpha_inter + 2 (m-1)/m N/g share beta_inter + (m-1)/m N/g gamma.
    """
    where = nodes_of(comm)
    g, m = where.per_node, where.nodes
    own = split(buffer, g)[where.local]
    yield from reduce_scatter_ring(Subset(comm, where.node_group(), 0, "inside node"),
                                    buffer, own)
    yield from all_reduce_ring(Subset(comm, where.rail(), g - 1, "across nodes"), own)
    yield from all_gather_ring(Subset(comm, where.node_group(), g - 1 + 2 * (m - 1),
                                       "inside node"), buffer)


register_for_nodes("all_reduce", {"ring_2d": ring_2d})
