"""The parameter server's worked examples for the course (lessons 7 and 8,
``minidist demo parameter-server``): linear regression with known true
weights, and the small MLP on the bundled digits, each trained by
:class:`~minidist.parallel.parameter_server.server.ParameterServer` on every rank
of a launch.

    results = minidist.launch(train_linear_regression, world_size=4, args=(50,),
                              kwargs={"servers": 1, "mode": "bsp"})

The strategy itself is in :mod:`minidist.parallel.parameter_server.server`; these
functions only use it, as a student's program would.
"""

from __future__ import annotations

import time

import numpy as np

import minidist.distributed as dist
from minidist import Tensor, nn
from minidist.parallel.parameter_server.layout import load_flat_parameters, shard_ranges
from minidist.parallel.parameter_server.server import ParameterServer
from minidist.tensor import no_grad


def split_rows(count: int, parts: int) -> list[slice]:
    """Contiguous, as-even-as-possible row ranges, one per worker."""
    return [slice(start, stop) for start, stop in shard_ranges(count, parts)]


def linear_regression_gradient(weights: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Mean squared error of ``x @ w + b`` against ``y`` (``weights = [w..., b]``)
    and its gradient: ``(gradient, examples, loss)``, as gradient_fn returns."""
    residual = x @ weights[:-1] + weights[-1] - y
    count = len(y)
    gradient = np.empty_like(weights)
    gradient[:-1] = x.T @ residual * (2 / count)
    gradient[-1] = residual.sum() * (2 / count)
    return gradient, count, float(residual @ residual / count)


def train_linear_regression(steps: int, *, servers: int = 1, mode: str = "bsp", lr: float = 0.1,
                            n_samples: int = 200, n_features: int = 8, noise: float = 0.1,
                            seed: int = 0, batch_size: int | None = None, dtype=np.float64,
                            group=None, **options):
    """The course's example, run on every rank of a launch: workers fit
    ``y = x @ w + b`` on their own rows of ``make_linear_regression(n_samples,
    n_features, noise, seed)`` (its true weights are the answer to compare
    with), starting from zeros. Each step a worker uses its next
    ``batch_size`` rows, cycling (None: all its rows). Returns this rank's result."""
    from minidist.data import make_linear_regression

    x, y, _, _ = make_linear_regression(n_samples, n_features, noise, seed, dtype)
    group = group if group is not None else dist.world_group()
    ps = ParameterServer(np.zeros(n_features + 1, dtype), servers=servers, mode=mode, lr=lr,
                         group=group, **options)
    rows = split_rows(n_samples, ps.layout.workers)

    def gradient_fn(weights, worker, step):
        x_mine, y_mine = x[rows[worker]], y[rows[worker]]
        batch = _batch_rows(len(y_mine), batch_size, step)
        return linear_regression_gradient(weights, x_mine[batch], y_mine[batch])

    return ps.run(steps, gradient_fn)


def _batch_rows(count: int, batch_size: int | None, step: int):
    if batch_size is None or batch_size >= count:
        return slice(None)
    start = (step * batch_size) % count
    return np.arange(start, start + batch_size) % count


def digits_mlp(hidden: int = 32, seed: int = 0, dtype=np.float32) -> nn.Module:
    """The small MLP used on the digits: 64 pixels -> hidden -> 10 classes."""
    nn.init.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)).to(dtype)


def digits_accuracy(weights: np.ndarray, hidden: int = 32, dtype=np.float32) -> float:
    """Test accuracy of the MLP holding ``weights`` on the digits' test split."""
    from minidist.data import load_digits

    _, _, x_test, y_test = load_digits(dtype=dtype)
    model = digits_mlp(hidden, dtype=dtype)
    load_flat_parameters(model, weights)
    with no_grad():
        predicted = model(Tensor(x_test)).data.argmax(axis=1)
    return float((predicted == y_test).mean())


def train_mlp_on_digits(steps: int, *, servers: int = 1, mode: str = "bsp", lr: float = 0.1,
                        batch_size: int = 32, hidden: int = 32, seed: int = 0,
                        dtype=np.float32, straggler: tuple[int, float] | None = None,
                        group=None, **options):
    """Train :func:`digits_mlp` by parameter server, run on every rank of a
    launch. Worker ``k`` holds its own contiguous part of the training set
    and uses its next ``batch_size`` images each step (cross-entropy).
    ``straggler=(worker, seconds)`` makes that worker sleep so long before
    every gradient. Returns this rank's result (workers log their losses)."""
    from minidist.data import load_digits

    x, y, _, _ = load_digits(dtype=dtype)
    model = digits_mlp(hidden, seed, dtype)
    group = group if group is not None else dist.world_group()
    ps = ParameterServer(model, servers=servers, mode=mode, lr=lr, group=group, **options)
    rows = split_rows(len(y), ps.layout.workers)

    def gradient_fn(weights, worker, step):
        if straggler is not None and straggler[0] == worker:
            time.sleep(straggler[1])
        x_mine, y_mine = x[rows[worker]], y[rows[worker]]
        batch = _batch_rows(len(y_mine), batch_size, step)
        load_flat_parameters(model, weights)
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(Tensor(x_mine[batch])), y_mine[batch])
        loss.backward()
        gradient = np.concatenate([p.grad.reshape(-1) for p in model.parameters()
                                   if p.requires_grad])
        return gradient, len(y_mine[batch]), float(loss.data)

    return ps.run(steps, gradient_fn)
