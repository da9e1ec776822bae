"""Write a file all at once: readers see the old file or the whole new one.

Traces and checkpoints are written to a temporary file beside the target and
renamed over it (``os.replace`` is atomic on one file system). The temporary
file is made by :func:`tempfile.mkstemp` (``O_CREAT | O_EXCL``, a random name),
never opened by a name someone could guess: in a shared directory, another
user could otherwise plant a symbolic link at ``path.<pid>.tmp`` and have us
write through it into a file of theirs choosing. It gets the permissions a
plain ``open(path, "w")`` would give (mkstemp's own are owner-only), and it is
removed if writing fails.
"""

from __future__ import annotations

import contextlib
import os


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", encoding: str | None = "utf-8"):
    """``with atomic_write(path) as file: file.write(...)``; ``mode`` "w" or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes text ('w') or bytes ('wb'), not {mode!r}")
    import tempfile  # here: every rank imports this module (the trace), few write a file

    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(descriptor, _default_mode())
        with os.fdopen(descriptor, mode, encoding=None if "b" in mode else encoding) as file:
            yield file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
