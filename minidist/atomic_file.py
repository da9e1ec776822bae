"""Write a file all at once: readers see the old file or the whole new one.

Traces and checkpoints are written to a temporary file beside the target and
renamed over it (``os.replace`` is atomic on one file system). The temporary
file is made by :func:`tempfile.mkstemp` (``O_CREAT | O_EXCL``, a random name),
never opened by a name someone could guess: in a shared directory, another
user could otherwise plant a symbolic link at ``path.<pid>.tmp`` and have us
write through it into a file of theirs choosing. It gets the permissions a
plain ``open(path, "w")`` would give (mkstemp's own are owner-only), and it is
removed if writing fails.

A writer killed outright (SIGKILL) cannot remove its temporary file, so the
name carries the writer's pid (``.trace.jsonl.<pid>.<random>.tmp``) and the
next write to the same path removes those whose writer is gone.

:func:`atomic_path` is the same for libraries that want a file name to write
to (matplotlib's ``savefig``, an animation's writer): they write to a
temporary name beside the target, renamed over it when they are done.
"""

from __future__ import annotations

import contextlib
import os


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def _remove_stale(directory: str, name: str) -> None:
    """Remove ``.name.<pid>.<random>.tmp[.ext]`` left in ``directory`` by writers
    that died."""
    prefix = f".{name}."
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        parts = entry[len(prefix):].split(".")  # <pid>, <random>, "tmp"[, extension]
        if not entry.startswith(prefix) or len(parts) < 3 or parts[2] != "tmp":
            continue
        pid = parts[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def _temporary_beside(path) -> tuple[int, str, str]:
    """(descriptor, temporary name, target) for a write that ends in a rename."""
    import tempfile  # here: every rank imports this module (the trace), few write a file

    path = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder; name a file to write")
    _remove_stale(directory, name)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp",
                                             dir=directory)
    try:
        os.fchmod(descriptor, _default_mode())
    except BaseException:
        os.close(descriptor)
        os.unlink(temporary)
        raise
    return descriptor, temporary, path


@contextlib.contextmanager
def atomic_write(path, mode: str = "w", encoding: str | None = "utf-8"):
    """``with atomic_write(path) as file: file.write(...)``; ``mode`` "w" or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes text ('w') or bytes ('wb'), not {mode!r}")
    descriptor, temporary, path = _temporary_beside(path)
    try:
        with os.fdopen(descriptor, mode, encoding=None if "b" in mode else encoding) as file:
            yield file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_path(path):
    """``with atomic_path("out.gif") as name: writer.save(name)``: a temporary
    file name beside ``path``, renamed over it once the block ends without an
    error (a link at ``path`` is replaced, never written through). The name
    keeps ``path``'s extension, for writers that choose a format by it."""
    descriptor, temporary, path = _temporary_beside(path)
    os.close(descriptor)
    extension = os.path.splitext(path)[1]
    named = temporary[:-len(".tmp")] + ".tmp" + extension  # still matched as ours if left
    os.replace(temporary, named)
    try:
        yield named
        os.replace(named, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(named)
        raise
