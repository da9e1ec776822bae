"""minidist.flops: the GPT step's flops formula against the products the
autograd really runs, and the peak / MFU arithmetic."""

from __future__ import annotations

import numpy
import pytest

from minidist import flops
from minidist.models.gpt import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.tensor import Tensor


class _Counting(numpy.ndarray):
    """An ndarray that adds the flops of every matmul it takes part in (``@``
    and ``numpy.matmul`` both reach ``__array_ufunc__``) to ``counted``.
    Whatever a ufunc, a view or an index makes from it is again a _Counting,
    so the count follows the data through the forward and the backward."""

    counted: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is numpy.matmul and method == "__call__":
            _Counting.counted.append(flops.matmul_flops(inputs[0].shape, inputs[1].shape))
        plain = [value.view(numpy.ndarray) if isinstance(value, _Counting) else value for value in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(value.view(numpy.ndarray) if isinstance(value, _Counting) else value
                                  for value in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if isinstance(result, numpy.ndarray) and "out" not in kwargs:
            return result.view(_Counting)
        if "out" in kwargs:
            return kwargs["out"][0] if len(kwargs["out"]) == 1 else kwargs["out"]
        return result


def _counted_step(config, batch, steps, monkeypatch, seed=0):
    """The flops of every matmul of one forward + backward of a GPT: the
    parameters and every node's output are _Counting arrays, so every product
    of the forward and of the backward closures has a counting operand."""
    model = GPT(config, rng=seed)
    for param in model.parameters():
        param.data = param.data.view(_Counting)
    make = Tensor._make

    def counting_make(data, parents, backward, op):
        return make(data.view(_Counting) if isinstance(data, numpy.ndarray) else data,
                    parents, backward, op)

    monkeypatch.setattr(Tensor, "_make", staticmethod(counting_make))
    rng = numpy.random.default_rng(seed)
    idx = rng.integers(0, config.vocab_size, (batch, steps))
    targets = rng.integers(0, config.vocab_size, (batch, steps))
    _Counting.counted = []
    logits = model(idx)
    forward = sum(_Counting.counted)
    loss = F.cross_entropy(logits.reshape(batch * steps, config.vocab_size), targets.reshape(-1))
    loss.backward()
    return forward, sum(_Counting.counted)


@pytest.mark.parametrize("shape", [
    dict(n_layer=2, n_head=2, n_embd=16, vocab_size=11, block_size=8, batch=3, steps=8),
    dict(n_layer=1, n_head=4, n_embd=32, vocab_size=7, block_size=16, batch=2, steps=5),
    dict(n_layer=3, n_head=1, n_embd=8, vocab_size=5, block_size=12, batch=1, steps=12),
])
def test_the_formula_is_the_flops_of_the_products_the_autograd_runs(shape, monkeypatch):
    shape = dict(shape)
    batch, steps = shape.pop("batch"), shape.pop("steps")
    config = GPTConfig(**shape)
    forward, total = _counted_step(config, batch, steps, monkeypatch)
    counted = flops.gpt_step_flops(config, batch, steps)
    assert total == counted.total
    assert forward == counted.forward
    d, tokens = config.n_embd, batch * steps
    assert counted.dense == 6 * (12 * config.n_layer * d * d + d * config.vocab_size) * tokens
    assert counted.attention == 12 * config.n_layer * d * steps * tokens


def test_the_counting_array_sees_a_product():
    """The instrument itself can fail: a product it misses would leave 0."""
    _Counting.counted = []
    a = numpy.ones((2, 3, 4)).view(_Counting)
    _ = a @ numpy.ones((4, 5))
    _ = numpy.matmul(numpy.ones((7, 2)), numpy.ones((2, 3)).view(_Counting))
    assert _Counting.counted == [2 * 2 * 3 * 4 * 5, 2 * 7 * 2 * 3]


def test_matmul_flops_broadcasts_and_refuses_mismatches():
    assert flops.matmul_flops((5, 1, 3, 4), (6, 4, 2)) == 2 * 5 * 6 * 3 * 4 * 2
    assert flops.matmul_flops((4,), (4, 3)) == 2 * 4 * 3
    assert flops.matmul_flops((3, 4), (4,)) == 2 * 3 * 4
    with pytest.raises(ValueError, match="inner axes"):
        flops.matmul_flops((3, 4), (5, 2))


def test_the_step_is_six_times_the_matmul_parameters_per_token_plus_attention():
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    counted = flops.gpt_step_flops(config, batch=8)
    model = GPT(config, rng=0)
    # N: every parameter but the position embedding, the biases and the LayerNorms.
    n = sum(p.data.size for name, p in model.named_parameters()
            if name.endswith("weight") and ".ln_" not in name and "wpe" not in name)
    assert counted.matmul_parameters == n
    assert counted.total == 6 * n * 8 * 64 + 12 * 4 * 128 * 64 * 8 * 64
    assert counted.forward * 3 == counted.total


def test_peak_and_mfu():
    peak = flops.measure_gemm_peak(threads=1, size=128, repeats=2)
    assert peak > 0
    assert flops.achieved(6_000, 2.0) == 3_000
    assert flops.mfu(6_000, 2.0, 6_000) == 0.5
    with pytest.raises(ValueError, match="peak"):
        flops.mfu(1, 1.0, 0)
    with pytest.raises(ValueError, match="at least 1"):
        flops.measure_gemm_peak(threads=0)
