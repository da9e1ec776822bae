"""The cost of a message: alpha + N beta (and N gamma to combine N bytes).

A message of N bytes takes ``t = alpha + N * beta``: a fixed latency alpha
(seconds) and a time per byte beta (seconds per byte, 1 / bandwidth).
Combining N bytes with a reduction takes ``N * gamma``. Every collective
algorithm is a pattern of such messages, so its time is a formula in alpha,
beta, gamma, the number of ranks n and the array size N (bytes): each
algorithm states its own next to its code (see
:mod:`minidist.distributed.collectives.registry`); this module holds the
model they are written in: the parameters, their fit to measurements, and
the few functions of n the formulas use.

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
turns on the CPU: no formula models that.

Imports nothing of minidist: the collectives and the cost model stand on it.
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


#: Measurements that the code uses: alpha and beta fitted by
#: ``benchmarks/bench_p2p.py`` (ping-pong; "mpi" from its MPICH column) in an
#: earlier run on the 2-core development machine than the one in
#: benchmarks/results/p2p.json; gamma from timing ``np.add(a, b, out=a)`` on
#: 64 MiB float32 arrays (bench_p2p.py fits it too).
#: Refit on your machine with :func:`fit` (lesson 2 shows how).
PARAMS = {
    # slots_alpha: the one-shot all_reduce through shared slots pays about half
    # a message's latency: bench_collectives.py measures it at 4 KiB on 2 ranks.
    "shm": Params(alpha=4.9e-6, beta=1.21e-10, gamma=1.5e-10, slots_alpha=2.5e-6),
    "pipe": Params(alpha=3.1e-5, beta=3.83e-10, gamma=1.5e-10),
    "mpi": Params(alpha=2.1e-6, beta=7.5e-11, gamma=1.5e-10),
    # A cluster-like default for the simulator (chosen, not measured: a fast
    # network link and a core's adding speed of today's machines).
    "sim": Params(alpha=5e-6, beta=1e-10, gamma=1e-10),
}


def params_for(transport: str | None) -> Params:
    """The default parameters of a transport (shm's for one not listed)."""
    return PARAMS.get(transport or "shm", PARAMS["shm"])


def fit(sizes, seconds) -> Params:
    """Least-squares fit of ``t = alpha + N * beta`` to measured one-way times
    of messages of N bytes (``sizes``).

    Each error is weighted by 1 / t (relative errors), so that the latency of
    the small messages is not drowned out by the large ones, which still
    decide beta. Negative results (noise on a
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


# --------------------------------------------------------------------------- functions of n
# The formulas' words for what depends on n alone (see the registry's notation).


def ceil_log2(n: int) -> int:
    """ceil(log2 n): the rounds of a binomial tree (exact for any int)."""
    return max(n - 1, 0).bit_length()


def largest_power_of_two(n: int) -> int:
    """p: the largest power of two not above n."""
    return 1 << (n.bit_length() - 1)


def doubling_pieces(n: int) -> int:
    """B(n): pieces on the critical path of a folded recursive doubling / halving
    (round k moves at most 2^k + min(2^k, n - p) pieces); n - 1 when n = p."""
    p = largest_power_of_two(n)
    extra = n - p
    return sum((1 << k) + min(1 << k, extra) for k in range(p.bit_length() - 1))


def bruck_pieces(n: int) -> int:
    """C(n) = sum_k c_k: the pieces an all-to-all Bruck rank sends, in round k
    those whose index has bit k set."""
    return sum(sum(1 for index in range(n) if index >> k & 1) for k in range(ceil_log2(n)))


# --------------------------------------------------------------------------- reading units


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


#: What the exchange's beta means, for wherever a formula that uses it is shown.
EXCHANGE_BETA_LEGEND = ("βₓ: β of a step in which a rank sends and receives at once; about 2β "
                        "on one machine, whose CPU copies both ways; β on a full-duplex link")


#: What the shared slots' latency means, for wherever a formula that uses it is shown.
SLOTS_ALPHA_LEGEND = ("αₛ: the latency of the shared slots, through which the one-shot "
                      "all_reduce adds small arrays without messages (shm only)")


def in_symbols(formula: str) -> str:
    """A cost formula in the lessons' notation: ``alpha`` -> α, ``beta`` -> β,
    ``gamma`` -> γ, ``xbeta`` (the exchange's beta) -> βₓ, ``slots_alpha`` (the
    shared slots' latency) -> αₛ."""
    import re

    names = {"slots_alpha": "αₛ", "xbeta": "βₓ", "alpha": "α", "beta": "β", "gamma": "γ"}
    return re.sub(r"\b(slots_alpha|xbeta|alpha|beta|gamma)\b",
                  lambda match: names[match.group(1)], formula)
