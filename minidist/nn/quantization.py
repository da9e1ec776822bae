"""INT8 post-training quantisation of Linear and Conv2d: smaller weights, integer products.

A trained float32 model is turned into one that stores every Linear and
Conv2d weight as int8 (a quarter of the bytes) and multiplies int8 by int8
with int32 accumulation, the arithmetic of int8 inference hardware. No
retraining: the ranges are measured on a few calibration batches
("post-training"). Three steps, in :func:`quantize`:

1. **Weights, per output channel, symmetric.** For output channel c (a row of
   the Linear weight, a filter of the Conv2d weight),
   ``s_w[c] = max|w_c| / 127`` and ``w_q = round(w / s_w[c])`` in [-127, 127].
   One scale per channel instead of one per tensor: a channel with small
   weights keeps its own resolution instead of being rounded to zero by the
   largest channel's scale. -128 is never used, so the range is symmetric
   and negating a weight is exact.
2. **Activations, per tensor, symmetric, calibrated.** The float model runs
   on the calibration batches with an observer on the input of every
   Linear/Conv2d that records ``max|x|``; then ``s_x = max|x| / 127`` and at
   inference ``x_q = clip(round(x / s_x), -127, 127)``. Why symmetric and not
   asymmetric (a zero point z, ``x_q = round(x / s) + z``, 256 levels over
   [min, max]): the product stays a plain ``x_q @ w_q^T``, with no
   zero-point correction term (``z * sum_k w_q[c, k]`` per channel), the
   quantised zero is exactly 0 so the convolution's zero padding stays exact,
   and the error bound below is one line. The price: after a ReLU the inputs
   are >= 0 and use only 0..127, one bit of the eight, so the step s_x is
   twice what an asymmetric uint8 scheme would take. On the digits this
   costs no accuracy (see the tests); on a model where it does, asymmetric
   activations are the next thing to try.
3. **The product.** ``acc = x_q @ w_q^T`` in int32 (exact: each of the K
   terms is at most 127 * 127 in size, so K up to 133,152 cannot overflow),
   then ``y = acc * (s_x * s_w[c]) + b`` in float32, the bias kept in float.
   A convolution does the same on the im2col columns of ``x_q`` (int8,
   a quarter of the float columns' bytes), see :mod:`minidist.nn.im2col`.

The error bound. Write x^ = s_x x_q and w^ = s_w w_q for the values the
integers stand for. Then ``x.w - x^.w^ = (x - x^).w + x^.(w - w^)``, and
rounding puts every |x - x^| <= s_x / 2 (for x inside the calibrated range;
outside it the clipping error is larger) and every |w - w^| <= s_w[c] / 2, so
for one output of channel c::

    |y - y^| <= s_x / 2 * sum_k |w_ck|  +  s_w[c] / 2 * sum_k |x^_k|

plus float32 rounding of the final rescale (a few units in the last place).
:func:`matmul_error_bound` computes it; the tests check every output of a
Linear and a Conv2d against it.

Cost (K inputs per output, OC outputs, M rows or output positions):
weights K*OC bytes instead of 4*K*OC, plus 4 bytes of scale per channel;
one pass over the input to quantise it (M*K divisions and roundings); the
product 2*M*K*OC integer operations; one multiply-add per output to rescale.
Speed in NumPy: NumPy has no int8 or int32 BLAS, so the int32 product runs
in NumPy's plain loops, many times slower than the float32 BLAS GEMM (see
``benchmarks/bench_inference.py``): here int8 saves memory, not time. The
option ``accumulate="float32"`` does the same integer product in float32
BLAS, and is bit-for-bit the same as int32 while every partial sum fits
float32's 24-bit mantissa: K * 127 * 127 <= 2**24, K <= 1,040 (checked).
Hardware with int8 dot products (VNNI, Tensor Cores, NEON sdot) does the
int32 path at 2-4 times the float32 rate, which is where the speed comes from.

Layers: Linear and Conv2d (exactly those types) are replaced. Layers without
parameters (ReLU, MaxPool2d, Flatten, Dropout, containers) stay as they are.
Any other module that holds parameters of its own (BatchNorm, a Linear
subclass such as tensor parallel's, your own layer) is refused with an error
naming it, unless ``keep_float=True``, which leaves such layers in float32
(their input and output stay float; only the known layers are int8).

The quantised layers are for inference only: they hold no Parameters
(their arrays are buffers, saved in ``state_dict``), a forward in training
mode raises, and so does a backward through them.

Usage::

    q_model = quantize(model, x_train[:512])      # a copy; model is unchanged
    logits = q_model(Tensor(x_test))
    print(model_size_bytes(model), model_size_bytes(q_model))
"""

