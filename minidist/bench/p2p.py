"""Point-to-point timings and the alpha, beta, gamma fitted from them.

The cost model (:mod:`minidist.costmodel`) prices every collective in three
numbers: alpha (seconds per message), beta (seconds per byte; ``exchange
beta`` when a rank sends and receives at once, as in every ring step) and
gamma (seconds per byte combined). This module measures them the way the
model defines them, between ranks 0 and 1 of a running world:

* ping-pong: rank 0 sends n bytes, rank 1 receives them into a buffer and
  sends them back; one-way time = round trip / 2. Fit: t = alpha + n beta.
* exchange: both send n bytes to each other at once; t = alpha + n xbeta
  (alpha kept from the ping-pong).
* gamma: ``np.add(a, b, out=a)`` on one rank, seconds per byte of ``a``.

Each point is the best of a few repeats: on a shared machine the best
repeat is the one least disturbed. ``benchmarks/bench_p2p.py`` uses these to
write benchmarks/results/p2p.json; ``minidist bench collectives`` fits them
again in the same run as the collectives it predicts, because a shared
machine's speed drifts from one hour to the next (MPICH's own times drift
with it: benchmarks/README.md, "How the benchmarks time, and why"): a
prediction is only as good as the alpha and beta it is given.

Ranks other than 0 and 1 only wait at the barriers.
"""

from __future__ import annotations

import time

import numpy as np

from minidist import costmodel

KIB, MIB = 1 << 10, 1 << 20
#: The in-run fit takes the exchange beta from messages this big and bigger:
#: the collectives it predicts move their bulk in such pieces, and below it
#: the per-message overhead still shows (a 64 KiB exchange runs at a fraction
#: of a 1 MiB one's bandwidth: bench_p2p.py's exchange points show it).
BULK_BYTES = 256 * KIB
#: One repeat of a point moves about this many bytes.
BYTES_PER_REPEAT = 256 * MIB


