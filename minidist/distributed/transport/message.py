"""What travels on the wire: a header describing an array, then its bytes.

The header carries everything the receiver needs to check and place the
message before touching its payload: the tag and context it must match, the
dtype and shape (so a receive into a wrong buffer is refused with a clear
message instead of silently reinterpreting bytes), the payload length, and a
per-(sender, receiver) sequence number that the trace uses to draw an arrow
from each send to its recv.

Layout (little-endian)::

    u32 magic | u16 ndim | u16 dtype_len | i64 tag | u64 context | u64 nbytes | u64 seq
    dtype.str (dtype_len bytes, e.g. b"<f4") | shape (ndim x i64)
"""

from __future__ import annotations

import struct

import numpy as np

MAGIC = 0x4D44534D  # "MSDM"
FIXED = struct.Struct("<IHHqQQQ")
_SHAPES: dict[int, struct.Struct] = {}
_DTYPE_BY_TEXT: dict[bytes, np.dtype] = {}
_SUFFIX: dict[tuple, bytes] = {}


class Header:
    """A decoded message header; ``length`` is its size in bytes on the wire."""

    __slots__ = ("tag", "context", "nbytes", "seq", "dtype", "shape", "length")

    def __init__(self, tag, context, nbytes, seq, dtype, shape, length):
        self.tag = tag
        self.context = context
        self.nbytes = nbytes
        self.seq = seq
        self.dtype = dtype
        self.shape = shape
        self.length = length

    def describe(self) -> str:
        return f"{self.dtype} array of shape {self.shape} ({self.nbytes} B)"


def _shape_struct(ndim: int) -> struct.Struct:
    packer = _SHAPES.get(ndim)
    if packer is None:
        packer = _SHAPES[ndim] = struct.Struct(f"<{ndim}q")
    return packer


def encode(tag: int, context: int, seq: int, dtype: np.dtype, shape: tuple, nbytes: int) -> bytes:
    """The header bytes of one message."""
    key = (dtype, shape)
    suffix = _SUFFIX.get(key)
    if suffix is None:
        text = dtype.str.encode("ascii")
        suffix = text + _shape_struct(len(shape)).pack(*shape)
        if len(_SUFFIX) < 4096:
            _SUFFIX[key] = suffix
        _DTYPE_BY_TEXT.setdefault(text, dtype)
    return FIXED.pack(MAGIC, len(shape), len(dtype.str), tag, context, nbytes, seq) + suffix


def fixed_length() -> int:
    return FIXED.size


def full_length(buffer, offset: int = 0) -> int:
    """Total header length, given at least its fixed part."""
    _, ndim, dtype_len, *_ = FIXED.unpack_from(buffer, offset)
    return FIXED.size + dtype_len + 8 * ndim


def decode(buffer, offset: int = 0) -> Header:
    """Decode a header from ``buffer`` (any bytes-like object) at ``offset``."""
    magic, ndim, dtype_len, tag, context, nbytes, seq = FIXED.unpack_from(buffer, offset)
    if magic != MAGIC:
        raise RuntimeError(
            f"corrupted message stream (bad header magic {magic:#x}); this is a bug in "
            "minidist's transport, please report it with the code that triggered it"
        )
    start = offset + FIXED.size
    text = bytes(buffer[start:start + dtype_len])
    dtype = _DTYPE_BY_TEXT.get(text)
    if dtype is None:
        dtype = _DTYPE_BY_TEXT[text] = np.dtype(text.decode("ascii"))
    shape = _shape_struct(ndim).unpack_from(buffer, start + dtype_len) if ndim else ()
    return Header(tag, context, nbytes, seq, dtype, shape, FIXED.size + dtype_len + 8 * ndim)