from __future__ import annotations

import copy

import numpy

from minidist import backend
from minidist.nn.conv import Conv2d
from minidist.nn.im2col import im2col, output_size
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.tensor import Tensor, no_grad

#: The largest magnitude of a symmetric int8 value (-128 is not used).
QMAX = 127
#: K up to which an int8 x int8 product accumulated in float32 is exact.
FLOAT32_EXACT_K = (1 << 24) // (QMAX * QMAX)
#: K up to which the int32 accumulator cannot overflow.
INT32_SAFE_K = ((1 << 31) - 1) // (QMAX * QMAX)
ACCUMULATORS = ("int32", "float32")


# --------------------------------------------------------------------------
# The arithmetic, as pure functions


def weight_scales(weight):
    """Per-output-channel scales ``max|w_c| / 127`` of ``weight`` (OC, ...),
    as float32 (OC,). An all-zero channel gets scale 1 (its integers are 0
    whatever the scale)."""
    xp = backend.of(weight)
    max_abs = xp.abs(weight.reshape(weight.shape[0], -1)).max(axis=1).astype(numpy.float32)
    return xp.where(max_abs > 0, max_abs / QMAX, numpy.float32(1.0)).astype(numpy.float32)


def quantize_weight(weight):
    """``(w_q int8 of weight's shape, s_w float32 (OC,))``, per output channel:
    ``w_q = round(w / s_w[c])`` in [-127, 127]."""
    xp = backend.of(weight)
    scales = weight_scales(weight)
    shape = (-1,) + (1,) * (weight.ndim - 1)
    integers = xp.rint(weight / scales.reshape(shape))
    return xp.clip(integers, -QMAX, QMAX).astype(numpy.int8), scales


def activation_scale(max_abs: float) -> numpy.float32:
    """``s_x = max|x| / 127`` from a calibrated range (1/127 if the range is 0:
    the calibration saw only zeros)."""
    max_abs = float(max_abs)
    return numpy.float32(max_abs / QMAX if max_abs > 0 else 1.0 / QMAX)


def quantize_activation(x, scale):
    """``clip(round(x / s_x), -127, 127)`` as int8: one pass over ``x``."""
    xp = backend.of(x)
    return xp.clip(xp.rint(x / numpy.float32(scale)), -QMAX, QMAX).astype(numpy.int8)


def int8_matmul(a, b, accumulate: str = "int32"):
    """``a @ b`` for int8 ``a`` (M, K) and ``b`` (K, N), exactly, as int32
    (``accumulate="int32"``: NumPy's integer loops, no BLAS) or as float32
    holding the same integers (``"float32"``: BLAS, exact for K <= 1,040)."""
    if accumulate == "int32":
        return a.astype(numpy.int32) @ b.astype(numpy.int32)
    if accumulate == "float32":
        return a.astype(numpy.float32) @ b.astype(numpy.float32)
    raise ValueError(f"accumulate must be one of {ACCUMULATORS}, got {accumulate!r}")


