"""The cost of a message, and of every collective algorithm built from messages.

A message of n bytes takes ``t = alpha + n * beta``: a fixed latency alpha
(seconds) and a time per byte beta (seconds per byte, 1 / bandwidth).
Combining n bytes with a reduction takes ``n * gamma``. Every algorithm in
:mod:`minidist.distributed.collectives` is a pattern of such messages, so its
time is a formula in alpha, beta, gamma, the number of ranks n and the array
size N (bytes); this module holds those formulas, fits alpha and beta from
measurements, and predicts::

    from minidist import costmodel
    costmodel.predict("all_reduce", "ring", world_size=8, nbytes=64 << 20,
                      params=costmodel.PARAMS["shm"])
    costmodel.best("all_reduce", 8, 4096, transport="pipe")  # -> "recursive_doubling"

N is the size of each rank's array for broadcast, reduce and all_reduce; of
the whole (gathered / scattered / exchanged) array for gather, scatter,
all_gather, reduce_scatter (its input) and all_to_all (what one rank sends in
total). p is the largest power of two not above n.

The model assumes each rank can send one message and receive one message at
a time, and that links do not slow each other down. Whether a rank can send
and receive *at the same time* at full speed (full duplex) depends on what
moves the bytes: a network card does, but on one machine the rank's own CPU
copies every byte in and out of shared memory, so a step in which a rank
sends m bytes and receives m bytes (an *exchange*: every step of the ring,
recursive doubling, Bruck, pairwise...) costs about twice a one-way message.
``Params.exchange_beta`` is that measured cost per byte of an exchange
(``benchmarks/bench_p2p.py`` fits it, as it fits beta from a ping-pong);
the formulas of exchange steps use :attr:`Params.xbeta`, which falls back to
beta for a full-duplex link. With more ranks than cores, ranks also take
turns on the CPU: no formula here models that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Params:
    """alpha: seconds per message; beta: seconds per byte moved; gamma: seconds
    per byte combined by a reduction."""

    alpha: float
    beta: float
    gamma: float = 0.0
    #: seconds per byte when a rank sends and receives at once; None: as beta
    exchange_beta: float | None = None
    #: latency of the shared slots (the one-shot all_reduce of small arrays
    #: without messages, shm only; see transport/shared_slots.py); None: none
    slots_alpha: float | None = None

    @property
    def xbeta(self) -> float:
        """Seconds per byte of an exchange step (beta on a full-duplex link)."""
        return self.beta if self.exchange_beta is None else self.exchange_beta

    @property
    def bandwidth(self) -> float:
        """Bytes per second of one link (1 / beta)."""
        return 1.0 / self.beta if self.beta else math.inf

    def message(self, nbytes: float) -> float:
        """Time of one message: alpha + nbytes * beta."""
        return self.alpha + nbytes * self.beta


#: Fitted on the 2-core development machine by ``benchmarks/bench_p2p.py``
#: (ping-pong, see benchmarks/results/p2p.json); gamma from timing
#: ``np.add(a, b, out=a)`` on 64 MiB float32 arrays (about 1.5e-10 s/B).
#: Refit on your machine with :func:`fit` (lesson 2 shows how).
PARAMS = {
    # slots_alpha: the one-shot all_reduce through shared slots took about half
    # of recursive doubling's time at 4 KiB on 2 ranks (2026-11-23, EPYC).
    "shm": Params(alpha=4.9e-6, beta=1.21e-10, gamma=1.5e-10, slots_alpha=2.5e-6),
    "pipe": Params(alpha=3.1e-5, beta=3.83e-10, gamma=1.5e-10),
    "mpi": Params(alpha=2.1e-6, beta=7.5e-11, gamma=1.5e-10),
    # A cluster-like default for the simulator: 5 us latency, 10 GB/s links,
    # combining at 10 GB/s.
    "sim": Params(alpha=5e-6, beta=1e-10, gamma=1e-10),
}


def fit(sizes, seconds) -> Params:
    """Least-squares fit of ``t = alpha + n * beta`` to measured one-way times.

    Fitted on absolute errors, large messages dominate beta and small ones
    alpha, which is what the predictions need. Negative results (noise on a
    tiny alpha) are clipped to zero.
    """
    sizes = np.asarray(sizes, np.float64)
    seconds = np.asarray(seconds, np.float64)
    if sizes.shape != seconds.shape or sizes.size < 2:
        raise ValueError("fit needs at least two (size, time) pairs of equal length, got "
                         f"{sizes.size} sizes and {seconds.size} times")
    design = np.stack([np.ones_like(sizes), sizes], axis=1)
    # Weight by 1/t so that the latency of small messages is not drowned out.
    weights = 1.0 / np.maximum(seconds, 1e-12)
    (alpha, beta), *_ = np.linalg.lstsq(design * weights[:, None], seconds * weights, rcond=None)
    return Params(alpha=max(float(alpha), 0.0), beta=max(float(beta), 0.0))


def _log2(n: int) -> int:
    """ceil(log2 n): rounds of a binomial tree."""
    return max(n - 1, 0).bit_length()


def _p(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _fold(n: int, N: float, P: Params) -> float:
    """Extra cost of folding a non-power-of-two world into p ranks and back."""
    return 0.0 if n == _p(n) else 2 * (P.alpha + N * P.beta) + N * P.gamma


# Each formula: (n ranks, N bytes, Params) -> seconds. Keep in step with the
# docstring of the algorithm it describes.
FORMULAS = {
    "broadcast": {
        "linear": lambda n, N, P: (n - 1) * (P.alpha + N * P.beta),
        "binomial": lambda n, N, P: _log2(n) * (P.alpha + N * P.beta),
    },
    "reduce": {
        "linear": lambda n, N, P: (n - 1) * (P.alpha + N * P.beta + N * P.gamma),
        "binomial": lambda n, N, P: _log2(n) * (P.alpha + N * P.beta + N * P.gamma),
    },
    "all_reduce": {
        "coordinator": lambda n, N, P: 2 * (n - 1) * (P.alpha + N * P.beta)
        + (n - 1) * N * P.gamma,
        "reduce_broadcast": lambda n, N, P: 2 * _log2(n) * (P.alpha + N * P.beta)
        + _log2(n) * N * P.gamma,
        "recursive_doubling": lambda n, N, P: math.log2(_p(n)) * (P.alpha + N * P.xbeta
                                                                   + N * P.gamma)
        + _fold(n, N, P),
        "rabenseifner": lambda n, N, P: 2 * math.log2(_p(n)) * P.alpha
        + 2 * (_p(n) - 1) / _p(n) * N * P.xbeta + (_p(n) - 1) / _p(n) * N * P.gamma
        + _fold(n, N, P),
        "ring": lambda n, N, P: 2 * (n - 1) * P.alpha + 2 * (n - 1) / n * N * P.xbeta
        + (n - 1) / n * N * P.gamma,
        "two_shot": lambda n, N, P: 2 * (n - 1) * P.alpha + 2 * (n - 1) / n * N * P.xbeta
        + (n - 1) / n * N * P.gamma,
        "one_shot": lambda n, N, P: _one_shot(n, N, P),
    },
}


def _one_shot(n: int, N: float, P: Params) -> float:
    from minidist.distributed.transport import shared_slots

    if P.slots_alpha is not None and N <= shared_slots.SLOT_BYTES \
            and n <= shared_slots.MAX_WORLD:
        return P.slots_alpha + N * P.beta + (n - 1) * N * P.gamma
    return (n - 1) * (P.alpha + N * P.xbeta) + (n - 1) * N * P.gamma


# --------------------------------------------------------------------------- rooted, barrier


def _chain_segments(N: float) -> int:
    from minidist.distributed.collectives.broadcast import chain_segments

    return chain_segments(int(N))


FORMULAS["broadcast"].update({
    "scatter_allgather": lambda n, N, P: _log2(n) * P.alpha + (n - 1) / n * N * P.beta
    + (n - 1) * (P.alpha + N / n * P.xbeta),
    "chain": lambda n, N, P: (n - 2 + _chain_segments(N))
    * (P.alpha + N / _chain_segments(N) * P.xbeta),
})
# Root 0, which sits out of the fold (and is handed its chunk) whenever n != p.
FORMULAS["reduce"]["rabenseifner"] = lambda n, N, P: (
    2 * math.log2(_p(n)) * P.alpha + 2 * (_p(n) - 1) / _p(n) * N * P.beta
    + (_p(n) - 1) / _p(n) * N * P.gamma
    + (0.0 if n == _p(n) else P.alpha + N * P.beta + N * P.gamma + P.alpha + N / _p(n) * P.beta))
FORMULAS["scatter"] = {
    "linear": lambda n, N, P: (n - 1) * (P.alpha + N / n * P.beta),
    "binomial": lambda n, N, P: _log2(n) * P.alpha + (n - 1) / n * N * P.beta,
}
FORMULAS["gather"] = dict(FORMULAS["scatter"])
FORMULAS["barrier"] = {
    "dissemination": lambda n, N, P: _log2(n) * P.alpha,
    "tree": lambda n, N, P: 2 * _log2(n) * P.alpha,
}


# --------------------------------------------------------------------------- traffic
#
# TRAFFIC[collective][algorithm](n, count, itemsize, root=0) -> (messages, bytes):
# how many messages the algorithm sends, summed over all ranks, and how many
# payload bytes they carry, exactly as the code sends them (empty chunks
# included: they are still sent). ``count`` is the element count of the array
# each rank passes (one rank's piece for scatter and gather). A world of one
# sends nothing. The test suite compares these with traced runs.


def _chunk_bytes(count: int, parts: int, itemsize: int) -> list[int]:
    from minidist.distributed.collectives.chunks import chunk_bounds

    bounds = chunk_bounds(count, parts)
    return [(bounds[index + 1] - bounds[index]) * itemsize for index in range(parts)]


def _subtree(virtual: int, n: int) -> int:
    return n if virtual == 0 else min(virtual & -virtual, n - virtual)


def _scatter_allgather_traffic(n, count, itemsize, root=0):
    chunks = _chunk_bytes(count, n, itemsize)
    scatter = sum(sum(chunks[v:v + _subtree(v, n)]) for v in range(1, n))
    return (n - 1) + n * (n - 1), scatter + (n - 1) * count * itemsize


def _chain_traffic(n, count, itemsize, root=0):
    return (n - 1) * _chain_segments(count * itemsize), (n - 1) * count * itemsize


def _whole_arrays(messages_per_n):
    """Traffic of an algorithm whose every message is the whole array."""
    return lambda n, count, itemsize, root=0: (messages_per_n(n),
                                               messages_per_n(n) * count * itemsize)


def _reduce_rabenseifner_traffic(n, count, itemsize, root=0):
    p = _p(n)
    extra, rounds = n - p, p.bit_length() - 1
    total = count * itemsize
    root_sat_out = root < 2 * extra and root % 2 == 0
    core_root = root // 2 if root < 2 * extra else root - extra
    chunks = _chunk_bytes(count, p, itemsize)
    # In the gather, chunk c travels once for every bit in which c and the
    # root's chunk differ (each level's sender passes on all it has gathered).
    gathered = sum(bin(chunk ^ core_root).count("1") * nbytes
                   for chunk, nbytes in enumerate(chunks))
    # fold in; halving ((p-1) N in all); the root's chunk if it sat out; gather
    messages = extra + p * rounds + root_sat_out + (p - 1)
    payload = extra * total + (p - 1) * total + root_sat_out * chunks[core_root] + gathered
    return messages, payload


def _all_reduce_rabenseifner_traffic(n, count, itemsize, root=0):
    p = _p(n)
    extra, rounds = n - p, p.bit_length() - 1
    return 2 * extra + 2 * p * rounds, (2 * extra + 2 * (p - 1)) * count * itemsize


def _binomial_pieces_traffic(n, count, itemsize, root=0):
    return n - 1, sum(_subtree(v, n) for v in range(1, n)) * count * itemsize


TRAFFIC = {
    "broadcast": {
        "linear": _whole_arrays(lambda n: n - 1),
        "binomial": _whole_arrays(lambda n: n - 1),
        "scatter_allgather": _scatter_allgather_traffic,
        "chain": _chain_traffic,
    },
    "reduce": {
        "linear": _whole_arrays(lambda n: n - 1),
        "binomial": _whole_arrays(lambda n: n - 1),
        "rabenseifner": _reduce_rabenseifner_traffic,
    },
    "all_reduce": {
        "coordinator": _whole_arrays(lambda n: 2 * (n - 1)),
        "reduce_broadcast": _whole_arrays(lambda n: 2 * (n - 1)),
        "recursive_doubling": _whole_arrays(
            lambda n: 2 * (n - _p(n)) + _p(n) * (_p(n).bit_length() - 1)),
        "rabenseifner": _all_reduce_rabenseifner_traffic,
        "ring": lambda n, count, itemsize, root=0: (2 * n * (n - 1),
                                                    2 * (n - 1) * count * itemsize),
        "two_shot": lambda n, count, itemsize, root=0: (2 * n * (n - 1),
                                                        2 * (n - 1) * count * itemsize),
        "one_shot": lambda n, count, itemsize, root=0: (n * (n - 1),
                                                        n * (n - 1) * count * itemsize),
    },
    "scatter": {
        "linear": _whole_arrays(lambda n: n - 1),
        "binomial": _binomial_pieces_traffic,
    },
    "gather": {
        "linear": _whole_arrays(lambda n: n - 1),
        "binomial": _binomial_pieces_traffic,
    },
    "barrier": {
        "dissemination": lambda n, count=0, itemsize=0, root=0: (n * _log2(n), 0),
        "tree": lambda n, count=0, itemsize=0, root=0: (2 * (n - 1), 0),
    },
}


# --------------------------------------------------------------------------- the all-to-all family
# all_gather (N: the gathered result), reduce_scatter (N: the input), all_to_all
# (N: what one rank sends); each rank's piece is N/n bytes.


def _doubling_pieces(n: int) -> int:
    """B(n): pieces on the critical path of a folded recursive doubling / halving
    (round k moves at most 2^k + min(2^k, n - p) pieces); n - 1 when n = p."""
    p, extra = _p(n), n - _p(n)
    return sum((1 << k) + min(1 << k, extra) for k in range(p.bit_length() - 1))


def _bruck_pieces(n: int) -> int:
    """Pieces an all-to-all Bruck rank sends: in round k those whose index has bit k set."""
    return sum(sum(1 for index in range(n) if index >> k & 1) for k in range(_log2(n)))


def _folded(n: int, power_of_two: float, otherwise: float) -> float:
    return power_of_two if n == _p(n) else otherwise


FORMULAS.update({
    "all_gather": {
        "ring": lambda n, N, P: (n - 1) * (P.alpha + N / n * P.xbeta),
        "recursive_doubling": lambda n, N, P: _folded(
            n, math.log2(n) * P.alpha + (n - 1) / n * N * P.xbeta,
            (math.log2(_p(n)) + 2) * P.alpha + _doubling_pieces(n) * N / n * P.xbeta
            + (1 + n) * N / n * P.beta),
        "bruck": lambda n, N, P: _log2(n) * P.alpha + (n - 1) / n * N * P.xbeta,
    },
    "reduce_scatter": {
        "ring": lambda n, N, P: (n - 1) * (P.alpha + N / n * (P.xbeta + P.gamma)),
        "recursive_halving": lambda n, N, P: _folded(
            n, math.log2(n) * P.alpha + (n - 1) / n * N * (P.xbeta + P.gamma),
            (math.log2(_p(n)) + 2) * P.alpha
            + _doubling_pieces(n) * N / n * (P.xbeta + P.gamma)
            + n * N / n * (P.beta + P.gamma) + N / n * P.beta),
        "pairwise": lambda n, N, P: (n - 1) * (P.alpha + N / n * (P.xbeta + P.gamma)),
    },
    "all_to_all": {
        "pairwise": lambda n, N, P: (n - 1) * (P.alpha + N / n * P.xbeta),
        "bruck": lambda n, N, P: _log2(n) * P.alpha + _bruck_pieces(n) * N / n * P.xbeta,
    },
})

#: The double binary tree all_reduce pipelines each half of the array in
#: chunks of about this many bytes.
DOUBLE_BINARY_TREE_CHUNK_BYTES = 1 << 16


def double_binary_tree_chunks(nbytes: float) -> int:
    """k: the chunks each half of an ``nbytes`` array is pipelined in."""
    return max(1, math.ceil(nbytes / 2 / DOUBLE_BINARY_TREE_CHUNK_BYTES))


def _double_binary_tree(n: int, N: float, P: Params) -> float:
    k = double_binary_tree_chunks(N)
    return (k + 2 * _log2(n) - 1) * (P.alpha + 2 * N / k * P.beta + N / k * P.gamma)


FORMULAS["all_reduce"]["double_binary_tree"] = _double_binary_tree

#: What each algorithm puts on the wires, summed over all ranks:
#: ``f(n, count, itemsize) -> (messages, bytes)``, count being the elements of
#: N above (a multiple of n). Empty pieces are still sent, so messages do not
#: depend on count.
TRAFFIC_ALL_TO_ALL_FAMILY = {
    "all_gather": {
        "ring": lambda n, count, itemsize: (n * (n - 1), (n - 1) * count * itemsize),
        "recursive_doubling": lambda n, count, itemsize: (
            _p(n) * _log2(_p(n)) + 2 * (n - _p(n)),
            (n - _p(n) + n * (_p(n) - 1) + (n - _p(n)) * n) * count // n * itemsize),
        "bruck": lambda n, count, itemsize: (n * _log2(n), (n - 1) * count * itemsize),
    },
    "reduce_scatter": {
        "ring": lambda n, count, itemsize: (n * (n - 1), (n - 1) * count * itemsize),
        "recursive_halving": lambda n, count, itemsize: (
            _p(n) * _log2(_p(n)) + 2 * (n - _p(n)),
            ((n - _p(n)) * n + n * (_p(n) - 1) + n - _p(n)) * count // n * itemsize),
        "pairwise": lambda n, count, itemsize: (n * (n - 1), (n - 1) * count * itemsize),
    },
    "all_to_all": {
        "pairwise": lambda n, count, itemsize: (n * (n - 1), (n - 1) * count * itemsize),
        "bruck": lambda n, count, itemsize: (n * _log2(n),
                                             _bruck_pieces(n) * count * itemsize),
    },
    # Not of this family, but added with it: each non-root rank of each tree
    # sends k chunks up and receives k down (count: the whole array).
    "all_reduce": {
        "double_binary_tree": lambda n, count, itemsize: (
            4 * (n - 1) * double_binary_tree_chunks(count * itemsize),
            2 * (n - 1) * count * itemsize),
    },
}



def _without_root(function):
    return lambda n, count, itemsize, root=0: function(n, count, itemsize)


# One TRAFFIC table for every algorithm (the all-to-all family has no root).
for _collective, _algorithms in TRAFFIC_ALL_TO_ALL_FAMILY.items():
    for _name, _function in _algorithms.items():
        TRAFFIC.setdefault(_collective, {})[_name] = _without_root(_function)


def formula(collective: str, algorithm: str):
    """The cost function of one algorithm: ``f(n, N, params) -> seconds``."""
    try:
        algorithms = FORMULAS[collective]
    except KeyError:
        raise ValueError(f"no cost model for collective {collective!r}; known: "
                         f"{sorted(FORMULAS)}") from None
    try:
        return algorithms[algorithm]
    except KeyError:
        raise ValueError(f"no cost model for {collective} algorithm {algorithm!r}; known: "
                         f"{sorted(algorithms)}") from None


def params_for(transport: str | None) -> Params:
    return PARAMS.get(transport or "shm", PARAMS["shm"])


def predict(collective: str, algorithm: str, world_size: int, nbytes: float,
            params: Params | None = None, transport: str | None = None) -> float:
    """Predicted seconds for one call (the alpha-beta-gamma formula)."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size == 1:
        return 0.0
    params = params or params_for(transport)
    return float(formula(collective, algorithm)(world_size, float(nbytes), params))


