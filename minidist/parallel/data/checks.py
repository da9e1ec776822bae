"""What every data-parallel wrapper checks of what it is given.

The coordinator, DDP and FSDP each take a model to replicate and, every
step, this rank's number of examples (the weight of its gradient in the
exact average over uneven shards). A mistake in either would show up only
as replicas that drift apart, or as an average that is quietly wrong, so
the wrappers refuse them at once, with the same words:

* :func:`_check_model`: a ``minidist.nn.Module`` with at least one
  parameter to train, all of one dtype (the gradients travel as one flat
  array of that dtype);
* :func:`_local_count`: a non-negative whole number of examples;
  :func:`_examples_in` reads it from a forward's arguments (the batch's
  length, or ``batch_size=``).

Cost: one pass over the parameters when a wrapper is built; nothing per step.
"""

from __future__ import annotations

import numpy as np

from minidist import nn


def _check_model(model, who: str) -> list:
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who} wraps a minidist.nn.Module, got {type(model).__name__}")
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ValueError(f"{who}: the model has no parameter that requires a gradient, "
                         "so there is nothing to train in parallel")
    dtypes = {p.data.dtype for p in parameters}
    if len(dtypes) > 1:
        raise TypeError(f"{who}: the parameters have several dtypes ({sorted(map(str, dtypes))}); "
                        "convert the model to one, e.g. model.to(numpy.float32)")
    return parameters


def _local_count(batch_size, rank: int, who: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 0:
        raise ValueError(f"rank {rank}: {who} needs this rank's number of examples as a "
                         f"non-negative int, got {batch_size!r}")
    return int(batch_size)


def _examples_in(args, batch_size, rank: int, who: str) -> int:
    """This rank's number of examples in a forward: ``batch_size`` when given,
    else the length of the first argument (the batch)."""
    if batch_size is None:
        if not args or not hasattr(args[0], "shape") or len(args[0].shape) == 0:
            raise ValueError(f"rank {rank}: {who} could not read the batch size from the "
                             "first argument; pass batch_size=")
        batch_size = args[0].shape[0]
    return _local_count(batch_size, rank, who)
