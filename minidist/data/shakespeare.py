"""Shakespeare's text that ships with minidist: a real corpus for a language model, no download.

255,531 characters of the "tiny shakespeare" selection that char-rnn and
nanoGPT train on: all of Coriolanus, then Richard III into Act III. Plain
ASCII, 62 distinct characters, speeches separated by empty lines. A
character-level GPT of a few hundred thousand parameters learns its spelling
and its layout (speaker, colon, verse) in minutes on one core.

Source and licence: the first 255,531 characters of
data/tinyshakespeare/input.txt in github.com/karpathy/char-rnn (commit
d1d7aa34), cut at an empty line; Shakespeare's plays are in the public
domain. ``SHAKESPEARE_LICENSE.txt`` beside this file gives the exact range,
how it was copied and its SHA-256.
"""

from __future__ import annotations

from importlib import resources

SHAKESPEARE_FILE = "shakespeare.txt"
SHAKESPEARE_CHARS = 255_531


def load_shakespeare() -> str:
    """The bundled text as one ``str`` (read from the installed package,
    about 250 KB; the file is ASCII, read as UTF-8)."""
    return resources.files(__package__).joinpath(SHAKESPEARE_FILE).read_text(encoding="utf-8")


__all__ = ["SHAKESPEARE_CHARS", "SHAKESPEARE_FILE", "load_shakespeare"]
