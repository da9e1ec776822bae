"""The IDX file format of MNIST: read it, write it, and say clearly when a file is broken.

An IDX file is a tiny header followed by one big-endian array::

    bytes 0-1   0x00 0x00                   (a file starting otherwise is not IDX)
    byte  2     the element type:
                  0x08 unsigned byte   0x09 signed byte
                  0x0B short (2 bytes) 0x0C int (4 bytes)
                  0x0D float (4 bytes) 0x0E double (8 bytes)
    byte  3     the number of dimensions, d
    then        d sizes, each a 4-byte big-endian unsigned integer
    then        the elements, row-major, big-endian, prod(sizes) of them

MNIST's images are 0x08 with d = 3 (count, 28, 28), its labels 0x08 with
d = 1. Files are often distributed gzip-compressed (``.gz``); :func:`read_idx`
recognises gzip by its first two bytes (0x1F 0x8B), whatever the file name.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

# type code -> big-endian NumPy dtype, as the format defines them.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_OF_KIND_AND_SIZE = {(dtype.kind, dtype.itemsize): code for code, dtype in IDX_DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
_HEADER_SIZE = 4


class IDXFormatError(ValueError):
    """A file is not a valid IDX file (bad header, unknown type, wrong length)."""


def _read_bytes(path) -> bytes:
    with open(path, "rb") as file:
        raw = file.read()
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as error:
        raise IDXFormatError(
            f"{os.fspath(path)} is gzip-compressed but cannot be decompressed ({error}); "
            "it is probably truncated or corrupt. Download it again."
        ) from error


def parse_idx(raw: bytes, source: str = "<bytes>") -> np.ndarray:
    """The array held by the (uncompressed) IDX bytes ``raw``; ``source`` names them in errors."""
    if len(raw) < _HEADER_SIZE:
        raise IDXFormatError(
            f"{source} is {len(raw)} bytes long, too short for the 4-byte IDX header; "
            "the file is empty or truncated. Download it again."
        )
    if raw[0] != 0 or raw[1] != 0:
        raise IDXFormatError(
            f"{source} does not start with the IDX magic bytes 0x00 0x00 (it starts with "
            f"{raw[:4].hex(' ')}); it is not an IDX file, or it is compressed in a format "
            "other than gzip."
        )
    code, ndim = raw[2], raw[3]
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{known:02X}" for known in IDX_DTYPES)
        raise IDXFormatError(
            f"{source} has IDX type code 0x{code:02X}, which is not one of {known}; "
            "the file is corrupt or not an IDX file."
        )
    dims_end = _HEADER_SIZE + 4 * ndim
    if len(raw) < dims_end:
        raise IDXFormatError(
            f"{source} declares {ndim} dimensions but ends after {len(raw)} bytes, before "
            "their sizes; the file is truncated. Download it again."
        )
    shape = tuple(int(size) for size in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - dims_end
    if actual != expected:
        what = "truncated" if actual < expected else "followed by extra bytes"
        raise IDXFormatError(
            f"{source} declares shape {shape} of {dtype.str[1:]} ({expected} data bytes) but "
            f"holds {actual} data bytes: the file is {what}. Download it again."
        )
    data = np.frombuffer(raw, dtype=dtype, offset=dims_end).reshape(shape)
    # Native byte order so later arithmetic is not slowed by byte swapping,
    # and a writable copy rather than a view of an immutable bytes object.
    return data.astype(dtype.newbyteorder("="))


def read_idx(path) -> np.ndarray:
    """Read an IDX file (plain or gzip-compressed) into a native-endian NumPy array.

    Raises:
        FileNotFoundError: no file at ``path``.
        IDXFormatError: the file is not valid IDX (the message says what is wrong).
    """
    return parse_idx(_read_bytes(path), source=os.fspath(path))


def write_idx(path, array, compress: bool | None = None) -> None:
    """Write ``array`` as an IDX file; gzip-compressed when ``compress`` or the name ends in .gz.

    The type code follows the array's dtype (uint8, int8, int16, int32,
    float32, float64); other dtypes raise TypeError. Useful for tests and for
    turning your own data into MNIST-shaped files.
    """
    array = np.asarray(array)
    code = _CODE_OF_KIND_AND_SIZE.get((array.dtype.kind, array.dtype.itemsize))
    if code is None:
        raise TypeError(
            f"IDX cannot store dtype {array.dtype}; convert to one of uint8, int8, int16, "
            "int32, float32 or float64 first."
        )
    if array.ndim > 255:
        raise ValueError(f"IDX stores at most 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    raw = header + np.ascontiguousarray(array, dtype=IDX_DTYPES[code]).tobytes()
    if compress is None:
        compress = os.fspath(path).endswith(".gz")
    if compress:
        # mtime=0 makes the same array always give the same bytes.
        raw = gzip.compress(raw, mtime=0)
    with open(path, "wb") as file:
        file.write(raw)
