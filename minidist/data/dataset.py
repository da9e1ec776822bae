"""ArrayDataset: several arrays that share their first axis, indexed together.

A data set here is anything with ``len()`` and ``[indices]``, where
``indices`` is an integer array and the result is one batch. Indexing with an
array (NumPy's fancy indexing) gathers a whole batch in one C loop, which is
why the loader never touches samples one by one in Python.
"""

from __future__ import annotations

import numpy as np


class ArrayDataset:
    """Arrays ``x, y, ...`` with equal first dimension; ``dataset[indices]`` is a tuple of batches.

    >>> data = ArrayDataset(np.zeros((5, 3)), np.arange(5))
    >>> len(data), [a.shape for a in data[np.array([4, 0])]]
    (5, [(2, 3), (2,)])
    """

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array, e.g. ArrayDataset(x, y)")
        arrays = tuple(np.asarray(array) for array in arrays)
        for position, array in enumerate(arrays):
            if array.ndim == 0:
                raise ValueError(
                    f"array {position} is a scalar; every array needs a first axis that "
                    "counts the samples"
                )
        lengths = [len(array) for array in arrays]
        if len(set(lengths)) > 1:
            raise ValueError(
                f"arrays have different numbers of samples (first dimensions {lengths}); "
                "x and y must describe the same samples, one row each."
            )
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index):
        return tuple(array[index] for array in self.arrays)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{array.dtype}{list(array.shape)}" for array in self.arrays)
        return f"ArrayDataset({shapes})"
