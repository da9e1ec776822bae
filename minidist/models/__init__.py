"""Whole models built from :mod:`minidist.nn`'s layers.

* :class:`GPT` (with :class:`GPTConfig`): a decoder-only transformer,
  token and position embeddings, pre-LayerNorm blocks of causal
  self-attention and a GELU MLP, the output layer tied to the token
  embedding; ``gpt.py``.
* :func:`generate`: sampling text from a GPT, one token at a time;
  ``generate.py``.

The models know nothing of processes: the parallel strategies of
:mod:`minidist.parallel` split them.
"""

from minidist.models.generate import generate
from minidist.models.gpt import GPT, MLP, Block, CausalSelfAttention, GPTConfig

__all__ = ["GPT", "GPTConfig", "Block", "CausalSelfAttention", "MLP", "generate"]
