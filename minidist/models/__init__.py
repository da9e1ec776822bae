"""Whole models built from :mod:`minidist.nn`'s layers.

* :class:`GPT` (with :class:`GPTConfig`): a decoder-only transformer,
  token and position embeddings, pre-LayerNorm blocks of causal
  self-attention and a GELU MLP, the output layer tied to the token
  embedding; ``gpt.py``.
* :func:`generate`: sampling text from a GPT, one token at a time;
  ``generate.py``; with ``use_cache=True`` each layer's keys and values are
  kept between tokens (:class:`KVCache`, ``kv_cache.py``).

The models know nothing of processes: the parallel strategies of
:mod:`minidist.parallel` split them.
"""

from minidist.models.generate import generate
from minidist.models.gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig
from minidist.models.kv_cache import KVCache

__all__ = ["GPT", "GPTConfig", "Block", "CausalSelfAttention", "MLP", "KVCache", "generate"]
