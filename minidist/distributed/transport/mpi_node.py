"""What the ranks of one machine can see of each other under mpiexec.

Under :func:`minidist.launch` and ``minidist run`` every rank maps the run's
control block (see :mod:`minidist.runtime.control`): a waiting rank reads
its peers' status records and sees at once that one returned early, or
which call each is in. mpiexec starts ranks that share no memory a minidist
launcher made, perhaps on several machines. What can be had:

* the ranks on one machine (MPI's ``COMM_TYPE_SHARED`` split) share a
  control block. The first rank of the machine creates the segment, tells
  the others its name (an MPI broadcast), all map it, and once all have
  (a barrier) the creator unlinks the name: the memory lives while a rank
  maps it and is gone with the last of them, so no ending of the job, even
  SIGKILL, leaves it in ``/dev/shm``. The block has a record for every rank
  of the world, but only this machine's ranks write theirs; the others'
  stay "not started" and are never judged from here;
* so a rank waiting in a collective sees, for the peers on its machine,
  everything a rank of ``minidist run`` sees: a peer that finished its script
  without entering the call (check_group's PeerGoneError), the call each peer
  is in, and the peer's pid, from which :class:`NodeWatch` reads whether
  the process still exists (``/proc/<pid>``) and whether it is stopped
  (state T or t in ``/proc/<pid>/stat``: SIGSTOP, Ctrl-Z, a debugger).
  A peer seen in state T for ``STOPPED_SECONDS`` while this rank waits is
  named and the job ended then, as ``minidist run``'s supervisor does on
  shared memory (:mod:`minidist.runtime.stopped_ranks`): nothing in a job
  ever continues it, and its peers would wait out their timeout. A peer in
  ``t`` (a debugger) is only named if the wait times out;
* a rank whose script has ended waits, before MPI_Finalize, for the peers of
  its machine to end theirs (:func:`await_peers`): MPI_Finalize waits for
  every rank of the job, so a peer stopped after its last message (no rank
  waits in minidist for it, no timeout runs) held the whole job forever.
  Stopped (T) for ``STOPPED_SECONDS``, or gone without finishing, it is
  named and the job ended then.

Across machines nothing of this holds: a peer on another machine is
visible only through MPI, which says nothing until its messages come.
"""

from __future__ import annotations

import os
import time

from minidist.runtime import control as ctl
from minidist.runtime.errors import CommTimeoutError, PeerGoneError
from minidist.runtime.stopped_ranks import STOPPED, STOPPED_SECONDS, TRACED

#: How often a waiting rank looks whether its machine's peers still exist (seconds).
LOOK_EVERY = 0.25
#: Looks further apart than this (this rank computed, or was stopped itself)
#: start the count of a peer's stopped seconds again: they must be seen.
SEEN_GAP = 1.0


def node_control_block(MPI, comm) -> tuple[ctl.ControlBlock, list[int]]:
    """A control block shared by the ranks of ``comm`` on this machine, and
    those ranks (ranks of ``comm``) whose processes this one can see. Collective:
    every rank of ``comm`` calls it."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        ranks_and_pids = node.allgather((comm.Get_rank(), os.getpid()))
        # Ranks that share memory may still not share process ids (containers
        # with their own PID namespaces): then /proc says nothing of the
        # others, and the watch must not read "gone" into that.
        if not all(process_state(pid) is not None for _, pid in ranks_and_pids):
            ranks_and_pids = [(comm.Get_rank(), os.getpid())]
        local = [rank for rank, _ in ranks_and_pids]
        block = name = None
        if node.Get_rank() == 0:
            block = ctl.ControlBlock.create(comm.Get_size())
            name = block.name
        name = node.bcast(name, root=0)
        if block is None:
            block = ctl.ControlBlock.attach(name)
        node.Barrier()  # every rank of the machine maps it: the name can go
        block.unlink()  # (the creator's; a no-op on the others)
    finally:
        node.Free()
    return block, local


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (R, S, D, T, t, Z, ...) or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode()


def is_stopped(state: str | None) -> bool:
    return state in ("T", "t")


class NodeWatch:
    """A waiting rank's look at the peers on its machine, through the shared
    control block's records (their pids) and ``/proc``."""

    def __init__(self, rank: int, control: ctl.ControlBlock, node_ranks):
        self.rank = rank
        self.control = control
        self.peers = [peer for peer in node_ranks if peer != rank]
        self._next_look = 0.0
        self._next_stop_look = 0.0
        self._stopped_since: dict[int, float] = {}  # peer -> first seen in state T

    def _live_peers(self):
        """(rank, pid, state letter) of each peer that has started and not
        finished or failed."""
        for peer in self.peers:
            status = self.control.status(peer)
            if status.pid and status.state in (ctl.RUNNING, ctl.WAITING):
                yield peer, status.pid, process_state(status.pid)

    def vanished(self) -> tuple[int, int] | None:
        """(rank, pid) of a peer whose process is gone (or a zombie) though its
        record never said finished or failed: it ended in the middle of the
        run, by os._exit, a signal or a crash. Looks at most every LOOK_EVERY s."""
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + LOOK_EVERY
        for peer, pid, state in self._live_peers():
            if state in (None, "Z", "X"):
                # Its record could have been written FINISHED just now, as it ended.
                if self.control.state_of(peer) in (ctl.RUNNING, ctl.WAITING):
                    return peer, pid
        return None

    def stopped(self) -> list[tuple[int, int, float, str]]:
        """(rank, pid, seconds since its record last changed, state letter) of
        each peer whose process is stopped now."""
        now_ns = time.monotonic_ns()
        found = []
        for peer, pid, state in self._live_peers():
            if is_stopped(state):
                since = self.control.status(peer).since_ns
                found.append((peer, pid, max(now_ns - since, 0) / 1e9 if since else 0.0,
                              state))
        return found

    def stalled(self) -> tuple[int, int, float] | None:
        """(rank, pid, seconds) of a peer seen stopped by a signal (state T)
        for STOPPED_SECONDS or more of this rank's waits. Looks at most every
        LOOK_EVERY s; a gap longer than SEEN_GAP between looks starts over."""
        now = time.monotonic()
        if now < self._next_stop_look:
            return None
        if now > self._next_stop_look + SEEN_GAP:
            self._stopped_since.clear()
        self._next_stop_look = now + LOOK_EVERY
        stopped = set()
        for peer, pid, state in self._live_peers():
            if state == STOPPED:
                stopped.add(peer)
                since = self._stopped_since.setdefault(peer, now)
                if now - since >= STOPPED_SECONDS:
                    return peer, pid, now - since
        for peer in set(self._stopped_since) - stopped:
            del self._stopped_since[peer]
        return None

    def any_failed(self) -> bool:
        """Has a peer of this machine failed? It reports itself and ends the job
        (MPI_Abort), so the others must not add reports of their own."""
        return any(self.control.state_of(peer) == ctl.FAILED for peer in self.peers)


