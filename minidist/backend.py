"""The array module every numerical line of minidist goes through.

NumPy by default. On a machine with an NVIDIA GPU and CuPy installed
(``pip install minidist[gpu]``), ``minidist.backend.use("cupy")`` (or the
environment variable ``MINIDIST_BACKEND=cupy``) makes new tensors live on the
GPU. CuPy mirrors NumPy's API, so the autograd and layers are written once,
against ``xp``, the module returned by :func:`get` or :func:`of`.
"""

from __future__ import annotations

import os

import numpy

_BACKENDS = ("numpy", "cupy")
_current = numpy
#: backend name -> what to run the first time :func:`use` selects it (see when_selected).
_WHEN_SELECTED: dict = {}


def _load_cupy():
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "The 'cupy' backend needs CuPy, which is not installed. Install it with "
            "`pip install minidist[gpu]` (CUDA 12) or pick the right cupy-cudaXXx wheel "
            "for your driver; or stay on the default backend with use('numpy')."
        ) from error
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            f"CuPy is installed but no CUDA device can be used ({error}). "
            "Check `nvidia-smi`, or stay on the default backend with use('numpy')."
        ) from error
    if count == 0:  # pragma: no cover
        raise RuntimeError("CuPy found no CUDA device. Use use('numpy') on this machine.")
    return cupy


def use(name: str):
    """Select the array module for new tensors: ``"numpy"`` or ``"cupy"``."""
    global _current
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {_BACKENDS}")
    _current = numpy if name == "numpy" else _load_cupy()
    for action in _WHEN_SELECTED.pop(name, ()):
        action()
    return _current


def when_selected(backend_name: str, action) -> None:
    """Run ``action()`` now if ``backend_name`` is the backend in use, else the
    first time :func:`use` selects it (minidist.distributed puts its GPU
    staging in place this way, see distributed/device_arrays.py)."""
    if name() == backend_name:
        action()
    else:
        _WHEN_SELECTED.setdefault(backend_name, []).append(action)


def get():
    """The array module new arrays are created with."""
    return _current


def name() -> str:
    return "cupy" if _current is not numpy else "numpy"


def of(array):
    """The array module an existing array belongs to (NumPy or CuPy)."""
    if isinstance(array, numpy.ndarray) or numpy.isscalar(array):
        return numpy
    module = type(array).__module__
    if module.startswith("cupy"):
        import cupy

        return cupy
    return numpy


def from_numpy(array):
    """A host (NumPy) array as the active backend's array: the array itself
    under NumPy, a copy on the device under CuPy. The way back is
    :func:`to_numpy`; a message or a collective's result arrives in host
    memory and goes through here to join the model's arrays."""
    xp = get()
    return array if xp is numpy else xp.asarray(array)


def to_numpy(array, contiguous: bool = False):
    """A NumPy copy (or the array itself) of a NumPy or CuPy array;
    ``contiguous=True`` makes it C-contiguous as well, as a message's buffer
    must be (a copy only where the array is a strided view)."""
    if isinstance(array, numpy.ndarray):
        host = array
    elif type(array).__module__.startswith("cupy"):
        host = array.get()
    else:
        host = numpy.asarray(array)
    return numpy.ascontiguousarray(host) if contiguous else host


if os.environ.get("MINIDIST_BACKEND", "numpy") != "numpy":
    use(os.environ["MINIDIST_BACKEND"])
