"""PowerSGD: each gradient matrix sent as a low-rank product, P Q^T.

Read after :mod:`.compression`, whose hooks send fewer bits or fewer values
of every gradient. PowerSGD (Vogels, Karimireddy and Jaggi, 2019) sends a
few *directions* instead: a parameter's gradient, seen as an n x m matrix M,
is approximated by ``P Q^T`` with P of n x r and Q of m x r, found by one
step of power iteration that needs only two all-reduces of small matrices,
and the sum over the ranks of ``M_r Q`` is the ``(sum M_r) Q`` the method
wants, so the ranks add while they pass the ring (no all-gather). What the
approximation missed stays on the rank as its error feedback residual
(:class:`~minidist.parallel.data.compression.ErrorFeedbackState`), and
starting each step's iteration from the last step's Q tracks the top-r
subspace over time.

Cost, per bucket and step, N ranks, s bytes a value: two ring all-reduces,
``2 (N - 1) / N s`` times the sum of ``r (n + m)`` over the compressed
matrices plus the values of the tensors too small to compress, against
``n m`` values each for the plain all-reduce; the compute, ``4 n m r``
multiply-adds and one QR of n x r per matrix.
"""

from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist.distributed.device_mesh import as_group
from minidist.parallel.data.compression import ErrorFeedbackState, _contribution, allreduce_hook


class PowerSGDState(ErrorFeedbackState):
    """PowerSGD (Vogels, Karimireddy and Jaggi, 2019), torch's names, order and defaults:
    ``PowerSGDState(process_group, matrix_approximation_rank=1,
    start_powerSGD_iter=1_000, min_compression_rate=2, use_error_feedback=True,
    warm_start=True, random_seed=0)``.

    * ``process_group``: the group the hook all-reduces over; None: DDP's own
      (torch: the world). It must have DDP's ranks, whose examples the
      average divides by;
    * ``matrix_approximation_rank``: r, the rank of each gradient matrix's
      approximation ``P Q^T`` (a parameter of shape (n, ...) is an n x m
      matrix, m the product of the other sizes);
    * ``start_powerSGD_iter``: plain all-reduce for this many steps first
      (the paper's warm-up; torch's default 1,000, so pass a smaller one to
      see compression in a short run; 0 compresses from the first step);
    * ``min_compression_rate``: compress a matrix only when its n m values
      are at least this many times the (n + m) r of P and Q; the others
      (biases, small layers) are all-reduced whole;
    * ``use_error_feedback``: keep ``M_r - P Q^T / N`` (what the
      approximation missed of this rank's share) for the next step;
    * ``warm_start``: start each step's power iteration from the last
      step's Q (one iteration a step then tracks the top-r subspace over
      time); without it Q is drawn afresh every step;
    * ``random_seed``: the seed of Q's draws, the same on every rank (P and
      Q must be the same matrices everywhere).

    As torch, it refuses ``start_powerSGD_iter <= 1`` with error feedback or
    warm start: torch's DDP rebuilds its buckets after the first step, and
    the kept residuals and Qs would no longer fit them. minidist's buckets
    are fixed when DDP is built, so the rule is torch's reason, not ours; it
    is kept so that a script means the same under both. (Compressing from
    step 0 is allowed with both off.)

    The residuals and the Qs are kept per bucket, by bucket index.
    """

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 random_seed: int = 0):
        process_group = as_group(process_group, "PowerSGDState")
        if process_group is not None and not hasattr(process_group, "ranks"):
            raise TypeError(
                f"PowerSGDState: process_group must be a process group or None, got "
                f"{type(process_group).__name__} {process_group!r}; as in torch it is the "
                "first argument: PowerSGDState(None, matrix_approximation_rank=2)")
        super().__init__(use_error_feedback)
        self.process_group = process_group
        if int(matrix_approximation_rank) != matrix_approximation_rank \
                or matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be a positive "
                             f"integer, got {matrix_approximation_rank!r}")
        if start_powerSGD_iter < 0:
            raise ValueError(f"PowerSGDState: start_powerSGD_iter must be >= 0, "
                             f"got {start_powerSGD_iter!r}")
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError(
                f"PowerSGDState: start_powerSGD_iter={start_powerSGD_iter} with "
                "use_error_feedback or warm_start: expect start_powerSGD_iter > 1, as torch "
                "does (PowerSGD can only be applied after the first two iterations in DDP). "
                "Pass 2 or more, or turn both off to compress from the first step.")
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.warm_start = bool(warm_start)
        self.min_compression_rate = float(min_compression_rate)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.random_seed = int(random_seed)
        self.iter = 0                       # steps seen (counted on the last bucket)
        self.qs: dict[int, list[np.ndarray]] = {}
        self._rng = np.random.default_rng(self.random_seed)   # shared: no rank in the seed

    def layout(self, shapes) -> list[tuple[int, int, int, int, int]]:
        """For the parameters' shapes, in bucket order: (offset, size, n, m,
        r) with r = 0 for a tensor sent whole."""
        out, offset = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            n = int(shape[0]) if len(shape) >= 2 else size
            m = size // n if len(shape) >= 2 else 1
            r = min(n, m, self.matrix_approximation_rank) if len(shape) >= 2 else 0
            if r and n * m < self.min_compression_rate * (n + m) * r:
                r = 0
            out.append((offset, size, n, m, r))
            offset += size
        return out

    def fresh_q(self, m: int, r: int, dtype) -> np.ndarray:
        """A new m x r starting matrix, standard normal, from the shared generator."""
        return self._rng.standard_normal((m, r)).astype(dtype)


