"""MNIST (or Fashion-MNIST) from the four standard IDX files in a directory you downloaded.

minidist never downloads anything: put the files in a directory once and
point :func:`load_mnist` at it. Each may be plain or gzip-compressed::

    train-images-idx3-ubyte[.gz]   60,000 images, 28x28, uint8
    train-labels-idx1-ubyte[.gz]   60,000 labels 0..9
    t10k-images-idx3-ubyte[.gz]    10,000 images
    t10k-labels-idx1-ubyte[.gz]    10,000 labels

Fashion-MNIST uses the same names and format, so the same function reads it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minidist.data.idx import IDXFormatError, read_idx

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
MNIST_DOWNLOAD_HINT = (
    "Download the four files (the .gz versions are fine, no need to unpack) from a "
    "mirror such as https://ossci-datasets.s3.amazonaws.com/mnist/ (the copy torchvision "
    "uses) or http://yann.lecun.com/exdb/mnist/, and put them in that directory. "
    "For Fashion-MNIST: https://github.com/zalandoresearch/fashion-mnist (data/fashion)."
)


def find_mnist_file(directory, name: str) -> Path:
    """The path of ``name`` or ``name.gz`` in ``directory``; a clear FileNotFoundError if neither exists."""
    directory = Path(directory)
    for candidate in (directory / name, directory / (name + ".gz")):
        if candidate.is_file():
            return candidate
    if not directory.is_dir():
        raise FileNotFoundError(
            f"MNIST directory {str(directory)!r} does not exist. Create it and fill it with "
            f"{', '.join(MNIST_FILES.values())} (each may end in .gz). {MNIST_DOWNLOAD_HINT}"
        )
    raise FileNotFoundError(
        f"MNIST file {name!r} (or {name + '.gz'!r}) is missing from {str(directory)!r}. "
        f"{MNIST_DOWNLOAD_HINT}"
    )


def _images_and_labels(directory, images_name: str, labels_name: str):
    images_path = find_mnist_file(directory, images_name)
    labels_path = find_mnist_file(directory, labels_name)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise IDXFormatError(
            f"{images_path} holds an array of shape {images.shape}; MNIST images must be "
            "(count, height, width). Is it a labels file under an images name?"
        )
    if labels.ndim != 1:
        raise IDXFormatError(
            f"{labels_path} holds an array of shape {labels.shape}; MNIST labels must be "
            "(count,). Is it an images file under a labels name?"
        )
    if len(images) != len(labels):
        raise IDXFormatError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} "
            "labels; the two files come from different data sets or one is damaged."
        )
    return images, labels


def load_mnist(directory, flatten: bool = True, dtype=np.float32):
    """MNIST from ``directory`` as ``(x_train, y_train, x_test, y_test)``.

    Same conventions as :func:`minidist.data.load_digits`: pixels scaled to
    [0, 1] (divided by 255) in ``dtype``; ``flatten=True`` gives (N, 784),
    ``flatten=False`` gives (N, 1, 28, 28); labels int64. The split is
    MNIST's own (60,000 train, 10,000 test).

    Raises:
        FileNotFoundError: naming the missing file and where to download it.
        IDXFormatError: a file is damaged, or images and labels disagree.
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(
            f"load_mnist(dtype={dtype}) is not a floating type; pixels are scaled to [0, 1], "
            "so pass np.float32 (the default) or np.float64. For the raw bytes use read_idx()."
        )
    parts = []
    for split in ("train", "test"):
        images, labels = _images_and_labels(
            directory, MNIST_FILES[f"{split}_images"], MNIST_FILES[f"{split}_labels"]
        )
        pixels = images.astype(dtype) / dtype.type(255)
        pixels = pixels.reshape(len(images), -1) if flatten else pixels[:, None, :, :]
        parts += [pixels, labels.astype(np.int64)]
    return tuple(parts)
