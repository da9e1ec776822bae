"""Random search on N worker processes: the plain version, with no dependency.

Hyper-parameter search is *embarrassingly parallel*: trial 7 (train with
lr 0.03, 64 hidden units, ...) needs nothing from trial 8. N workers can run
N trials at once and exchange no message at all; the only things they share
are the list of trials still to run and the record of what came out.

**Who runs which trial: a shared counter (dynamic assignment).** A worker
that finishes a trial takes the next number from a counter in the search's
folder (:class:`~minidist.search.journal.Journal`), so no worker waits while
trials are left, whatever each trial costs (a large network or a pruned run
costs more or less than the average). A static split (worker r runs trials
r, r + N, r + 2N, ...) would be simpler, but a slow trial would hold up its
worker's whole share, and a worker that dies would take its remaining share
with it; with the counter the others simply take those numbers.

**Reproducible whoever runs what.** Trial k's parameters come from a
generator seeded with ``(seed, k)`` (:func:`~minidist.search.space.sample_params`),
and so does ``trial.seed`` for the objective's own randomness: the same seed
gives the same trials with the same values, with 1 worker or 8, in whatever
order they finish. Only the record of *who* ran *when* changes.

**One BLAS thread per worker.** N workers already use N cores; threads
inside a trial would fight them for the same cores. It also keeps the
arithmetic of a trial the same whatever the number of workers (``launch``
would give one worker of a 2-core machine two threads, two workers one each).

**Failures.** An objective that raises marks its trial ``failed`` (with the
error) and the worker takes the next number. A worker *process* that dies in
the middle of a trial (os._exit, SIGKILL, a segfault in a library) is let go
by the runtime (``minidist.launch(..., tolerate_failures=True)``); its trial
has a start line in the journal and no end line, and is marked ``failed``
with the worker's error; the other workers run the rest. A worker whose
trial runs past ``trial_timeout`` seconds (an endless loop, a process
stopped by SIGSTOP) is killed and counted the same way
(:mod:`~minidist.search.deadline`): no trial holds the search for ever.

Cost: one trial's time per N trials, plus per trial a lock and two short
appends to a local file (tens of microseconds).
"""

from __future__ import annotations

import math
import tempfile
import time
import traceback
from dataclasses import dataclass, field

from minidist.runtime.blas_threads import set_blas_threads
from minidist.search.deadline import TRIAL_TIMEOUT, TrialClock, Watchdog, check_trial_timeout
from minidist.search.journal import Journal
from minidist.search.space import check_space, sample_params, trial_seed

STATES = ("complete", "pruned", "failed")
DIRECTIONS = ("maximize", "minimize")


class TrialPruned(Exception):
    """Raised by an objective to stop a trial that is not worth finishing
    (``if trial.should_prune(): raise TrialPruned()``); the trial is recorded
    as ``pruned``. Under Optuna it becomes ``optuna.TrialPruned``."""


class Trial:
    """What the objective is given: ``number``, ``params`` (a dict),
    ``seed`` (for its own randomness) and ``worker``; ``report(value, step)``
    records an intermediate value (say, accuracy after each epoch) and
    ``should_prune()`` says whether to stop. The plain random search never
    prunes: deciding needs the other trials' curves, which Optuna's pruners
    read from the shared storage (:mod:`minidist.search.optuna_search`)."""

    def __init__(self, number: int, params: dict, seed: int, worker: int):
        self.number = number
        self.params = params
        self.seed = seed
        self.worker = worker
        self.intermediate: dict[int, float] = {}

    def report(self, value: float, step: int) -> None:
        self.intermediate[int(step)] = float(value)

    def should_prune(self) -> bool:
        return False

    def __repr__(self):
        return f"Trial(number={self.number}, worker={self.worker}, params={self.params})"


