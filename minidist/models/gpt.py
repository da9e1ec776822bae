"""A GPT: the decoder-only transformer of GPT-2 (Radford et al., 2019), small enough for one core.

For a batch of B sequences of T token ids (T <= block_size):

    x = wte[idx] + wpe[0..T-1]                        (B, T, C)   C = n_embd
    repeat n_layer times (a Block, pre-LayerNorm):
        x = x + attn(ln_1(x))                         causal self-attention
        x = x + mlp(ln_2(x))                          C -> 4C -> GELU -> C
    logits = ln_f(x) wte^T                            (B, T, vocab_size)

* **Causal self-attention** (:class:`CausalSelfAttention`): one Linear makes
  queries, keys and values for every position, (B, T, 3C); they are split
  into n_head heads of D = C / n_head, (B, H, T, D), and
  ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` lets position
  t look at positions 0..t only; the heads are concatenated and projected
  back, (B, T, C). The heads sit on their own axis of one tensor, which is
  the axis tensor parallelism will split (each rank a share of the heads and
  the matching columns of ``c_attn`` and rows of ``c_proj``), as Megatron-LM
  does. ``nn.MultiheadAttention`` would compute the same, but keeps that
  axis inside; written out here, the split is visible.
* **Pre-LayerNorm** (GPT-2's order): each sublayer normalises its input and
  adds its output to the residual stream, which is never normalised itself,
  so gradients reach the embeddings through the additions unchanged.
* **Tied output layer**: the logits are the final features times the token
  embedding's transpose, ``wte.weight`` serving both ends (Press and Wolf,
  2017): one (vocab, C) matrix, trained by both uses (its gradient is the
  sum of the two).

Initialisation as GPT-2 and nanoGPT: every Linear and Embedding weight from
N(0, 0.02), biases zero, LayerNorms one and zero, and the two projections
that write into the residual stream (``attn.c_proj``, ``mlp.c_proj``) from
N(0, 0.02 / sqrt(2 n_layer)), so the stream's variance does not grow with
depth. Parameter names are nanoGPT's (``transformer.wte.weight``,
``transformer.h.0.attn.c_attn.weight``, ...) in torch's (out, in) layout.

Cost per token, forward: about 2 N flops for the N parameters outside the
embeddings (24 C^2 per layer: 6 C^2 for c_attn, 2 C^2 for c_proj, 16 C^2 for
the MLP; plus 2 C V for the logits) and 4 T C per layer for attention
(scores and weighted sum, half of them masked but computed); backward twice
that. Memory: the activations each block keeps for backward, among them the
(B, H, T, T) attention weights that grow with the square of the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy

from minidist import backend
from minidist.nn import GELU, Embedding, LayerNorm, Linear, Module, ModuleList, init
from minidist.nn import functional as F
from minidist.tensor import Tensor

INIT_STD = 0.02  # GPT-2's N(0, 0.02) for every weight matrix


@dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT: ``vocab_size`` (from the tokenizer),
    ``block_size`` (the longest context), ``n_layer`` blocks, ``n_head``
    heads, width ``n_embd`` (a multiple of ``n_head``), ``bias`` in the
    Linears and LayerNorms, and the MLP's GELU: ``"none"`` (the exact erf
    form, torch's ``nn.GELU()`` default and nanoGPT's) or ``"tanh"`` (GPT-2's
    approximation)."""

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    bias: bool = True
    gelu: str = "none"

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, (int, numpy.integer)) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd={self.n_embd} must be a multiple of n_head={self.n_head} "
                f"(each head gets n_embd / n_head features); try n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"GPTConfig: gelu must be 'tanh' or 'none', got {self.gelu!r}")