def matmul_error_bound(x, weight, input_scale, weight_scale):
    """The bound on ``|x @ w^T - x^ @ w^^T|`` for every output (M, OC), in
    float64, for ``x`` (M, K) inside the calibrated range and ``weight``
    (OC, K): ``s_x/2 * sum_k |w_ck| + s_w[c]/2 * sum_k |x^_k|`` (see the
    module docstring for the derivation)."""
    x = numpy.asarray(backend.to_numpy(x), dtype=numpy.float64)
    weight = numpy.asarray(backend.to_numpy(weight), dtype=numpy.float64)
    s_x = float(input_scale)
    s_w = numpy.asarray(backend.to_numpy(weight_scale), dtype=numpy.float64)
    x_hat = numpy.clip(numpy.rint(x / s_x), -QMAX, QMAX) * s_x
    return s_x / 2 * numpy.abs(weight).sum(axis=1)[None, :] + numpy.abs(x_hat).sum(axis=1)[:, None] * s_w[None, :] / 2


def _check_accumulator(accumulate: str, k: int, layer: str) -> None:
    if accumulate not in ACCUMULATORS:
        raise ValueError(f"accumulate must be one of {ACCUMULATORS}, got {accumulate!r}")
    if k > INT32_SAFE_K:
        raise ValueError(f"{layer} sums {k:,} products per output; int32 can overflow above "
                         f"{INT32_SAFE_K:,} (127 * 127 each): keep this layer in float")
    if accumulate == "float32" and k > FLOAT32_EXACT_K:
        raise ValueError(f"{layer} sums {k:,} products per output; float32 accumulation is exact "
                         f"only up to {FLOAT32_EXACT_K:,}: use accumulate='int32'")


def _inference_only(name: str):
    def backward(g):
        raise RuntimeError(f"{name} has no backward: int8 layers are for inference only. Train "
                           "the float32 model, then quantize() it again.")
    return backward


# --------------------------------------------------------------------------
# The layers


class _QuantizedLayer(Module):
    """What QuantizedLinear and QuantizedConv2d share: buffers, checks, rescale."""

    def _set_arrays(self, weight_int8, weight_scale, input_scale, bias, accumulate):
        self.register_buffer("weight", weight_int8)
        self.register_buffer("weight_scale", weight_scale.astype(numpy.float32))
        self.register_buffer("input_scale", numpy.asarray(input_scale, dtype=numpy.float32))
        self.register_buffer("bias", None if bias is None else bias.astype(numpy.float32))
        self.accumulate = accumulate
        self.eval()

    def _check_mode(self):
        if self.training:
            raise RuntimeError(f"{type(self).__name__} is for inference only and cannot train: "
                               "call .eval() on the quantised model (quantize() returns it in "
                               "eval mode), and train the float32 model instead")

    def _rescale(self, accumulated, channel_axis: int):
        shape = [1] * accumulated.ndim
        shape[channel_axis] = -1
        combined = (self.input_scale.data * self.weight_scale.data).reshape(shape)
        out = accumulated.astype(numpy.float32) * combined
        if self.bias is not None:
            out += self.bias.data.reshape(shape)
        return out


