"""The 8x8 handwritten digits that ship with minidist: a real data set with no download.

1,797 images of the digits 0-9, 8x8 pixels each, 10 classes. Small enough that
a multilayer perceptron or a tiny CNN trains in seconds on a laptop, real
enough that accuracy means something (around 97% is reachable).

Source and licence: the test partition ("optdigits.tes") of the UCI "Optical
Recognition of Handwritten Digits" data by E. Alpaydin and C. Kaynak (1998),
https://doi.org/10.24432/C50P49, licensed CC BY 4.0, in the copy
redistributed by scikit-learn (BSD-3-Clause) as ``sklearn.datasets.load_digits``.
``scripts/make_digits.py`` converted it once to ``digits.npz`` beside this
file; ``DIGITS_LICENSE.txt`` there says the same.

The train/test split, fixed forever
-----------------------------------
No random generator is involved, so the split cannot change with a NumPy
version. Walk the 1,797 samples in the file's order and count, for each
digit separately, how many samples of that digit came before: the sample is
a *test* sample when that count is 4, 9, 14, ... (``count % 5 == 4``, every
fifth sample of each digit), otherwise a *train* sample. Both parts keep the
file's order.

That gives 1,442 train and 355 test images; each digit has ``n_c // 5`` test
images (35, 36, 35, 36, 36, 36, 36, 35, 34, 36 for the digits 0..9), so the
classes are as balanced in test as in train. The same 13 writers appear in
both parts, so test accuracy here is writer-dependent (a little more
optimistic than UCI's writer-independent protocol).
"""

from __future__ import annotations

from importlib import resources

import numpy as np

NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8)
MAX_PIXEL_VALUE = 16
TEST_EVERY = 5  # every fifth sample of each digit goes to test
TRAIN_SIZE = 1442
TEST_SIZE = 355


def load_digits_raw():
    """All 1,797 samples as stored: ``images`` (1797, 8, 8) uint8 in 0..16, ``labels`` (1797,) uint8."""
    with resources.files(__package__).joinpath("digits.npz").open("rb") as file:
        with np.load(file) as archive:
            return archive["images"], archive["labels"]


def digits_test_mask(labels: np.ndarray) -> np.ndarray:
    """Boolean mask, True for test samples, by the rule in the module docstring.

    ``count`` is the 0-based position of each sample among the samples of its
    own digit, computed with a stable sort instead of a Python loop.
    """
    labels = np.asarray(labels)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    first_of_class = np.searchsorted(sorted_labels, sorted_labels, side="left")
    count = np.empty(len(labels), dtype=np.int64)
    count[order] = np.arange(len(labels)) - first_of_class
    return count % TEST_EVERY == TEST_EVERY - 1


def load_digits(flatten: bool = True, dtype=np.float32):
    """The bundled digits as ``(x_train, y_train, x_test, y_test)``.

    Args:
        flatten: True gives images as rows of 64 pixels, shape (N, 64), for a
            multilayer perceptron; False gives (N, 1, 8, 8), one channel, for
            a CNN.
        dtype: the floating type of the pixels, which are scaled to [0, 1]
            by dividing by 16.

    Returns:
        x_train (1442, 64) or (1442, 1, 8, 8), y_train (1442,) int64,
        x_test (355, 64) or (355, 1, 8, 8), y_test (355,) int64; the split
        is the fixed rule of the module docstring. Fresh arrays on every call,
        so changing them in place cannot affect the next caller.
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(
            f"load_digits(dtype={dtype}) is not a floating type; pixels are scaled to [0, 1], "
            "so pass np.float32 (the default) or np.float64. For the raw 0..16 integers use "
            "load_digits_raw()."
        )
    images, labels = load_digits_raw()
    pixels = images.astype(dtype) / dtype.type(MAX_PIXEL_VALUE)
    pixels = pixels.reshape(len(images), -1) if flatten else pixels[:, None, :, :]
    targets = labels.astype(np.int64)
    test = digits_test_mask(targets)
    train = ~test
    return pixels[train], targets[train], pixels[test], targets[test]