def iterations(size: int, quick: bool = False, budget: int = BYTES_PER_REPEAT) -> int:
    """Messages per repeat of a point: enough bytes for a stable time."""
    count = min(20000, max(3, budget // max(size, 1)))
    return max(3, count // 4) if quick else count


def pingpong(sizes, repeats: int, quick: bool = False, budget: int = BYTES_PER_REPEAT):
    """Run on every rank; rank 0 returns {size: best one-way seconds}, others None."""
    import minidist.distributed as dist

    rank = dist.get_rank()
    best = {}
    for size in sizes:
        outgoing = np.ones(size, np.uint8)
        incoming = np.zeros(size, np.uint8)
        count = iterations(size, quick, budget)
        for repeat in range(repeats + 1):  # the first round warms up (page faults, caches)
            dist.barrier()
            start = time.perf_counter()
            if rank < 2:
                for _ in range(count):
                    if rank == 0:
                        dist.send(outgoing, 1)
                        dist.recv(incoming, 1)
                    else:
                        dist.recv(incoming, 0)
                        dist.send(outgoing, 0)
            elapsed = (time.perf_counter() - start) / count / 2
            if repeat:
                best[size] = min(best.get(size, elapsed), elapsed)
        del outgoing, incoming
    return best if rank == 0 else None


def exchange(sizes, repeats: int, quick: bool = False, budget: int = BYTES_PER_REPEAT):
    """Ranks 0 and 1 send n bytes to each other at once (the step of a ring or
    of recursive doubling); rank 0 returns {size: best seconds per exchange}."""
    import minidist.distributed as dist

    rank = dist.get_rank()
    best = {}
    for size in sizes:
        outgoing = np.ones(size, np.uint8)
        incoming = np.zeros(size, np.uint8)
        count = max(2, iterations(size, quick, budget) // 2)
        for repeat in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            if rank < 2:
                for _ in range(count):
                    request = dist.irecv(incoming, 1 - rank)
                    dist.send(outgoing, 1 - rank)
                    request.wait()
            elapsed = (time.perf_counter() - start) / count
            if repeat:
                best[size] = min(best.get(size, elapsed), elapsed)
        del outgoing, incoming
    return best if rank == 0 else None


def combine_time(sizes, repeats: int = 3) -> dict:
    """{size: best seconds of ``np.add(a, b, out=a)``} on float32 arrays of ``size`` bytes."""
    best = {}
    for size in sizes:
        a = np.full(size // 4, 1.0, np.float32)
        b = np.full(size // 4, 1.0, np.float32)
        count = max(3, min(1000, BYTES_PER_REPEAT // 4 // max(size, 1)))
        np.add(a, b, out=a)
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(count):
                np.add(a, b, out=a)
            elapsed = (time.perf_counter() - start) / count
            best[size] = min(best.get(size, elapsed), elapsed)
    return best


def fit_alpha_beta(points: dict) -> tuple[float, float]:
    """Least squares of t = alpha + beta * n, each point weighted by 1 / t
    (relative error), so latency and bandwidth ends both count."""
    sizes = np.array(sorted(points), dtype=float)
    times = np.array([points[int(size)] for size in sizes])
    weights = 1.0 / times
    design = np.stack([np.ones_like(sizes), sizes], axis=1) * weights[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, times * weights, rcond=None)
    return float(max(alpha, 0.0)), float(max(beta, 1e-15))


def fit_exchange_beta(points: dict, alpha: float, smallest: int = 64 * KIB) -> float:
    """Seconds per byte of an exchange, t = alpha + n * exchange_beta, fitted
    (alpha kept from the ping-pong) on the messages of ``smallest`` bytes and
    more, where bytes, not latency, decide."""
    sizes = np.array([size for size in sorted(points) if size >= smallest], dtype=float)
    excess = np.array([points[int(size)] - alpha for size in sizes])
    weights = 1.0 / np.array([points[int(size)] for size in sizes])
    return float(max(np.sum(weights**2 * sizes * excess) / np.sum(weights**2 * sizes**2), 1e-15))


def fit_gamma(points: dict) -> float:
    """Seconds per byte combined: the slope through the origin, relative error."""
    sizes = np.array(sorted(points), dtype=float)
    times = np.array([points[int(size)] for size in sizes])
    return float(np.mean(times / sizes))


def fit_sizes(largest: int) -> tuple[list[int], list[int]]:
    """(ping-pong sizes, exchange sizes) for a fit that covers messages up to
    ``largest`` bytes (at least 1 MiB, at most 64 MiB)."""
    top = min(max(largest, MIB), 64 * MIB)
    bulk = [64 * KIB << k for k in range(11) if 64 * KIB << k <= top]  # 64 KiB, 128 KiB, ...
    return [8, KIB, 8 * KIB] + bulk, bulk


def burn_in(seconds: float = 0.3) -> None:
    """Keep ranks 0 and 1 busy exchanging 1 MiB for about ``seconds`` before
    anything is timed. On a VM the first moments after workers start can run
    at half speed or worse (calls stalling every few calls, then none),
    whatever ran first; timing that stretch would make the first point look
    slow. Rank 0 decides when to stop."""
    import minidist.distributed as dist

    rank = dist.get_rank()
    outgoing = np.ones(MIB, np.uint8)
    incoming = np.zeros(MIB, np.uint8)
    go = np.ones(1, np.int64)
    start = time.perf_counter()
    while go[0]:
        if rank < 2:
            for _ in range(20):
                request = dist.irecv(incoming, 1 - rank)
                dist.send(outgoing, 1 - rank)
                request.wait()
        go[0] = time.perf_counter() - start < seconds
        dist.broadcast(go, src=0)


def measure_params(largest: int, slots_alpha: float | None = None, repeats: int = 3,
                   budget: int = 32 * MIB):
    """Run on every rank of a world of 2 or more: measure and fit alpha, beta,
    exchange beta (ranks 0 and 1) and gamma (rank 0). Rank 0 returns
    (Params, {"pingpong": points, "exchange": points, "combine": points}),
    the others None."""
    import minidist.distributed as dist

    one_way, both_ways = fit_sizes(largest)
    burn_in()
    ping = pingpong(one_way, repeats, budget=budget)
    swap = exchange(both_ways, repeats, budget=budget)
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    combine = combine_time(both_ways)
    alpha, beta = fit_alpha_beta(ping)
    params = costmodel.Params(alpha=alpha, beta=beta, gamma=fit_gamma(combine),
                              exchange_beta=fit_exchange_beta(swap, alpha, BULK_BYTES),
                              slots_alpha=slots_alpha)
    return params, {"pingpong": ping, "exchange": swap, "combine": combine}
