"""Every communication hook of DDP by name, with what one rank sends.

The hooks of :mod:`.compression` (fewer bits, fewer values) and of
:mod:`.powersgd` (low rank), read after them, as one table for the lessons
and experiments that try them in turn. For a bucket of n values of s bytes
on N ranks, what one rank sends per bucket and step (the formulas of each
hook's docstring):

==============  ==================================================
``allreduce``   2 (N - 1) / N n s (ring): the uncompressed baseline
``fp16``        2 (N - 1) / N n 2
``bf16``        (N - 1) n 2 (an all-gather: no bfloat16 sums)
``int8``        (N - 1) (n + 8)
``sign``        (N - 1) (ceil(n / 8) + 8)
``threshold``   (N - 1) (8 + m (4 + s)), m the largest count sent
``topk``        (N - 1) (8 + k (4 + s))
``randomk``     (N - 1) (8 + k (4 + s))
``powersgd``    2 (N - 1) / N s (sum of r (n + m), and the small tensors)
==============  ==================================================
"""

from __future__ import annotations

from minidist.parallel.data.compression import (
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
    int8_hook,
    randomk_hook,
    sign_hook,
    threshold_hook,
    topk_hook,
)
from minidist.parallel.data.powersgd import powersgd_hook

HOOKS = {
    "allreduce": allreduce_hook,
    "fp16": fp16_compress_hook,
    "bf16": bf16_compress_hook,
    "int8": int8_hook,
    "sign": sign_hook,
    "threshold": threshold_hook,
    "topk": topk_hook,
    "randomk": randomk_hook,
    "powersgd": powersgd_hook,
}
