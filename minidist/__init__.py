"""minidist: learn parallel and distributed training of neural networks by running it.

The layers, bottom to top (see the README):

* ``minidist.backend``   the array module (NumPy, or CuPy on a GPU)
* ``minidist.tensor``    the autograd ``Tensor``
* ``minidist.nn``, ``minidist.optim``, ``minidist.data``  layers, optimizers, datasets
* ``minidist.distributed``  processes, transports, point-to-point and collectives
* ``minidist.parallel``  the parallel training strategies of the course
"""

__version__ = "0.1.0"

#: What ``minidist`` offers from :mod:`minidist.tensor` (the autograd).
_TENSOR_NAMES = ("Tensor", "cat", "concatenate", "enable_grad", "is_grad_enabled", "matmul",
                 "maximum", "minimum", "no_grad", "ones", "split", "stack", "where", "zeros")

__all__ = [
    "Tensor", "no_grad", "enable_grad", "is_grad_enabled", "matmul", "concatenate", "cat", "stack", "split",
    "where", "maximum", "minimum", "zeros", "ones", "launch", "__version__",
]


def __getattr__(name):
    # Everything is imported when first asked for, not by `import minidist`:
    # each process of `minidist run` imports the package, and the launching
    # one must start the workers before it has paid for NumPy (see run_script).
    if name in _TENSOR_NAMES or name == "tensor":
        import minidist.tensor as tensor

        return tensor if name == "tensor" else getattr(tensor, name)
    # launch pulls in multiprocessing machinery; import it only when asked so
    # that `import minidist` stays light for the single-process chapters.
    if name == "launch":
        from minidist.distributed.launch import launch

        return launch
    raise AttributeError(f"module 'minidist' has no attribute {name!r}")
