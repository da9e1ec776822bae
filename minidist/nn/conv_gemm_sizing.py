"""How the convolution sizes its matrix products for OpenBLAS's kernels.

The convolution (:func:`minidist.nn.functional.conv2d`) is im2col, a GEMM and
col2im, and computes the same on every BLAS. This module holds the one thing
that depends on which BLAS kernel runs: OpenBLAS's SkylakeX family of kernels
(what NumPy's wheels pick on AVX-512 Xeons) multiplies small matrices with an
unpacked kernel that reads its operands in place; above a size, and on the
other kernel sets (Haswell, Zen, ...), OpenBLAS first copies the operands
into packed panels, which for the thin products of a small convolution costs
as much as the arithmetic. Where that kernel exists, the convolution keeps its
GEMMs under it:

* the weight gradient's per-image GEMM reads the output gradient transposed;
  the unpacked kernel takes a transposed operand only for small products, so
  past :data:`SMALL_GEMM_TRANSPOSED_OUTPUT` the operand is first copied
  contiguous (:func:`weight_gradient_operand`);
* the input gradient (col2im) works in chunks of images; each chunk's GEMM is
  kept within :data:`SMALL_GEMM` multiply-adds (:func:`cap_chunk_images`).

Elsewhere (CuPy) both return their input unchanged: the copy only costs
there. On OpenBLAS's packed kernels the weight gradient is instead one GEMM
over the whole batch (:func:`weight_gradient_in_one_gemm`): per-image
products would each pack their operands again. The forward stays one GEMM
per image on every kernel: on the packed kernels an image's output computed
inside one batch-wide GEMM differs in its last bits with the images around
it, and a prediction must not depend on its batch-mates.

Results are the same either way up to float rounding of the GEMM's blocking;
on one machine and kernel they are the same bits run to run. (OpenBLAS:
kernel/x86_64/sgemm_small_kernel_permit_skylakex.c.)
"""

from __future__ import annotations

import functools

import numpy

from minidist.runtime.blas_threads import openblas_cores

#: The unpacked small-matrix kernel takes products of at most this many
#: multiply-adds (M*N*K).
SMALL_GEMM = 100 * 100 * 100

#: ... but with the right-hand operand transposed (a NumPy ``.T`` view), only
#: when the product has at most this many entries.
SMALL_GEMM_TRANSPOSED_OUTPUT = 1200

#: The OpenBLAS kernel sets that have the unpacked small-matrix kernel.
SMALL_GEMM_CORES = ("skylakex", "cooperlake", "sapphirerapids")


@functools.cache
def unpacked_small_gemm() -> bool:
    """Whether NumPy's BLAS is an OpenBLAS running a kernel set with the
    unpacked small-matrix GEMM (:data:`SMALL_GEMM_CORES`). Asked once."""
    return any(core.lower() in SMALL_GEMM_CORES for core in openblas_cores())


def copy_before_transposed_gemm(xp, outputs: int) -> bool:
    """Whether a per-image GEMM whose right operand is a transposed view and
    whose product has ``outputs`` entries runs faster after copying that
    operand contiguous: on NumPy over OpenBLAS's small-matrix kernel, when
    the product is past :data:`SMALL_GEMM_TRANSPOSED_OUTPUT` (so the copy
    lets it stay unpacked). Elsewhere the copy only costs."""
    return xp is numpy and outputs > SMALL_GEMM_TRANSPOSED_OUTPUT and unpacked_small_gemm()


def weight_gradient_operand(xp, per_pixel, outputs: int):
    """The output gradient ``per_pixel`` (N, OH*OW, OC), a transposed view,
    as the weight gradient's GEMM should read it: copied contiguous where
    :func:`copy_before_transposed_gemm` says so (a copy of g, against the
    packing of every per-image product), else the view itself. ``outputs``:
    the entries of one image's product, OC * (C*KH*KW [+ 1])."""
    if copy_before_transposed_gemm(xp, outputs):
        return xp.ascontiguousarray(per_pixel)
    return per_pixel


def weight_gradient_in_one_gemm(xp) -> bool:
    """Whether the weight gradient is one GEMM over the whole batch,
    ``columns (C*KH*KW [+1], N*OH*OW) @ g (N*OH*OW, OC)`` with the output
    gradient first copied channel-major, rather than one product per image
    summed over the images. On NumPy's BLAS wherever it lacks the unpacked
    small-matrix GEMM (OpenBLAS's packed kernel sets, such as Haswell, or
    another BLAS): the per-image
    products each pack both their operands for an OH*OW-long sum, where the
    one GEMM packs them once, runs a sum as long as the batch's pixels, and
    writes one (C*KH*KW, OC) result instead of N to be summed. Where the
    unpacked kernel runs, the per-image products read their operands in place
    and are the faster. (The weight gradient is a sum over the batch either
    way; only its rounding differs.)"""
    return xp is numpy and not unpacked_small_gemm()


def cap_chunk_images(xp, images: int, multiply_adds: int) -> int:
    """``images`` per col2im chunk (as many as fit the cache), lowered where
    OpenBLAS has its unpacked small-matrix kernel so that each chunk's GEMM,
    ``multiply_adds`` per image, stays within :data:`SMALL_GEMM`."""
    if xp is numpy and unpacked_small_gemm():
        return max(1, min(images, SMALL_GEMM // multiply_adds))
    return images
