"""``loss_parallel()``: the cross entropy of logits sharded by class, without
gathering them (torch's ``torch.distributed.tensor.parallel.loss_parallel``).

A ColwiseParallel ``lm_head`` with ``use_local_output=False`` leaves logits
``Shard(-1)``: each rank holds its words' columns. Gathering the whole
vocabulary for the loss would cost (n-1)/n of the logits per rank; inside
``with loss_parallel():`` ``F.cross_entropy`` of (N, classes) ``Shard(1)``
logits instead reduces three numbers per row (the row max, the sum of
exponentials, the target's logit: Megatron's vocabulary-parallel loss) and
the backward needs no message (each rank's columns of softmax - onehot).
Outside the context the same call is refused, as torch does. ::

    with loss_parallel():
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()

The rule itself is :mod:`minidist.distributed.tensor.ops`' (reached through
that face); this context only opens it. Cost: 3 all_reduces of N numbers
forward, none backward.
"""

from __future__ import annotations

import contextlib

from minidist.distributed.tensor import loss_parallel_depth


@contextlib.contextmanager
def loss_parallel():
    """Within it, ``F.cross_entropy`` takes class-sharded DTensor logits."""
    depth = loss_parallel_depth()
    depth[0] += 1
    try:
        yield
    finally:
        depth[0] -= 1


__all__ = ["loss_parallel"]
