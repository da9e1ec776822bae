"""Hierarchical collectives: inside the node, across the nodes, inside again.

On a machine of nodes the links inside a node (NVLink, shared memory) are
many times faster than the network between nodes. A flat ring crossing
nodes waits at every one of its 2 (n - 1) steps for the message that
crosses, so it pays 2 (n - 1) of the network's latencies and its bandwidth.
Each algorithm here is a flat algorithm run in phases on parts of the group
(see :mod:`.nodes`: g ranks per node, m nodes; a rank's *node group*, and
its *rail*, the ranks of its local index on every node), the split NCCL
makes on a cluster of nodes:

* all_reduce: a ring reduce-scatter inside each node leaves local rank l
  with chunk l of the node's sum; the m ranks of rail l all_reduce that
  chunk across the nodes (Rabenseifner's halving and doubling); a ring all_gather
  inside each node hands every rank the whole result. The network sees
  2 log2 m latencies instead of 2 (n - 1). Its bytes: each rank sends
  about 2 N/g across, so a node's card carries about 2 N, as in the ring;
  with a card per rank (nics = g, the "rail" layout of NCCL's clusters) the
  g ranks cross side by side, each at the card's full speed;
* reduce_scatter: the same first two phases (a ring inside, a ring across);
* all_gather: the mirror image (a ring across, then a ring inside);
* broadcast: a binomial tree across the nodes among the root's rail (the
  node leaders), then a binomial tree inside each node.

The nodes come from ``minidist.topology.current()`` (set it in every rank
with ``minidist.topology.use(Topology(...))``, or before ``minidist.launch``,
whose forked workers inherit it); without one, or on a group
that is not a whole number of nodes, the call is refused in one line.

Costs on the two-level model (see :mod:`.registry`: alpha_intra, beta_intra
inside a node, alpha_inter, beta_inter between nodes, beta_inter with the
spine's oversubscription; N bytes as the flat algorithms count it; share =
ceil(g / nics), the ranks one NIC serves):

all_reduce      2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma
                + 2 log2 q share alpha_inter + 2 (q-1)/q N/g share beta_inter + (q-1)/q N/g gamma
                + (2 share (alpha_inter + N/g beta_inter) + N/g gamma if m != q else 0)
reduce_scatter  (g - 1) (alpha_intra + N/g (beta_intra + gamma))
                + (m - 1) (share (alpha_inter + N/n beta_inter) + N/n gamma)
all_gather      (m - 1) share (alpha_inter + N/n beta_inter) + (g - 1) (alpha_intra + N/g beta_intra)
broadcast       ceil(log2 m) (alpha_inter + N beta_inter) + ceil(log2 g) (alpha_intra + N beta_intra)

What they assume, the simulator's NIC model
(:class:`~minidist.distributed.transport.sim.TopologyTransport`): in the phase across the nodes of all_reduce,
reduce_scatter and all_gather every rank of a node sends off it at once, and
a NIC takes whole messages one after another, each busy alpha_inter + m
beta_inter, so a step across costs share (alpha_inter + m beta_inter); in
the broadcast only the leader sends. Phases follow one another, each
starting when its slowest rank is done.

How exact (``topology_costs.kind``): every formula is the simulated time when
no NIC is shared (share 1, a DGX) or the phase across crosses once each way
(two nodes), and the broadcast's always. With a shared NIC over several
steps the figure keeps the NIC busy without a break; the simulator's NIC
takes messages in the order its driver reaches them, so a rank ahead may
take a slot before a late one's earlier message, and the simulated time is
up to a few tens of percent longer: a lower bound (with gamma = 0; combining
partly hidden by the queue makes it an estimate otherwise). On m nodes that
are not a power of two, the all_reduce's fold with a shared NIC is an
estimate.
"""

from __future__ import annotations

from minidist import topology as _topology
from minidist.alpha_beta import ceil_log2
from minidist.distributed.collectives.all_gather import ring as all_gather_ring
from minidist.distributed.collectives.all_reduce import (
    _rabenseifner_traffic as rabenseifner_traffic,
)
from minidist.distributed.collectives.all_reduce import rabenseifner
from minidist.distributed.collectives.broadcast import binomial
from minidist.distributed.collectives.chunks import chunk_bounds, largest_power_of_two, split
from minidist.distributed.collectives.nodes import Subset, nodes_of
from minidist.distributed.collectives.reduce_scatter import ring as reduce_scatter_ring
from minidist.distributed.collectives.registry import cost, register_for_nodes


