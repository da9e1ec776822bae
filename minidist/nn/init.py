"""Weight initialisation, and the seeding convention of minidist.

**Seeding.** Every random draw of the library (initial weights, dropout
masks) comes from a NumPy ``Generator``: the one passed as ``rng=`` (a
Generator or an int seed), or else this module's *default generator*.
``manual_seed(seed)`` replaces the default generator with
``numpy.random.default_rng(seed)``. At import the default generator is seeded
with ``DEFAULT_SEED`` (0), so a fresh process builds the same model every
time, like PyTorch's fixed initial seed.

Why it matters for distributed training: every rank builds its own copy of
the model, and synchronous data parallelism assumes the copies start equal.
Calling ``nn.init.manual_seed(seed)`` with the same seed on every rank before
building the model guarantees it (broadcasting rank 0's weights is the other
way). Draws are made on the CPU in float64 and then cast and copied to the
tensor's backend and dtype, so NumPy and CuPy, float32 and float64 models
built from one seed hold the same numbers (up to rounding).

**Initialisers.** Each fills an existing tensor in place and returns it
(trailing underscore, as in PyTorch). The fans of a weight: for a Linear
weight ``(out, in)``, fan_in = in, fan_out = out; for a Conv2d weight
``(out_channels, in_channels, kh, kw)``, fan_in = in_channels*kh*kw and
fan_out = out_channels*kh*kw.

* ``kaiming_uniform_``: U(-b, b), b = gain * sqrt(3 / fan), which keeps the
  variance of activations (``mode="fan_in"``) or of gradients
  (``"fan_out"``) constant through ReLU layers (He et al., 2015). Linear and
  Conv2d use it with ``a=sqrt(5)``, i.e. b = 1/sqrt(fan_in), as PyTorch does.
* ``xavier_uniform_``: U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out))
  (Glorot and Bengio, 2010), for tanh and sigmoid networks.
"""

from __future__ import annotations

import math

import numpy

from minidist import backend

DEFAULT_SEED = 0

_default_generator = numpy.random.default_rng(DEFAULT_SEED)


def manual_seed(seed: int) -> numpy.random.Generator:
    """Reseed the default generator (weights and dropout masks drawn without
    an explicit ``rng=``). Returns the new generator."""
    global _default_generator
    _default_generator = numpy.random.default_rng(seed)
    return _default_generator


def default_generator() -> numpy.random.Generator:
    """The generator used when no ``rng=`` is given."""
    return _default_generator


def as_generator(rng=None) -> numpy.random.Generator:
    """``rng`` as a Generator: None means the default generator, an int is a
    seed for a new one, a Generator is used as it is."""
    if rng is None:
        return _default_generator
    if isinstance(rng, numpy.random.Generator):
        return rng
    if isinstance(rng, (int, numpy.integer)) and not isinstance(rng, bool):
        return numpy.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be None, an int seed or a numpy.random.Generator, got {type(rng).__name__}; "
        "e.g. rng=numpy.random.default_rng(0)"
    )


def _fill(tensor, values):
    """Write CPU float64 ``values`` into ``tensor.data`` in place, cast to its
    dtype and moved to its backend (in place, so views of it stay valid)."""
    data = tensor.data
    tensor.data[...] = backend.of(data).asarray(values.astype(data.dtype, copy=False))
    return tensor


def calculate_fans(shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight of this shape (see the module docstring)."""
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(
            f"fan_in and fan_out need a weight with at least 2 axes, got shape {shape}; "
            "initialise a bias with uniform_ or zeros_"
        )
    receptive_field = int(numpy.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive_field, shape[0] * receptive_field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The factor that keeps activation variance at 1 through ``nonlinearity``:
    1 for linear/sigmoid, 5/3 for tanh, sqrt(2) for relu,
    sqrt(2 / (1 + slope^2)) for leaky_relu (slope ``param``, default 0.01)."""
    if nonlinearity in ("linear", "identity", "conv2d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3.0
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1.0 + slope * slope))
    raise ValueError(
        f"unknown nonlinearity {nonlinearity!r}; choose linear, sigmoid, tanh, relu or leaky_relu"
    )


def uniform_(tensor, low: float = 0.0, high: float = 1.0, rng=None):
    """Fill with draws from U(low, high)."""
    return _fill(tensor, as_generator(rng).uniform(low, high, size=tensor.data.shape))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, rng=None):
    """Fill with draws from N(mean, std^2)."""
    return _fill(tensor, as_generator(rng).normal(mean, std, size=tensor.data.shape))


def constant_(tensor, value: float):
    tensor.data[...] = value
    return tensor


def zeros_(tensor):
    return constant_(tensor, 0)


def ones_(tensor):
    return constant_(tensor, 1)


def _fan(shape, mode):
    fan_in, fan_out = calculate_fans(shape)
    if mode == "fan_in":
        return fan_in
    if mode == "fan_out":
        return fan_out
    raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")


def kaiming_uniform_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", rng=None):
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan), gain from
    ``calculate_gain(nonlinearity, a)``."""
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / _fan(tensor.data.shape, mode))
    return uniform_(tensor, -bound, bound, rng)


def kaiming_normal_(tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", rng=None):
    """He normal: N(0, std^2) with std = gain / sqrt(fan)."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor.data.shape, mode))
    return normal_(tensor, 0.0, std, rng)


def xavier_uniform_(tensor, gain: float = 1.0, rng=None):
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fans(tensor.data.shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, rng)


def xavier_normal_(tensor, gain: float = 1.0, rng=None):
    """Glorot normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fans(tensor.data.shape)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), rng)


__all__ = [
    "DEFAULT_SEED", "manual_seed", "default_generator", "as_generator", "calculate_fans",
    "calculate_gain", "uniform_", "normal_", "constant_", "zeros_", "ones_",
    "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
]
