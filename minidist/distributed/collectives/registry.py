"""The algorithm registry: every collective algorithm once, with its cost.

An algorithm module states each algorithm's cost right above its code, in
the lessons' notation (lesson 2's t = alpha + n beta, grown into lesson 3's
costs), and lists its algorithms in one table::

    @cost("2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma",
          traffic=lambda n, count, itemsize, root=0: (2 * n * (n - 1),
                                                      2 * (n - 1) * count * itemsize))
    def ring(comm, buffer):
        '''... Cost: 2 (n - 1) alpha + 2 (n-1)/n N xbeta + (n-1)/n N gamma.'''

    ALGORITHMS = register("all_reduce", {"coordinator": coordinator, ..., "ring": ring})

The text is compiled once into a function of (n, N, params), so the formula a
student reads (in the docstring, which the tests hold to the same text) is
the formula the cost model computes. :mod:`.call` picks "auto" from here, and
:mod:`minidist.costmodel` fits and predicts from here.

The notation. Names: n (ranks), N (bytes), p (the largest power of two <= n),
alpha, beta, gamma, xbeta (seconds per byte of an exchange step, where a rank
sends and receives at once: beta on a full-duplex link), slots_alpha (see
:class:`~minidist.alpha_beta.Params`), and whatever the algorithm adds with
``where=`` (the chain's S segments, say). Writing two terms side by side
multiplies them and binds as tightly as / does, left to right: ``(n-1)/n N
beta`` is ((n-1)/n) N beta. ``log2 p`` and ``ceil(log2 n)`` are logarithms;
B(n) and C(n) are :func:`~minidist.alpha_beta.doubling_pieces` and
:func:`~minidist.alpha_beta.bruck_pieces`. ``X if n == p else Y`` picks a
case, as in Python.

Traffic: what the algorithm puts on the wires, summed over all ranks,
``traffic(n, count, itemsize, root=0) -> (messages, bytes)`` exactly as the
code sends them (empty pieces are sent too); ``count`` is the element count
of the array each rank passes (one rank's piece for scatter and gather; for
all_gather the gathered result). The tests compare it with traced runs.

Two levels. An algorithm built for a machine of nodes (the hierarchical
ones) states its cost on the two-level model instead, ``@cost(text,
two_level=True, ...)``, in the names g (ranks per node), m (nodes, n / g), q
(the largest power of two <= m), alpha_intra, beta_intra (a message inside a
node), alpha_inter, beta_inter (a message between nodes; beta_inter is the
NIC's beta times the spine's oversubscription,
:attr:`~minidist.topology.Topology.inter_beta`), gamma (a rank's, read from
the intra link), nics (NICs per node) and share (the most ranks one NIC
serves, ceil(g / nics): when every rank of a node sends off it at once, a NIC
carries share messages one after another, each alpha_inter + m beta_inter).
The links are full duplex, as the simulator's are: a rank sends and receives
in the same step at no extra cost (no xbeta). Such a formula is a function
of (n, N, topology) (:class:`minidist.topology.Topology`, passed in, never
imported here), and its traffic takes ``topology=`` too; these algorithms
have their own tables (:data:`NODE_ALGORITHMS`, :data:`NODE_COSTS`), and
:func:`predict` and :func:`best` here, on the flat network, never see them.
Every figure on a topology, of these and of the flat algorithms, comes from
one place: :mod:`.topology_costs`.

Imports only the message model (:mod:`minidist.alpha_beta`): everything
above it (the algorithms, call.py, the cost model) may import this.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

from minidist import alpha_beta
from minidist.alpha_beta import Params, params_for

#: Every collective's algorithms by name, filled in by the collective modules
#: (the order is part of the message fingerprint: append, never reorder).
ALGORITHMS: dict[str, dict[str, Callable]] = {}
#: The cost of each of them: COSTS[collective][algorithm].
COSTS: dict[str, dict[str, Cost]] = {}
#: The algorithms for a machine of nodes (they run only with a topology set),
#: by collective, in their own table: every "for each algorithm" of the
#: course runs the flat ones on any world, which these refuse. Their index in
#: a message's tag follows the flat table's (append, never reorder).
NODE_ALGORITHMS: dict[str, dict[str, Callable]] = {}
#: Their costs, on the two-level model: NODE_COSTS[collective][algorithm].
NODE_COSTS: dict[str, dict[str, Cost]] = {}


@dataclass(frozen=True)
class Cost:
    """One algorithm's cost: the formula as written, and what it computes."""

    #: the formula in the lessons' notation (also in the algorithm's docstring)
    text: str
    #: (n ranks, N bytes, Params) -> seconds
    seconds: Callable
    #: (n, count, itemsize, root=0) -> (messages, bytes), summed over ranks
    #: (a two-level algorithm's also takes topology=)
    traffic: Callable
    #: (n ranks, N bytes, Topology) -> seconds, for an algorithm that needs a
    #: topology (its ``seconds`` refuses); None for a flat algorithm
    two_level: Callable | None = None

    @property
    def needs_topology(self) -> bool:
        return self.two_level is not None