class QuantizedLinear(_QuantizedLayer):
    """An int8 Linear: ``y = (x_q @ w_q^T) * (s_x * s_w) + b``.

    Buffers: ``weight`` int8 (out, in), ``weight_scale`` float32 (out,),
    ``input_scale`` float32 (), ``bias`` float32 (out,) or None. Build it with
    :meth:`from_float` (or :func:`quantize` for a whole model).

    Cost per forward of M rows: M*K divisions and roundings to quantise the
    input, 2*M*K*OC integer operations, M*OC multiply-adds to rescale.
    """

    def __init__(self, weight_int8, weight_scale, input_scale, bias=None, accumulate: str = "int32"):
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight_int8.shape)
        _check_accumulator(accumulate, self.in_features, "QuantizedLinear")
        self._set_arrays(weight_int8, weight_scale, input_scale, bias, accumulate)

    @classmethod
    def from_float(cls, linear: Linear, input_max_abs: float, accumulate: str = "int32"):
        """Quantise ``linear``'s weight per output channel; ``input_max_abs``
        is the calibrated max|x| of its input."""
        weight_int8, scales = quantize_weight(linear.weight.data)
        bias = None if linear.bias is None else linear.bias.data.copy()
        return cls(weight_int8, scales, activation_scale(input_max_abs), bias, accumulate)

    def forward(self, x):
        self._check_mode()
        x = x if isinstance(x, Tensor) else Tensor(x)
        data = x.data
        if data.ndim == 0 or data.shape[-1] != self.in_features:
            raise ValueError(f"QuantizedLinear: the input has shape {tuple(data.shape)}, expected "
                             f"(..., {self.in_features})")
        x_q = quantize_activation(data, self.input_scale.data)
        accumulated = int8_matmul(x_q.reshape(-1, self.in_features), self.weight.data.T, self.accumulate)
        out = self._rescale(accumulated, 1).reshape(data.shape[:-1] + (self.out_features,))
        return Tensor._make(out, (x,), _inference_only("QuantizedLinear"), "quantized_linear")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, int8, accumulate={self.accumulate}")


class QuantizedConv2d(_QuantizedLayer):
    """An int8 Conv2d: im2col of ``x_q`` (int8 columns), then
    ``w_q (OC, C*KH*KW) @ columns`` accumulated in int32, rescaled by
    ``s_x * s_w[c]`` and the float bias added.

    Buffers as :class:`QuantizedLinear`, ``weight`` int8 (OC, C, KH, KW).
    Cost per forward: the input quantised once (N*C*H*W roundings), columns of
    C*KH*KW * N*OH*OW int8 (a quarter of the float columns' bytes),
    2 * OC * C*KH*KW * N*OH*OW integer operations, one multiply-add per output.
    """

    def __init__(self, weight_int8, weight_scale, input_scale, bias=None, stride=(1, 1),
                 padding=(0, 0), accumulate: str = "int32"):
        super().__init__()
        self.out_channels, self.in_channels = (int(n) for n in weight_int8.shape[:2])
        self.kernel_size = tuple(int(n) for n in weight_int8.shape[2:])
        self.stride = tuple(stride)
        self.padding = tuple(padding)
        _check_accumulator(accumulate, self.in_channels * self.kernel_size[0] * self.kernel_size[1],
                           "QuantizedConv2d")
        self._set_arrays(weight_int8, weight_scale, input_scale, bias, accumulate)

    @classmethod
    def from_float(cls, conv: Conv2d, input_max_abs: float, accumulate: str = "int32"):
        """Quantise ``conv``'s filters per output channel; ``input_max_abs``
        is the calibrated max|x| of its input."""
        weight_int8, scales = quantize_weight(conv.weight.data)
        bias = None if conv.bias is None else conv.bias.data.copy()
        return cls(weight_int8, scales, activation_scale(input_max_abs), bias, conv.stride,
                   conv.padding, accumulate)

    def forward(self, x):
        self._check_mode()
        x = x if isinstance(x, Tensor) else Tensor(x)
        data = x.data
        if data.ndim != 4 or data.shape[1] != self.in_channels:
            raise ValueError(f"QuantizedConv2d: the input has shape {tuple(data.shape)}, expected "
                             f"(batch, {self.in_channels}, height, width)")
        n, _, h, w = data.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        out_h, out_w = output_size(h, kh, sh, ph), output_size(w, kw, sw, pw)
        if out_h < 1 or out_w < 1:
            raise ValueError(f"QuantizedConv2d: a {kh}x{kw} kernel does not fit in the {h}x{w} "
                             f"input padded by ({ph}, {pw})")
        columns = im2col(quantize_activation(data, self.input_scale.data), kh, kw, sh, sw, ph, pw)
        accumulated = int8_matmul(self.weight.data.reshape(self.out_channels, -1), columns, self.accumulate)
        accumulated = accumulated.reshape(self.out_channels, n, out_h, out_w).transpose(1, 0, 2, 3)
        out = backend.of(data).ascontiguousarray(self._rescale(accumulated, 1))
        return Tensor._make(out, (x,), _inference_only("QuantizedConv2d"), "quantized_conv2d")

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, int8, accumulate={self.accumulate}")


