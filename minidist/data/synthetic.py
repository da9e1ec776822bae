"""Synthetic data sets whose answer is known, so a training run can be checked against it.

* :func:`make_linear_regression`: y = x @ w + b + noise with the true w and b
  returned, for the parameter-server chapter (did the workers find w?).
* :func:`make_spirals` and :func:`make_blobs`: 2-D classification that can be
  drawn, hard (spirals need a hidden layer) and easy (blobs are nearly
  linearly separable).
* :func:`make_sparse_logistic`: binary classification where each sample
  touches only a few features, the setting where Hogwild's lock-free updates
  rarely collide.

Every function takes a ``seed`` and draws from its own
``np.random.default_rng(seed)``, so the same call gives the same data and
the global NumPy random state is never touched.
"""

from __future__ import annotations

import numpy as np


def _check_positive(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(value)


def _check_noise(noise) -> float:
    if not noise >= 0:  # also rejects NaN
        raise ValueError(f"noise is a standard deviation and must be >= 0, got {noise!r}")
    return float(noise)


def _class_sizes(n_samples: int, n_classes: int) -> np.ndarray:
    # As even as possible: the first n_samples % n_classes classes get one more.
    sizes = np.full(n_classes, n_samples // n_classes)
    sizes[: n_samples % n_classes] += 1
    return sizes


def make_linear_regression(
    n_samples: int = 1000,
    n_features: int = 10,
    noise: float = 0.1,
    seed: int = 0,
    dtype=np.float32,
):
    """A linear regression problem with known answer.

    x ~ N(0, 1) of shape (n_samples, n_features); true weights ~ N(0, 1) of
    shape (n_features,); true bias ~ N(0, 1), a float;
    ``y = x @ true_weights + true_bias + noise * N(0, 1)``, shape (n_samples,).

    With ``noise = 0`` least squares recovers the weights exactly; with noise
    sigma the error of each recovered weight shrinks like sigma / sqrt(n_samples).

    Returns:
        (x, y, true_weights, true_bias); arrays in ``dtype``, bias a Python float.
    """
    n_samples = _check_positive("n_samples", n_samples)
    n_features = _check_positive("n_features", n_features)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    true_weights = rng.standard_normal(n_features)
    true_bias = float(rng.standard_normal())
    x = rng.standard_normal((n_samples, n_features))
    y = x @ true_weights + true_bias + noise * rng.standard_normal(n_samples)
    return x.astype(dtype), y.astype(dtype), true_weights.astype(dtype), true_bias


def make_spirals(
    n_samples: int = 300,
    n_classes: int = 3,
    noise: float = 0.2,
    seed: int = 0,
    dtype=np.float32,
):
    """Interleaved spiral arms in 2-D, one per class (the CS231n classic).

    Arm k has points at radius r in [0, 1] and angle
    ``4 * k + 4 * r + noise * N(0, 1)`` radians, i.e. each arm turns about
    two-thirds of a circle and the arms start 4 radians apart. No straight
    line separates them, so a linear classifier stays near chance and a
    small MLP learns them.

    Returns:
        x (n_samples, 2) in ``dtype`` within [-1, 1], y (n_samples,) int64;
        classes as even as possible in size, samples grouped by class.
    """
    n_samples = _check_positive("n_samples", n_samples)
    n_classes = _check_positive("n_classes", n_classes)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    sizes = _class_sizes(n_samples, n_classes)
    y = np.repeat(np.arange(n_classes, dtype=np.int64), sizes)
    # Position along the arm, 0 at the centre and 1 at the tip, per class.
    start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    along = (np.arange(n_samples) - start) / np.maximum(np.repeat(sizes, sizes) - 1, 1)
    angle = 4.0 * y + 4.0 * along + noise * rng.standard_normal(n_samples)
    x = np.stack([along * np.sin(angle), along * np.cos(angle)], axis=1)
    return x.astype(dtype), y


def make_blobs(
    n_samples: int = 300,
    n_classes: int = 3,
    noise: float = 1.0,
    seed: int = 0,
    n_features: int = 2,
    radius: float = 5.0,
    dtype=np.float32,
):
    """Gaussian blobs, one per class, with centres evenly spaced on a circle.

    Class k is centred at ``radius * (cos(2 pi k / n_classes), sin(2 pi k / n_classes))``
    in the first two features (0 in any further ones) and spread by
    ``noise * N(0, 1)`` in every feature. Fixed centres rather than random
    ones keep the classes apart for every seed: with the defaults neighbouring
    centres are 8.7 apart, so the blobs barely overlap.

    Returns:
        x (n_samples, n_features) in ``dtype``, y (n_samples,) int64; classes
        as even as possible in size, samples grouped by class.
    """
    n_samples = _check_positive("n_samples", n_samples)
    n_classes = _check_positive("n_classes", n_classes)
    n_features = _check_positive("n_features", n_features, minimum=2)
    noise = _check_noise(noise)
    rng = np.random.default_rng(seed)
    angles = 2.0 * np.pi * np.arange(n_classes) / n_classes
    centres = np.zeros((n_classes, n_features))
    centres[:, 0], centres[:, 1] = radius * np.cos(angles), radius * np.sin(angles)
    y = np.repeat(np.arange(n_classes, dtype=np.int64), _class_sizes(n_samples, n_classes))
    x = centres[y] + noise * rng.standard_normal((n_samples, n_features))
    return x.astype(dtype), y


def make_sparse_logistic(
    n_samples: int = 1000,
    n_features: int = 100,
    nonzeros_per_sample: int = 5,
    seed: int = 0,
    weight_scale: float = 2.0,
    dtype=np.float32,
):
    """Binary classification with sparse features and a known logistic model.

    Each sample has exactly ``nonzeros_per_sample`` nonzero features, at
    distinct random positions, with values ~ N(0, 1). True weights ~
    ``weight_scale * N(0, 1)``; labels are drawn from the model itself,
    ``y ~ Bernoulli(sigmoid(x @ true_weights))``, so logistic regression is
    exactly the right model and its best accuracy is below 100% only by the
    coin flips near the boundary.

    Why sparse: one SGD step on one sample changes only the weights of that
    sample's nonzero features (``np.flatnonzero(x[i])``). Two workers updating
    shared weights without locks (Hogwild) then rarely touch the same
    weight: with s nonzeros among d features, two samples share a feature
    with probability about s * s / d.

    Returns:
        (x, y, true_weights): x (n_samples, n_features) dense ``dtype`` array,
        mostly zeros; y (n_samples,) int64 in {0, 1}; true_weights (n_features,).
    """
    n_samples = _check_positive("n_samples", n_samples)
    n_features = _check_positive("n_features", n_features)
    nonzeros_per_sample = _check_positive("nonzeros_per_sample", nonzeros_per_sample)
    if nonzeros_per_sample > n_features:
        raise ValueError(
            f"nonzeros_per_sample={nonzeros_per_sample} exceeds n_features={n_features}; "
            "a sample cannot have more nonzero features than there are features."
        )
    rng = np.random.default_rng(seed)
    true_weights = weight_scale * rng.standard_normal(n_features)
    # Distinct positions per row without a Python loop: the first s columns
    # of a random ordering of each row, found by sorting random keys.
    positions = np.argsort(rng.random((n_samples, n_features)), axis=1)[:, :nonzeros_per_sample]
    x = np.zeros((n_samples, n_features))
    rows = np.arange(n_samples)[:, None]
    x[rows, positions] = rng.standard_normal((n_samples, nonzeros_per_sample))
    probability = 1.0 / (1.0 + np.exp(-(x @ true_weights)))
    y = (rng.random(n_samples) < probability).astype(np.int64)
    return x.astype(dtype), y, true_weights.astype(dtype)
