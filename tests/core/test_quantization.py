"""INT8 post-training quantisation: the arithmetic against its error bound,
the scales, the sizes, the digits models' accuracy, and the errors."""

import numpy as np
import pytest
from rich.console import Console

from minidist import Tensor, nn, no_grad
from minidist.data import load_digits
from minidist.nn import functional as F
from minidist.nn.im2col import im2col
from minidist.nn.quantization import (
    FLOAT32_EXACT_K,
    QuantizedConv2d,
    QuantizedLinear,
    int8_matmul,
    matmul_error_bound,
    model_size_bytes,
    quantize,
    quantize_weight,
)
from minidist.train import build_model, evaluate, train_digits

# Values through BLAS, compared exactly or to a rounding: run again on Haswell kernels by .ci/run.
pytestmark = pytest.mark.blas_kernel

#: float32 rounding of the rescale and of nothing else: the integer product is exact.
RELATIVE_SLACK = 1e-5


def _bounded(quantised, reference, bound, scale):
    """Every |quantised - reference| <= bound (+ float32 rounding of a value of size ``scale``)."""
    error = np.abs(quantised.astype(np.float64) - reference)
    allowed = bound + RELATIVE_SLACK * scale
    assert (error <= allowed).all(), f"worst excess {(error - allowed).max():.3g}"
    return error


def test_per_channel_weight_scales_are_the_channel_max_over_127():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((5, 7)).astype(np.float32) * np.array([1, 10, 0.01, 3, 0], np.float32)[:, None]
    integers, scales = quantize_weight(weight)
    assert integers.dtype == np.int8 and integers.shape == weight.shape
    np.testing.assert_allclose(scales[:4], np.abs(weight[:4]).max(axis=1) / 127, rtol=1e-6)
    assert scales[4] == 1.0 and not integers[4].any()       # an all-zero channel
    assert (np.abs(integers[:4]).max(axis=1) == 127).all()  # each channel uses its full range
    assert np.abs(integers).max() <= 127                    # -128 never appears
    # Per channel, the rounding error is at most half a step of that channel's own scale.
    assert (np.abs(integers * scales[:, None] - weight) <= scales[:, None] / 2 + 1e-7).all()


def test_quantised_matmul_is_within_the_bound_of_the_float_product():
    """|y - y^| <= s_x/2 sum_k |w_ck| + s_w[c]/2 sum_k |x^_k|, output by output."""
    rng = np.random.default_rng(1)
    linear = nn.Linear(96, 24, rng=2)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    layer = QuantizedLinear.from_float(linear, np.abs(x).max())
    with no_grad():
        y_q = layer(Tensor(x)).data
    w = linear.weight.data.astype(np.float64)
    reference = x.astype(np.float64) @ w.T + linear.bias.data
    bound = matmul_error_bound(x, w, layer.input_scale.data, layer.weight_scale.data)
    error = _bounded(y_q, reference, bound, np.abs(x) @ np.abs(w).T + np.abs(linear.bias.data))
    assert error.max() > 0  # it is an approximation, and the bound is not vacuous:
    assert error.max() < 0.05 * np.abs(reference).max()
    # int32 and float32 accumulation give the same integers (K = 96 <= 1,040).
    x_q = np.clip(np.rint(x / layer.input_scale.data), -127, 127).astype(np.int8)
    exact = int8_matmul(x_q, layer.weight.data.T, "int32")
    assert exact.dtype == np.int32
    assert (int8_matmul(x_q, layer.weight.data.T, "float32") == exact).all()
    assert FLOAT32_EXACT_K == 1040


def test_quantised_conv_is_within_the_bound_of_the_float_conv():
    rng = np.random.default_rng(3)
    conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, rng=4)
    x = rng.standard_normal((4, 3, 9, 9)).astype(np.float32)
    layer = QuantizedConv2d.from_float(conv, np.abs(x).max())
    with no_grad():
        y_q = layer(Tensor(x)).data
        reference = F.conv2d(Tensor(x.astype(np.float64)), Tensor(conv.weight.data.astype(np.float64)),
                             Tensor(conv.bias.data.astype(np.float64)), stride=2, padding=1).data
    assert y_q.shape == reference.shape == (4, 8, 5, 5) and y_q.dtype == np.float32
    # Per output position, the bound of a dot product over the C*KH*KW window
    # (padding contributes exact zeros, which only loosens the bound).
    s_x, s_w = float(layer.input_scale.data), layer.weight_scale.data.astype(np.float64)
    x_hat = np.clip(np.rint(x / s_x), -127, 127) * s_x
    window_sums = im2col(np.abs(x_hat), 3, 3, 2, 2, 1, 1).sum(axis=0).reshape(4, 1, 5, 5)
    w_sums = np.abs(conv.weight.data.astype(np.float64)).reshape(8, -1).sum(axis=1)
    bound = s_x / 2 * w_sums[None, :, None, None] + s_w[None, :, None, None] / 2 * window_sums
    magnitude = F.conv2d(Tensor(np.abs(x).astype(np.float64)), Tensor(np.abs(conv.weight.data).astype(np.float64)),
                         stride=2, padding=1).data + np.abs(conv.bias.data)[None, :, None, None]
    _bounded(y_q, reference, bound, magnitude)
    float32_path = QuantizedConv2d.from_float(conv, np.abs(x).max(), accumulate="float32")
    with no_grad():
        assert (float32_path(Tensor(x)).data == y_q).all()