def stopped_words(culprit: int, pid: int, state: str) -> str:
    """'rank 1 is stopped (its process, pid 80, is in state T: SIGSTOP or Ctrl-Z)'."""
    if state == TRACED:
        return (f"rank {culprit} is stopped by a debugger or tracer (its process, pid {pid}, "
                "is in state t)")
    return f"rank {culprit} is stopped (its process, pid {pid}, is in state T: SIGSTOP or Ctrl-Z)"


def stalled_error(culprit: int, pid: int, seconds: float, rank: int, what: str):
    """The error of rank ``rank``, waiting in ``what``, whose peer ``culprit``
    has been stopped by a signal (state T) for ``seconds``: nothing in the job
    will continue it, so the job is ended now rather than at the timeout."""
    error = CommTimeoutError(
        f"{stopped_words(culprit, pid, STOPPED)} and has not progressed for {seconds:.1f} s "
        f"while rank {rank} waits {what}; only SIGCONT resumes a stopped process, so the "
        "job is ended.", operation=what, report="")
    error.culprit = culprit  # the first line names it (report_failure_and_abort)
    return error


def vanished_error(culprit: int, pid: int, rank: int, what: str) -> PeerGoneError:
    """The error of rank ``rank``, waiting ``what``, whose peer ``culprit``'s
    process is gone though it never finished its script."""
    error = PeerGoneError(
        f"rank {culprit} exited in the middle of the run: its process (pid {pid}) is gone "
        f"and never finished its script (os._exit, a signal or a crash?), while rank {rank} "
        f"waits {what}.", peer=culprit)
    error.culprit = culprit
    return error


#: How often a rank whose script has ended looks whether its peers have.
FINISHED_POLL = 0.02


def await_peers(rank: int, control: ctl.ControlBlock, node_ranks) -> None:
    """Return once every peer of this machine has finished its script (or
    failed: it reports itself and ends the job); raise the error that names
    a peer stopped by a signal (state T) for STOPPED_SECONDS, or one whose
    process is gone without finishing. A peer stopped by a debugger (t) is
    waited for: someone is at its breakpoint.

    Called as this rank's script ends, before MPI_Finalize, which waits for
    every rank of the job: a peer stopped after its last message kept the
    whole job waiting there, with no minidist wait to notice and no timeout.
    Cost for a healthy job: at most FINISHED_POLL seconds more at the end."""
    watch = NodeWatch(rank, control, node_ranks)
    what = "for it to end its script (MPI_Finalize waits for every rank)"
    while any(control.state_of(peer) in (ctl.STARTING, ctl.RUNNING, ctl.WAITING)
              for peer in watch.peers):
        gone = watch.vanished()
        if gone is not None:
            raise vanished_error(*gone, rank, what)
        stalled = watch.stalled()
        if stalled is not None:
            raise stalled_error(stalled[0], stalled[1], stalled[2], rank, what)
        time.sleep(FINISHED_POLL)
