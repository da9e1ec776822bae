"""The two kinds of worker the supervisor watches, with what it asks of each:
its pid, its exit code, a sentinel to wait on, terminate / kill / join / close.

The sentinel is a pidfd (Linux 5.3+): ready when the *process* exits. Not
multiprocessing's own sentinel, which is a pipe whose write end a child of
the worker inherits and keeps open: a worker that forked and then died
would never look dead (see :mod:`.process_groups`, which also says why the
worker's group is killed before its exit status is collected).

In a module of their own, apart from :mod:`.supervisor`: ``minidist run``
starts its programs before it imports anything it can do without yet (every
import of the launching process delays the workers' start), and wrapping a
started program is all it needs then.
"""

from __future__ import annotations

import os

from minidist.runtime import process_groups


def _pidfd(pid):
    """A file descriptor ready when process ``pid`` exits, or None (no pidfd here)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class ForkedWorker:
    """A worker made by fork (a started ``multiprocessing.Process``), with its result pipe."""

    def __init__(self, rank, process, reader):
        self.rank = rank
        self.process = process
        self.reader = reader  # None once its one message has been read
        self._connection = reader
        self._pidfd = _pidfd(process.pid)
        self.sentinel = self._pidfd if self._pidfd is not None else process.sentinel
        self._group_ended = False

    @property
    def pid(self):
        return self.process.pid

    def exitcode(self):
        if not self._group_ended and process_groups.has_ended(self.pid):
            process_groups.end_group(self.pid)  # before the status is collected below
            self._group_ended = True
        return self.process.exitcode

    def terminate(self):
        self.process.terminate()

    def kill(self):
        self.process.kill()

    def join(self, timeout=None):
        if self._pidfd is None:
            self.process.join(timeout)  # multiprocessing's pipe: fine without a child
        elif self.exitcode() is None:
            from multiprocessing.connection import wait  # imported by launch already

            wait([self._pidfd], timeout)
        if self.exitcode() is not None:
            self.process.join(0)  # collected: multiprocessing forgets the child

    def close(self):
        self._connection.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = self.sentinel = None
        try:
            self.process.close()
        except ValueError:
            pass


class ProgramWorker:
    """A worker that runs a script as its main program (``minidist run``):
    ``popen`` is a :class:`~minidist.runtime.program.ForkedProgram` (or anything
    with ``subprocess.Popen``'s pid, poll, wait, terminate and kill)."""

    def __init__(self, rank, popen):
        self.rank = rank
        self.popen = popen
        self.reader = None
        self.sentinel = _pidfd(popen.pid)

    @property
    def pid(self):
        return self.popen.pid

    def exitcode(self):
        return self.popen.poll()

    def terminate(self):
        if self.popen.poll() is None:
            self.popen.terminate()

    def kill(self):
        if self.popen.poll() is None:
            self.popen.kill()

    def join(self, timeout=None):
        try:
            self.popen.wait(timeout)
        except Exception:
            pass

    def close(self):
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None
