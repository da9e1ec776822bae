"""MultiheadAttention: attention with learned projections, split into heads
(Vaswani et al., 2017; torch's ``nn.MultiheadAttention``).

For inputs of width E = embed_dim and H = num_heads heads of D = E / H:

    q, k, v = query W_q^T + b_q, key W_k^T + b_k, value W_v^T + b_v
    each split into H heads of width D:  (N, L, E) -> (N, H, L, D)
    o_h = softmax(q_h k_h^T / sqrt(D) + mask) v_h     for every head h
    out = concat_h(o_h) W_o^T + b_o

The heads are stacked on an axis, so all of them are one batched matmul and
one node (:func:`functional.scaled_dot_product_attention`); tensor
parallelism will later split exactly that axis across ranks.

Parameters with torch's names and shapes, so that state dicts load both
ways: ``in_proj_weight`` (3E, E) (W_q, W_k, W_v stacked), ``in_proj_bias``
(3E,), ``out_proj.weight`` (E, E) and ``out_proj.bias`` (E,).

Cost, for N sequences of L queries and S keys: 2 N (L + 2 S) E^2 flops for
the input projections, 4 N L S E for the attention (scores and weighted sum),
2 N L E^2 for the output projection; backward twice that. Memory: the
(N, H, L, S) attention weights are kept for backward, the L^2 term that
grows with the context.
"""

from __future__ import annotations

import numpy

from minidist import backend
from minidist.nn import functional as F
from minidist.nn import init
from minidist.nn.linear import Linear
from minidist.nn.module import Module
from minidist.nn.parameter import Parameter
from minidist.tensor import Tensor, _shape_str


