"""Test helpers for minidist.nn: naive Python-loop versions of the layers
(written for obviousness, not speed) and a central-difference gradient check.

The naive versions follow the definitions one output element at a time, so
they share no code and no cleverness (im2col, strided views) with the
implementations they check.
"""

import numpy as np

from minidist import Tensor


def conv2d_naive(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """out[n, o, r, c] = b[o] + sum_{ch, i, j} w[o, ch, i, j] * xpad[n, ch, r*sh + i, c*sw + j]."""
    n, channels, h, width = x.shape
    oc, _, kh, kw = w.shape
    sh, sw = stride
    ph, pw = padding
    xpad = np.zeros((n, channels, h + 2 * ph, width + 2 * pw), dtype=x.dtype)
    xpad[:, :, ph : ph + h, pw : pw + width] = x
    out_h = (h + 2 * ph - kh) // sh + 1
    out_w = (width + 2 * pw - kw) // sw + 1
    out = np.zeros((n, oc, out_h, out_w), dtype=x.dtype)
    for s in range(n):
        for o in range(oc):
            for r in range(out_h):
                for c in range(out_w):
                    total = 0.0 if b is None else b[o]
                    for ch in range(channels):
                        for i in range(kh):
                            for j in range(kw):
                                total += w[o, ch, i, j] * xpad[s, ch, r * sh + i, c * sw + j]
                    out[s, o, r, c] = total
    return out


def _pool_naive(x, kernel, stride, padding, fill, reduce):
    n, channels, h, width = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    xpad = np.full((n, channels, h + 2 * ph, width + 2 * pw), fill, dtype=x.dtype)
    xpad[:, :, ph : ph + h, pw : pw + width] = x
    out_h = (h + 2 * ph - kh) // sh + 1
    out_w = (width + 2 * pw - kw) // sw + 1
    out = np.zeros((n, channels, out_h, out_w), dtype=x.dtype)
    for s in range(n):
        for ch in range(channels):
            for r in range(out_h):
                for c in range(out_w):
                    values = [xpad[s, ch, r * sh + i, c * sw + j] for i in range(kh) for j in range(kw)]
                    out[s, ch, r, c] = reduce(values)
    return out


def max_pool2d_naive(x, kernel, stride, padding=(0, 0)):
    return _pool_naive(x, kernel, stride, padding, -np.inf, max)


def avg_pool2d_naive(x, kernel, stride, padding=(0, 0)):
    return _pool_naive(x, kernel, stride, padding, 0.0, lambda v: sum(v) / len(v))


def max_pool2d_grad_naive(x, grad_out, kernel, stride, padding=(0, 0)):
    """Each window's gradient to its first maximum (row-major), as PyTorch."""
    n, channels, h, width = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    xpad = np.full((n, channels, h + 2 * ph, width + 2 * pw), -np.inf, dtype=x.dtype)
    xpad[:, :, ph : ph + h, pw : pw + width] = x
    grad = np.zeros_like(xpad)
    for s in range(n):
        for ch in range(channels):
            for r in range(grad_out.shape[2]):
                for c in range(grad_out.shape[3]):
                    best, where = -np.inf, None
                    for i in range(kh):
                        for j in range(kw):
                            value = xpad[s, ch, r * sh + i, c * sw + j]
                            if where is None or value > best:
                                best, where = value, (r * sh + i, c * sw + j)
                    grad[s, ch, where[0], where[1]] += grad_out[s, ch, r, c]
    return grad[:, :, ph : ph + h, pw : pw + width]


def numeric_grad(function, arrays, eps=1e-6):
    """Central differences of the scalar ``function(*arrays)``, one entry at a time."""
    grads = []
    for array in arrays:
        grad = np.zeros_like(array)
        flat, grad_flat = array.reshape(-1), grad.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + eps
            plus = function(*arrays)
            flat[i] = old - eps
            minus = function(*arrays)
            flat[i] = old
            grad_flat[i] = (plus - minus) / (2 * eps)
        grads.append(grad)
    return grads


def check_grad(op, *arrays, rtol=1e-5, atol=1e-7, seed=0, eps=1e-6):
    """Autograd against central differences (float64) for the scalar
    sum(op(*tensors) * W), W a fixed random array, so that every output
    element carries its own weight. Checks every input's gradient."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    out_shape = op(*[Tensor(a) for a in arrays]).shape
    weights = np.random.default_rng(seed).standard_normal(out_shape)

    def scalar(*values):
        return float((op(*[Tensor(v) for v in values]).data * weights).sum())

    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = op(*tensors)
    out.backward(weights)
    expected = numeric_grad(scalar, [a.copy() for a in arrays], eps=eps)
    for i, (tensor, numeric) in enumerate(zip(tensors, expected)):
        assert tensor.grad is not None, f"input {i} got no gradient"
        assert tensor.grad.shape == arrays[i].shape
        np.testing.assert_allclose(tensor.grad, numeric, rtol=rtol, atol=atol, err_msg=f"input {i}")
