"""im2col and col2im: convolution as one matrix product.

A 2-D convolution slides a ``(C, KH, KW)`` kernel over the image and takes a
dot product at every output position. Copy, for every output position, the
``C*KH*KW`` input values under the kernel into one column, and the whole
convolution becomes a single GEMM, the operation BLAS does fastest:

    out (OC, N*OH*OW) = weight (OC, C*KH*KW) @ columns (C*KH*KW, N*OH*OW)

Layout of the columns, and why. Rows are ordered ``(c, i, j)``, matching
``weight.reshape(OC, C*KH*KW)``; columns are ordered ``(n, oh, ow)``. The
columns are built with one strided copy per kernel offset ``(i, j)``: the
shifted, subsampled image ``x_padded[:, :, i::stride, j::stride]`` of *all*
channels and samples is the block ``columns[(c, i, j), :]``, copied whole.
That is KH*KW vectorised copies (9 for a 3x3 kernel), each writing a
contiguous block, and it is the same as copying
``sliding_window_view(x_padded, (KH, KW))`` transposed to
``(C, KH, KW, N, OH, OW)``. Each block is a plain slice of the
channel-major view ``x.transpose(1, 0, 2, 3)``, with zeros written where the
kernel offset would read padding (the padding is never copied). (That one
copy of the 6-D ``sliding_window_view``, done by ``numpy.copyto``, is slower
than the KH*KW block copies: NumPy walks it with the same OW-long inner loop
and more bookkeeping.)

The forward product is best done as N GEMMs, one per image, each
``weight @ columns[:, n-th block of OH*OW]``: BLAS reads the block in place
(its rows are OH*OW contiguous floats, N*OH*OW apart), and the results land
directly in ``(N, OC, OH, OW)`` order, with no transposing copy. The
weight gradient is the same per image, ``columns_n @ g_n^T`` in one batched
matmul summed over the images, which reads the output gradient g in its own
(N, OC, OH, OW) layout, where OpenBLAS runs its unpacked small-matrix kernel;
on its packed kernels it is one GEMM whose sum runs over the whole batch
(:mod:`minidist.nn.conv_gemm_sizing`). A bias rides in both GEMMs: a row of ones under the
columns and the bias as one more weight column (``ones_row``), so neither
the bias add nor the bias gradient costs a pass of its own.

The transposed layout ``(N*OH*OW, C*KH*KW)`` is the same GEMM with its
operands swapped; it makes both the copy into the columns and the copy of
the result back to ``(N, OC, OH, OW)`` slower, because its blocks are
scattered by the row length C*KH*KW.

col2im is the adjoint: every column entry is added back to the input pixel it
was copied from, again one strided *add* per kernel offset, never a
scatter-add per element (``numpy.add.at`` is an unbuffered per-element loop,
tens of times slower). Overlapping windows (stride < kernel) simply add
several times into the same pixel, which is the chain rule for a value used
several times.

Cost for N images of C x H x W, OC output channels, a KH x KW kernel and an
OH x OW output: the columns take C*KH*KW * N*OH*OW floats (KH*KW times the
input for stride 1) and as many copied values; the GEMM takes
2 * OC * C*KH*KW * N*OH*OW flops. Backward costs two GEMMs of the same size
(weight gradient ``grad_out @ columns^T`` and column gradient
``weight^T @ grad_out``) plus the strided adds of col2im. The column
gradient is consumed by col2im as it is made (:func:`col2im_product`), so
it never occupies memory as a whole: for stride 1, a cache-sized chunk of
images at a time, on rows as wide as the padded image so that a kernel
offset is a shift of the flattened image, one GEMM summing each kernel
row's KW offsets and one long add per row (KH adds, not KH*KW OW-long
ones); for other strides, one kernel offset at a time.
"""

from __future__ import annotations

from minidist import backend
from minidist.nn import conv_gemm_sizing


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Positions a window of ``kernel`` fits along an axis of ``size`` padded
    by ``padding`` on both sides, moving by ``stride``: floor((size + 2p - k) / s) + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def window(padded, i: int, j: int, out_h: int, out_w: int, stride_h: int, stride_w: int):
    """The view of the last two axes of ``padded`` that kernel offset ``(i, j)``
    sees at every output position: rows i, i+s, ..., i+s*(out_h-1)."""
    return padded[..., i : i + stride_h * (out_h - 1) + 1 : stride_h, j : j + stride_w * (out_w - 1) + 1 : stride_w]