# --------------------------------------------------------------------------
# Whole models

QUANTIZABLE = {Linear: QuantizedLinear, Conv2d: QuantizedConv2d}


def _batches(calibration_data, batch_size: int = 256):
    """The calibration inputs as a list of arrays: one array (split into
    batches), or an iterable of arrays, Tensors or (input, label) pairs."""
    def as_array(item):
        if isinstance(item, (tuple, list)) and item and not numpy.isscalar(item[0]):
            item = item[0]
        data = item.data if isinstance(item, Tensor) else item
        if not hasattr(data, "shape") or not hasattr(data, "dtype"):
            raise TypeError(f"calibration data must be arrays or Tensors of inputs, got "
                            f"{type(item).__name__}")
        if data.dtype.kind not in "fiu":
            raise TypeError(f"calibration data must be numbers, got dtype {data.dtype}")
        return data

    if calibration_data is None:
        raise ValueError("calibration data is empty (None): pass a few batches of typical "
                         "inputs, e.g. x_train[:512]")
    if isinstance(calibration_data, Tensor) or hasattr(calibration_data, "shape"):
        data = as_array(calibration_data)
        batches = [data[start : start + batch_size] for start in range(0, len(data), batch_size)] if data.ndim else [data]
    else:
        batches = [as_array(item) for item in calibration_data]
    batches = [batch for batch in batches if batch.ndim == 0 or len(batch) > 0]
    if not batches:
        raise ValueError("calibration data is empty: pass a few batches of typical inputs, "
                         "e.g. x_train[:512] (a few hundred examples are enough)")
    shapes = {tuple(batch.shape[1:]) for batch in batches}
    if len(shapes) > 1:
        raise ValueError(f"calibration batches disagree in shape: per-example shapes {sorted(shapes)}")
    return batches


def _expected_input(name: str, layer: Module) -> str:
    if isinstance(layer, Conv2d):
        return (f"its first layer {name!r} (Conv2d with {layer.in_channels} input channels) "
                f"expects (batch, {layer.in_channels}, height, width)")
    return (f"its first layer {name!r} (Linear with in_features={layer.in_features}) "
            f"expects (batch, {layer.in_features})")


def _quantizable(module) -> bool:
    """A Linear, or a dense Conv2d (a grouped or depthwise one is left to
    ``keep_float``: QuantizedConv2d multiplies every input channel)."""
    return type(module) in QUANTIZABLE and getattr(module, "groups", 1) == 1