def test_weights_are_four_times_smaller_and_the_original_is_unchanged():
    model = build_model("cnn")
    before = {k: v.copy() for k, v in model.state_dict().items()}
    x = load_digits(flatten=False)[0][:64]
    quantised = quantize(model, x)
    assert [type(m).__name__ for m in quantised if m._parameters or m._buffers] == [
        "QuantizedConv2d", "QuantizedConv2d", "QuantizedLinear", "QuantizedLinear"]
    assert all(type(m) in (nn.Conv2d, nn.Linear) for m in model if m._parameters)
    assert all((before[k] == v).all() for k, v in model.state_dict().items())
    assert model_size_bytes(model, weights_only=True) == 4 * model_size_bytes(quantised, weights_only=True)
    float_bytes, int8_bytes = model_size_bytes(model), model_size_bytes(quantised)
    assert float_bytes == 4 * model.num_parameters()
    assert 3.5 < float_bytes / int8_bytes < 4  # biases and scales stay float32
    assert quantised.state_dict()["0.weight"].dtype == np.int8
    assert list(quantised.parameters()) == []


@pytest.mark.parametrize("name, epochs", [("mlp", None), ("cnn", 8)])
def test_digits_models_keep_their_accuracy_within_one_point(name, epochs):
    quiet = Console(file=open("/dev/null", "w"))
    trained = train_digits(name, epochs=epochs, progress=False, console=quiet)
    x_train, _, x_test, y_test = load_digits(flatten=(name == "mlp"))
    assert trained["test_accuracy"] >= (0.95 if name == "mlp" else 0.97)
    quantised = quantize(trained["model"], x_train[:512])
    int8_accuracy = evaluate(quantised, x_test, y_test)
    assert abs(int8_accuracy - trained["test_accuracy"]) <= 0.01, (trained["test_accuracy"], int8_accuracy)
    # The same integers in float32 BLAS: the same predictions, bit for bit.
    exact = quantize(trained["model"], x_train[:512], accumulate="float32")
    with no_grad():
        assert (exact(Tensor(x_test)).data == quantised(Tensor(x_test)).data).all()


def test_quantised_layers_refuse_training_and_backward():
    model = build_model("mlp")
    quantised = quantize(model, np.random.default_rng(0).random((32, 64), dtype=np.float32))
    x = Tensor(np.ones((2, 64), np.float32), requires_grad=True)
    out = quantised(x)
    with pytest.raises(RuntimeError, match="QuantizedLinear has no backward: int8 layers are for inference"):
        out.sum().backward()
    quantised.train()
    with pytest.raises(RuntimeError, match="inference only and cannot train"):
        quantised(x)


def test_bad_input_is_named():
    model = build_model("mlp")
    x = np.random.default_rng(0).random((32, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="calibration data is empty"):
        quantize(model, x[:0])
    with pytest.raises(ValueError, match="calibration data is empty"):
        quantize(model, [])
    with pytest.raises(ValueError, match=r"shape \(batch, 1, 8, 8\) does not fit Sequential: its first "
                                         r"layer '0' \(Linear with in_features=64\) expects \(batch, 64\)"):
        quantize(model, x.reshape(32, 1, 8, 8))
    with pytest.raises(ValueError, match=r"expects \(batch, 1, height, width\)"):
        quantize(build_model("cnn"), x)
    with pytest.raises(ValueError, match="NaN or infinity"):
        quantize(model, np.full((4, 64), np.nan, np.float32))
    with pytest.raises(ValueError, match="accumulate must be one of"):
        quantize(model, x, accumulate="int8")
    with pytest.raises(ValueError, match="no Linear or Conv2d"):
        quantize(nn.Sequential(nn.ReLU()), x)

    with_norm = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    with pytest.raises(TypeError, match=r"cannot quantise '1' \(BatchNorm1d\): quantize knows Linear and "
                                        r"Conv2d \(groups=1\) only.*keep_float=True"):
        quantize(with_norm, x)
    kept = quantize(with_norm, x, keep_float=True)
    assert [type(m).__name__ for m in kept.children()] == ["QuantizedLinear", "BatchNorm1d", "ReLU", "QuantizedLinear"]
    with no_grad():
        assert kept(Tensor(x)).data.shape == (32, 10)


def test_a_depthwise_conv_is_named_and_can_stay_float():
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    x = np.random.default_rng(0).standard_normal((8, 4, 6, 6)).astype(np.float32)
    with pytest.raises(TypeError, match=r"'0' \(Conv2d\).*groups=1"):
        quantize(model, x)
    mixed = quantize(model, x, keep_float=True)
    assert type(mixed[0]) is nn.Conv2d and type(mixed[2]).__name__ == "QuantizedConv2d"
