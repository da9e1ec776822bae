"""The two kinds of worker the supervisor watches, with what it asks of each:
its pid, its exit code, a sentinel to wait on, terminate / kill / join / close.

In a module of their own, apart from :mod:`.supervisor`: ``minidist run``
starts its programs before it imports anything it can do without yet (every
import of the launching process delays the workers' start), and wrapping a
started program is all it needs then.
"""

from __future__ import annotations

import os


class ForkedWorker:
    """A worker made by fork, with its result pipe."""

    def __init__(self, rank, process, reader):
        self.rank = rank
        self.process = process
        self.reader = reader  # None once its one message has been read
        self._connection = reader
        self.sentinel = process.sentinel

    @property
    def pid(self):
        return self.process.pid

    def exitcode(self):
        return self.process.exitcode

    def terminate(self):
        self.process.terminate()

    def kill(self):
        self.process.kill()

    def join(self, timeout=None):
        self.process.join(timeout)

    def close(self):
        self._connection.close()
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
        try:
            self.sentinel = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            self.sentinel = None

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
