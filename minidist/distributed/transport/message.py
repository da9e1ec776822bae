"""What travels on the wire: a header describing an array, then its bytes.

The header carries everything the receiver needs to check and place the
message before touching its payload: the dtype and shape (so a receive into
a wrong buffer is refused with a clear message instead of silently
reinterpreting bytes), the payload length, the tag and context it must match,
and a per-(sender, receiver) sequence number that the trace uses to draw an
arrow from each send to its recv.

Layout (little-endian)::

    u32 magic | u16 ndim | u16 dtype_len | u64 nbytes        } the same for every
    dtype.str (dtype_len bytes, e.g. b"<f4") | shape (ndim x i64) } array of this
                                                                    dtype and shape
    i64 tag | u64 context | u64 seq                          } per message

The part that depends only on the dtype and shape comes first, so a sender
can write it from a cache and a receiver expecting a given buffer can check it
with one comparison (see :class:`Layout`).
"""

from __future__ import annotations

import math
import struct

import numpy as np

#: A receive's wildcards (MPI_ANY_SOURCE, MPI_ANY_TAG): from any rank, with any tag.
ANY_SOURCE = -1
ANY_TAG = -1

MAGIC = 0x4D44534D  # "MSDM"
FIXED = struct.Struct("<IHHQ")  # magic, ndim, dtype_len, nbytes
TAIL = struct.Struct("<qQQ")  # tag, context, seq
_SHAPES: dict[int, struct.Struct] = {}
_DTYPE_BY_TEXT: dict[bytes, np.dtype] = {}
_LAYOUTS: dict[tuple, Layout] = {}


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


class Layout:
    """The constant part of the header of every ``dtype`` x ``shape`` array:
    ``prefix`` (bytes) and where the per-message ``TAIL`` goes (``tail_at``)."""

    __slots__ = ("prefix", "tail_at", "length")

    def __init__(self, dtype: np.dtype, shape: tuple):
        text = dtype.str.encode("ascii")
        nbytes = dtype.itemsize * math.prod(shape)
        self.prefix = (FIXED.pack(MAGIC, len(shape), len(text), nbytes) + text
                       + _shape_struct(len(shape)).pack(*shape))
        self.tail_at = len(self.prefix)
        self.length = self.tail_at + TAIL.size
        _DTYPE_BY_TEXT.setdefault(text, dtype)


def layout(dtype: np.dtype, shape: tuple) -> Layout:
    key = (dtype, shape)
    found = _LAYOUTS.get(key)
    if found is None:
        found = Layout(dtype, shape)
        if len(_LAYOUTS) < 4096:
            _LAYOUTS[key] = found
    return found


def _shape_struct(ndim: int) -> struct.Struct:
    packer = _SHAPES.get(ndim)
    if packer is None:
        packer = _SHAPES[ndim] = struct.Struct(f"<{ndim}q")
    return packer


def encode(tag: int, context: int, seq: int, dtype: np.dtype, shape: tuple) -> bytes:
    """The header bytes of one message."""
    return layout(dtype, shape).prefix + TAIL.pack(tag, context, seq)


def fixed_length() -> int:
    """Bytes needed before :func:`full_length` can tell the header's length."""
    return FIXED.size


def full_length(buffer, offset: int = 0) -> int:
    _, ndim, dtype_len, _ = FIXED.unpack_from(buffer, offset)
    return FIXED.size + dtype_len + 8 * ndim + TAIL.size


def decode(buffer, offset: int = 0) -> Header:
    """Decode a header from ``buffer`` (any bytes-like object) at ``offset``."""
    magic, ndim, dtype_len, nbytes = FIXED.unpack_from(buffer, offset)
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
    tail = start + dtype_len + 8 * ndim
    tag, context, seq = TAIL.unpack_from(buffer, tail)
    return Header(tag, context, nbytes, seq, dtype, shape, tail + TAIL.size - offset)