class MultiheadAttention(Module):
    """``MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
    batch_first=False, rng=None, dtype=float32)``.

    Defaults as torch's, so that a ported script computes the same values:
    inputs are (L, N, E) (sequence first) unless ``batch_first=True`` asks
    for (N, L, E), and ``forward`` returns the attention weights unless
    ``need_weights=False``. A 2-D input (L, E) is one unbatched sequence, as
    torch.

    Initialisation, as torch's ``_reset_parameters``: ``in_proj_weight``
    from xavier_uniform_ (fans E and 3E), ``in_proj_bias`` and
    ``out_proj.bias`` zero, ``out_proj.weight`` as any Linear's
    (kaiming_uniform_ with a=sqrt(5); torch's out_proj is a
    NonDynamicallyQuantizableLinear, a plain Linear by another name so that
    quantisation leaves it alone). Draws come from ``rng`` (a Generator or
    int seed) or the default generator of :mod:`minidist.nn.init`; dropout
    on the attention weights too, in training mode only.

    torch's ``add_bias_kv``, ``add_zero_attn`` and ``kdim``/``vdim`` other
    than embed_dim are not implemented and are refused.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, rng=None, dtype=numpy.float32):
        super().__init__()
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim={embed_dim} must be a positive multiple of "
                             f"num_heads={num_heads} (each head gets embed_dim // num_heads features)")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise NotImplementedError(
                "MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim different from embed_dim "
                "are not implemented; project key and value to embed_dim with a Linear first")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        self.embed_dim = int(embed_dim)
        self.num_heads = int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        rng = init.as_generator(rng) if rng is not None else None
        self.rng = rng
        xp = backend.get()
        self.in_proj_weight = Parameter(xp.empty((3 * embed_dim, embed_dim), dtype=dtype))
        if bias:
            self.in_proj_bias = Parameter(xp.empty((3 * embed_dim,), dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, rng=rng, dtype=dtype)
        self.reset_parameters(rng)

    def reset_parameters(self, rng=None):
        """Draw fresh weights as the class docstring says."""
        init.xavier_uniform_(self.in_proj_weight, rng=rng)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _project(self, query, key, value):
        """q, k, v (N, H, length, D) from the inputs (N, length, E)."""
        E = self.embed_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:
            # Self-attention: one GEMM for the three projections.
            qkv = F.linear(query, w, b)
            parts = [qkv[..., i * E:(i + 1) * E] for i in range(3)]
        else:
            parts = [F.linear(x, w[i * E:(i + 1) * E], None if b is None else b[i * E:(i + 1) * E])
                     for i, x in enumerate((query, key, value))]
        heads = []
        for part in parts:
            n, length, _ = part.shape
            heads.append(part.reshape(n, length, self.num_heads, self.head_dim).transpose(0, 2, 1, 3))
        return heads

    def _mask(self, attn_mask, key_padding_mask, is_causal, n, target_len, source_len, dtype):
        """``(float mask (N|1, H|1, L, S) to add, or None; is_causal for SDPA)``.
        torch's masks say True where a pair must NOT take part (the
        opposite of scaled_dot_product_attention's boolean masks); they are
        turned into -inf to add, as torch does."""
        xp = backend.get()

        def additive(mask, name):
            mask = mask.data if isinstance(mask, Tensor) else mask
            mask = xp.asarray(mask)
            if mask.dtype == bool:
                return xp.where(mask, -numpy.inf, 0.0).astype(dtype)
            if not numpy.issubdtype(mask.dtype, numpy.floating):
                raise TypeError(f"MultiheadAttention: {name} must be boolean (True = masked out, as "
                                f"torch) or floating (added to the scores), got dtype {mask.dtype}")
            return mask.astype(dtype, copy=False)

        mask = None
        if attn_mask is not None:
            mask = additive(attn_mask, "attn_mask")
            if mask.shape == (target_len, source_len):
                pass
            elif mask.shape == (n * self.num_heads, target_len, source_len):
                mask = mask.reshape(n, self.num_heads, target_len, source_len)
            else:
                raise ValueError(
                    f"MultiheadAttention: attn_mask has shape {_shape_str(mask.shape)}; expected "
                    f"(L, S) = ({target_len}, {source_len}) or (N * num_heads, L, S) = "
                    f"({n * self.num_heads}, {target_len}, {source_len})")
        elif is_causal:
            if key_padding_mask is None:
                return None, True
            causal = xp.tril(xp.ones((target_len, source_len), dtype=bool))
            mask = xp.where(causal, 0.0, -numpy.inf).astype(dtype)
        if key_padding_mask is not None:
            padding = additive(key_padding_mask, "key_padding_mask")
            if padding.shape != (n, source_len):
                raise ValueError(f"MultiheadAttention: key_padding_mask has shape {_shape_str(padding.shape)}; "
                                 f"expected (N, S) = ({n}, {source_len})")
            padding = padding.reshape(n, 1, 1, source_len)
            mask = padding if mask is None else mask + padding
        return mask, False

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        """``(output, weights or None)``, as torch: output of the query's
        shape; with ``need_weights=True`` the attention weights (after
        dropout), (N, L, S) averaged over the heads or (N, H, L, S) with
        ``average_attn_weights=False``, as a Tensor outside the graph (torch's
        carry a gradient).

        Masks as torch's: ``attn_mask`` (L, S) or (N * num_heads, L, S) and
        ``key_padding_mask`` (N, S), boolean with True = may NOT attend, or
        floating, added to the scores. ``is_causal=True`` applies the causal
        mask when ``attn_mask`` is None (torch insists on being given the mask
        too, and takes is_causal as a hint about it; here a given attn_mask is
        used as it is). ``need_weights=False`` (as most transformer code passes)
        skips averaging and returning the weights.
        """
        shapes = {x.ndim for x in (query, key, value)}
        if shapes not in ({2}, {3}):
            raise ValueError(
                f"MultiheadAttention: query, key and value must all be 3-D ((N, L, E) with batch_first, "
                f"(L, N, E) without) or all 2-D (one unbatched sequence), got shapes "
                f"{_shape_str(query.shape)}, {_shape_str(key.shape)}, {_shape_str(value.shape)}")
        batched = shapes == {3}
        same = query is key and key is value
        if not batched:
            query, key, value = (x.reshape(1, *x.shape) for x in (query, key, value))
        elif not self.batch_first:
            query, key, value = (x.transpose(1, 0, 2) for x in (query, key, value))
        if same:
            key = value = query
        if query.shape[-1] != self.embed_dim or key.shape[-1] != self.embed_dim or value.shape[-1] != self.embed_dim:
            raise ValueError(f"MultiheadAttention: inputs must have {self.embed_dim} features on their last "
                             f"axis (embed_dim), got {_shape_str(query.shape)}, {_shape_str(key.shape)}, "
                             f"{_shape_str(value.shape)}")
        n, target_len, _ = query.shape
        source_len = key.shape[1]
        dtype = self.in_proj_weight.data.dtype
        mask, causal = self._mask(attn_mask, key_padding_mask, is_causal, n, target_len, source_len, dtype)
        q, k, v = self._project(query, key, value)
        dropout_p = self.dropout if self.training else 0.0
        heads, weights = F._attention(q, k, v, mask, dropout_p, causal, None, self.rng,
                                      "MultiheadAttention")
        out = self.out_proj(heads.transpose(0, 2, 1, 3).reshape(n, target_len, self.embed_dim))
        if not batched:
            out = out.reshape(target_len, self.embed_dim)
        elif not self.batch_first:
            out = out.transpose(1, 0, 2)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(axis=1)
        if not batched:
            weights = weights[0]
        return out, Tensor(weights)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"bias={self.in_proj_bias is not None}, batch_first={self.batch_first}")