class CausalSelfAttention(Module):
    """Multi-head causal self-attention: ``c_attn`` (C -> 3C: q, k, v),
    the heads through ``F.scaled_dot_product_attention(..., is_causal=True)``,
    ``c_proj`` (C -> C). Input and output (B, T, C)."""

    def __init__(self, config: GPTConfig, rng=None, dtype=numpy.float32):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias, rng=rng, dtype=dtype)
        self.c_proj = Linear(config.n_embd, config.n_embd, bias=config.bias, rng=rng, dtype=dtype)

    def attend(self, q, k, v):
        """The heads' causal attention, (B, H, T, D) each. A hook: context
        parallelism sets it to attention across the ranks' pieces of the
        sequence (minidist.parallel.context.gpt)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x, cache=None):
        """``cache``: this layer's part of a :class:`~minidist.models.kv_cache.KVCache`
        (generation): the new positions' keys and values join the cached ones,
        and the queries attend over all of them."""
        heads, head_dim = self.n_head, self.head_dim
        qkv = self.c_attn(x)
        # Sized from c_attn's output and head_dim, not from x: a tensor-parallel
        # shard's c_attn makes the q, k, v of its n_head / tp heads only.
        batch, steps, width = qkv.shape
        if width != 3 * heads * head_dim:
            raise ValueError(
                f"CausalSelfAttention: c_attn gives {width} features, {width // (3 * head_dim)} heads "
                f"of {head_dim}, but n_head={heads}; after splitting c_attn by heads over tp ranks "
                f"set n_head to n_head // tp (as torchtitan does)")
        # (B, T, 3C) -> (3, B, H, T, D): q, k and v, each with the heads on axis 1.
        qkv = qkv.reshape(batch, steps, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if cache is None:
            y = self.attend(q, k, v)  # (B, H, T, D)
        else:
            if "attend" in self.__dict__:  # a strategy's attention (context parallelism)
                raise ValueError("CausalSelfAttention: this layer's attention was replaced (context "
                                 "parallelism sets attend), and a KV cache would bypass it; "
                                 "generate with use_cache=False")
            prompt = cache.is_prompt  # a prompt attends causally; a later token to every position
            keys, values = cache.append(k.data, v.data)
            y = F.scaled_dot_product_attention(q, Tensor(keys), Tensor(values), is_causal=prompt)
        y = y.transpose(0, 2, 1, 3).reshape(batch, steps, heads * head_dim)  # heads side by side
        return self.c_proj(y)


class MLP(Module):
    """``c_fc`` (C -> 4C), GELU, ``c_proj`` (4C -> C): the position-wise feed-forward layer."""

    def __init__(self, config: GPTConfig, rng=None, dtype=numpy.float32):
        super().__init__()
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, bias=config.bias, rng=rng, dtype=dtype)
        self.gelu = GELU(approximate=config.gelu)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, bias=config.bias, rng=rng, dtype=dtype)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(Module):
    """One pre-LayerNorm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: GPTConfig, rng=None, dtype=numpy.float32):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias, dtype=dtype)
        self.attn = CausalSelfAttention(config, rng=rng, dtype=dtype)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias, dtype=dtype)
        self.mlp = MLP(config, rng=rng, dtype=dtype)

    def forward(self, x, cache=None):
        h = self.ln_1(x)
        # Without a cache the attention is called as any module (a strategy may
        # have put its own in its place).
        x = x + (self.attn(h) if cache is None else self.attn(h, cache))
        return x + self.mlp(self.ln_2(x))


class _Transformer(Module):
    """The container of nanoGPT's names: ``wte``, ``wpe``, ``h`` (the blocks), ``ln_f``."""

    def __init__(self, config: GPTConfig, rng=None, dtype=numpy.float32):
        super().__init__()
        self.wte = Embedding(config.vocab_size, config.n_embd, rng=rng, dtype=dtype)
        self.wpe = Embedding(config.block_size, config.n_embd, rng=rng, dtype=dtype)
        self.h = ModuleList([Block(config, rng=rng, dtype=dtype) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd, bias=config.bias, dtype=dtype)


class GPT(Module):
    """``GPT(config, rng=None, dtype=float32)``: ``forward(idx)`` maps token
    ids (B, T), T <= ``config.block_size``, to next-token logits
    (B, T, vocab_size). ``rng`` (a Generator or int seed; None: the default
    generator of :mod:`minidist.nn.init`) draws every initial weight, so a
    seed gives the same model."""

    def __init__(self, config: GPTConfig, rng=None, dtype=numpy.float32):
        super().__init__()
        self.config = config
        rng = init.as_generator(rng)
        self.transformer = _Transformer(config, rng=rng, dtype=dtype)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False, rng=rng, dtype=dtype)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one Parameter, two uses
        self._init_weights(rng)

    def _init_weights(self, rng):
        """GPT-2's initialisation (module docstring), drawn in the order of ``named_parameters``."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                init.normal_(param, 0.0, residual_std, rng=rng)
            elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                init.ones_(param)
            elif name.endswith(".bias"):
                init.zeros_(param)
            else:  # Linear and Embedding weights (the tied wte once)
                init.normal_(param, 0.0, INIT_STD, rng=rng)

    def forward(self, idx, cache=None):
        """``cache``: a :class:`~minidist.models.kv_cache.KVCache` (generation):
        ``idx`` then holds only the tokens after the cached ones, at the
        positions that follow them."""
        idx = numpy.asarray(backend.to_numpy(idx.data if isinstance(idx, Tensor) else idx))
        if idx.ndim != 2:
            raise ValueError(f"GPT: expected token ids of shape (batch, time), got shape {idx.shape}")
        steps = idx.shape[1]
        if steps > self.config.block_size:
            raise ValueError(
                f"GPT: a sequence of {steps} tokens is longer than block_size={self.config.block_size}; "
                f"crop it to its last {self.config.block_size} tokens (as generate() does)"
            )
        t = self.transformer
        if cache is not None:
            cache.check_model(len(t.h), self.config.block_size)
        start = 0 if cache is None else cache.check_feed(steps)
        x = t.wte(idx) + t.wpe(numpy.arange(start, start + steps))  # (B, T, C) + (T, C)
        for index, block in enumerate(t.h):
            x = block(x) if cache is None else block(x, cache.layer(index))
        if cache is not None:
            cache.advance(steps)
        return self.lm_head(t.ln_f(x))

    def num_parameters(self, trainable_only: bool = False, non_embedding: bool = False) -> int:
        """Scalars in the parameters (the tied matrix counted once);
        ``non_embedding=True`` leaves out the position embedding, as GPT-2's
        and nanoGPT's counts do (the token embedding is also the output layer)."""
        count = super().num_parameters(trainable_only)
        if non_embedding:
            count -= int(self.transformer.wpe.weight.data.size)
        return count


__all__ = ["GPT", "GPTConfig", "Block", "CausalSelfAttention", "MLP", "INIT_STD"]