def orthogonalize(p: np.ndarray) -> np.ndarray:
    """An orthonormal basis of P's columns (reduced QR). Every rank holds the
    same all-reduced P, so every rank computes the same bits."""
    return np.linalg.qr(p)[0]


def _group_of(state: PowerSGDState, bucket):
    """The group PowerSGD all-reduces over: the state's, if it has DDP's ranks."""
    if state.process_group is None:
        return bucket.group
    mine = dist.get_process_group_ranks(state.process_group)
    ddp = dist.get_process_group_ranks(bucket.group)
    if mine != ddp:
        raise ValueError(f"rank {bucket.rank}: PowerSGDState's process_group has ranks {mine}, "
                         f"but DistributedDataParallel averages over ranks {ddp}; give the "
                         "state DDP's process_group (or None for DDP's own)")
    return state.process_group


def powersgd_hook(state: PowerSGDState, bucket) -> np.ndarray:
    """Low rank: PowerSGD (Vogels et al. 2019). Each parameter's gradient,
    seen as an n x m matrix M (this rank's share plus its residual), is
    approximated by P Q^T of rank r with one step of power iteration:

    1. ``P_r = M_r Q`` on every rank, all-reduce the Ps (their sum is M Q,
       M the sum of the ranks' shares); the tensors too small to compress
       ride in the same all-reduce, whole;
    2. orthogonalize each P (the same bits on every rank);
    3. ``Q_r = M_r^T P``, all-reduce the Qs (``M^T P``);
    4. the averaged gradient is ``P Q^T``; the residual keeps ``M_r - P Q^T
       / N``; with ``warm_start`` the next step starts from this Q.

    Two all-reduces per bucket, of small matrices.

    bytes: 2 (N - 1) / N s (sum of r (n + m) over the compressed matrices +
    the values of the others) (ring)."""
    index = bucket.index()
    group = _group_of(state, bucket)
    warming_up = state.iter < state.start_powerSGD_iter
    if bucket.is_last():
        state.iter += 1
    if warming_up:
        return allreduce_hook(None, bucket)
    p = state.compensate(index, _contribution(bucket))
    dtype = p.dtype
    layout = state.layout([param.data.shape for param in bucket.parameters()])
    if index not in state.qs or not state.warm_start:
        state.qs[index] = [state.fresh_q(m, r, dtype) if r else None
                           for (_, _, n, m, r) in layout]
    qs = state.qs[index]
    matrices = [p[o:o + size].reshape(n, m) for (o, size, n, m, r) in layout]

    # 1. P = M Q, summed over the ranks (with the uncompressed tensors).
    first = np.concatenate([(mat @ q).reshape(-1) if r else mat.reshape(-1)
                            for mat, q, (_, _, _, _, r) in zip(matrices, qs, layout)])
    dist.all_reduce(first, group=group, algorithm=bucket.algorithm)
    out = np.empty_like(p)
    ps, offset = [], 0
    for (o, size, n, _, r) in layout:
        width = n * r if r else size
        piece = first[offset:offset + width]
        offset += width
        if r:
            ps.append(orthogonalize(piece.reshape(n, r)))        # 2.
        else:
            ps.append(None)
            out[o:o + size] = piece

    # 3. Q = M^T P, summed over the ranks.
    compressed = [i for i, (*_, r) in enumerate(layout) if r]
    if compressed:
        second = np.concatenate([(matrices[i].T @ ps[i]).reshape(-1) for i in compressed])
        dist.all_reduce(second, group=group, algorithm=bucket.algorithm)
        offset = 0
        for i in compressed:
            o, size, n, m, r = layout[i]
            q = second[offset:offset + m * r].reshape(m, r)
            offset += m * r
            out[o:o + size] = (ps[i] @ q.T).reshape(-1)        # 4.
            qs[i] = q.copy()

    # The residual: this rank's share of what P Q^T missed (nothing on the
    # tensors sent whole, they arrived exactly).
    sent = np.array(p)
    for i in compressed:
        o, size = layout[i][:2]
        sent[o:o + size] = out[o:o + size] / dtype.type(bucket.world_size)
    state.update(index, p, sent)
    return out