def per_node(topology) -> int:
    """g of the topology given to a traffic formula, or of the current one."""
    machine = topology if topology is not None else _topology.current()
    if machine is None:
        raise ValueError("the traffic of a hierarchical algorithm depends on the nodes: pass "
                         "topology= or call minidist.topology.use(Topology(...)) first")
    return machine.ranks_per_node


def rabenseifner_steps(n: int) -> int:
    """Steps of Rabenseifner's all_reduce on n ranks (the fold takes one each way)."""
    rounds = largest_power_of_two(n).bit_length() - 1
    return 2 * rounds + (0 if n == largest_power_of_two(n) else 2)


# --------------------------------------------------------------------------- all_reduce


def _all_reduce_traffic(n, count, itemsize, root=0, topology=None):
    if n == 1:
        return 0, 0
    g = per_node(topology)
    m = n // g
    bounds = chunk_bounds(count, g)
    # inside: a ring reduce-scatter and all_gather, (g - 1) messages per rank each,
    # every chunk but one sent by each rank; across: Rabenseifner on each rail's chunk
    messages, elements = 2 * n * (g - 1), 2 * m * (g - 1) * count
    for local in range(g):
        rail = rabenseifner_traffic(m, bounds[local + 1] - bounds[local], 1)
        messages, elements = messages + rail[0], elements + rail[1]
    return messages, elements * itemsize


@cost("2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma"
      " + 2 log2 q share alpha_inter + 2 (q-1)/q N/g share beta_inter + (q-1)/q N/g gamma"
      " + (2 share (alpha_inter + N/g beta_inter) + N/g gamma if m != q else 0)",
      traffic=_all_reduce_traffic, two_level=True)
def all_reduce(comm, buffer):
    """Hierarchical all_reduce: reduce-scatter inside the node, all_reduce across
    the nodes, all_gather inside the node.

    The array is cut into g chunks. A ring reduce-scatter among the node's g
    ranks leaves local rank l with chunk l summed over its node; the m ranks
    of rail l (local rank l of every node) all_reduce that chunk with
    Rabenseifner's algorithm, so each holds chunk l summed over the world;
    a ring all_gather inside the node gives every rank every chunk.
    Cost: 2 (g - 1) alpha_intra + 2 (g-1)/g N beta_intra + (g-1)/g N gamma
    + 2 log2 q share alpha_inter + 2 (q-1)/q N/g share beta_inter + (q-1)/q N/g gamma
    + (2 share (alpha_inter + N/g beta_inter) + N/g gamma if m != q else 0)
    (q: the largest power of two <= m; the last term the fold of an m that is not one).
    """
    where = nodes_of(comm)
    g, m = where.per_node, where.nodes
    own = split(buffer, g)[where.local]
    yield from reduce_scatter_ring(Subset(comm, where.node_group(), 0, "inside node"),
                                    buffer, own)
    if m > 1:
        yield from rabenseifner(Subset(comm, where.rail(), g - 1, "across nodes"),
                                            own)
    after = g - 1 + (rabenseifner_steps(m) if m > 1 else 0)
    yield from all_gather_ring(Subset(comm, where.node_group(), after, "inside node"), buffer)


# --------------------------------------------------------------------------- reduce_scatter


def _reduce_scatter_traffic(n, count, itemsize, root=0, topology=None):
    if n == 1:
        return 0, 0
    g = per_node(topology)
    m = n // g
    # inside: every rank sends g - 1 blocks of count / g; across: m - 1 pieces of count / n
    return n * (g - 1) + n * (m - 1), (m * (g - 1) * count + (m - 1) * count) * itemsize


@cost("(g - 1) (alpha_intra + N/g (beta_intra + gamma))"
      " + (m - 1) (share (alpha_inter + N/n beta_inter) + N/n gamma)",
      traffic=_reduce_scatter_traffic, two_level=True)
