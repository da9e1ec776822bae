"""What a training step costs in floating-point operations, what the machine
can do at most, and the share of that a step reaches (MFU).

**Counting a GPT's step.** Nearly all of a transformer's arithmetic is in
matrix products, and those are what is counted (as PaLM's appendix B, the
Ultra-Scale Playbook and picotron count): a product of (M, K) by (K, N) is
M*K*N multiply-adds, 2*M*K*N flops. Per token, one forward pass of a GPT of
``n_layer`` blocks of width ``d`` (``n_embd``), vocabulary ``V`` and
sequence length ``T`` multiplies every matrix weight once:

* per block: ``c_attn`` d x 3d, ``c_proj`` d x d, the MLP d x 4d and
  4d x d, 12 d^2 weights, 24 d^2 flops;
* the logits, the (tied) token embedding d x V: 2 d V flops;
* attention per block: the scores Q K^T (2 T d: every head's D = d / H
  features against T keys) and the weighted sum P V (2 T d): 4 T d flops.
  A causal mask hides half the scores, but they are computed (minidist's
  attention and PyTorch's math path do), and PaLM counts them all.

Backward does each product twice (the gradient of the input and of the
weight: dX = dY W^T, dW = X^T dY; for attention dQ, dK, dV and dP), so
forward + backward is 3 x forward. With N = 12 n_layer d^2 + d V the weights
that enter a product, a step over B sequences of T tokens costs exactly::

    6 N B T  +  12 n_layer d T * B T

the "6 x parameters x tokens" rule plus attention's 12 n_layer d T per
token. N leaves out the position embedding (an addition, not a product),
the biases and the LayerNorms' weights; the count leaves out all
elementwise work: LayerNorm, softmax, GELU, the residual additions, the
bias additions, the embedding lookups, the loss and the optimizer's update,
all O(B T d) or O(parameters), against O(B T d^2) for the products.
tests/core/test_flops.py checks the count against the products the autograd
actually runs in a step (each ``@`` counted as it happens).

**Peak and MFU.** :func:`measure_gemm_peak` times a large square float32
product with NumPy's BLAS (best of a few) on a given number of threads: the
most this machine does per second with the library minidist uses, measured
here rather than read from a datasheet. The model FLOPs utilisation of a
step is then ``step flops / step seconds / peak``. MFU counts the model's
flops, not those a run does on top (recomputation's second forward is not
in it), so that it compares runs that do the same work in different ways.

Cost: the counts are a few multiplications; :func:`measure_gemm_peak` runs
``repeats`` products of ``2 size^3`` flops each (a fraction of a second at
the default size).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy

from minidist.runtime import blas_threads


def matmul_flops(a_shape, b_shape) -> int:
    """Flops of ``a @ b`` as NumPy broadcasts it: 2 M K N per product, times
    the number of products the leading axes make. A vector operand (one axis)
    counts as a matrix of one row (``a``) or one column (``b``)."""
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if not a_shape or not b_shape:
        raise ValueError(f"matmul_flops: matmul needs operands with at least one axis, "
                         f"got shapes {a_shape} and {b_shape}")
    if len(a_shape) == 1:
        a_shape = (1,) + a_shape
    if len(b_shape) == 1:
        b_shape = b_shape + (1,)
    (rows, inner), (inner_b, columns) = a_shape[-2:], b_shape[-2:]
    if inner != inner_b:
        raise ValueError(f"matmul_flops: inner axes disagree: {a_shape} @ {b_shape}")
    products = int(numpy.prod(numpy.broadcast_shapes(a_shape[:-2], b_shape[:-2]), dtype=numpy.int64))
    return 2 * products * rows * inner * columns


@dataclass(frozen=True)
class StepFlops:
    """The flops of one training step (forward + backward) of a GPT, split
    into the weights' products (``dense``, 6 N tokens) and attention's
    (``attention``, 12 n_layer d T tokens)."""

    matmul_parameters: int   # N: the weights that enter a product
    tokens: int              # B * T
    dense: int
    attention: int

    @property
    def total(self) -> int:
        return self.dense + self.attention

    @property
    def forward(self) -> int:
        """The forward pass alone: a third of the step."""
        return self.total // 3


def gpt_matmul_parameters(config) -> int:
    """N = 12 n_layer d^2 + d V: the weights of a GPT that enter a product
    (the tied token embedding once, as the output layer). ``config`` has
    ``n_layer``, ``n_embd`` and ``vocab_size`` (a GPTConfig)."""
    d = config.n_embd
    return 12 * config.n_layer * d * d + d * config.vocab_size


def gpt_step_flops(config, batch: int, seq_len: int | None = None) -> StepFlops:
    """The flops of one training step (forward and backward; the optimizer's
    elementwise update not counted) of a GPT on ``batch`` sequences of
    ``seq_len`` tokens (default ``config.block_size``): 6 N B T + 12 n_layer d
    T B T (module docstring)."""
    steps = config.block_size if seq_len is None else seq_len
    if batch < 1 or steps < 1:
        raise ValueError(f"gpt_step_flops: batch and seq_len must be at least 1, got {batch} and {steps}")
    tokens = batch * steps
    n = gpt_matmul_parameters(config)
    return StepFlops(matmul_parameters=n, tokens=tokens, dense=6 * n * tokens,
                     attention=12 * config.n_layer * config.n_embd * steps * tokens)


def measure_gemm_peak(threads: int = 1, size: int = 2048, repeats: int = 5,
                      dtype=numpy.float32, clock=time.perf_counter) -> float:
    """Flop/s of the best of ``repeats`` ``(size, size) @ (size, size)``
    products of ``dtype`` with NumPy's BLAS running ``threads`` threads (put
    back afterwards): the machine's own GEMM peak, the denominator of MFU.
    Large and square, so the BLAS kernel runs at its best; the best of a few,
    so a moment of other load on the machine does not lower it. OpenBLAS
    runs at most the threads it started with (``OPENBLAS_NUM_THREADS`` when
    set at start, else one per core), whatever ``threads`` asks. ``clock``:
    wall time, or ``time.process_time`` on a shared machine (one thread)."""
    if threads < 1 or size < 1 or repeats < 1:
        raise ValueError(f"measure_gemm_peak: threads, size and repeats must be at least 1, "
                         f"got {threads}, {size}, {repeats}")
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(dtype)
    b = rng.standard_normal((size, size)).astype(dtype)
    out = numpy.empty((size, size), dtype=dtype)
    best = float("inf")
    with blas_threads.limit(threads):
        numpy.matmul(a, b, out=out)  # warm: the thread pool started, pages touched
        for _ in range(repeats):
            start = clock()
            numpy.matmul(a, b, out=out)
            best = min(best, clock() - start)
    return matmul_flops(a.shape, b.shape) / best


def achieved(flops: int, seconds: float) -> float:
    """Flop/s of a step of ``flops`` that took ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"achieved: seconds must be positive, got {seconds}")
    return flops / seconds


def mfu(flops: int, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: the step's achieved flop/s over ``peak``
    (from :func:`measure_gemm_peak` with the step's thread count)."""
    if peak <= 0:
        raise ValueError(f"mfu: peak must be positive flop/s, got {peak}")
    return achieved(flops, seconds) / peak
