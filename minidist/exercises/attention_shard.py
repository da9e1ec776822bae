"""The attention the tensor_parallel_attention exercise runs: one rank's
heads of a :class:`~minidist.models.gpt.CausalSelfAttention`, with the
student's function at Megatron's f and g.

Rank r of n keeps n_head / n heads: the rows of the fused ``c_attn`` that
make their q, k and v (:func:`~minidist.parallel.tensor.gpt.qkv_rows`) and
the columns of ``c_proj`` that read their outputs. The student's
``communicate(array, operator, direction)`` is called at the four points,
each in a trace region named after it ("f forward", ..., where the checker
finds which collective was made where): on x before ``c_attn`` (f) and on
``c_proj``'s partial output (g), going forward, and on their gradients
coming back. Costs: the block's own, over n_head / n heads, plus what the
student's function sends.
"""

from __future__ import annotations

import numpy as np

from minidist import trace
from minidist.models.gpt import CausalSelfAttention
from minidist.nn import functional as F
from minidist.nn.parameter import Parameter
from minidist.parallel.tensor.gpt import qkv_rows
from minidist.tensor import Tensor


def _call(communicate, array, operator: str, direction: str):
    """The student's function at one point, in a trace region named after
    it. It gets its own contiguous copy, to change in place or not."""
    given = np.array(array, dtype=np.float64, copy=True, order="C")
    with trace.region(f"{operator} {direction}"):
        out = communicate(given, operator, direction)
    if not isinstance(out, np.ndarray) or out.shape != given.shape:
        got = (f"an array of shape {out.shape}" if isinstance(out, np.ndarray)
               else type(out).__name__)
        raise TypeError(f"attention_communication(array, {operator!r}, {direction!r}) "
                        f"returned {got}, expected an array of shape {given.shape}: return "
                        "the array to pass on (the one you were given, changed in place, "
                        "or a new one)")
    return np.asarray(out, dtype=np.float64)


def _point(tensor: Tensor, operator: str, communicate) -> Tensor:
    """An autograd node that calls ``communicate`` on the values going
    forward and on the gradient coming back: Megatron's f or g, written by
    the student."""
    out = _call(communicate, tensor.data, operator, "forward")
    return Tensor._make(out, (tensor,),
                        lambda grad: (_call(communicate, grad, operator, "backward"),),
                        f"{operator} (tensor-parallel)")


class AttentionShard:
    """Rank ``rank``'s n_head / n heads of ``attention`` (a whole
    :class:`~minidist.models.gpt.CausalSelfAttention`), with the student's
    ``communicate`` at f and g. The forward is the block's own with two
    changes: c_attn's and c_proj's weights are this rank's shards, and
    c_proj's bias is added after g (once, to the sum, not by every rank to
    its term)."""

    def __init__(self, attention: CausalSelfAttention, rank: int, world_size: int,
                 communicate):
        width = attention.n_embd
        rows = qkv_rows(width, attention.n_head, rank, world_size)
        columns = slice(rank * width // world_size, (rank + 1) * width // world_size)
        self.heads, self.head_dim = attention.n_head // world_size, attention.head_dim
        self.communicate = communicate
        #: which part of the whole parameter each shard is
        self.pieces = {"c_attn.weight": rows, "c_attn.bias": rows,
                       "c_proj.weight": (slice(None), columns),
                       "c_proj.bias": slice(None)}   # replicated
        whole = dict(attention.named_parameters())
        self.parameters = {name: Parameter(whole[name].data[piece].copy())
                           for name, piece in self.pieces.items()}

    def __call__(self, x: Tensor) -> Tensor:
        p = self.parameters
        x = _point(x, "f", self.communicate)
        qkv = F.linear(x, p["c_attn.weight"], p["c_attn.bias"])  # my heads' q, k, v
        batch, steps, _ = qkv.shape
        qkv = qkv.reshape(batch, steps, 3, self.heads, self.head_dim).transpose(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(batch, steps, self.heads * self.head_dim)
        partial = F.linear(y, p["c_proj.weight"])  # one term of c_proj's product
        return _point(partial, "g", self.communicate) + p["c_proj.bias"]
