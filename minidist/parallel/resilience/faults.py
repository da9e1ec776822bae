"""Failures made on purpose, to test and to show fault-tolerant data parallel.

A :class:`ReplicaFault` names a replica, a step and a way to fail:

* ``"raise"``: an exception in the replica's own code (a bug, a bad batch);
* ``"sigkill"``: the process killed (out of memory, a node lost);
* ``"exit"``: ``os._exit(0)``, gone without a word and with status 0;
* ``"sigstop"``: stopped, neither running nor dead (a hung driver, a
  debugger). The supervisor treats a rank stopped for a few seconds while
  the others wait for it as failed and kills it
  (:mod:`minidist.runtime.stopped_ranks`); the group goes on then.

``where`` is ``"compute"`` (before the replica's gradient is ready: the
others wait for it in the all_reduce) or ``"allreduce"`` (inside the
all_reduce, after its first messages went out: the others hold part of its
gradient, which must not count). The launch must tolerate the rank
(``launch(..., tolerate_failures=True)``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

KINDS = ("raise", "sigkill", "exit", "sigstop")
PLACES = ("compute", "allreduce")


class InjectedFault(RuntimeError):
    """The exception of a ``"raise"`` fault."""


@dataclass(frozen=True)
class ReplicaFault:
    rank: int
    step: int
    kind: str = "sigkill"
    where: str = "compute"
    #: a file the failing rank writes the time of its fault to (seconds since
    #: the epoch), for the time from a fault to the group going on
    time_file: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"ReplicaFault kind {self.kind!r} is not one of {KINDS}")
        if self.where not in PLACES:
            raise ValueError(f"ReplicaFault where={self.where!r} is not one of {PLACES}")

    def due(self, rank: int, step: int, where: str) -> bool:
        return rank == self.rank and step == self.step and where == self.where

    def between_messages(self, after: int = 1) -> None:
        """Fail at this process's collective message number ``after + 1``:
        the first ``after`` left, the rest never will. (A hook on the
        collectives' send, put in place in the failing process only.)"""
        from minidist.distributed.collectives.comm import Comm

        send, sent, fault = Comm.isend, [0], self

        def isend_then_fail(comm, *args, **kwargs):
            sent[0] += 1
            if sent[0] > after:
                fault.happen()
            return send(comm, *args, **kwargs)

        Comm.isend = isend_then_fail

    def happen(self) -> None:
        """Fail now, the chosen way."""
        if self.time_file:
            with open(self.time_file, "w") as file:
                file.write(repr(time.time()))
        if self.kind == "raise":
            raise InjectedFault(f"rank {self.rank}: a fault injected at step {self.step} "
                                f"({self.where})")
        if self.kind == "exit":
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL if self.kind == "sigkill" else signal.SIGSTOP)
        time.sleep(60)  # a stopped process stays here until the supervisor kills it
