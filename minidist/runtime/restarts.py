"""Elastic restarts: what ``minidist run --max-restarts K -n MIN:MAX`` decides
between two attempts, and what a rank tells it (torchrun's, torchelastic's idea).

torchrun answers a failed rank by ending every rank and starting the whole
group again, up to ``--max-restarts`` times; the script resumes from its own
checkpoint. Nothing is repaired in place: a restart is a fresh start of every
process, a fresh control block and transport, the shared memory of the failed
attempt released first. Its cost is a whole start (fork, imports, joining) and
the load of the checkpoint, plus the steps done since that checkpoint, which
are done again (``benchmarks/bench_elastic.py`` measures it).

What a rank sees (torchrun's names), beside ``RANK`` and ``WORLD_SIZE`` of the
attempt's size:

* ``TORCHELASTIC_RESTART_COUNT``: 0 on the first attempt, 1 on the first restart, ...
* ``TORCHELASTIC_MAX_RESTARTS``: K;
* ``TORCHELASTIC_RUN_ID``: one id for every attempt of the run;
* ``MINIDIST_ELASTIC_DIR``: the run's folder, where the markers below go.

**Fewer ranks.** ``-n MIN:MAX`` starts on MAX ranks. A rank whose slot will
not come back (its machine is gone, in a cluster) says so, and the next
attempt has one rank fewer; below MIN the run gives up. Two ways to say it:

* :func:`mark_rank_lost` writes a marker into the run's folder (the rank may
  then fail however it fails: raise, be killed). This is the one to use: it
  says what it means, and a rank can mark itself before the fault it injects.
* exiting with :data:`LOST_EXIT_CODE` (69, ``EX_UNAVAILABLE`` of sysexits.h)
  counts the same, for a rank that has no time to write a file.

torchrun itself learns of a lost node from its rendezvous (a node that does
not rejoin); on one machine there is no rendezvous, so the rank says so. The
world never grows back here: a lost slot is lost for the run.

:func:`mark_no_restart` asks for no further attempt (a failure that a restart
cannot cure, such as a wrong configuration).

This module only decides; ``minidist/run_script.py`` forks and watches.
"""

from __future__ import annotations

import os

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
RUN_ID = "TORCHELASTIC_RUN_ID"
ELASTIC_DIR = "MINIDIST_ELASTIC_DIR"

#: A rank that exits with this status counts as lost (``EX_UNAVAILABLE``).
LOST_EXIT_CODE = 69


def restart_count() -> int:
    """This attempt's number: 0 on the first, or when not run with restarts."""
    return int(os.environ.get(RESTART_COUNT, "0"))


def max_restarts() -> int:
    """The run's ``--max-restarts`` (0 when not run with restarts)."""
    return int(os.environ.get(MAX_RESTARTS, "0"))


def _folder(what: str) -> str:
    folder = os.environ.get(ELASTIC_DIR)
    if not folder:
        raise RuntimeError(f"{what}: this process was not started by `minidist run "
                           f"--max-restarts K` ({ELASTIC_DIR} is not set), so no attempt "
                           f"follows to shrink or to skip; run the script with --max-restarts")
    return folder


def _mark(kind: str, name: str, what: str) -> str:
    folder = os.path.join(_folder(what), kind, str(restart_count()))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as file:
        file.write(f"{os.getpid()}\n")
        file.flush()
        os.fsync(file.fileno())  # written before the fault this rank may inject next
    return path


def mark_rank_lost(rank: int | None = None) -> str:
    """Say that ``rank``'s slot (this rank's by default) will not come back:
    the next attempt runs on one rank fewer. Returns the marker's path."""
    rank = int(os.environ["RANK"]) if rank is None else int(rank)
    return _mark("lost", f"rank_{rank}", "mark_rank_lost")


def mark_no_restart() -> str:
    """Ask ``minidist run`` not to restart after this attempt fails."""
    return _mark("no_restart", f"rank_{os.environ.get('RANK', '0')}", "mark_no_restart")


def _marked(folder: str, kind: str, attempt: int) -> set[int]:
    where = os.path.join(folder, kind, str(attempt))
    if not os.path.isdir(where):
        return set()
    return {int(name[len("rank_"):]) for name in os.listdir(where) if name.startswith("rank_")}


def lost_ranks(folder: str, attempt: int, exit_codes: dict[int, int | None]) -> set[int]:
    """The ranks of ``attempt`` that will not come back: those marked, and
    those that exited with :data:`LOST_EXIT_CODE` (``exit_codes``: rank -> status)."""
    by_code = {rank for rank, code in exit_codes.items() if code == LOST_EXIT_CODE}
    return _marked(folder, "lost", attempt) | by_code