@dataclass
class TrialRecord:
    """One trial as the search recorded it. Times are seconds since the search
    started; ``end`` of a trial whose worker died is when the search noticed."""

    number: int
    worker: int | None
    params: dict
    state: str
    value: float | None = None
    start: float = 0.0
    end: float = 0.0
    error: str | None = None
    intermediate: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class SearchResult:
    """Every trial of a search, by number, and what it took."""

    trials: list[TrialRecord]
    n_trials: int
    n_workers: int
    seed: int | None
    direction: str = "maximize"
    wall_time: float = 0.0
    lost_workers: dict = field(default_factory=dict)  # rank -> what happened to it
    engine: str = "random"
    study: object = None  # the Optuna study, for optuna_search

    def by_state(self, state: str) -> list[TrialRecord]:
        if state not in STATES + ("running",):
            raise ValueError(f"unknown state {state!r}: choose one of {', '.join(STATES)}")
        return [trial for trial in self.trials if trial.state == state]

    @property
    def best(self) -> TrialRecord | None:
        """The complete trial with the best value (None if none completed)."""
        done = [t for t in self.by_state("complete") if t.value is not None]
        if not done:
            return None
        pick = max if self.direction == "maximize" else min
        return pick(done, key=lambda t: (t.value, -t.number) if pick is max else (t.value, t.number))

    def trials_per_worker(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for trial in self.trials:
            if trial.worker is not None:
                counts[trial.worker] = counts.get(trial.worker, 0) + 1
        return dict(sorted(counts.items()))

    def table(self, limit: int | None = None) -> str:
        """The trials as a text table, best first (then pruned, then failed)."""
        rank = {"complete": 0, "pruned": 1, "running": 2, "failed": 3}
        sign = -1 if self.direction == "maximize" else 1
        ordered = sorted(self.trials, key=lambda t: (
            rank[t.state], sign * t.value if t.value is not None else 0.0, t.number))
        names = list(ordered[0].params) if ordered else []
        header = (f"{'trial':>5} {'worker':>6} {'state':>8} {'value':>7} {'seconds':>7}  "
                  + "  ".join(f"{name:>12}" for name in names))
        lines = [header]
        for trial in ordered[:limit]:
            value = f"{trial.value:7.4f}" if trial.value is not None else f"{'-':>7}"
            cells = "  ".join(f"{_short(trial.params.get(name)):>12}" for name in names)
            worker = "-" if trial.worker is None else str(trial.worker)
            line = (f"{trial.number:>5} {worker:>6} {trial.state:>8} {value} "
                    f"{trial.duration:7.2f}  {cells}")
            if trial.error:
                line += f"  [{trial.error.splitlines()[0][:90]}]"
            lines.append(line)
        if limit is not None and len(ordered) > limit:
            lines.append(f"... {len(ordered) - limit} more")
        return "\n".join(lines)

    def summary(self) -> str:
        counts = ", ".join(f"{len(self.by_state(s))} {s}" for s in STATES)
        best = self.best
        workers = f"{self.n_workers} worker{'' if self.n_workers == 1 else 's'}"
        text = (f"{self.engine} search: {len(self.trials)} trials on {workers} in "
                f"{self.wall_time:.2f} s ({counts})")
        if best is not None:
            text += f"; best {best.value:.4f} (trial {best.number})"
        if len(self.trials) < self.n_trials:
            text += (f"\n  {self.n_trials - len(self.trials)} of {self.n_trials} trials never "
                     "started: every worker was lost before")
        for rank, what in sorted(self.lost_workers.items()):
            text += f"\n  worker {rank} was lost: {what}"
        return text


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def check_search_arguments(objective, n_trials, n_workers, seed, direction) -> None:
    if not callable(objective):
        raise TypeError(f"objective must be a function of a trial, got {type(objective).__name__}")
    for name, value in (("n_trials", n_trials), ("n_workers", n_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be a non-negative int (or None), got {seed!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'maximize' or 'minimize', got {direction!r}")


def objective_value(returned) -> float:
    """The objective's return value as a float, or an error saying why not
    (as Optuna, a NaN is a failure, not a value to compare)."""
    if isinstance(returned, bool) or not isinstance(returned, (int, float)) and not (
            hasattr(returned, "item") and getattr(returned, "size", 1) == 1):
        raise TypeError(f"the objective returned {returned!r}; it must return one number")
    value = float(returned)
    if math.isnan(value):
        raise ValueError("the objective returned NaN")
    return value


def _run_trials(objective, space, n_trials, seed, folder):
    """One worker: take a number, run that trial, write what came out; again,
    until the numbers run out."""
    import minidist.distributed as dist

    worker = dist.get_rank()
    set_blas_threads(1)
    journal = Journal(folder)
    clock = TrialClock(folder, worker)
    ran = 0
    while True:
        number = journal.take_ticket()
        if number >= n_trials:
            return ran
        params = sample_params(space, seed, number)
        trial = Trial(number, params, trial_seed(seed, number), worker)
        journal.append({"event": "start", "number": number, "worker": worker,
                        "params": params, "time": time.time()})
        clock.started(number)
        record = {"event": "end", "number": number, "worker": worker}
        try:
            record.update(state="complete", value=objective_value(objective(trial)))
        except TrialPruned:
            record.update(state="pruned")
        except Exception as error:  # the trial fails, the search goes on
            record.update(state="failed", error=f"{type(error).__name__}: {error}",
                          traceback=traceback.format_exc())
        clock.finished()
        record.update(time=time.time(), intermediate=trial.intermediate)
        journal.append(record)
        ran += 1


def random_search(objective, space: dict, n_trials: int, n_workers: int = 1, seed: int = 0,
                  *, direction: str = "maximize", folder=None, transport: str = "pipe",
                  trial_timeout: float | None = TRIAL_TIMEOUT) -> SearchResult:
    """Run ``n_trials`` trials of ``objective`` on ``n_workers`` processes.

    ``objective(trial)`` trains with ``trial.params`` (drawn from ``space``,
    a dict of :mod:`~minidist.search.space` distributions) and returns the
    number to ``direction`` (maximize or minimize): a validation accuracy,
    a loss. ``seed`` fixes every trial's parameters and ``trial.seed``.
    ``folder`` keeps the journal (tickets and ``trials.jsonl``) there; by
    default it lives in a temporary folder for the search's duration.
    ``trial_timeout`` is one trial's deadline in seconds (default 600, None
    for none): a worker still in a trial after it is killed, that trial is
    ``failed``, and the other workers run the rest.

    Returns a :class:`SearchResult`: per trial its number, worker, params,
    value, start and end, state (complete / pruned / failed with the error).
    """
    check_search_arguments(objective, n_trials, n_workers, seed, direction)
    space = check_space(space)
    seed = 0 if seed is None else seed
    trial_timeout = check_trial_timeout(trial_timeout)
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="minidist-search-") as temporary:
            return _search(objective, space, n_trials, n_workers, seed, direction, temporary,
                           transport, trial_timeout)
    return _search(objective, space, n_trials, n_workers, seed, direction, folder, transport,
                   trial_timeout)


def _search(objective, space, n_trials, n_workers, seed, direction, folder, transport,
            trial_timeout):
    from minidist.distributed.launch import launch

    journal = Journal(folder).create()
    began = time.time()
    # No timeout for the launch: its workers never wait for each other's
    # messages. The trial deadline is the watchdog's.
    with Watchdog(folder, trial_timeout) as watchdog:
        results = launch(_run_trials, world_size=n_workers, transport=transport,
                         args=(objective, space, n_trials, seed, str(folder)),
                         tolerate_failures=True, timeout=None)
    ended = time.time()
    lost = {rank: _first_line(result) for rank, result in enumerate(results)
            if isinstance(result, BaseException)}
    lost.update(watchdog.overdue)  # "killed by SIGKILL" says less than why
    trials = trials_from_journal(journal.read(), began, ended, lost)
    return SearchResult(trials, n_trials, n_workers, seed, direction, ended - began, lost)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def trials_from_journal(records, began: float, noticed: float, lost: dict) -> list[TrialRecord]:
    """The trials, by number, from the journal's start and end lines. A start
    without an end is a trial whose worker died: ``failed``, with the
    worker's error, ended when the search noticed."""
    starts, ends = {}, {}
    for record in records:
        (starts if record["event"] == "start" else ends)[record["number"]] = record
    trials = []
    for number in sorted(starts):
        start = starts[number]
        end = ends.get(number)
        trial = TrialRecord(number, start["worker"], start["params"], "failed",
                            start=start["time"] - began)
        if end is None:
            worker = start["worker"]
            trial.end = noticed - began
            trial.error = (f"worker {worker} died during this trial: "
                           f"{lost.get(worker, 'its process ended without a word')}")
        else:
            trial.state = end["state"]
            trial.value = end.get("value")
            trial.end = end["time"] - began
            trial.error = end.get("error")
            trial.intermediate = {int(step): value
                                  for step, value in end.get("intermediate", {}).items()}
        trials.append(trial)
    return trials


__all__ = ["random_search", "Trial", "TrialPruned", "TrialRecord", "SearchResult"]