def quantize(model: Module, calibration_data, keep_float: bool = False, accumulate: str = "int32") -> Module:
    """A quantised copy of ``model``: every Linear and Conv2d replaced by a
    :class:`QuantizedLinear` / :class:`QuantizedConv2d`, in eval mode.
    ``model`` itself is not changed.

    ``calibration_data``: a few hundred typical inputs, as one array (or
    Tensor) of examples, or an iterable of batches (arrays, Tensors, or
    (input, label) pairs such as a DataLoader yields). The float model runs
    on them once, in eval mode and without a graph, with an observer on the
    input of every Linear/Conv2d recording max|x|.

    ``keep_float``: what to do with a module of another type that holds
    parameters of its own (BatchNorm, a Linear subclass, your own layer):
    False (default) refuses with an error naming it; True leaves it in
    float32. ``accumulate``: "int32" (default) or "float32" (the same exact
    integer product in float32 BLAS, allowed where K <= 1,040).

    Cost: a deep copy of the model, one float forward over the calibration
    data, one pass over every weight.
    """
    if not isinstance(model, Module):
        raise TypeError(f"quantize needs a minidist.nn.Module, got {type(model).__name__}")
    if accumulate not in ACCUMULATORS:
        raise ValueError(f"accumulate must be one of {ACCUMULATORS}, got {accumulate!r}")
    layers = [(name, module) for name, module in model.named_modules() if _quantizable(module)]
    unknown = [(name, module) for name, module in model.named_modules()
               if not _quantizable(module) and not isinstance(module, _QuantizedLayer)
               and any(p is not None for p in module._parameters.values())]
    if unknown and not keep_float:
        listed = ", ".join(f"{name or '(the model)'!r} ({type(module).__name__})" for name, module in unknown)
        raise TypeError(f"cannot quantise {listed}: quantize knows Linear and Conv2d (groups=1) "
                        "only, and "
                        "this layer holds parameters. Pass keep_float=True to leave such layers "
                        "in float32, or fold it into the layer before it (a BatchNorm into the "
                        "preceding Conv2d/Linear)")
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Linear or Conv2d layer to quantise")
    batches = _batches(calibration_data)

    copied = copy.deepcopy(model)
    targets = [(name, module) for name, module in copied.named_modules() if _quantizable(module)]
    max_abs = {name: None for name, _ in targets}

    def observe(name, layer):
        forward = layer.forward

        def observed(x):
            data = x.data if isinstance(x, Tensor) else x
            seen = float(backend.of(data).abs(data).max()) if data.size else 0.0
            max_abs[name] = seen if max_abs[name] is None else max(max_abs[name], seen)
            return forward(x)
        return observed

    for name, layer in targets:
        object.__setattr__(layer, "forward", observe(name, layer))
    copied.eval()
    try:
        with no_grad():
            for batch in batches:
                copied(Tensor(batch))
    except (ValueError, TypeError, IndexError) as error:
        raise ValueError(
            f"calibration data of shape (batch, {', '.join(str(n) for n in batches[0].shape[1:])}) "
            f"does not fit {type(model).__name__}: {_expected_input(*layers[0])} ({error})"
        ) from error
    finally:
        for _, layer in targets:
            object.__delattr__(layer, "forward")

    for name, seen in max_abs.items():
        if seen is None:
            raise ValueError(f"layer {name!r} saw no input during calibration: the model's forward "
                             "never calls it, so its input range is unknown")
        if not numpy.isfinite(seen):
            raise ValueError(f"the input of layer {name!r} held NaN or infinity during calibration: "
                             "check the calibration data (and the model) for non-finite values")

    replaced = {name: QUANTIZABLE[type(layer)].from_float(layer, max_abs[name], accumulate)
                for name, layer in targets}
    if "" in replaced:  # the model is itself one Linear or Conv2d
        return replaced[""]
    for parent_name, parent in list(copied.named_modules()):
        for child_name, _ in list(parent.named_children()):
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if full in replaced:
                setattr(parent, child_name, replaced[full])
    return copied.eval()


def model_size_bytes(model: Module, weights_only: bool = False) -> int:
    """Bytes of everything ``model.state_dict()`` holds (parameters and
    persistent buffers: weights, biases, scales, running statistics), or of
    the entries named ``weight`` only when ``weights_only``. A float32 Linear
    of K x OC holds 4*K*OC weight bytes; its quantised copy K*OC."""
    total = 0
    for name, tensor in model._state_tensors().items():
        if weights_only and name.rsplit(".", 1)[-1] != "weight":
            continue
        total += int(tensor.data.nbytes)
    return total


__all__ = [
    "quantize", "model_size_bytes", "QuantizedLinear", "QuantizedConv2d",
    "quantize_weight", "weight_scales", "quantize_activation", "activation_scale",
    "int8_matmul", "matmul_error_bound", "QMAX", "FLOAT32_EXACT_K", "INT32_SAFE_K",
]
