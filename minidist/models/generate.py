"""Sampling from a language model, one token at a time (autoregressive generation).

Given a context ``idx`` (B, T) of token ids, repeat ``max_new_tokens`` times:

1. crop the context to its last ``block_size`` tokens (the model has no
   position embedding beyond that);
2. run the model, keep the logits of the last position only (B, vocab);
3. divide them by ``temperature`` (below 1: sharper, the likely tokens more
   likely; above 1: flatter) and, with ``top_k``, keep the k largest and set
   the rest to minus infinity;
4. softmax, draw one token per row from a NumPy Generator seeded by
   ``seed``, and append it to the context.

No graph is recorded (``no_grad``) and the model is put in eval mode for the
duration. Each new token costs a full forward pass over up to
``block_size`` positions: this simple loop recomputes the keys and values of
the whole context every time, so generating n tokens costs about n forward
passes. ``use_cache=True`` keeps them instead
(:class:`~minidist.models.kv_cache.KVCache`: the prompt runs once, then each
token alone), the same tokens for a fraction of the work; what real
inference servers do.
"""

from __future__ import annotations

import inspect
import math
import numbers

import numpy as np

from minidist import backend, no_grad
from minidist.models.kv_cache import KVCache


def generate(model, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             seed=None, use_cache: bool = False) -> np.ndarray:
    """Extend ``idx`` (token ids, (B, T) or (T,)) by ``max_new_tokens``
    sampled tokens; returns an int64 array (B, T + max_new_tokens) (or
    (T + max_new_tokens,) for a 1-D context). ``model(idx)`` must return
    logits (B, T, vocab) and ``model.config.block_size`` give its longest
    context. ``seed`` (an int or a Generator) makes the draws repeatable.
    ``use_cache``: keep each layer's keys and values between tokens (a
    model whose ``forward`` takes a cache, as the
    :class:`~minidist.models.gpt.GPT`'s does).

    A tensor-parallel shard (:func:`~minidist.parallel.tensor.gpt.tensor_parallel_gpt`)
    makes the logits of its own words only: generate gathers the last
    position's over the group (the model's ``gather_vocabulary``), so every
    rank, given the same seed, draws the same tokens, those one process
    draws from the whole model (up to the rounding of the ranks' sums)."""
    check_sampling(max_new_tokens, temperature, top_k)
    context = np.asarray(idx, dtype=np.int64)
    one_sequence = context.ndim == 1
    if one_sequence:
        context = context[None, :]
    if context.ndim != 2 or context.shape[1] < 1:
        raise ValueError(f"generate: idx must hold at least one token, shape (batch, time); got {np.shape(idx)}")
    if use_cache and "cache" not in inspect.signature(model.forward).parameters:
        raise TypeError(f"generate(use_cache=True) needs a model whose forward takes the cache (a "
                        f"minidist GPT, or its tensor-parallel shard); {type(model).__name__}'s "
                        "forward does not: pass use_cache=False")
    rng = np.random.default_rng(seed)
    block_size = model.config.block_size
    cache = KVCache(model.config.n_layer, block_size) if use_cache else None
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for _ in range(max_new_tokens):
                logits = _next_logits(model, context, block_size, cache)
                last = _whole_vocabulary(model, logits.data[:, -1, :]).astype(np.float64) / temperature
                if top_k is not None and top_k < last.shape[-1]:
                    kth = np.partition(last, -top_k, axis=-1)[:, -top_k][:, None]
                    last = np.where(last < kth, -np.inf, last)
                probs = np.exp(last - last.max(axis=-1, keepdims=True))
                probs /= probs.sum(axis=-1, keepdims=True)
                # Inverse CDF: the first token whose cumulative probability passes u.
                u = rng.random((len(probs), 1))
                chosen = (probs.cumsum(axis=-1) < u).sum(axis=-1)
                chosen = np.minimum(chosen, probs.shape[-1] - 1)  # u above a sum rounded below 1
                context = np.concatenate([context, chosen[:, None]], axis=1)
    finally:
        model.train(was_training)
    return context[0] if one_sequence else context


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_sampling(max_new_tokens, temperature, top_k) -> None:
    """Refuse, before any forward pass, sampling settings that cannot work,
    each in one line that names the argument (a float token count or top_k
    would otherwise fail deep inside NumPy, a string temperature at a
    comparison): a TypeError for the wrong kind of value, a ValueError for
    one out of range, as torch's checks do."""
    if not _is_int(max_new_tokens):
        raise TypeError(f"generate: max_new_tokens must be an int (how many tokens to add), got "
                        f"{max_new_tokens!r} of type {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool):
        raise TypeError(f"generate: temperature must be a number (the logits are divided by it), "
                        f"got {temperature!r} of type {type(temperature).__name__}")
    if not 0 < temperature < math.inf:
        raise ValueError(
            f"generate: temperature must be > 0 and finite, got {temperature} (for the most likely "
            "token every time, pass top_k=1)")
    if top_k is not None and not _is_int(top_k):
        raise TypeError(f"generate: top_k must be None or an int (how many of the likeliest tokens "
                        f"to draw from), got {top_k!r} of type {type(top_k).__name__}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be None or >= 1, got {top_k}")


def _whole_vocabulary(model, last) -> np.ndarray:
    """The last position's logits over the whole vocabulary (B, vocab). A
    model that holds a share of the vocabulary (a tensor-parallel shard,
    whose logits are its own words only) gathers them with its
    ``gather_vocabulary``: sampling from a share would draw from the wrong
    distribution, a different one on every rank."""
    gather = getattr(model, "gather_vocabulary", None)
    last = gather(last) if gather is not None else backend.to_numpy(last)
    vocab_size = getattr(model.config, "vocab_size", last.shape[-1])
    if last.shape[-1] != vocab_size:
        raise ValueError(
            f"generate: the model's logits have {last.shape[-1]} words but its config's vocab_size "
            f"is {vocab_size}; a model that holds a share of the vocabulary needs a "
            "gather_vocabulary(logits) method that returns the whole vocabulary's logits")
    return last


def _next_logits(model, context, block_size: int, cache):
    """The model's logits for the context's last ``block_size`` tokens, or,
    with a cache, for the tokens it does not hold yet."""
    if cache is None:
        return model(context[:, -block_size:])
    if cache.length == block_size:
        cache.clear()  # the window slides: every position moves, every key changes
    if cache.length == 0:
        return model(context[:, -block_size:], cache=cache)  # the prompt (or the new window)
    return model(context[:, -1:], cache=cache)


__all__ = ["generate"]
