"""Every algorithm's cost on a cluster with a shape (two levels): the one place.

:func:`predict` is the figure ``costmodel.predict(..., topology=)`` prints,
``simulate(..., topology=)`` puts in ``predicted``, and "auto" compares
(:func:`best`: in the simulator, and on processes after
``minidist.topology.use``). It takes, in this order:

* an algorithm for nodes (``registry.NODE_COSTS``: hierarchical, ring_2d,
  nccl_tree): the two-level formula registered above its code, in the
  registry's two-level names (see :mod:`.registry` and :mod:`.hierarchical`);
* any flat algorithm on a single node: its flat formula on the intra link;
* a flat algorithm across nodes: the closed formula below (:data:`FORMULAS`),
  or none (ValueError; "auto" then passes it over).

:func:`kind` says how each figure stands to the simulator, the reference of
the model: "exact" (the ring; the binomial broadcast and reduce and
reduce_broadcast; recursive doubling with a NIC a rank or on two nodes; the
hierarchical algorithms and ring_2d with a NIC a rank, on two nodes, and the
hierarchical broadcast always), "lower bound" (recursive doubling, the
hierarchical all_reduce, reduce_scatter, all_gather and ring_2d when ranks
share a NIC over several rounds), "estimate" (nccl_tree, and the shared-NIC
cases with combining or a fold), "flat formula" (one node).

The registry's formulas (:mod:`.registry`) give every message the same
alpha and beta. On a :class:`~minidist.topology.Topology` a message within a
node costs the intra link's ``h_i(m) = alpha_i + m beta_i``, one between
nodes the inter link's ``h_e(m) = alpha_e + m beta_e x`` (x the spine's
oversubscription), and the R ranks of a node share its c NICs: when all of
them send off the node in the same step, each NIC carries ``s = ceil(R / c)``
messages one after another. Here are the formulas where the algorithm's
pattern gives one in closed form; n ranks fill K = n / R whole nodes,
numbered node by node; gamma is the ranks' seconds per byte combined.

* The **ring** (all_reduce, 2 (n - 1) steps of m = N / n bytes; all_gather
  and reduce_scatter, n - 1 steps): on K > 1 nodes one rank of each node
  sends off the node in every step (the ring leaves each node once), so no
  NIC is shared, and every step is as slow as the slowest hop, h = max(h_i(m),
  h_e(m)): the rank before the slow hop sends one step after another over
  it, and the rank after it combines each piece before its in port takes the
  next. So the flat formula, on the slowest hop::

      all_reduce:     2 (n - 1) h + (n - 1) m gamma
      reduce_scatter: (n - 1) h + (n - 1) m gamma
      all_gather:     (n - 1) h

* **Recursive doubling** (all_reduce; n and R powers of two): the rounds of
  bit k < log2 R stay in the node, ``h_i(N) + N gamma`` each; the log2 K
  others cross nodes with every rank of the node at once, each NIC carrying
  s messages a round, the node's ranks staggered along it::

      log2 R (h_i(N) + N gamma) + max(log2 K s h_e(N) + N gamma,
                                      log2 K (h_e(N) + N gamma) + (s - 1) h_e(N))

  Exact when each rank has a NIC of its own (s = 1, a DGX) or the ranks
  cross nodes once (K = 2). With shared NICs over several rounds it is a
  lower bound (the NICs busy without a break): the simulator's NIC takes
  messages in the order the driver reaches them, not strictly by their
  time, and a rank that got ahead may take it before a late one's earlier
  message; the simulation then takes up to a round or so more.
* The **binomial broadcast** (root 0, R a power of two): the rounds of
  distance >= R cross nodes, from one rank a node (no NIC shared), the others
  stay inside: ``L_e h_e(N) + L_i h_i(N)`` with L = ceil(log2 n) rounds,
  L_i = min(L, log2 R) of them inside a node. The **binomial reduce** is the
  same tree run backwards, each round also combining:
  ``L_e (h_e(N) + N gamma) + L_i (h_i(N) + N gamma)``, and the all_reduce
  **reduce_broadcast** the two one after the other.

Any algorithm on a single node is its flat formula on the intra link. For
the others (the trees of chunks, Rabenseifner, Bruck, pairwise, the direct
exchanges of two_shot and one_shot, whose many off-node messages at once
wait for the NICs in the simulator's order...) no closed
formula is given here: :func:`predict` says so, and
``simulate(..., topology=...)`` times them. The tests hold the simulator to
these formulas on arrays that divide evenly, up to 4,096 ranks.

Imports the registry (the flat formulas) and :mod:`minidist.topology`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from minidist.alpha_beta import Params
from minidist.distributed.collectives import registry
from minidist.topology import Topology


def _hops(topology: Topology):
    intra, inter = topology.intra, topology.inter
    inter_beta = topology.inter_beta

    def h_i(m):
        return intra.alpha + m * intra.beta

    def h_e(m):
        return inter.alpha + m * inter_beta
    return h_i, h_e


def _ring(steps, combines: bool):
    def seconds(topology, n, N, gamma):
        h_i, h_e = _hops(topology)
        m = N / n
        slowest = max(h_i(m), h_e(m))
        return steps(n) * slowest + ((n - 1) * m * gamma if combines else 0.0)
    return seconds


def _recursive_doubling(topology, n, N, gamma):
    R = topology.ranks_per_node
    if n & (n - 1) or R & (R - 1):
        raise ValueError("recursive doubling's two-level formula needs n and the ranks a node "
                         "to be powers of two; simulate it")
    h_i, h_e = _hops(topology)
    inside, across = int(math.log2(R)), int(math.log2(n // R))
    s = topology.ranks_per_nic
    crossing = max(across * s * h_e(N) + N * gamma,
                   across * (h_e(N) + N * gamma) + (s - 1) * h_e(N)) if across else 0.0
    return inside * (h_i(N) + N * gamma) + crossing


def _binomial_rounds(topology, n):
    """(rounds across nodes, rounds inside a node) of a binomial tree rooted at 0."""
    R = topology.ranks_per_node
    if R & (R - 1):
        raise ValueError("the binomial tree's two-level formula needs the ranks a node to be "
                         "a power of two; simulate it")
    rounds = max(n - 1, 0).bit_length()
    inside = min(rounds, int(math.log2(R)))
    return rounds - inside, inside


def _binomial_reduce(topology, n, N, gamma):
    h_i, h_e = _hops(topology)
    across, inside = _binomial_rounds(topology, n)
    return across * (h_e(N) + N * gamma) + inside * (h_i(N) + N * gamma)


def _reduce_broadcast(topology, n, N, gamma):
    return _binomial_reduce(topology, n, N, gamma) + _binomial(topology, n, N, gamma)


def _binomial(topology, n, N, gamma):
    R = topology.ranks_per_node
    if R & (R - 1):
        raise ValueError("the binomial broadcast's two-level formula needs the ranks a node "
                         "to be a power of two; simulate it")
    h_i, h_e = _hops(topology)
    rounds = max(n - 1, 0).bit_length()
    inside = min(rounds, int(math.log2(R)))
    return (rounds - inside) * h_e(N) + inside * h_i(N)


#: FORMULAS[collective][algorithm](topology, n, N, gamma) -> seconds, n > one node.
FORMULAS = {
    "all_reduce": {"ring": _ring(lambda n: 2 * (n - 1), True),
                   "recursive_doubling": _recursive_doubling,
                   "reduce_broadcast": _reduce_broadcast},
    "reduce_scatter": {"ring": _ring(lambda n: n - 1, True)},
    "all_gather": {"ring": _ring(lambda n: n - 1, False)},
    "broadcast": {"binomial": _binomial},
    "reduce": {"binomial": _binomial_reduce},
}


def _figure(collective: str, algorithm: str, n: int, N: float, topology: Topology,
            gamma: float) -> float:
    """The two-level figure of one call (n > 1), or ValueError saying why none."""
    if registry.needs_topology(collective, algorithm):
        if n % topology.ranks_per_node:
            raise ValueError(f"{collective} {algorithm} runs on whole nodes: {n:,} ranks are "
                             f"not a multiple of {topology.ranks_per_node} ranks a node")
        if gamma != topology.gamma:
            topology = replace(topology, intra=replace(topology.intra, gamma=gamma))
        return registry.NODE_COSTS[collective][algorithm].two_level(n, N, topology)
    if topology.nodes_used(n) == 1:  # every message on the intra link: the flat formula
        intra = topology.intra
        return registry.predict(collective, algorithm, n, N,
                                Params(intra.alpha, intra.beta, gamma))
    formula = FORMULAS.get(collective, {}).get(algorithm)
    if formula is None:
        known = ", ".join(f"{c} {a}" for c, algorithms in FORMULAS.items() for a in algorithms)
        raise ValueError(f"no closed two-level formula for {collective} {algorithm} across "
                         f"nodes (there are for: {known}, and the algorithms for nodes); time "
                         "it with simulate(..., topology=...)")
    return formula(topology, n, N, gamma)


def kind(collective: str, algorithm: str, world_size: int, topology: Topology) -> str:
    """How :func:`predict`'s figure stands to the simulator's time on
    ``topology``: "exact", "lower bound", "upper bound", "estimate" (no bound
    either way, see the algorithm's docstring), or "flat formula" (one node:
    the flat formula on the intra link, as exact as it is on a flat network)."""
    n, share = int(world_size), topology.ranks_per_nic
    if registry.needs_topology(collective, algorithm):
        if algorithm == "nccl_tree":  # no closed form: see its docstring
            return "estimate"
        nodes = n // topology.ranks_per_node
        if collective == "broadcast" or share == 1 or nodes <= 2:
            return "exact"  # no NIC shared, or each rank crosses once each way
        # a shared NIC over several rounds: busy without a break in the figure,
        # in the driver's order in the simulator (see the module's docstring)
        power_of_two = nodes & (nodes - 1) == 0
        return "lower bound" if topology.gamma == 0 and power_of_two else "estimate"
    if n <= 1:
        return "exact"
    if topology.nodes_used(n) == 1:
        return "flat formula"
    if (collective, algorithm) == ("all_reduce", "recursive_doubling") and share > 1 \
            and topology.nodes_used(n) > 2:
        return "lower bound"
    return "exact"


def predict(collective: str, algorithm: str, world_size: int, nbytes: float,
            topology: Topology, gamma: float | None = None) -> float:
    """Predicted seconds of one call on ``topology`` (root 0 for a rooted
    collective), or ValueError naming why there is no figure.

    The one place every two-level figure comes from (``costmodel.predict(...,
    topology=)``, ``simulate``'s ``predicted``, and "auto" on a topology, in
    the simulator and on processes after ``minidist.topology.use``):

    * a flat algorithm with a closed formula here (:data:`FORMULAS`): it;
    * an algorithm for nodes (``registry.NODE_COSTS``: hierarchical, ring_2d,
      nccl_tree): the two-level formula registered above its code;
    * any flat algorithm on a single node: its flat formula on the intra link;
    * any other flat algorithm across nodes: none (ValueError; simulate it).

    :func:`kind` says which figures are exact and which are bounds."""
    n = int(world_size)
    topology.check_world(n)
    gamma = topology.gamma if gamma is None else float(gamma)
    registry.formula(collective, algorithm)  # an unknown algorithm: the registry's error
    if n == 1:
        return 0.0
    return float(_figure(collective, algorithm, n, float(nbytes), topology, gamma))


def predict_all(collective: str, world_size: int, nbytes: float, topology: Topology,
                gamma: float | None = None) -> dict:
    """:func:`predict` of every algorithm of ``collective`` that has a figure
    on ``topology`` (the flat ones first, then those for nodes)."""
    times = {}
    for name in registry.every_algorithm(collective):
        try:
            times[name] = predict(collective, name, world_size, nbytes, topology, gamma)
        except ValueError:
            continue
    return times


def best(collective: str, world_size: int, nbytes: float, topology: Topology, *,
         gamma: float | None = None, candidates=None) -> str | None:
    """The algorithm of ``candidates`` (default: every one, flat and for nodes)
    with the least :func:`predict` on ``topology`` (ties: the first listed);
    None when none has a figure (the caller then chooses on the flat model).
    A bound competes as its figure: see :func:`kind`."""
    names = list(candidates or registry.every_algorithm(collective))
    timed = {}
    for name in names:
        try:
            timed[name] = predict(collective, name, world_size, nbytes, topology, gamma)
        except ValueError:
            continue
    return min(timed, key=timed.get) if timed else None