def cost(text: str, *, traffic: Callable, where: dict | None = None, two_level: bool = False):
    """Decorator: the algorithm's cost ``text`` (see the notation above) and its
    ``traffic``. ``where`` names more terms, each a function of
    (n, N, params): ``where={"S": lambda n, N, P: chain_segments(int(N))}``
    (of (n, N, topology) with ``two_level``: the formula is on the two-level model)."""
    words = " ".join(text.split())
    if two_level:
        on_topology = compile_formula(text, where or {}, two_level=True)

        def seconds(n, N, P):
            raise ValueError(f"the cost {words!r} is on the two-level model: pass topology= "
                             "(a minidist.topology.Topology) to minidist.costmodel.predict")
    else:
        on_topology, seconds = None, compile_formula(text, where or {})

    def attach(function):
        function.cost = Cost(words, seconds, traffic, on_topology)
        return function

    return attach


def register(collective: str, algorithms: dict) -> dict:
    """``collective``'s table of algorithms, name -> generator, each with a cost."""
    missing = [name for name, function in algorithms.items() if not hasattr(function, "cost")]
    if missing:
        raise TypeError(f"{collective}: algorithms {missing} have no @cost")
    ALGORITHMS[collective] = algorithms
    COSTS[collective] = {name: function.cost for name, function in algorithms.items()}
    return algorithms


def register_for_nodes(collective: str, algorithms: dict) -> dict:
    """Add ``algorithms``, costed on the two-level model, to ``collective``'s
    table of algorithms for a machine of nodes (:data:`NODE_ALGORITHMS`)."""
    table = NODE_ALGORITHMS.setdefault(collective, {})
    clash = sorted(set(algorithms) & (set(table) | set(ALGORITHMS.get(collective, {}))))
    if clash:
        raise ValueError(f"{collective}: algorithms {clash} are registered already")
    wrong = [name for name, function in algorithms.items()
             if not getattr(getattr(function, "cost", None), "needs_topology", False)]
    if wrong:
        raise TypeError(f"{collective}: algorithms {wrong} have no @cost(..., two_level=True)")
    for name, function in algorithms.items():
        table[name] = function
        NODE_COSTS.setdefault(collective, {})[name] = function.cost
    return algorithms


def needs_topology(collective: str, algorithm: str) -> bool:
    """Whether the algorithm runs only on a group cut into nodes (a topology set)."""
    return algorithm in NODE_COSTS.get(collective, {})


def every_algorithm(collective: str) -> dict:
    """Name -> generator of every algorithm of ``collective``: the flat ones,
    then those for a machine of nodes (the order of their tags)."""
    return {**ALGORITHMS.get(collective, {}), **NODE_ALGORITHMS.get(collective, {})}


def whole_arrays(messages: Callable[[int], int]) -> Callable:
    """Traffic of an algorithm whose every message is the whole array:
    ``messages(n)`` of them."""
    return lambda n, count, itemsize, root=0: (messages(n), messages(n) * count * itemsize)


# --------------------------------------------------------------------------- predictions


def formula(collective: str, algorithm: str) -> Callable:
    """The cost function of one algorithm: ``f(n, N, params) -> seconds``."""
    return _cost(collective, algorithm).seconds


def text(collective: str, algorithm: str) -> str:
    """The cost formula of one algorithm, as the lessons write it."""
    return _cost(collective, algorithm).text


def traffic(collective: str, algorithm: str) -> Callable:
    """``f(n, count, itemsize, root=0) -> (messages, bytes)`` of one algorithm."""
    return _cost(collective, algorithm).traffic


def _cost(collective: str, algorithm: str) -> Cost:
    try:
        algorithms = {**COSTS[collective], **NODE_COSTS.get(collective, {})}
    except KeyError:
        raise ValueError(f"no cost model for collective {collective!r}; known: "
                         f"{sorted(COSTS)}") from None
    try:
        return algorithms[algorithm]
    except KeyError:
        raise ValueError(f"no cost model for {collective} algorithm {algorithm!r}; known: "
                         f"{sorted(algorithms)}") from None


