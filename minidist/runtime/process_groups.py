"""A worker and whatever it started end together: each worker leads its own
session (and so its own process group), and the group is killed the moment
the worker is seen to have ended.

A rank may fork (``os.fork``, ``multiprocessing``, a library's helper). The
child inherits the worker's file descriptors (its result, log and transport
pipes) and outlives it unless someone ends it: its death signal
(``PR_SET_PDEATHSIG``) is not inherited. Left alone it would keep running
after the run, and keep the worker's pipes from ever ending. So:

* the worker calls ``setsid`` first thing (:func:`lead_own_session`): its
  children are born in its group, whose id is the worker's pid;
* the launcher watches the worker's *process* (a pidfd, ready when it
  exits), never one of its pipes, so a child holding copies of them cannot
  hide the worker's death;
* when the worker has ended, before its exit status is collected
  (:func:`end_group`), the launcher SIGKILLs the group. Until the status is
  collected the dead worker is a zombie that still holds its pid, so the
  group's id cannot yet belong to anyone else: the kill hits only what the
  worker started. A segment reaper the worker forked dies in the same kill,
  so the segments named after the worker are unlinked here.

A child that starts a session of its own (a daemon's double fork) has left
the group on purpose; minidist does not follow it.
"""

from __future__ import annotations

import os
import signal

from minidist.runtime import segment_reaper
from minidist.runtime.segments import creator_prefix


def lead_own_session() -> None:
    """In a freshly forked worker: a new session and process group, led by it
    (a no-op for a process that leads one already)."""
    try:
        os.setsid()
    except PermissionError:
        pass  # a group leader already (a `minidist run` program made its session)


def has_ended(pid: int) -> bool:
    """True when child ``pid`` has exited, without collecting its status (it
    stays a zombie, holding its pid). Also True once it has been collected."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def wait_ended(pid: int) -> None:
    """Block until child ``pid`` has exited, without collecting its status."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass


def end_group(pid: int) -> None:
    """Kill what is left of the group led by worker ``pid`` (call it after
    :func:`has_ended`, before the status is collected), and unlink the
    segments the worker made, whose reaper was in that group."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in it (or the worker never got to lead it)
    segment_reaper.unlink_all(creator_prefix(pid))