def no_restart_asked(folder: str, attempt: int) -> set[int]:
    """The ranks of ``attempt`` that called :func:`mark_no_restart`."""
    return _marked(folder, "no_restart", attempt)


def parse_sizes(text) -> tuple[int, int]:
    """``-n``'s value: ``"4"`` is (4, 4), ``"2:4"`` is (2, 4) (torchrun's
    ``--nnodes MIN:MAX``, here counting ranks). A mistake raises ValueError
    saying what is expected."""
    if isinstance(text, tuple):
        low, high = text
    elif isinstance(text, int) and not isinstance(text, bool):
        low = high = text
    else:
        parts = str(text).split(":")
        try:
            if len(parts) == 1:
                low = high = int(parts[0])
            elif len(parts) == 2:
                low, high = int(parts[0]), int(parts[1])
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"expected a number of ranks N or a range MIN:MAX (e.g. 4 or "
                             f"2:4), got {text!r}") from None
    if low < 1 or high < low:
        raise ValueError(f"expected 1 <= MIN <= MAX in MIN:MAX, got {text!r}")
    return low, high


class RestartPolicy:
    """Counts the attempts and words the decision after a failed one.

    ``decide(world, culprit, summary, lost, no_restart)`` returns
    ``(next_world or None, line)``: the size of the next attempt and the line
    that says so, or None and the line that says why the run gives up.
    """

    def __init__(self, min_size: int, max_size: int, max_restarts: int):
        if max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more, got {max_restarts}")
        self.min_size, self.max_size = min_size, max_size
        self.max_restarts = max_restarts
        self.restarts = 0  # restarts made so far (the next attempt's TORCHELASTIC_RESTART_COUNT)

    @property
    def attempts(self) -> int:
        return self.max_restarts + 1

    def _sizes(self) -> str:
        return (f"-n {self.min_size}:{self.max_size}" if self.min_size != self.max_size
                else f"-n {self.min_size}")

    def decide(self, world: int, culprit, summary: str, lost=frozenset(),
               no_restart=frozenset()) -> tuple[int | None, str]:
        who = f"rank {culprit}" if culprit is not None else "a rank"
        if no_restart:
            ranks = ", ".join(map(str, sorted(no_restart)))
            return None, (f"{who} failed and rank{'s' if len(no_restart) > 1 else ''} "
                          f"{ranks} asked for no restart "
                          f"(mark_no_restart); giving up")
        if self.restarts >= self.max_restarts:
            if self.max_restarts == 0:
                return None, f"{who} failed and --max-restarts 0 allows no restart; giving up"
            spent = ("the 1 restart of --max-restarts 1 is spent" if self.max_restarts == 1
                     else f"the {self.max_restarts} restarts of --max-restarts "
                          f"{self.max_restarts} are spent")
            return None, f"{who} failed again and {spent}; giving up"
        left = world - len(lost)
        if left < self.min_size:
            return None, (f"{left} rank{'' if left == 1 else 's'} left, below the minimum of "
                          f"{self.min_size} ({self._sizes()}); giving up")
        self.restarts += 1
        gone = (f", {len(lost)} lost (rank{'s' if len(lost) > 1 else ''} "
                f"{', '.join(map(str, sorted(lost)))})" if lost else "")
        return left, (f"attempt {self.restarts} of {self.attempts} failed ({summary}){gone}; "
                      f"restarting on {left} rank{'' if left == 1 else 's'} "
                      f"(restart {self.restarts} of {self.max_restarts})")


def run_with_restarts(attempt, max_restarts: int, say=None):
    """``attempt()`` up to ``max_restarts + 1`` times, for ``minidist.launch``:
    each time with this process's environment holding the restarts' names
    (which the forked workers inherit; put back after), again after a
    :class:`~minidist.runtime.errors.WorkerError`, that error raised once the
    restarts are spent. The world keeps its size: a function's workers have
    no slot to lose. ``say(line)`` is told of each restart."""
    from minidist.runtime.errors import WorkerError

    names = (RESTART_COUNT, MAX_RESTARTS, RUN_ID)
    before = {name: os.environ.get(name) for name in names}
    os.environ[MAX_RESTARTS] = str(max_restarts)
    os.environ[RUN_ID] = before[RUN_ID] or os.urandom(6).hex()
    try:
        for count in range(max_restarts + 1):
            os.environ[RESTART_COUNT] = str(count)
            try:
                return attempt()
            except WorkerError as error:
                if count == max_restarts:
                    raise
                if say is not None:
                    say(f"attempt {count + 1} of {max_restarts + 1} failed "
                        f"({error.summary.splitlines()[0]}); restarting "
                        f"(restart {count + 1} of {max_restarts})")
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
