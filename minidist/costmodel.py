"""The cost of a message, and of every collective algorithm built from messages.

A message of N bytes takes ``t = alpha + N * beta``; combining N bytes with a
reduction ``N * gamma`` (the model: :mod:`minidist.alpha_beta`). Every
algorithm of :mod:`minidist.distributed.collectives` is a pattern of such
messages, and states its time as a formula in alpha, beta, gamma, the number
of ranks n and the array size N (bytes) where it is written (see
:mod:`minidist.distributed.collectives.registry`). This module is where you
use them: it fits alpha and beta from measurements, and predicts::

    from minidist import costmodel
    costmodel.predict("all_reduce", "ring", world_size=8, nbytes=64 << 20,
                      params=costmodel.PARAMS["shm"])
    costmodel.best("all_reduce", 8, 4096, transport="pipe")  # -> "recursive_doubling"
    costmodel.text("all_reduce", "ring")  # -> "2 (n - 1) alpha + 2 (n-1)/n N xbeta + ..."

N is the size of each rank's array for broadcast, reduce and all_reduce; of
the whole (gathered / scattered / exchanged) array for gather, scatter,
all_gather, reduce_scatter (its input) and all_to_all (what one rank sends in
total). p is the largest power of two not above n; xbeta the seconds per
byte of a step in which a rank sends and receives at once (see
:attr:`Params.xbeta`).

On a cluster with a shape (:mod:`minidist.topology`: nodes, the links inside
and between them, the NICs a node's ranks share), ``predict(...,
topology=...)``, ``predict_all`` and ``best`` give the two-level figures of
:mod:`minidist.distributed.collectives.topology_costs`, the one place they
come from (the flat algorithms with a closed formula, the algorithms for
nodes with the formula above their code, any algorithm on one node; which
are exact and which are bounds: ``topology_costs.kind``), and say so where
there is none::

    costmodel.predict("all_reduce", "ring", 64, 100 << 20,
                      topology=topology.parse_topology("dgx:8"))
    costmodel.best("all_reduce", 64, 64 << 20, topology=topology.parse_topology("dgx:8"))

It stands above the collectives (importing them registers every algorithm),
which themselves never import it: "auto" asks the registry directly.
"""

from __future__ import annotations

# Importing the collectives registers every algorithm and its cost.
import minidist.distributed.collectives  # noqa: F401
from minidist.alpha_beta import (  # noqa: F401  (the public face of the model)
    PARAMS,
    Params,
    fit,
    params_for,
    parse_bandwidth,
    parse_size,
    parse_time,
)
from minidist.distributed.collectives import registry, topology_costs
from minidist.distributed.collectives.registry import (  # noqa: F401
    formula,
    text,
)
from minidist.topology import Topology


def predict(collective: str, algorithm: str, world_size: int, nbytes: float,
            params: Params | None = None, transport: str | None = None,
            topology: Topology | None = None) -> float:
    """Predicted seconds for one call: the alpha-beta-gamma formula on the flat
    network (``params``, or ``transport``'s), or with ``topology`` the
    two-level formula (ValueError where none is given: simulate it). With a
    topology, ``params`` may only set gamma, the ranks' combining speed; a
    ``transport`` is refused (its links are not the cluster's)."""
    if topology is None:
        return registry.predict(collective, algorithm, world_size, nbytes, params, transport)
    if transport is not None:
        raise ValueError("give either topology= or transport=, not both: the topology's "
                         "links are the cluster's")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    gamma = None if params is None else params.gamma
    return topology_costs.predict(collective, algorithm, world_size, nbytes, topology, gamma)

def predict_all(collective: str, world_size: int, nbytes: float,
                params: Params | None = None, transport: str | None = None,
                topology: Topology | None = None) -> dict:
    """Predicted seconds of every algorithm of ``collective``: the flat ones
    on the flat network, or with ``topology`` every one that has a two-level
    figure (:func:`.topology_costs.predict_all`; ``params`` may set gamma)."""
    if topology is None:
        return registry.predict_all(collective, world_size, nbytes, params, transport)
    return topology_costs.predict_all(collective, world_size, nbytes, topology,
                                      None if params is None else params.gamma)


def best(collective: str, world_size: int, nbytes: float, *, transport: str | None = None,
         params: Params | None = None, candidates=None,
         topology: Topology | None = None) -> str:
    """The algorithm predicted fastest (ties: the first listed): on the flat
    network among the flat ones, or with ``topology`` among every one with a
    two-level figure (:func:`.topology_costs.best`, what "auto" runs on it)."""
    if topology is not None:
        chosen = topology_costs.best(collective, world_size, nbytes, topology,
                                     gamma=None if params is None else params.gamma,
                                     candidates=candidates)
        if chosen is None:
            raise ValueError(f"no two-level figure for any algorithm of {collective} on "
                             f"{world_size:,} ranks of {topology.describe()}; simulate them "
                             "with simulate(..., topology=...)")
        return chosen
    return registry.best(collective, world_size, nbytes, transport=transport, params=params,
                         candidates=candidates)


#: FORMULAS[collective][algorithm]: ``f(n, N, params) -> seconds``.
FORMULAS = {collective: {name: cost.seconds for name, cost in costs.items()}
            for collective, costs in registry.COSTS.items()}

#: TRAFFIC[collective][algorithm](n, count, itemsize, root=0) -> (messages, bytes):
#: how many messages the algorithm sends, summed over all ranks, and how many
#: payload bytes they carry, exactly as the code sends them (empty chunks
#: included: they are still sent). ``count`` is the element count of the array
#: each rank passes (one rank's piece for scatter and gather). A world of one
#: sends nothing. The test suite compares these with traced runs.
TRAFFIC = {collective: {name: cost.traffic for name, cost in costs.items()}
           for collective, costs in registry.COSTS.items()}
