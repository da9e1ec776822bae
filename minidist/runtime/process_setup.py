"""What a worker process does first: tie its life to the parent's.

* ``PR_SET_PDEATHSIG``: the kernel sends the worker SIGKILL the moment the
  process that started it dies, however it dies (even by SIGKILL, when no
  cleanup code can run). No orphaned workers, ever.
* Ctrl-C goes to the parent alone, and SIGTERM keeps its default action
  (see :func:`minidist.runtime.signals.reset_in_worker`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from minidist.runtime.signals import reset_in_worker

_PR_SET_PDEATHSIG = 1


def _find_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up once, in the launching process, when it imports this module: a
# forked worker inherits it instead of opening libc again (which also touched
# pages that fork shares, and copying them is most of what a worker costs).
_prctl = _find_prctl() if sys.platform.startswith("linux") else None


_PR_SET_NAME = 15


def set_process_name(name: str) -> None:
    """The name ``ps -e`` and ``top`` show for this process (Linux; 15 bytes at most)."""
    if _prctl is not None:
        _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def close_fds_except(keep) -> None:
    """Close every file descriptor of this process but ``keep``: what a forked
    child does so that copies of its parent's pipe ends never keep a pipe
    from ending (``subprocess``'s ``close_fds``, for a fork without exec)."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every number up to the limit
        open_fds = range(os.sysconf("SC_OPEN_MAX"))
    keep = set(keep)
    for fd in open_fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass  # listdir's own, closed already


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask the kernel to send this process ``signum`` (SIGKILL: die) when its
    parent dies (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


def end_job_with_parent() -> None:
    """For mpiexec started by ``minidist run --transport mpi``: SIGTERM when the
    launcher dies, however it dies; mpiexec then ends every rank of its job
    (a SIGKILLed launcher left an mpiexec whose ranks spun for ever)."""
    die_with_parent(signal.SIGTERM)


def prepare_worker_process(parent_pid: int) -> None:
    die_with_parent()
    if os.getppid() != parent_pid:
        # The parent died before the death signal was armed.
        os._exit(1)
    reset_in_worker()
