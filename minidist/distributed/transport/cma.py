"""Cross-memory attach (CMA): read another process's memory with one copy.

Moving a message through shared memory costs two copies: the sender copies
it into a shared slot, the receiver copies it out. Linux can do better for
big messages: ``process_vm_readv(pid, ...)`` copies straight from the
sender's own array into the receiver's, inside the kernel, so every byte is
copied once. MPICH (its "CMA" large-message transfer) and Open MPI use the
same system call between ranks on one machine.

The shared-memory transport's shortcuts use it as a *rendezvous* for messages
bigger than its ring (:mod:`.shm_fast`): the sender puts only a small descriptor in a
slot, "array of n bytes at address A in process P", the receiver reads the
bytes from there (combining them block by block when the receive is a
``recv_reduce``), then frees the slot, which tells the sender its array may
be reused. A send that large could never complete before its receiver was
draining it anyway, so nothing a program can observe changes except speed.

Permission. Reading another process's memory is what a debugger does, so
the kernel asks for ptrace rights over the target. On systems with Yama
(``/proc/sys/kernel/yama/ptrace_scope`` = 1, Ubuntu's default) a process may
only be read by its ancestors, and minidist's ranks are siblings; each rank
therefore calls ``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`` to let
processes of the same user read it. With ``ptrace_scope`` 2 or 3, off Linux,
or with ``MINIDIST_SHM_CMA=0`` in the environment, :func:`available` says no
and the transport keeps to its two-copy ring (as it does, with every other
shortcut, under ``MINIDIST_FAST_PATHS=0``: then the plain :mod:`.shm`
transport runs, which never calls this module).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys

_PR_SET_PTRACER = 0x59616D61  # "Yama"
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc = None


def _load():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                          ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                               ctypes.c_ulong]
        _libc = libc
    return _libc


def available() -> tuple[bool, str]:
    """(whether ranks of one run may read each other's memory, why not)."""
    if os.environ.get("MINIDIST_SHM_CMA", "1").strip().lower() in ("0", "no", "off", "false"):
        return False, "turned off by MINIDIST_SHM_CMA=0"
    if not sys.platform.startswith("linux"):
        return False, "process_vm_readv is Linux only"
    try:
        libc = _load()
        libc.process_vm_readv  # noqa: B018 - a libc without it raises AttributeError
    except (OSError, AttributeError):
        return False, "this C library has no process_vm_readv"
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as file:
            scope = int(file.read().strip() or 0)
    except (OSError, ValueError):
        scope = 0  # no Yama: same-user processes may read each other
    if scope >= 2:
        return False, (f"kernel.yama.ptrace_scope is {scope}: only root may read another "
                       "process's memory")
    return True, ""


def allow_peers() -> None:
    """Let other processes of this user read this one (needed under Yama
    ptrace_scope 1; harmless, and refused without effect, elsewhere)."""
    try:
        _load().prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class ReadError(OSError):
    """A read from another process failed; ``gone`` when that process has exited."""

    def __init__(self, code: int, text: str):
        super().__init__(code, text)
        self.gone = code == errno.ESRCH


class Reader:
    """``read(pid, remote_address, local_address, nbytes)``: one kernel copy."""

    def __init__(self):
        libc = _load()
        self._readv = libc.process_vm_readv
        self._local = _IoVec()
        self._remote = _IoVec()
        self._local_ref = ctypes.byref(self._local)
        self._remote_ref = ctypes.byref(self._remote)

    def read(self, pid: int, remote: int, local: int, nbytes: int) -> None:
        local_vec, remote_vec = self._local, self._remote
        done = 0
        while done < nbytes:
            # The kernel may copy less than asked (a page it could not pin yet).
            local_vec.base, local_vec.length = local + done, nbytes - done
            remote_vec.base, remote_vec.length = remote + done, nbytes - done
            got = self._readv(pid, self._local_ref, 1, self._remote_ref, 1, 0)
            if got <= 0:
                code = ctypes.get_errno() if got < 0 else errno.EIO
                raise ReadError(code, _explain(code, pid))
            done += got


def _explain(code: int, pid: int) -> str:
    name = errno.errorcode.get(code, str(code))
    if code == errno.EPERM:
        return (f"process_vm_readv from process {pid} was refused ({name}): this system does "
                "not let one process read another's memory (a container's seccomp profile, "
                "or a ptrace policy). Run with MINIDIST_SHM_CMA=0 to keep the shared-memory "
                "transport to its two-copy ring, or use transport='pipe'.")
    if code == errno.ESRCH:
        return f"process {pid} has exited while its message was being read ({name})"
    if code == errno.ENOSYS:
        return (f"process_vm_readv is not available in this kernel ({name}); run with "
                "MINIDIST_SHM_CMA=0")
    return f"process_vm_readv from process {pid} failed: {name} ({os.strerror(code)})"
