"""A KV cache: generating one token at a time without recomputing the past.

:func:`~minidist.models.generate.generate` asks the model for the next
token's logits again and again. Without a cache every call runs the whole
context through every block, and the keys and values of the positions
already seen are computed again at every step, although they cannot change:
in a causal model position i looks at positions 0..i only, so nothing that
comes later alters what position i computed. A KV cache keeps them. The
prompt runs once and fills each layer's cache with its keys and values;
after that each call feeds the one new token, which makes its own query,
key and value, appends its key and value to the layer's cache and attends
over all of them.

Cost per new token at context length t, forward: about 2 N flops for the
token's own matrix products (N: the parameters outside the embeddings) and
4 t C per layer for its attention over the cache, where the whole context
costs about t times that. Memory: 2 n_layer B block_size C numbers (a key
and a value per layer and position, allocated for the longest context at
the first call): the price of the speed, and at a large model's size what
limits how many sequences a server generates at once.

The window: a context longer than ``block_size`` is cropped to its last
``block_size`` tokens (as generate() does without a cache). Cropping moves
every token's position, and with it every key and value (the position
embedding is added at the input), so on a full cache generate() empties it
and runs the cropped window as a new prompt: beyond ``block_size`` each
token costs a whole forward pass again, as it does without a cache.
"""

from __future__ import annotations

import numpy as np

from minidist.tensor import is_grad_enabled


class KVCache:
    """``KVCache(n_layer, block_size)``: the keys and values of the first
    ``length`` positions, per layer; pass it as ``model(idx, cache=...)``
    (:class:`~minidist.models.gpt.GPT`). For generation only: the cache
    holds plain arrays, so no gradient would reach the layers that made
    them, and it refuses to run while gradients are recorded."""

    def __init__(self, n_layer: int, block_size: int):
        for name, value in (("n_layer", n_layer), ("block_size", block_size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"KVCache: {name} must be a positive int, got {value!r}; make "
                                 "it with KVCache(model.config.n_layer, model.config.block_size)")
        self.n_layer = int(n_layer)
        self.block_size = int(block_size)
        self.length = 0  # positions held
        self._keys: list[np.ndarray | None] = [None] * n_layer
        self._values: list[np.ndarray | None] = [None] * n_layer

    def layer(self, index: int) -> _LayerCache:
        """What block ``index``'s attention reads and extends."""
        return _LayerCache(self, index)

    def check_model(self, n_layer: int, block_size: int) -> None:
        """Refuse a cache made for another model: one with another number of
        layers (a block would find no keys of its own, or some would be left
        unused), or one that would hold positions past the model's position
        table (``block_size`` rows)."""
        remedy = "make it with KVCache(model.config.n_layer, model.config.block_size)"
        if self.n_layer != n_layer:
            raise ValueError(f"KVCache: the cache has {self.n_layer} layers and the model "
                             f"{n_layer}; {remedy}")
        if self.block_size > block_size:
            raise ValueError(f"KVCache: the cache holds up to {self.block_size} positions, more "
                             f"than the model's block_size={block_size} (the rows of its position "
                             f"table, not its vocabulary); {remedy}")

    def check_feed(self, steps: int) -> int:
        """The first position of ``steps`` new tokens; refuses a feed the
        cache cannot take."""
        if is_grad_enabled():
            raise RuntimeError("KVCache: the cache holds arrays without a graph, so no gradient "
                               "would reach the layers that made them; generate under "
                               "minidist.no_grad() (generate() does)")
        if self.length and steps != 1:
            raise ValueError(f"KVCache: after the prompt feed one token at a time, got {steps} "
                             f"(the cache holds {self.length} positions)")
        if self.length + steps > self.block_size:
            raise ValueError(f"KVCache: {self.length} cached positions + {steps} new ones exceed "
                             f"block_size={self.block_size}; crop the context and clear() the "
                             "cache (generate() does)")
        return self.length

    def advance(self, steps: int) -> None:
        """The model's call is done: ``steps`` more positions are held."""
        self.length += steps

    def clear(self) -> None:
        """Forget every position (the arrays stay allocated for the next prompt)."""
        self.length = 0

    def nbytes(self) -> int:
        """Bytes allocated for keys and values."""
        return sum(a.nbytes for a in self._keys + self._values if a is not None)


class _LayerCache:
    """One layer's view of the cache (what CausalSelfAttention receives)."""

    __slots__ = ("cache", "index")

    def __init__(self, cache: KVCache, index: int):
        self.cache = cache
        self.index = index

    @property
    def is_prompt(self) -> bool:
        """True while the cache is empty: the new positions attend causally among
        themselves; after that a single new token attends to every position."""
        return self.cache.length == 0

    def append(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the new positions' keys and values (B, H, steps, D); return
        every held position's, these included (views of the cache)."""
        cache, index = self.cache, self.index
        start, stop = cache.length, cache.length + keys.shape[2]
        held = cache._keys[index]
        if held is None or cache.length == 0 and (held.shape[:2] != keys.shape[:2]
                                                  or held.dtype != keys.dtype):
            shape = keys.shape[:2] + (cache.block_size,) + keys.shape[3:]
            cache._keys[index] = np.empty(shape, keys.dtype)
            cache._values[index] = np.empty(shape, values.dtype)
        elif held.shape[:2] != keys.shape[:2]:
            raise ValueError(f"KVCache: the cache holds {held.shape[0]} sequences of "
                             f"{held.shape[1]} heads, the new token {keys.shape[0]} of "
                             f"{keys.shape[1]}; clear() it for another batch")
        cache._keys[index][:, :, start:stop] = keys
        cache._values[index][:, :, start:stop] = values
        return cache._keys[index][:, :, :stop], cache._values[index][:, :, :stop]


__all__ = ["KVCache"]
