"""The CuPy backend gives the same numbers as NumPy. Skipped cleanly on a
machine without CuPy or without a CUDA device (CI has neither)."""

import numpy as np
import pytest

from minidist import Tensor, backend, nn, optim
from minidist.train import build_model


def _cupy_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy found no CUDA device")
    except Exception as error:  # no driver, no device
        pytest.skip(f"no usable CUDA device: {error}")
    return cupy


pytestmark = pytest.mark.gpu


def test_missing_cupy_gives_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_cupy(name, *args, **kwargs):
        if name == "cupy":
            raise ImportError("no cupy here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    with pytest.raises(RuntimeError, match=r"minidist\[gpu\]"):
        backend.use("cupy")
    assert backend.name() == "numpy"
    with pytest.raises(ValueError, match="unknown backend"):
        backend.use("tpu")


def one_step(model_name, backend_name, x, y):
    backend.use(backend_name)
    try:
        model = build_model(model_name, seed=3)
        optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss = nn.CrossEntropyLoss()(model(Tensor(x)), y)
        optimizer.zero_grad()
        loss.backward()
        grads = [backend.to_numpy(p.grad) for p in model.parameters()]
        optimizer.step()
        weights = [backend.to_numpy(p.data) for p in model.parameters()]
        kinds = {type(p.data).__module__.split(".")[0] for p in model.parameters()}
        return loss.item(), grads, weights, kinds
    finally:
        backend.use("numpy")


@pytest.mark.parametrize("model_name, shape", [("mlp", (32, 64)), ("cnn", (16, 1, 8, 8))])
def test_cupy_matches_numpy(model_name, shape):
    _cupy_or_skip()
    rng = np.random.default_rng(0)
    x = rng.random(shape, dtype=np.float32)
    y = rng.integers(0, 10, shape[0])
    loss_cpu, grads_cpu, weights_cpu, kinds_cpu = one_step(model_name, "numpy", x, y)
    loss_gpu, grads_gpu, weights_gpu, kinds_gpu = one_step(model_name, "cupy", x, y)
    assert kinds_cpu == {"numpy"} and kinds_gpu == {"cupy"}
    assert np.isclose(loss_cpu, loss_gpu, rtol=1e-5)
    for cpu, gpu in zip(grads_cpu + weights_cpu, grads_gpu + weights_gpu):
        np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-6)


def test_training_on_the_gpu_learns():
    _cupy_or_skip()
    from minidist.train import train_digits

    backend.use("cupy")
    try:
        result = train_digits("mlp", epochs=3, progress=False)
    finally:
        backend.use("numpy")
    assert result["test_accuracy"] > 0.8
