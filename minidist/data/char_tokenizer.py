"""A character-level tokenizer: each distinct character of a text is one token.

The vocabulary is the text's distinct characters in sorted order (by code
point), so the same text always gives the same ids: for the bundled
Shakespeare that is 62 tokens, ``"\\n"`` = 0, ``" "`` = 1, ``"!"`` = 2, ...,
``"z"`` = 61. ``encode`` maps a string to an int64 array of ids, ``decode``
maps ids back; ``decode(encode(s)) == s`` for every string made of the
vocabulary's characters.

Characters are the simplest tokens: no merges to learn and nothing unknown
in the training text, at the price of long sequences (one token per
character, where a byte-pair tokenizer such as GPT-2's takes about one per
four characters of English). Cost: one dictionary lookup per character to
encode, one array lookup per id to decode.
"""

from __future__ import annotations

import numpy as np


class CharTokenizer:
    """``CharTokenizer(text)``: the vocabulary of ``text``'s distinct characters, sorted.

    * ``vocab`` (str): the characters, id ``i`` is ``vocab[i]``.
    * ``vocab_size``: ``len(vocab)``.
    * ``encode(s) -> np.ndarray`` of int64 ids; ``decode(ids) -> str``.
    """

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("CharTokenizer needs a non-empty str to take its vocabulary from")
        self.vocab = "".join(sorted(set(text)))
        self.vocab_size = len(self.vocab)
        self._ids = {char: index for index, char in enumerate(self.vocab)}
        self._chars = np.array(list(self.vocab))

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``'s characters, int64 of shape (len(text),)."""
        try:
            return np.fromiter((self._ids[char] for char in text), dtype=np.int64, count=len(text))
        except KeyError as error:
            raise ValueError(
                f"CharTokenizer.encode: {error.args[0]!r} is not in the vocabulary "
                f"({self.vocab_size} characters taken from the training text); "
                "build the tokenizer from a text that contains it"
            ) from None

    def decode(self, ids) -> str:
        """The string of ``ids`` (a sequence or 1-D array of ints in [0, vocab_size))."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise ValueError(f"CharTokenizer.decode: id {int(bad)} is outside [0, {self.vocab_size})")
        return "".join(self._chars[ids].tolist())

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, vocab={self.vocab!r})"


__all__ = ["CharTokenizer"]