def predict(collective: str, algorithm: str, world_size: int, nbytes: float,
            params: Params | None = None, transport: str | None = None) -> float:
    """Predicted seconds for one call on the flat network (the
    alpha-beta-gamma formula). On a topology: :func:`.topology_costs.predict`."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size == 1:
        return 0.0
    if needs_topology(collective, algorithm):
        raise ValueError(f"{collective} algorithm={algorithm!r} is costed on a machine of "
                         "nodes: pass topology= (a minidist.topology.Topology) to "
                         "minidist.costmodel.predict")
    params = params or params_for(transport)
    return float(formula(collective, algorithm)(world_size, float(nbytes), params))


def predict_all(collective: str, world_size: int, nbytes: float,
                params: Params | None = None, transport: str | None = None) -> dict:
    """Predicted seconds of every flat algorithm of ``collective``."""
    return {name: predict(collective, name, world_size, nbytes, params, transport)
            for name in COSTS.get(collective, {})}


def best(collective: str, world_size: int, nbytes: float, *, transport: str | None = None,
         params: Params | None = None, candidates=None) -> str:
    """The flat algorithm predicted fastest on the flat network (ties: the
    first listed); an algorithm for nodes among ``candidates`` is passed over.
    On a topology: :func:`.topology_costs.best`."""
    algorithms = COSTS.get(collective, {})
    names = [name for name in (candidates or algorithms) if name in algorithms]
    if not names:
        if candidates:
            return tuple(candidates)[0]
        raise ValueError(f"no cost model for collective {collective!r}")
    params = params or params_for(transport)
    return min(names, key=lambda name: algorithms[name].seconds(world_size, float(nbytes),
                                                                params))


# --------------------------------------------------------------------------- the notation

#: What the names of the notation stand for, read off the Params.
_PARAMETERS = ("alpha", "beta", "xbeta", "gamma", "slots_alpha")
#: Functions of the notation; ``log2 p`` applies one to the term that follows.
_FUNCTIONS = {"log2": math.log2, "ceil": math.ceil, "ceil_log2": alpha_beta.ceil_log2,
              "B": alpha_beta.doubling_pieces, "C": alpha_beta.bruck_pieces}
_KEYWORDS = ("if", "else", "and", "or", "not")
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z_]\w*)|(//|==|!=|<=|>=|[-+*/()<>,]))")


#: The two-level model's names, read off a Topology T (see the module docstring).
_TWO_LEVEL = {
    "g": "T.ranks_per_node", "m": "n // g", "q": "largest_power_of_two(m)",
    "alpha_intra": "T.intra.alpha", "beta_intra": "T.intra.beta",
    "alpha_inter": "T.inter.alpha", "beta_inter": "T.inter_beta", "gamma": "T.intra.gamma",
    "nics": "T.nics_per_node", "share": "T.ranks_per_nic",
}


def compile_formula(text: str, where: dict, two_level: bool = False) -> Callable:
    """``text`` in the notation above as a function ``f(n, N, params) -> seconds``
    (``two_level``: ``f(n, N, topology)``, in the two-level names)."""
    expression = _to_python(text, set(where) | (set(_TWO_LEVEL) if two_level else set()),
                            two_level)
    if two_level:
        lines = ["def seconds(n, N, T):",
                 *(f"    {name} = {value}" for name, value in _TWO_LEVEL.items()),
                 *(f"    {name} = where[{name!r}](n, N, T)" for name in where),
                 f"    return {expression}"]
    else:
        lines = ["def seconds(n, N, P):",
                 *(f"    {name} = P.{name}" for name in _PARAMETERS),
                 "    p = largest_power_of_two(n)",
                 *(f"    {name} = where[{name!r}](n, N, P)" for name in where),
                 f"    return {expression}"]
    namespace = {"__builtins__": {}, "where": dict(where), **_FUNCTIONS,
                 "largest_power_of_two": alpha_beta.largest_power_of_two}
    exec(compile("\n".join(lines), f"<cost: {text}>", "exec"), namespace)
    return namespace["seconds"]


def _to_python(text: str, extra: set, two_level: bool = False) -> str:
    """Python for ``text``: side by side becomes *, ``log2 p`` becomes log2(p)."""
    # ceil(log2 n) exactly, also where the float log2 of a huge n would round.
    source = re.sub(r"ceil\(log2 (\w+)\)", r"ceil_log2(\1)", text)
    values = {"n", "N", *extra} if two_level else {"n", "N", "p", *_PARAMETERS, *extra}
    tokens, position = [], 0
    while position < len(source.rstrip()):
        match = _TOKEN.match(source, position)
        if match is None:
            raise ValueError(f"cost {text!r}: cannot read {source[position:]!r}")
        position = match.end()
        token = match.group(match.lastindex)
        if match.lastindex == 2 and token not in values and token not in _FUNCTIONS \
                and token not in _KEYWORDS:
            raise ValueError(f"cost {text!r}: unknown name {token!r}; known: "
                             f"{sorted(values | set(_FUNCTIONS))}")
        tokens.append(token)

    def is_term(token):  # a number, a value, or a bracketed expression
        return token[0].isdigit() or token in values

    out: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if out and (is_term(out[-1]) or out[-1] == ")") \
                and (is_term(token) or token in _FUNCTIONS or token == "("):
            out.append("*")
        if token in _FUNCTIONS and index + 1 < len(tokens) and tokens[index + 1] != "(":
            argument = tokens[index + 1]  # log2 p: the function of the next term
            if not is_term(argument):
                raise ValueError(f"cost {text!r}: {token} of {argument!r}?")
            out += [token, "(", argument, ")"]
            index += 2
            continue
        out.append(token)
        index += 1
    return " ".join(out)
