"""Gradient compression: communication hooks for DistributedDataParallel.

The communication wall: a data-parallel step all-reduces the whole gradient,
about 2 P bytes per rank whatever the number of ranks. Two ways to send less,
in the order of the Greek course slides (Parallel and distributed training
of deep neural networks, 2019-20): *fewer bits* per value (float16, int8, one bit) and
*fewer values* (skip the changes under a threshold, the k largest, k at
random); a third, *low rank*, is :mod:`.powersgd`, read next (it reuses this
file's error feedback), and :mod:`.hooks` names them all. Read after
:mod:`.ddp` and :mod:`.buckets`: each hook has the signature of
:meth:`DistributedDataParallel.register_comm_hook`::

    ddp.register_comm_hook(state, hook)      # hook(state, bucket) -> averaged gradient

In the formulas below a bucket has n values of s bytes (s = 4 for float32),
N ranks, and "bytes" means what one rank sends per bucket per step (it
receives as much). A ring all-reduce sends 2 (N - 1) / N n s; an all-gather
of an m-byte payload sends (N - 1) m.

Every hook sums the ranks' contributions in rank order, so all ranks hold
identical bits afterwards. Each rank's contribution is ``c = buffer /
divisor`` (its share of the global mean gradient). Lossy compressors with
*error feedback* keep what they did not send, ``residual = c + residual_old -
sent``, in their state and add it to the next step's contribution: nothing
is lost, only delayed (sent + residual, summed over the steps, equals the
summed uncompressed contributions).
"""

from __future__ import annotations

import math

import numpy as np

import minidist.distributed as dist

# --------------------------------------------------------------------------- states


class ErrorFeedbackState:
    """The residual of every bucket (by bucket index): what a lossy
    compressor has not sent yet, added to the next step's contribution.

    ``use_error_feedback=False`` (torch's name) keeps nothing: what a
    compressor drops is lost, which is what the lesson measures against."""

    def __init__(self, use_error_feedback: bool = True):
        self.use_error_feedback = bool(use_error_feedback)
        self.residuals: dict[int, np.ndarray] = {}

    def compensate(self, index: int, contribution: np.ndarray) -> np.ndarray:
        """This step's contribution plus the bucket's residual (a new array)."""
        residual = self.residuals.get(index)
        if residual is None:
            return contribution.copy()
        return contribution + residual

    def update(self, index: int, compensated: np.ndarray, sent: np.ndarray) -> None:
        """Keep what was not sent: ``compensated - sent`` (nothing without error feedback)."""
        if self.use_error_feedback:
            self.residuals[index] = compensated - sent


class _Random:
    """A per-rank random generator, made on first use (seed + rank)."""

    def __init__(self, seed: int):
        self.seed = seed
        self._rng = None

    def rng(self, rank: int) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng([self.seed, rank])
        return self._rng


class Int8State(_Random):
    """The random generator of int8's stochastic rounding (per rank)."""

    def __init__(self, seed: int = 0):
        super().__init__(seed)


class ThresholdState(ErrorFeedbackState):
    """Strom (2015): send the entries whose accumulated change exceeds ``tau``.
    With ``quantize=True`` (Strom's) an entry sent is ``+tau`` or ``-tau``
    and the rest of it stays in the residual; with ``False`` its whole value."""

    def __init__(self, tau: float, quantize: bool = True, use_error_feedback: bool = True):
        super().__init__(use_error_feedback)
        if not tau > 0:
            raise ValueError(f"ThresholdState: tau must be positive, got {tau!r}")
        self.tau = float(tau)
        self.quantize = bool(quantize)


