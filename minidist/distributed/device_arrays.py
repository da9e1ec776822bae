"""Messages and collectives on GPU arrays (CuPy): staged through host memory.

With ``backend.use("cupy")`` a model's parameters and gradients live on the
GPU, and DDP all-reduces them with the very calls the course wrote for NumPy
arrays. The transports move bytes between processes through pipes, shared
memory or MPI: memory the CPU addresses. So a GPU array takes a detour:

1. before the call, each CuPy array (or Tensor on the GPU) passed to it is
   copied to a host NumPy array (device -> host over PCIe);
2. the call runs on the host copies, unchanged (every algorithm, every
   transport, the trace, the checks);
3. after it (for ``async_op`` / ``isend`` / ``irecv``: when its Work or
   request completes), the host copies of the arrays the call *writes* are
   copied back into the GPU arrays (host -> device).

Cost, for an N-byte array on a link of bandwidth B_pcie: the call's own
cost plus N / B_pcie before and (if it writes the array) N / B_pcie after.
NCCL, or MPI built "CUDA-aware", skips both copies by moving device memory
itself; ``algorithm="native"`` under such an MPI hands the GPU arrays to MPI
directly (see :func:`minidist.distributed.transport.mpi.cuda_aware`,
which asks the library rather than assuming).

Installed only where GPU arrays are in use: when CuPy becomes the array
backend (``backend.use("cupy")`` or ``MINIDIST_BACKEND=cupy``), :func:`install`
replaces each array-taking call of ``minidist.distributed`` with its staged
form (:func:`staged`). Until then ``dist.all_reduce`` and the others are the
plain functions. Once installed, NumPy arrays still go straight through: the
wrapper's first look is one type check.
"""

from __future__ import annotations

import functools

import numpy as np

from minidist import backend

#: For each public call: the parameters it writes into (copied back after the call).
WRITES = {
    "all_reduce": ("tensor",), "broadcast": ("tensor",), "reduce": ("tensor",),
    "all_gather": ("tensor_list",), "all_gather_into_tensor": ("output_tensor",),
    "reduce_scatter": ("output",), "reduce_scatter_tensor": ("output",),
    "all_to_all": ("output_tensor_list",), "all_to_all_single": ("output",),
    "gather": ("gather_list",), "scatter": ("tensor",),
    "send": (), "isend": (), "recv": ("tensor",), "irecv": ("tensor",),
    "recv_reduce": ("tensor",), "irecv_reduce": ("tensor",),
}


def _on_device(value) -> bool:
    module = type(value).__module__
    if module.startswith("cupy"):
        return True
    data = getattr(value, "data", None)
    return data is not None and type(data).__module__.startswith("cupy")


def _any_on_device(args, kwargs) -> bool:
    for value in (*args, *kwargs.values()):
        if type(value) is np.ndarray or value is None:
            continue
        if isinstance(value, (list, tuple)):
            if any(_on_device(item) for item in value):
                return True
        elif _on_device(value):
            return True
    return False


def _device_array(value):
    return value if type(value).__module__.startswith("cupy") else value.data


def _to_host(value, writes: bool, copies: list):
    """``value`` with every GPU array replaced by a host copy; the pairs
    (GPU array, host copy) to copy back are added to ``copies`` if ``writes``."""
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(item, writes, copies) for item in value)
    if value is None or type(value) is np.ndarray or not _on_device(value):
        return value
    device = _device_array(value)
    host = device.get()  # device -> host
    if writes:
        copies.append((device, host))
    return host


def _copy_back(copies) -> None:
    for device, host in copies:  # host -> device
        if device.flags.c_contiguous:
            device.set(host)
        else:
            device[...] = backend.of(device).asarray(host)
    copies.clear()


class StagedWork:
    """The Work (or request) of a staged call: when it completes, the host
    copies it wrote go back to the GPU arrays."""

    def __init__(self, work, copies):
        self._work, self._copies = work, copies

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        _copy_back(self._copies)
        return result

    def test(self) -> bool:
        done = self._work.test()
        if done:
            _copy_back(self._copies)
        return done

    def __getattr__(self, name):
        return getattr(self._work, name)


def staged(function, name: str | None = None):
    """``function`` (a public message or collective call) taking GPU arrays too."""
    name = name or function.__name__
    writes = set(WRITES[name])

    @functools.cache
    def signature():
        # Looked up at the first call with a GPU array: every process imports
        # this module, and inspect's import is a noticeable part of a rank's
        # start (bench_launch measures the start).
        import inspect

        return inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        if (args and type(args[0]) is np.ndarray and not kwargs) \
                or not _any_on_device(args, kwargs):
            return function(*args, **kwargs)
        bound = signature().bind(*args, **kwargs)
        copies: list = []
        for parameter, value in bound.arguments.items():
            bound.arguments[parameter] = _to_host(value, parameter in writes, copies)
        result = function(*bound.args, **bound.kwargs)
        if copies and hasattr(result, "wait"):
            return StagedWork(result, copies)
        _copy_back(copies)
        return result

    return call


_watching = False
_installed = False


def stage_when_on_gpu(face) -> None:
    """:func:`install` into ``face`` (the ``minidist.distributed`` module,
    which hands itself down when it first hands out a call that takes
    arrays: this module never imports the package above it) now if CuPy is
    the array backend, else the moment it becomes it."""
    global _watching
    if not _watching:
        _watching = True
        backend.when_selected("cupy", functools.partial(install, face))


def install(face) -> None:
    """Replace every call of :data:`WRITES` in ``face`` (the
    ``minidist.distributed`` module) with its staged form (once; the
    functions underneath are unchanged)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in WRITES:
        setattr(face, name, staged(getattr(face, name), name))
