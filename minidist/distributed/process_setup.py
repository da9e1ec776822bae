"""What a worker process does first: tie its life to the parent's.

* ``PR_SET_PDEATHSIG``: the kernel sends the worker SIGKILL the moment the
  process that started it dies, however it dies (even by SIGKILL, when no
  cleanup code can run). No orphaned workers, ever.
* Ctrl-C goes to the parent alone: a terminal sends SIGINT to the whole
  foreground process group, and N workers each printing a KeyboardInterrupt
  traceback would bury the one message that matters. The parent stops the
  workers itself.
* SIGTERM keeps its default action (terminate at once), which is how the
  parent stops a worker that does not notice the abort flag in time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def prepare_worker_process(parent_pid: int) -> None:
    die_with_parent()
    if os.getppid() != parent_pid:
        # The parent died before the death signal was armed.
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
