"""Data for the course: a bundled real data set, synthetic ones, and the loaders that feed ranks.

* :func:`load_digits`: 8x8 handwritten digits shipped inside the package (UCI
  "Optical Recognition of Handwritten Digits", Alpaydin and Kaynak, CC BY 4.0,
  via scikit-learn's copy), with a fixed train/test split; see ``digits.py``.
* :func:`load_shakespeare`: 250 KB of Shakespeare shipped inside the package
  (public domain; the "tiny shakespeare" selection), :class:`CharTokenizer`
  (one token per character), and :class:`RandomWindows` / :func:`split_tokens`
  for the shifted windows a language model trains on.
* :func:`read_idx`, :func:`write_idx`, :func:`load_mnist`: MNIST's IDX files,
  from a directory you downloaded them to (nothing is downloaded for you).
* :func:`make_linear_regression`, :func:`make_spirals`, :func:`make_blobs`,
  :func:`make_sparse_logistic`: synthetic sets with known answers.
* :class:`DataLoader` over an :class:`ArrayDataset` or a tuple ``(x, y)``, and
  :class:`DistributedSampler` for each rank's share in data parallelism.

Everything returns and yields NumPy arrays; none of it knows about processes.
"""

from minidist.data.char_tokenizer import CharTokenizer
from minidist.data.dataset import ArrayDataset
from minidist.data.digits import digits_test_mask, load_digits, load_digits_raw
from minidist.data.idx import IDXFormatError, parse_idx, read_idx, write_idx
from minidist.data.loader import DataLoader
from minidist.data.mnist import MNIST_FILES, load_mnist
from minidist.data.sampler import DistributedSampler
from minidist.data.shakespeare import load_shakespeare
from minidist.data.synthetic import (
    make_blobs,
    make_linear_regression,
    make_sparse_logistic,
    make_spirals,
)
from minidist.data.text_windows import RandomWindows, split_tokens

__all__ = [
    "ArrayDataset",
    "CharTokenizer",
    "DataLoader",
    "DistributedSampler",
    "IDXFormatError",
    "MNIST_FILES",
    "RandomWindows",
    "digits_test_mask",
    "load_digits",
    "load_digits_raw",
    "load_mnist",
    "load_shakespeare",
    "make_blobs",
    "make_linear_regression",
    "make_sparse_logistic",
    "make_spirals",
    "parse_idx",
    "read_idx",
    "split_tokens",
    "write_idx",
]