class TopKState(ErrorFeedbackState):
    """Send the ``k = ceil(ratio n)`` entries of largest magnitude of each bucket."""

    def __init__(self, ratio: float = 0.01, use_error_feedback: bool = True):
        super().__init__(use_error_feedback)
        if not 0 < ratio <= 1:
            raise ValueError(f"TopKState: ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)

    def k(self, n: int) -> int:
        return max(1, min(n, math.ceil(self.ratio * n)))


class RandomKState(TopKState, _Random):
    """Send ``k = ceil(ratio n)`` entries of each bucket drawn at random
    (each rank its own draw, from seed + rank)."""

    def __init__(self, ratio: float = 0.01, seed: int = 0, use_error_feedback: bool = True):
        TopKState.__init__(self, ratio, use_error_feedback)
        _Random.__init__(self, seed)


# --------------------------------------------------------------------------- compressors


def quantize_int8(x: np.ndarray, rng: np.random.Generator):
    """QSGD-style stochastic rounding to int8 with one scale per array:
    ``scale = max |x| / 127``, ``q = floor(x / scale + u)`` with u uniform in
    [0, 1), so ``E[q scale] = x`` (unbiased). Returns (q int8, scale)."""
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak == 0.0:
        return np.zeros(x.shape, np.int8), 0.0
    scale = peak / 127.0
    q = np.floor(x / scale + rng.random(x.shape))
    return np.clip(q, -127, 127).astype(np.int8), scale


def truncate_bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16 by truncation: the top 16 bits of each float32 (sign, the 8
    exponent bits, 7 mantissa bits), as uint16. Same range as float32, a
    relative error under 2^-7, always towards zero."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def expand_bf16(bits: np.ndarray) -> np.ndarray:
    """The float32 values of :func:`truncate_bf16`'s bits (low 16 bits zero)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def compress_sign(p: np.ndarray):
    """1-bit sign compression (EF-signSGD): ``sent = mean |p| * sign(p)``
    (a zero counts as +). Returns (packed bits, scale, sent)."""
    positive = p >= 0
    scale = float(np.mean(np.abs(p))) if p.size else 0.0
    sent = np.where(positive, scale, -scale).astype(p.dtype)
    return np.packbits(positive), scale, sent


def compress_threshold(p: np.ndarray, tau: float, quantize: bool = True):
    """The entries with ``|p| > tau``: (indices, values); the values are
    ``tau sign(p)`` with ``quantize`` (Strom 2015), else ``p`` itself."""
    indices = np.flatnonzero(np.abs(p) > tau)
    values = p[indices]
    if quantize:
        values = np.where(values > 0, tau, -tau).astype(p.dtype)
    return indices, values


def compress_topk(p: np.ndarray, k: int):
    """The ``k`` entries of largest magnitude: (sorted indices, values)."""
    if k >= p.size:
        indices = np.arange(p.size)
    else:
        indices = np.sort(np.argpartition(np.abs(p), p.size - k)[p.size - k:])
    return indices, p[indices]


def compress_randomk(p: np.ndarray, k: int, rng: np.random.Generator):
    """``k`` entries drawn uniformly without replacement: (sorted indices, values)."""
    indices = np.sort(rng.choice(p.size, size=min(k, p.size), replace=False))
    return indices, p[indices]


def _scatter(indices, values, n, dtype) -> np.ndarray:
    dense = np.zeros(n, dtype)
    dense[indices] = values
    return dense


# --------------------------------------------------------------------------- exchanges


def _contribution(bucket) -> np.ndarray:
    buffer = bucket.buffer()
    return buffer / buffer.dtype.type(bucket.divisor())


def _gather(array: np.ndarray, bucket) -> np.ndarray:
    """All ranks' ``array`` (same shape on every rank), rank r's in row r."""
    out = np.empty((bucket.world_size,) + array.shape, array.dtype)
    dist.all_gather_into_tensor(out, array, group=bucket.group)
    return out


def _sparse_sum(indices, values, bucket) -> np.ndarray:
    """Sum the ranks' sparse (index, value) pairs into a dense bucket: an
    all-gather of the counts, then of the pairs padded to the largest count
    (the counts may differ between ranks)."""
    n, dtype = bucket.buffer().size, bucket.buffer().dtype
    counts = _gather(np.array([indices.size], np.int64), bucket)[:, 0]
    width = int(counts.max())
    index_dtype = np.int32 if n < 2**31 else np.int64
    padded_indices = np.zeros(width, index_dtype)
    padded_indices[:indices.size] = indices
    padded_values = np.zeros(width, dtype)
    padded_values[:values.size] = values
    all_indices = _gather(padded_indices, bucket)
    all_values = _gather(padded_values, bucket)
    total = np.zeros(n, dtype)
    for count, rank_indices, rank_values in zip(counts, all_indices, all_values):
        total[rank_indices[:count]] += rank_values[:count]   # indices unique within a rank
    return total


# --------------------------------------------------------------------------- hooks


def allreduce_hook(state, bucket) -> np.ndarray:
    """No compression: all-reduce the bucket, divide by the examples of all
    ranks (DDP's own path, bit for bit). ``state`` is unused (None).

    bytes: 2 (N - 1) / N n s (ring)."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=bucket.group, algorithm=bucket.algorithm)
    buffer /= buffer.dtype.type(bucket.divisor())
    return buffer


def fp16_compress_hook(state, bucket) -> np.ndarray:
    """Fewer bits: cast each rank's contribution to float16, all-reduce,
    cast back. Divides before the cast so the sum stays in float16's range;
    relative error about 2^-11 per value and per addition.

    bytes: 2 (N - 1) / N n 2 (half of float32's)."""
    half = _contribution(bucket).astype(np.float16)
    dist.all_reduce(half, group=bucket.group, algorithm=bucket.algorithm)
    return half.astype(bucket.buffer().dtype)


def bf16_compress_hook(state, bucket) -> np.ndarray:
    """Fewer bits: bfloat16 by truncation (:func:`truncate_bf16`), float32's
    range with 8 bits of precision. NumPy has no bfloat16 arithmetic, so the
    ranks cannot add while they pass the ring: all-gather the 16-bit
    payloads and add them as float32, in rank order.

    bytes: (N - 1) n 2 (at N = 2 half of float32's ring, as fp16)."""
    contribution = _contribution(bucket)
    all_bits = _gather(truncate_bf16(contribution), bucket)
    total = np.zeros(contribution.size, np.float32)
    for rank_bits in all_bits:
        total += expand_bf16(rank_bits)
    return total.astype(contribution.dtype)


def int8_hook(state: Int8State, bucket) -> np.ndarray:
    """Fewer bits: int8 with one scale per bucket and rank, stochastic
    rounding (:func:`quantize_int8`, unbiased); all-gather the int8 payloads
    and the scales, and sum ``q_r scale_r`` over the ranks (an all-reduce
    would overflow int8).

    bytes: (N - 1) (n + 8) (n int8 values and a float64 scale per rank)."""
    contribution = _contribution(bucket)
    q, scale = quantize_int8(contribution, state.rng(bucket.rank))
    all_q = _gather(q, bucket)
    scales = _gather(np.array([scale], np.float64), bucket)[:, 0]
    total = np.zeros(contribution.size, contribution.dtype)
    for rank_q, rank_scale in zip(all_q, scales):
        total += rank_q.astype(contribution.dtype) * contribution.dtype.type(rank_scale)
    return total


def sign_hook(state: ErrorFeedbackState, bucket) -> np.ndarray:
    """Fewest bits: 1-bit signSGD with error feedback (Seide 2014, Karimireddy
    2019): each rank sends the signs of ``c + residual`` packed 8 per byte and
    one scale, mean |c + residual|; the residual keeps the rest.

    bytes: (N - 1) (ceil(n / 8) + 8)."""
    index = bucket.index()
    p = state.compensate(index, _contribution(bucket))
    bits, scale, sent = compress_sign(p)
    state.update(index, p, sent)
    all_bits = _gather(bits, bucket)
    scales = _gather(np.array([scale], np.float64), bucket)[:, 0]
    total = np.zeros(p.size, p.dtype)
    for rank_bits, rank_scale in zip(all_bits, scales):
        positive = np.unpackbits(rank_bits, count=p.size).astype(bool)
        total += np.where(positive, p.dtype.type(rank_scale), -p.dtype.type(rank_scale))
    return total


def threshold_hook(state: ThresholdState, bucket) -> np.ndarray:
    """Fewer values: Strom (2015), send only the entries whose accumulated
    change ``|c + residual|`` exceeds ``tau`` (:func:`compress_threshold`),
    as (index, value) pairs; error feedback keeps the rest.

    bytes: (N - 1) (8 + m (4 + s)), m the largest count of any rank."""
    index = bucket.index()
    p = state.compensate(index, _contribution(bucket))
    indices, values = compress_threshold(p, state.tau, state.quantize)
    state.update(index, p, _scatter(indices, values, p.size, p.dtype))
    return _sparse_sum(indices, values, bucket)


def topk_hook(state: TopKState, bucket) -> np.ndarray:
    """Fewer values: the k entries of largest magnitude of ``c + residual``,
    as (index, value) pairs, with error feedback.

    bytes: (N - 1) (8 + k (4 + s))."""
    index = bucket.index()
    p = state.compensate(index, _contribution(bucket))
    indices, values = compress_topk(p, state.k(p.size))
    state.update(index, p, _scatter(indices, values, p.size, p.dtype))
    return _sparse_sum(indices, values, bucket)


def randomk_hook(state: RandomKState, bucket) -> np.ndarray:
    """Fewer values: k entries of ``c + residual`` at random (each rank its
    own), as (index, value) pairs, with error feedback.

    bytes: (N - 1) (8 + k (4 + s))."""
    index = bucket.index()
    p = state.compensate(index, _contribution(bucket))
    indices, values = compress_randomk(p, state.k(p.size), state.rng(bucket.rank))
    state.update(index, p, _scatter(indices, values, p.size, p.dtype))
    return _sparse_sum(indices, values, bucket)
