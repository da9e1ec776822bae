"""The bundled Shakespeare, the character tokenizer and the random windows a language model trains on."""

import hashlib
import re
from importlib import resources

import numpy as np
import pytest

from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, split_tokens
from minidist.data.shakespeare import SHAKESPEARE_CHARS


def test_the_bundled_text_is_the_one_its_licence_file_describes():
    text = load_shakespeare()
    assert len(text) == SHAKESPEARE_CHARS
    licence = resources.files("minidist.data").joinpath("SHAKESPEARE_LICENSE.txt").read_text()
    stated = re.search(r"SHA-256 of this file:\s*([0-9a-f]{64})", licence).group(1)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == stated
    assert f"{SHAKESPEARE_CHARS:,} characters" in licence and "Public domain" in licence
    assert text.isascii() and text.startswith("First Citizen:\n") and text.endswith("your grace.\n")


def test_the_vocabulary_is_the_sorted_distinct_characters():
    tokenizer = CharTokenizer("banana!")
    assert tokenizer.vocab == "!abn" and tokenizer.vocab_size == 4
    assert tokenizer.encode("banana").tolist() == [2, 1, 3, 1, 3, 1]
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    assert tokenizer.vocab == "".join(sorted(set(text))) and tokenizer.vocab_size == 62


def test_encode_then_decode_gives_the_text_back():
    text = load_shakespeare()
    tokenizer = CharTokenizer(text)
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert ids.min() == 0 and ids.max() == tokenizer.vocab_size - 1
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([]) == "" and tokenizer.encode("").shape == (0,)


def test_tokenizer_mistakes_are_named():
    tokenizer = CharTokenizer("abc")
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        tokenizer.encode("abz")
    with pytest.raises(ValueError, match=r"id 3 is outside \[0, 3\)"):
        tokenizer.decode([0, 3])
    with pytest.raises(ValueError, match="non-empty str"):
        CharTokenizer("")


def test_split_keeps_the_order_and_cuts_at_the_fraction():
    tokens = np.arange(1000)
    train, val = split_tokens(tokens, 0.1)
    assert len(train) == 900 and len(val) == 100
    assert np.array_equal(np.concatenate([train, val]), tokens)
    with pytest.raises(ValueError, match="val_fraction"):
        split_tokens(tokens, 1.0)


def test_windows_are_consecutive_tokens_and_targets_are_shifted_by_one():
    tokens = np.random.default_rng(5).integers(0, 50, size=2000)
    windows = RandomWindows(tokens, block_size=16, batch_size=8, seed=3)
    all_windows = np.lib.stride_tricks.sliding_window_view(tokens, 17)
    for _ in range(5):
        x, y = windows.sample()
        assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
        assert np.array_equal(y[:, :-1], x[:, 1:])
        for row_x, row_y in zip(x, y):
            window = np.concatenate([row_x, row_y[-1:]])
            assert (all_windows == window).all(axis=1).any()  # a real slice of the stream


def test_windows_reach_both_ends_of_the_stream():
    tokens = np.arange(40)
    x, y = RandomWindows(tokens, block_size=4, batch_size=4000, seed=0).sample()
    assert x[:, 0].min() == 0 and y[:, -1].max() == 39


def test_same_seed_same_batches_other_seed_other_batches():
    tokens = np.arange(5000)
    a, b, c = (RandomWindows(tokens, 8, 4, seed=s) for s in (1, 1, 2))
    for _ in range(3):
        xa, _ = next(a)
        xb, _ = next(b)
        xc, _ = next(c)
        assert np.array_equal(xa, xb) and not np.array_equal(xa, xc)


def test_a_stream_shorter_than_a_window_is_refused():
    with pytest.raises(ValueError, match="block_size \\+ 1 = 11 tokens but the stream has 10"):
        RandomWindows(np.arange(10), block_size=10, batch_size=1)