def inside(size: int, kernel_offset: int, stride: int, padding: int, out_size: int) -> tuple[int, int]:
    """The output positions ``[first, last)`` along one axis at which kernel
    offset ``kernel_offset`` reads a pixel of the image, not of the padding:
    input index ``o * stride + kernel_offset - padding`` in ``[0, size)``."""
    first = max(0, -((kernel_offset - padding) // stride))
    last = min(out_size, (size - 1 - kernel_offset + padding) // stride + 1)
    return first, max(first, last)


def im2col(x, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, padding_h: int, padding_w: int, ones_row: bool = False):
    """Columns ``(C*KH*KW, N*OH*OW)`` of ``x`` (N, C, H, W), rows ordered
    (c, i, j) and columns (n, oh, ow). KH*KW strided block copies.

    Padding is never materialised: each kernel offset's block gets the part
    of the image it sees, copied from the channel-major view of ``x``, and
    zeros in the border rows and columns where it would see padding (at most
    four thin strips per block). That is faster than padding the input into
    a zeroed (C, N, H+2p, W+2p) copy first and copying whole blocks out of
    it: the padded copy is one more pass over the input.

    ``ones_row=True`` appends a row of ones, ``(C*KH*KW + 1, N*OH*OW)``: with
    the bias appended to the weight as one more column, the GEMM then adds
    the bias, and the weight-gradient GEMM sums the output gradient into the
    bias gradient, instead of a separate pass over the output for each."""
    n, c, h, w = x.shape
    out_h = output_size(h, kernel_h, stride_h, padding_h)
    out_w = output_size(w, kernel_w, stride_w, padding_w)
    channels_first = x.transpose(1, 0, 2, 3)  # (C, N, H, W), a view
    xp = backend.of(x)
    rows, positions = c * kernel_h * kernel_w, n * out_h * out_w
    total_rows = rows + 1 if ones_row else rows
    storage = xp.empty(total_rows * positions, dtype=x.dtype)
    columns = storage[: rows * positions].reshape(c, kernel_h, kernel_w, n, out_h, out_w)
    for i in range(kernel_h):
        top, bottom = inside(h, i, stride_h, padding_h, out_h)
        for j in range(kernel_w):
            left, right = inside(w, j, stride_w, padding_w, out_w)
            block = columns[:, i, j]  # (C, N, OH, OW)
            if top == bottom or left == right:  # sees only padding
                block[...] = 0
                continue
            block[:, :, top:bottom, left:right] = channels_first[
                :, :,
                top * stride_h + i - padding_h : (bottom - 1) * stride_h + i - padding_h + 1 : stride_h,
                left * stride_w + j - padding_w : (right - 1) * stride_w + j - padding_w + 1 : stride_w,
            ]
            if top > 0:
                block[:, :, :top] = 0
            if bottom < out_h:
                block[:, :, bottom:] = 0
            if left > 0:
                block[:, :, top:bottom, :left] = 0
            if right < out_w:
                block[:, :, top:bottom, right:] = 0
    if ones_row:
        storage[rows * positions :] = 1
    return storage.reshape(total_rows, positions)


def col2im(columns, x_shape, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, padding_h: int, padding_w: int):
    """The adjoint of :func:`im2col`: add every entry of ``columns``
    ``(C*KH*KW, N*OH*OW)`` back to the pixel of an ``x_shape`` (N, C, H, W)
    image it came from. KH*KW strided block adds, then one copy back to
    (N, C, H, W) that drops the padding."""
    n, c, h, w = x_shape
    out_h = output_size(h, kernel_h, stride_h, padding_h)
    out_w = output_size(w, kernel_w, stride_w, padding_w)
    xp = backend.of(columns)
    blocks = columns.reshape(c, kernel_h, kernel_w, n, out_h, out_w)
    padded = xp.zeros((c, n, h + 2 * padding_h, w + 2 * padding_w), dtype=columns.dtype)
    for i in range(kernel_h):
        for j in range(kernel_w):
            target = window(padded, i, j, out_h, out_w, stride_h, stride_w)
            target += blocks[:, i, j]
    inner = padded[:, :, padding_h : padding_h + h, padding_w : padding_w + w]
    return xp.ascontiguousarray(inner.transpose(1, 0, 2, 3))


def col2im_product(weight, grad_out, x_shape, kernel_h: int, kernel_w: int, stride_h: int, stride_w: int, padding_h: int, padding_w: int, groups: int = 1):
    """``col2im(weight.reshape(OC, -1).T @ grad_out, ...)``, the input
    gradient of a convolution, computed one kernel offset at a time.

    Stride 1 (the common case) takes a faster path that sums a whole kernel
    row per GEMM, in cache-sized chunks of images:
    :func:`_col2im_product_stride_one`. What follows is the general one.

    The rows of W^T @ g that belong to offset (i, j) are
    ``weight[:, :, i, j].T @ g``: the gradient of the input image shifted by
    (i, j). Each is one GEMM (C, OC) @ (OC, N*OH*OW) into the same reused
    buffer, added at its shift. Same flops as one big GEMM, but the
    (C*KH*KW, N*OH*OW) product, KH*KW times the input, is never held in
    memory, so a training step pages in far less fresh memory.

    ``weight`` (OC, C, KH, KW), ``grad_out`` (OC, N*OH*OW) or any array or
    view of shape (OC, N, OH, OW) (such as ``g.transpose(1, 0, 2, 3)``, read
    in place by the stride-1 path); returns the gradient of the (N, C, H, W)
    input.

    Grouped convolution (``groups`` = G > 1, ``weight`` (OC, C/G, KH, KW)):
    output channel block g sees only input channel block g, so per offset
    the product is G independent ones, (G, C/G, OC/G) @ (G, OC/G, N*OH*OW),
    one batched matmul into the same (C, N*OH*OW) buffer.
    """
    if stride_h == 1 and stride_w == 1:
        return _col2im_product_stride_one(weight, grad_out, x_shape, kernel_h, kernel_w, padding_h, padding_w, groups)
    n, c, h, w = x_shape
    out_h = output_size(h, kernel_h, stride_h, padding_h)
    out_w = output_size(w, kernel_w, stride_w, padding_w)
    xp = backend.of(grad_out)
    dtype = xp.result_type(weight.dtype, grad_out.dtype)
    out_channels, group_channels = weight.shape[0], weight.shape[1]
    if groups == 1:
        per_offset = xp.ascontiguousarray(weight.transpose(2, 3, 1, 0), dtype=dtype)  # (KH, KW, C, OC)
        grad_blocks = grad_out.reshape(out_channels, n * out_h * out_w)
        block = xp.empty((c, n * out_h * out_w), dtype=dtype)
    else:
        group_out = out_channels // groups
        # (KH, KW, G, C/G, OC/G): the transposed weights of each group, per offset.
        per_offset = xp.ascontiguousarray(
            weight.reshape(groups, group_out, group_channels, kernel_h, kernel_w).transpose(3, 4, 0, 2, 1),
            dtype=dtype,
        )
        grad_blocks = grad_out.reshape(groups, group_out, n * out_h * out_w)
        block = xp.empty((groups, group_channels, n * out_h * out_w), dtype=dtype)
    shaped_block = block.reshape(c, n, out_h, out_w)
    padded = xp.zeros((c, n, h + 2 * padding_h, w + 2 * padding_w), dtype=dtype)
    for i in range(kernel_h):
        for j in range(kernel_w):
            xp.matmul(per_offset[i, j], grad_blocks, out=block)
            target = window(padded, i, j, out_h, out_w, stride_h, stride_w)
            target += shaped_block
    inner = padded[:, :, padding_h : padding_h + h, padding_w : padding_w + w]
    return xp.ascontiguousarray(inner.transpose(1, 0, 2, 3))


#: Bytes of the buffers :func:`_col2im_product_stride_one` fills per chunk of
#: images: small enough to stay in a core's L2 cache (1-2 MiB on current x86
#: server cores) between the GEMM that writes them and the adds that read
#: them, and reused rather than freshly paged in every step. (1 MiB was the
#: best of 256 KiB to 8 MiB on the benchmark CNN of bench_training_step.py.)
CHUNK_BYTES = 1 << 20


def _col2im_product_stride_one(weight, grad_out, x_shape, kernel_h: int, kernel_w: int, padding_h: int, padding_w: int, groups: int = 1):
    """:func:`col2im_product` for stride 1, in image chunks that stay in cache.

    With stride 1, output pixel (oh, ow) under kernel offset (i, j) reads
    padded pixel (oh + i, ow + j). Lay the output gradient g out on rows as
    wide as the *padded* image, Wp = W + 2 pw (the KW - 1 extra columns are
    zeros), and flatten each image: output position q = oh*Wp + ow then
    reads padded position q + i*Wp + j. A kernel offset is a plain shift of
    the flattened image, so its contribution is added with one slice per
    (channel, image) row of about OH*Wp contiguous floats, not one OW-long
    row at a time.

    The KW column shifts go into the GEMM: stack KW copies of g, copy j
    shifted right by j, and one GEMM per kernel row i,
    ``W_i (C, KW*OC) @ shifted (KW*OC, m*(OH*Wp + KW - 1))``, sums the KW
    offsets of that row; it is added at shift i*Wp. That is KH adds instead
    of KH*KW (and KW copies of g, which is smaller than the C*KH*KW-row
    column gradient), fewer passes over the accumulator than the KH*KW-add
    form.

    Per chunk of images (sized by :data:`CHUNK_BYTES`, and on OpenBLAS's
    SkylakeX kernels small enough for each GEMM to stay within its
    small-matrix kernel: :func:`minidist.nn.conv_gemm_sizing.cap_chunk_images`): the copies into
    reused buffers, KH GEMMs (a batched matmul over the groups when
    ``groups`` > 1), KH shifted adds into a reused (C, m, Hp*Wp)
    accumulator, and one copy of its interior into the (N, C, H, W) result.
    Cost: 2 * OC/G * C*KH*KW * N*(OH*Wp + KW - 1) flops, about (KW-1)/OW
    more than the plain product (the zero columns: 15 % for 3x3 on 14x14); the
    (C*KH*KW, N*OH*OW) column gradient is never held.
    """
    n, c, h, w = x_shape
    padded_h, padded_w = h + 2 * padding_h, w + 2 * padding_w
    out_h, out_w = padded_h - kernel_h + 1, padded_w - kernel_w + 1
    row = out_h * padded_w  # one image's output positions on padded-width rows
    shifted_row = row + kernel_w - 1  # room for the KW shifts
    xp = backend.of(grad_out)
    dtype = xp.result_type(weight.dtype, grad_out.dtype)
    out_channels, group_channels = weight.shape[0], weight.shape[1]
    group_out = out_channels // groups
    # (KH, G, C/G, KW*OC/G): for kernel row i and group g, weight[o, c, i, j]
    # at [i, g, c, (j, o)], matching the (j, o) rows of the shifted copies.
    per_row = xp.ascontiguousarray(
        weight.reshape(groups, group_out, group_channels, kernel_h, kernel_w)
        .transpose(3, 0, 2, 4, 1)
        .reshape(kernel_h, groups, group_channels, kernel_w * group_out),
        dtype=dtype,
    )
    grad = grad_out.reshape(out_channels, n, out_h, out_w)
    per_image = (kernel_w * out_channels + c) * shifted_row * xp.dtype(dtype).itemsize
    # As many images as fit the cache, and as keep each GEMM (one group's)
    # within the BLAS kernel's small-matrix size where it has one.
    images = conv_gemm_sizing.cap_chunk_images(
        xp, max(1, min(n, CHUNK_BYTES // per_image)),
        group_channels * kernel_w * group_out * shifted_row)
    # Zeroed once: what no chunk writes (columns past out_w, the ends of the
    # shifted rows) stays zero.
    grad_rows = xp.zeros((out_channels, images, out_h, padded_w), dtype=dtype)
    shifted = xp.zeros((groups, kernel_w, group_out, images, shifted_row), dtype=dtype)
    products = xp.empty((groups, group_channels, images * shifted_row), dtype=dtype)
    accumulator = xp.empty((c, images, padded_h * padded_w + kernel_w - 1), dtype=dtype)
    result = xp.empty((n, c, h, w), dtype=dtype)
    for start in range(0, n, images):
        m = min(images, n - start)
        grad_rows[:, :m, :, :out_w] = grad[:, start : start + m]
        flat = grad_rows[:, :m].reshape(groups, group_out, m, row)
        for j in range(kernel_w):
            shifted[:, j, :, :m, j : j + row] = flat
        operand = shifted[:, :, :, :m].reshape(groups, kernel_w * group_out, m * shifted_row)
        product = products[:, :, : m * shifted_row]
        target = accumulator[:, :m]
        target[...] = 0
        for i in range(kernel_h):
            xp.matmul(per_row[i], operand, out=product)
            shift = i * padded_w
            target[:, :, shift : shift + shifted_row] += product.reshape(c, m, shifted_row)
        image = target[:, :, : padded_h * padded_w].reshape(c, m, padded_h, padded_w)
        result[start : start + m] = image[:, :, padding_h : padding_h + h, padding_w : padding_w + w].transpose(1, 0, 2, 3)
    return result
