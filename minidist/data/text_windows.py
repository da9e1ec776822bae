"""Random windows of a token stream: the batches a language model trains on.

A language model learns to predict each token from the ones before it. From
one long stream of token ids, a batch is ``batch_size`` windows of
``block_size + 1`` consecutive tokens starting at random offsets: the input
``x`` is the first ``block_size`` tokens of each window and the target ``y``
the same window shifted by one, so ``y[b, t] == x[b, t + 1]`` and
``y[b, -1]`` is the token after the window. One window gives ``block_size``
training examples at once (predict token t+1 from tokens 0..t, for every t),
which is why a causal model is trained this way.

The offsets come from a NumPy Generator seeded once, so a seed gives the
same sequence of batches on every machine. Windows are drawn with
replacement and may overlap: there are no epochs, only steps (as in
nanoGPT). Cost per batch: ``batch_size * (block_size + 1)`` int64 copies.

:func:`split_tokens` cuts the stream in two contiguous parts, the first for
training and the last for validation (the validation text is text the model
never saw, not a shuffle of the same lines).
"""

from __future__ import annotations

import numpy as np


def split_tokens(tokens, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: the first ``1 - val_fraction`` of ``tokens`` and the rest."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"split_tokens: expected a 1-D stream of token ids, got shape {tokens.shape}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"split_tokens: val_fraction must be between 0 and 1, got {val_fraction}")
    cut = int(round(len(tokens) * (1.0 - val_fraction)))
    return tokens[:cut], tokens[cut:]


class RandomWindows:
    """``RandomWindows(tokens, block_size, batch_size, seed=0)``: ``sample()``
    (or ``next()`` on it) returns ``(x, y)``, two int64 arrays of shape
    (batch_size, block_size), ``y`` being ``x`` shifted one token to the left."""

    def __init__(self, tokens, block_size: int, batch_size: int, seed=0):
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        if self.tokens.ndim != 1:
            raise ValueError(f"RandomWindows: expected a 1-D stream of token ids, got shape {self.tokens.shape}")
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"RandomWindows: block_size and batch_size must be >= 1, got {block_size}, {batch_size}")
        if len(self.tokens) < block_size + 1:
            raise ValueError(
                f"RandomWindows: a window needs block_size + 1 = {block_size + 1} tokens but the stream has "
                f"{len(self.tokens)}; use a shorter context or a longer text"
            )
        self.block_size = int(block_size)
        self.batch_size = int(batch_size)
        self.rng = np.random.default_rng(seed)
        self._offsets = np.arange(self.block_size + 1)

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        """One batch ``(x, y)`` from fresh random offsets."""
        starts = self.rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        windows = self.tokens[starts[:, None] + self._offsets]  # (batch, block + 1)
        return windows[:, :-1], windows[:, 1:]

    def __iter__(self):
        return self

    def __next__(self):
        return self.sample()


__all__ = ["RandomWindows", "split_tokens"]