def reduce_scatter(comm, pieces, output):
    """Hierarchical reduce_scatter: a ring reduce-scatter inside the node, then
    one across the nodes.

    Rank j g + l (node j, local l) is to end with piece j g + l. So the n
    pieces are first laid out by local index (a local copy): block l holds
    the pieces j g + l of every node j. The ring inside the node leaves local
    rank l with block l summed over its node; the ring across rail l leaves
    node j's rank with piece j of that block, summed over the world.
    Only reads ``pieces``.
    Cost: (g - 1) (alpha_intra + N/g (beta_intra + gamma))
    + (m - 1) (share (alpha_inter + N/n beta_inter) + N/n gamma).
    """
    where = nodes_of(comm)
    g, m = where.per_node, where.nodes
    piece = pieces.size // comm.size
    blocks = comm.scratch(pieces)
    blocks.reshape(g, m, piece)[...] = pieces.reshape(m, g, piece).transpose(1, 0, 2)
    block = blocks[where.local * m * piece:(where.local + 1) * m * piece]
    yield from reduce_scatter_ring(Subset(comm, where.node_group(), 0, "inside node"),
                                    blocks, block)
    yield from reduce_scatter_ring(Subset(comm, where.rail(), g - 1, "across nodes"),
                                    block, output)


# --------------------------------------------------------------------------- all_gather


def _all_gather_traffic(n, count, itemsize, root=0, topology=None):
    if n == 1:
        return 0, 0
    g = per_node(topology)
    m = n // g
    # across: every rank sends m - 1 pieces of count / n; inside: g - 1 blocks of count / g
    return n * (m - 1) + n * (g - 1), ((m - 1) * count + m * (g - 1) * count) * itemsize


@cost("(m - 1) share (alpha_inter + N/n beta_inter) + (g - 1) (alpha_intra + N/g beta_intra)",
      traffic=_all_gather_traffic, two_level=True)
def all_gather(comm, buffer):
    """Hierarchical all_gather: a ring all_gather across the nodes, then one
    inside the node.

    Work in a scratch array laid out by local index: block l is to hold the
    pieces j g + l of every node j. The ring across rail l fills block l on
    each of its ranks; the ring inside the node then passes the g blocks
    round; a local copy puts the pieces back in rank order.
    Cost: (m - 1) share (alpha_inter + N/n beta_inter) + (g - 1) (alpha_intra + N/g beta_intra).
    """
    where = nodes_of(comm)
    g, m = where.per_node, where.nodes
    piece = buffer.size // comm.size
    blocks = comm.scratch(buffer)
    block = blocks[where.local * m * piece:(where.local + 1) * m * piece]
    block[where.node * piece:(where.node + 1) * piece] = \
        buffer[comm.rank * piece:(comm.rank + 1) * piece]
    yield from all_gather_ring(Subset(comm, where.rail(), 0, "across nodes"), block)
    yield from all_gather_ring(Subset(comm, where.node_group(), m - 1, "inside node"), blocks)
    buffer.reshape(m, g, piece)[...] = blocks.reshape(g, m, piece).transpose(1, 0, 2)


# --------------------------------------------------------------------------- broadcast


def _broadcast_traffic(n, count, itemsize, root=0, topology=None):
    if n == 1:
        return 0, 0
    g = per_node(topology)
    m = n // g
    messages = (m - 1) + m * (g - 1)  # to every other leader, then to every other rank
    return messages, messages * count * itemsize


@cost("ceil(log2 m) (alpha_inter + N beta_inter) + ceil(log2 g) (alpha_intra + N beta_intra)",
      traffic=_broadcast_traffic, two_level=True)
def broadcast(comm, buffer, root):
    """Hierarchical broadcast: a binomial tree across the nodes among the node
    leaders (the ranks of the root's local index), then a binomial tree inside
    each node from its leader. Whole arrays, so for small ones.
    Cost: ceil(log2 m) (alpha_inter + N beta_inter) + ceil(log2 g) (alpha_intra + N beta_intra).
    """
    where = nodes_of(comm)
    g, m = where.per_node, where.nodes
    leader = root % g
    if where.local == leader and m > 1:
        yield from binomial(Subset(comm, where.rail(leader), 0, "across nodes"),
                                       buffer, root // g)
    if g > 1:
        yield from binomial(
            Subset(comm, where.node_group(), ceil_log2(m), "inside node"), buffer, leader)


register_for_nodes("all_reduce", {"hierarchical": all_reduce})
register_for_nodes("reduce_scatter", {"hierarchical": reduce_scatter})
register_for_nodes("all_gather", {"hierarchical": all_gather})
register_for_nodes("broadcast", {"hierarchical": broadcast})

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter"]
