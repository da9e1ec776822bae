"""NCCL's tree all_reduce: a double binary tree across the nodes, a chain
inside each node, pipelined in chunks.

NCCL 2.4 (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL
2.4", 2019) builds its trees on the two-tree idea of Sanders, Speck and Träff
("Two-tree algorithms for full bandwidth broadcast, reduction and scan",
2009): two binary trees over the nodes in which a node interior in one is a
leaf in the other, each carrying half the data, so that every node's network
card carries about the ring's bytes, with log m rather than m latencies
across the network. Inside a node NCCL does not build a tree: the node's g
ranks form a chain behind one head rank, the one that talks to the other
nodes, since the links inside are fast and a chain sends each byte once.

The two trees here (see :mod:`.nodes` for the nodes, g ranks per node, m
nodes): over the nodes, the two trees of the flat double binary tree
(:func:`.all_reduce.double_binary_trees` of m); inside node j, tree 0's
chain runs from local rank 0 (its head) to g - 1, tree 1's from g - 1 (its
head) back to 0, so the two heads are different ranks. A head's parent is
the head of its node's parent, its children the next rank of its chain and
the heads of its node's children. Then the flat double binary tree's
schedule (:func:`.all_reduce.pipelined_trees`): each half reduced up its
tree and broadcast down it in k chunks, the reduce of later chunks
overlapping the broadcast of earlier ones.

Cost on the two-level model: the trees are g - 1 + ceil(log2 m) deep, so
there are k + 2 (g - 1 + ceil(log2 m)) - 1 steps. In a step a node's
network card sends and receives four chunks of N/(2k) (its node interior in
one tree: one up, two down, and up in the other, the two heads sharing one
card), and its busiest head combines three chunks (its chain's and two
nodes'); on one node, two chains, each rank receives four chunks and
combines two. So:
(k + 2 (g - 1 + ceil(log2 m)) - 1) (alpha_inter + 2 N/k beta_inter + 3/2 N/k gamma if m > 1
else alpha_intra + 2 N/k beta_intra + N/k gamma), k = :func:`.chunks.double_binary_tree_chunks`.
It assumes the chain's steps inside a node are no slower than the card's,
and charges one latency for the card's four messages of a step.

An estimate, not a bound: there is no closed form for a pipeline on two
levels. In the simulator a step's four messages through one NIC each take
their latency (the figure is low when the heads share a NIC and latency
counts), and the trees' steps overlap more than one step per chunk (the
figure is high for small arrays). The tests hold it within a factor of 3
either way of the simulated time on dgx, commodity and a one-NIC cluster, at
64 and 4,096 ranks (``topology_costs.kind`` says "estimate").
"""

from __future__ import annotations

import functools

from minidist.distributed.collectives.all_reduce import (
    double_binary_trees,
    pipelined_trees,
    tree_tables,
)
from minidist.distributed.collectives.chunks import double_binary_tree_chunks
from minidist.distributed.collectives.nodes import nodes_of
from minidist.distributed.collectives.registry import cost, register_for_nodes


def node_trees(nodes: int, per_node: int) -> list[tuple[list[int], list[list[int]]]]:
    """NCCL's two trees on ``nodes`` nodes of ``per_node`` ranks, each as
    (parent of every rank, children of every rank): the double binary tree
    over the nodes, a chain inside each node behind its head (local rank 0
    in tree 0, per_node - 1 in tree 1)."""
    g = per_node
    trees = []
    for tree, (node_parents, node_children) in enumerate(double_binary_trees(nodes)):
        def local(position, tree=tree):  # the local rank at a position along the chain
            return position if tree == 0 else g - 1 - position

        parents, children = [-1] * (nodes * g), [[] for _ in range(nodes * g)]
        for node in range(nodes):
            for position in range(g):
                rank = node * g + local(position)
                if position + 1 < g:
                    children[rank].append(node * g + local(position + 1))
                if position:
                    parents[rank] = node * g + local(position - 1)
                    continue
                if node_parents[node] >= 0:
                    parents[rank] = node_parents[node] * g + local(0)
                children[rank] += [kid * g + local(0) for kid in node_children[node]]
        trees.append((parents, children))
    return trees


@functools.lru_cache(maxsize=8)
def _tables(nodes: int, per_node: int) -> tuple:
    """The trees' tables, made once and shared by every rank (read only)."""
    return tree_tables(node_trees(nodes, per_node))


def _chunks(n, N, T):
    return double_binary_tree_chunks(N)


@cost("(k + 2 (g - 1 + ceil(log2 m)) - 1) (alpha_inter + 2 N/k beta_inter + 3/2 N/k gamma"
      " if m > 1 else alpha_intra + 2 N/k beta_intra + N/k gamma)",
      where={"k": _chunks},
      # each non-root rank of each tree sends k chunks up and receives k down
      traffic=lambda n, count, itemsize, root=0, topology=None: (
          4 * (n - 1) * double_binary_tree_chunks(count * itemsize),
          2 * (n - 1) * count * itemsize),
      two_level=True)
def nccl_tree(comm, buffer):
    """NCCL's tree all_reduce: each half of the array reduced up one of two trees
    and broadcast down it, pipelined in k chunks; the trees are a double binary
    tree across the nodes with a chain inside each node (:func:`node_trees`).
    Cost: (k + 2 (g - 1 + ceil(log2 m)) - 1) (alpha_inter + 2 N/k beta_inter + 3/2 N/k gamma
    if m > 1 else alpha_intra + 2 N/k beta_intra + N/k gamma).
    """
    where = nodes_of(comm)
    yield from pipelined_trees(comm, buffer, _tables(where.nodes, where.per_node))


register_for_nodes("all_reduce", {"nccl_tree": nccl_tree})