def predict_all(collective: str, world_size: int, nbytes: float,
                params: Params | None = None, transport: str | None = None) -> dict:
    """Predicted seconds of every modelled algorithm of ``collective``."""
    return {name: predict(collective, name, world_size, nbytes, params, transport)
            for name in FORMULAS.get(collective, {})}


def best(collective: str, world_size: int, nbytes: float, *, transport: str | None = None,
         params: Params | None = None, candidates=None) -> str:
    """The algorithm the cost model predicts fastest (ties: the first listed)."""
    algorithms = FORMULAS.get(collective, {})
    names = [name for name in (candidates or algorithms) if name in algorithms]
    if not names:
        if candidates:
            return tuple(candidates)[0]
        raise ValueError(f"no cost model for collective {collective!r}")
    params = params or params_for(transport)
    return min(names, key=lambda name: formula(collective, name)(world_size, float(nbytes),
                                                                  params))


def parse_size(text) -> int:
    """'100MB' -> 100_000_000, '64MiB' -> 67108864, '4k' -> 4000, 512 -> 512."""
    if isinstance(text, (int, np.integer)):
        return int(text)
    units = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
             "kib": 1024, "mib": 1024**2, "gib": 1024**3}
    value, unit = _split_number(str(text))
    if unit.lower() not in units:
        raise ValueError(f"cannot read size {text!r}: use a number with B, KB, MB, GB, KiB, "
                         "MiB or GiB")
    return int(value * units[unit.lower()])


def parse_time(text) -> float:
    """'5us' -> 5e-6, '1.5ms' -> 1.5e-3, '2e-6' -> 2e-6 (seconds)."""
    if isinstance(text, (int, float)):
        return float(text)
    units = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    value, unit = _split_number(str(text))
    if unit.lower() not in units:
        raise ValueError(f"cannot read time {text!r}: use a number with s, ms, us or ns")
    return value * units[unit.lower()]


def parse_bandwidth(text) -> float:
    """'10GB/s' -> 1e10 bytes per second."""
    if isinstance(text, (int, float)):
        return float(text)
    text = str(text).strip()
    if text.lower().endswith("/s"):
        text = text[:-2]
    return float(parse_size(text))


def _split_number(text: str) -> tuple[float, str]:
    text = text.strip().replace("_", "")
    index = len(text)
    while index and not (text[index - 1].isdigit() or text[index - 1] == "."):
        index -= 1
    try:
        return float(text[:index]), text[index:].strip()
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a number with a unit") from None
